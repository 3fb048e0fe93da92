"""For audio tracks that make their own frames (the reply, the bench's microphone): wall-clock pacing and
the frame itself."""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np


class FramePacer:
    """Frame at stream position ``pts`` (samples) is due ``pts / sample_rate`` seconds after the first one.

    :meth:`wait` sleeps until then and returns how late the caller is (seconds, ≥ 0): a track decides
    itself whether to skip ahead or to send late frames back to back.
    """

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._start: float | None = None

    async def wait(self, pts: int) -> float:
        if self._start is None:
            self._start = time.monotonic() - pts / self.sample_rate
            return 0.0
        delay = self._start + pts / self.sample_rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            return 0.0
        return -delay


def s16_mono_frame(samples: np.ndarray, sample_rate: int, pts: int) -> av.AudioFrame:
    """A mono s16 ``AudioFrame`` of ``samples`` at stream position ``pts`` (time base 1/sample_rate)."""
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = sample_rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, sample_rate)
    return frame
