"""Wall-clock pacing for audio tracks that generate their own frames (the reply, the bench's microphone)."""

from __future__ import annotations

import asyncio
import time


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
