"""assistant.rtc.inbound: AudioFrame → 16 kHz mono conversion, the sample clock, gaps, the read loop."""

from __future__ import annotations

import asyncio
import itertools
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from assistant.rtc.inbound import (
    AudioChunk,
    InboundAudio,
    frame_to_float,
    read_track,
)

RATE = 48_000
FRAME = 960  # 20 ms at 48 kHz, what aiortc's Opus decoder produces
TONE_HZ = 440.0
LEVEL = 0.5


def make_frame(
    start: int,
    *,
    n: int = FRAME,
    rate: int = RATE,
    layout: str = "stereo",
    fmt: str = "s16",
    pts: int | None = -1,
) -> av.AudioFrame:
    """A sine frame starting at sample ``start``; pts in 1/rate ticks (-1: = start, None: no pts)."""
    t = (start + np.arange(n)) / rate
    x = LEVEL * np.sin(2 * np.pi * TONE_HZ * t)
    channels = 2 if layout == "stereo" else 1
    planar = fmt.endswith("p")
    if fmt.startswith("s16"):
        s = np.round(x * 32767).astype(np.int16)
    else:
        s = x.astype(np.float32)
    data = np.tile(s, (channels, 1)) if planar else np.repeat(s, channels)[None, :]
    frame = av.AudioFrame.from_ndarray(data, format=fmt, layout=layout)
    frame.sample_rate = rate
    if pts is not None:
        frame.pts = start if pts == -1 else pts
        frame.time_base = Fraction(1, rate)
    return frame


def _peak_hz(x: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * sr / len(x))


def _run(frames: list[av.AudioFrame]) -> tuple[InboundAudio, np.ndarray]:
    inbound = InboundAudio()
    out = [inbound.push(f) for f in frames] + [inbound.flush()]
    return inbound, np.concatenate(out)


@pytest.mark.parametrize(
    "layout,fmt", [("stereo", "s16"), ("mono", "s16"), ("stereo", "fltp"), ("mono", "flt")]
)
def test_frame_to_float_any_layout(layout: str, fmt: str) -> None:
    x = frame_to_float(make_frame(0, layout=layout, fmt=fmt))
    assert x.dtype == np.float32 and x.shape == (FRAME,)
    expected = LEVEL * np.sin(2 * np.pi * TONE_HZ * np.arange(FRAME) / RATE)
    np.testing.assert_allclose(x, expected, atol=1e-4)


def test_three_seconds_48k_stereo_gives_exactly_48000_samples_at_16k() -> None:
    frames = [make_frame(i * FRAME) for i in range(150)]  # 3 s
    inbound = InboundAudio()
    before_flush = sum(len(inbound.push(f)) for f in frames)
    assert 48_000 - before_flush < 16_000 * 0.05  # only the resampler's delay is held back
    tail = inbound.flush()
    assert before_flush + len(tail) == 48_000 == inbound.position
    assert inbound.gaps == 0 and inbound.frames == 150


def test_frequency_and_level_preserved() -> None:
    _, y = _run([make_frame(i * FRAME) for i in range(150)])
    assert abs(_peak_hz(y, 16_000) - TONE_HZ) < 1.0
    mid = y[1600:-1600]
    assert np.sqrt(np.mean(mid**2)) == pytest.approx(LEVEL / np.sqrt(2), rel=0.01)


def test_pts_gap_is_filled_with_silence() -> None:
    """Frames 50..59 (200 ms) never arrive: the clock still advances 3 s and the hole is silence."""
    frames = [make_frame(i * FRAME) for i in range(150) if not 50 <= i < 60]
    inbound, y = _run(frames)
    assert inbound.gaps == 1 and inbound.gap_fill_s == pytest.approx(0.2)
    assert len(y) == 48_000
    hole = y[int(1.01 * 16_000) : int(1.19 * 16_000)]  # inside 1.0–1.2 s, clear of the filter's ringing
    assert np.max(np.abs(hole)) < 1e-3
    assert np.max(np.abs(y[int(1.25 * 16_000) : int(1.3 * 16_000)])) > 0.4  # tone resumes on time


def test_frames_without_pts_are_contiguous_and_backward_jump_reanchors() -> None:
    inbound, y = _run([make_frame(i * FRAME, pts=None) for i in range(50)])
    assert len(y) == 16_000 and inbound.gaps == 0
    frames = [make_frame(i * FRAME) for i in range(25)] + [
        make_frame(i * FRAME, pts=i * FRAME) for i in range(25)
    ]
    inbound, y = _run(frames)  # pts restarts at 0 (e.g. RTP timestamp wrap): no fill, no loss
    assert len(y) == 16_000 and inbound.discontinuities == 1 and inbound.gaps == 0


def test_timestamp_jumps_fill_no_faster_than_time_passes_and_name_the_peer() -> None:
    """A peer that jumps its timestamps by 4.9 s on every packet gets one fill, then re-anchors, then a verdict."""
    now = [0.0]
    inbound = InboundAudio(clock=lambda: now[0])
    out = []
    for i in range(20):
        out.append(inbound.push(make_frame(i * FRAME, pts=i * (FRAME + int(4.9 * RATE)))))
        now[0] += 0.02
    assert inbound.gaps == 1 and inbound.gap_fill_s == pytest.approx(4.9)  # the first jump only
    assert inbound.discontinuities == 18 and inbound.abuse() == "timestamp_jumps"
    assert sum(map(len, out)) < 16_000 * (4.9 + 20 * 0.02 + 0.1)
    # A real loss after time passed is filled as before.
    honest = InboundAudio(clock=lambda: now[0])
    honest.push(make_frame(0))
    now[0] += 10.0
    honest.push(make_frame(10 * FRAME))
    assert honest.gaps == 1 and honest.abuse() == ""


def test_rate_change_keeps_every_sample() -> None:
    frames = [make_frame(i * FRAME) for i in range(50)]
    frames += [make_frame(i * 320, n=320, rate=16_000, pts=None) for i in range(50)]
    inbound, y = _run(frames)
    assert len(y) == 32_000 == inbound.position


class FakeTrack:
    """A stand-in for aiortc's remote audio track: ``recv()`` yields frames, then MediaStreamError."""

    def __init__(self, frames: list[av.AudioFrame], delay_s: float = 0.0) -> None:
        self.frames = list(frames)
        self.delay_s = delay_s

    async def recv(self) -> av.AudioFrame:
        await asyncio.sleep(self.delay_s)
        if not self.frames:
            raise MediaStreamError
        return self.frames.pop(0)


async def test_read_track_with_callback() -> None:
    chunks: list[AudioChunk] = []
    inbound = await read_track(FakeTrack([make_frame(i * FRAME) for i in range(50)]), chunks.append)
    assert sum(len(c.samples) for c in chunks) == 16_000 == inbound.position
    assert all(a.end == b.start for a, b in itertools.pairwise(chunks))


