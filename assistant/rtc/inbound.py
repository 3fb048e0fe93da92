"""Inbound audio: aiortc/PyAV ``AudioFrame``s → 16 kHz mono float32, on a sample clock the VAD can trust.

``InboundAudio`` turns each received frame (aiortc gives 48 kHz s16 20 ms frames, stereo or mono; any rate,
layout and sample format is accepted) into 16 kHz mono float32 with one streaming resampler whose state lives
across frames, so nothing drifts and nothing is lost: N seconds in → N·16000 samples out, less the
resampler's delay until ``flush()``.

``read_track`` is the receive loop: it pulls frames off a track until ``MediaStreamError`` and hands
``AudioChunk``s to a sink that never blocks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

import av
import numpy as np
import soxr
from aiortc.mediastreams import MediaStreamError
from av.frame import Frame
from av.packet import Packet

from assistant.audio import S16_SCALE, SPEECH_RATE, AudioChunk
from assistant.rtc.jitter import JUMP_WINDOW_S, MAX_JUMPS, RecentEvents

log = logging.getLogger(__name__)

# The pipeline's audio clock: VAD and ASR both run at 16 kHz.
# soxr "MQ" (16-bit precision, what s16 input carries) delays 48→16 kHz by ~12 ms; "HQ" by ~33 ms,
# and that delay adds straight to endpointing latency.
INBOUND_RESAMPLE_QUALITY = "MQ"
# A pts jump smaller than this is timestamp rounding, not a lost frame.
GAP_TOLERANCE_S = 0.001
# Longer pts jumps (or backwards ones: RTP timestamp wrap, stream restart) are a discontinuity: the clock is
# re-anchored instead of filled, so a long mute never turns into minutes of synthetic silence.
MAX_GAP_FILL_S = 5.0
# Silence is filled at most as fast as time passes (a real loss of packets is a stretch of time that went by),
# with MAX_GAP_FILL_S to start with: a peer that jumps its timestamps on every packet gets discontinuities, not
# seconds of silence for each packet.

# Scale of each integer sample format to −1…1 (PyAV format name without the planar "p").
_INT_SCALE = {"u8": 128.0, "s16": S16_SCALE, "s32": 2147483648.0, "s64": 9223372036854775808.0}


def frame_to_float(frame: av.AudioFrame) -> np.ndarray:
    """Any PyAV ``AudioFrame`` (packed or planar, u8/s16/s32/s64/flt/dbl, any layout) → float32 mono."""
    a = frame.to_ndarray()
    channels = len(frame.layout.channels)
    fmt = frame.format.name.rstrip("p")
    # The channels summed as they are (planar: rows; packed: interleaved L R L R …), then scaled once: a few
    # microseconds for the 20 ms stereo s16 frame every call's decoder gives, 50 times a second, on the event loop
    # (a float copy of each channel and numpy's mean took 2-3x as long, timed beside a benchmark run).
    each = a.reshape(channels, -1) if frame.format.is_planar else a.reshape(-1, channels).T
    x = each[0].astype(np.float32)
    for channel in each[1:]:
        x += channel
    if fmt == "u8":
        x -= np.float32(128.0 * channels)
    x *= np.float32(1.0 / (_INT_SCALE.get(fmt, 1.0) * channels))
    return x


class InboundAudio:
    """Converts received audio frames into 16 kHz mono float32 chunks, keeping a true sample clock.

    Frame timing comes from ``frame.pts`` · ``frame.time_base``. When a frame's pts is later than where the
    previous frame ended (a lost packet, a late start), the gap is filled with silence before the frame is
    resampled, so sample positions — the clock every VAD timestamp is measured on — keep matching the
    sender's time. Gaps up to ``MAX_GAP_FILL_S`` are filled, no faster than time passes; larger or backwards
    jumps, or a gap past what time allows, re-anchor the clock (logged). Frames without pts are taken as
    contiguous. A change of input rate flushes the old resampler and starts a new one. ``abuse()`` says
    ``timestamp_jumps`` once re-anchoring happens more often than any real sender makes it.
    """

    def __init__(self, out_rate: int = SPEECH_RATE, clock: Callable[[], float] = time.monotonic) -> None:
        self.out_rate = out_rate
        self.clock = clock
        self._fill_budget_s = MAX_GAP_FILL_S
        self._budget_stamp = clock()
        self._jumps = RecentEvents(MAX_JUMPS, JUMP_WINDOW_S, clock)
        self.position = 0  # samples emitted at out_rate: the stream clock
        self.frames = 0
        self.gaps = 0
        self.gap_fill_s = 0.0
        self.discontinuities = 0
        self._in_rate = 0
        self._stream: soxr.ResampleStream | None = None
        self._next_pts_s: Fraction | None = None
        self._stream_in = 0  # input samples given to the current resampler
        self._stream_out = 0  # output samples it returned

    @property
    def lag_samples(self) -> int:
        """Output samples the resampler still holds: the newest input is this far past ``position``."""
        if self._stream is None or not self._in_rate:
            return 0
        return max(0, round(self._stream_in * self.out_rate / self._in_rate) - self._stream_out)

    @property
    def position_s(self) -> float:
        return self.position / self.out_rate

    def abuse(self) -> str:
        """``timestamp_jumps`` when the sender's clock jumped more often than a real one does; else empty."""
        return "timestamp_jumps" if self._jumps.too_many else ""

    def _fill_allowed(self, gap_s: float) -> bool:
        """Spend ``gap_s`` of the fill budget (time passed since the last frame, at most MAX_GAP_FILL_S)."""
        now = self.clock()
        self._fill_budget_s = min(MAX_GAP_FILL_S, self._fill_budget_s + (now - self._budget_stamp))
        self._budget_stamp = now
        if gap_s > self._fill_budget_s:
            return False
        self._fill_budget_s -= gap_s
        return True

    def push(self, frame: av.AudioFrame) -> np.ndarray:
        """Convert one frame; returns the 16 kHz samples that are ready (may be empty at first)."""
        rate = int(frame.sample_rate)
        x = frame_to_float(frame)
        parts: list[np.ndarray] = []
        if rate != self._in_rate:
            if self._stream is not None:
                parts.append(self._resampler_tail())
                log.info("inbound.rate_change from=%d to=%d", self._in_rate, rate)
            self._in_rate = rate
            self._stream = soxr.ResampleStream(
                rate, self.out_rate, 1, dtype="float32", quality=INBOUND_RESAMPLE_QUALITY
            )
            self._stream_in = self._stream_out = 0
        gap = self._gap_samples(frame, rate, len(x))
        if gap:
            x = np.concatenate([np.zeros(gap, np.float32), x])
        self.frames += 1
        parts.append(self._resample(x))
        return self._emit(parts)

    def flush(self) -> np.ndarray:
        """End of stream: return the samples still held in the resampler's delay line."""
        return self._emit([self._resampler_tail()])

    def _gap_samples(self, frame: av.AudioFrame, rate: int, n: int) -> int:
        if frame.pts is None or frame.time_base is None:
            self._next_pts_s = None
            return 0
        t = Fraction(frame.pts) * Fraction(frame.time_base)
        expected, self._next_pts_s = self._next_pts_s, t + Fraction(n, rate)
        if expected is None:
            return 0
        gap_s = t - expected
        if abs(gap_s) < GAP_TOLERANCE_S:
            return 0
        if gap_s < 0 or gap_s > MAX_GAP_FILL_S or not self._fill_allowed(float(gap_s)):
            self.discontinuities += 1
            self._jumps.add()
            if self.discontinuities <= MAX_JUMPS:  # past that the peer is closed; its jumps are not logged each
                log.warning("inbound.discontinuity jump_s=%.3f action=reanchor", float(gap_s))
            return 0
        self.gaps += 1
        self.gap_fill_s += float(gap_s)
        log.info("inbound.gap fill_s=%.3f at_s=%.3f", float(gap_s), self.position_s)
        return round(gap_s * rate)

    def _resample(self, x: np.ndarray) -> np.ndarray:
        assert self._stream is not None
        if self._in_rate == self.out_rate:
            return x
        out = self._stream.resample_chunk(x)
        self._stream_in += len(x)
        self._stream_out += len(out)
        return out

    def _resampler_tail(self) -> np.ndarray:
        if self._stream is None or self._in_rate == self.out_rate:
            return np.zeros(0, np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream = None
        self._in_rate = 0
        return tail

    def _emit(self, parts: list[np.ndarray]) -> np.ndarray:
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        out = np.asarray(out, dtype=np.float32)
        self.position += len(out)
        return out


class AudioTrack(Protocol):
    """An aiortc media track (``MediaStreamTrack``): frames until it raises ``MediaStreamError``."""

    async def recv(self) -> Frame | Packet: ...


async def read_track(
    track: AudioTrack,
    sink: Callable[[AudioChunk], None],
    inbound: InboundAudio | None = None,
    arrival: Callable[[int], float | None] | None = None,
) -> InboundAudio:
    """Receive frames from ``track`` until it ends, converting each and passing it to ``sink`` at once.

    ``sink`` must not block (the session's conversation feeds its VAD in place). When the track ends
    (``MediaStreamError``) the resampler tail is delivered. Returns the ``InboundAudio`` (its counters:
    frames, gaps, position).

    ``arrival(pts)`` (e.g. ``AudioReceiveBuffer.arrival``) says when the packet of the frame with that pts
    reached the server; each chunk's ``arrived`` is then that moment, so the time a receive buffer held
    the packet counts. Without it (or when it does not know the frame), ``arrived`` is when it was read.
    """
    inbound = inbound or InboundAudio()

    def deliver(x: np.ndarray, at: float, lag: int = 0) -> None:
        if len(x):
            sink(AudioChunk(inbound.position - len(x), x, at, lag))

    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            break
        read_at = time.time()
        if not isinstance(frame, av.AudioFrame):  # an audio receiver gives nothing else
            log.warning("inbound.not_audio kind=%s", type(frame).__name__)
            continue
        x = inbound.push(frame)
        got = arrival(frame.pts) if arrival is not None and frame.pts is not None else None
        deliver(x, read_at if got is None else min(read_at, got), inbound.lag_samples)
    deliver(inbound.flush(), time.time())
    log.info(
        "inbound.track_ended frames=%d seconds=%.2f gaps=%d gap_fill_s=%.3f",
        inbound.frames,
        inbound.position_s,
        inbound.gaps,
        inbound.gap_fill_s,
    )
    return inbound
