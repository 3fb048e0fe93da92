"""The reply sink of a session without a peer (the Realtime API's WebSocket): audio goes out as events.

It is the pipeline's :class:`~assistant.pipeline.reply.ReplySink`, as ``rtc/outbound.ReplyTrack`` is for a peer,
so a WebSocket session's turns run exactly as a peer's do. The difference is who plays the audio: the client,
from a buffer of its own. The sink sends each chunk as soon as it is made, but never more than ``lead_ms``
ahead of where the client's playout is by the server's clock (playout starts when the first chunk of a run
goes out and never stops until the run has drained, as a player that drops nothing). That estimate is what
the pipeline counts as heard (``audible_frames_sent``): what a barge-in keeps of the reply, and where the
Realtime layer truncates the assistant's item. ``interrupt`` drops what is ahead of the playout; the client,
told by the events, stops playing it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from assistant.rtc.outbound import FRAME_MS, SILENCE_PEAK_S16, SinkBase

SAMPLE_RATE = 24_000  # the Realtime API's PCM rate: the speech path makes the reply at it directly
FRAME = SAMPLE_RATE * FRAME_MS // 1000  # the pipeline counts what was heard in 20 ms frames
PIECE = SAMPLE_RATE // 10  # audio goes out in pieces of at most 100 ms, each paced on its own
POLL_S = 0.05  # a waiting writer looks again at least this often (an interrupt is seen within it)


class StreamSink(SinkBase):
    """Reply audio to ``send_audio`` (int16 at 24 kHz), paced by the client's estimated playout."""

    sample_rate = SAMPLE_RATE

    def __init__(self, lead_ms: int, send_audio: Callable[[np.ndarray], None] | None = None) -> None:
        super().__init__()
        self.lead = max(PIECE, lead_ms * SAMPLE_RATE // 1000)
        self.send_audio = send_audio
        self.discard = False  # text-only output: the reply is made (and timed) but its audio is not sent
        self._stopped = False
        self._run_start: float | None = None  # when the client's playout of the current run began
        self._run_sent = 0  # samples sent in the current run
        self._played_before = 0  # samples played in runs that drained

    # --- the playout estimate ------------------------------------------------------------------------
    def _played_in_run(self, now: float) -> int:
        if self._run_start is None:
            return 0
        return min(self._run_sent, int((now - self._run_start) * SAMPLE_RATE))

    def _settle(self, now: float) -> None:
        """A run whose audio has all been played is over: the next chunk starts a new one."""
        if self._run_start is not None and self._played_in_run(now) >= self._run_sent:
            self._played_before += self._run_sent
            self._run_start, self._run_sent = None, 0

    def ahead_samples(self, now: float | None = None) -> int:
        """Sent but not yet played: what the client holds."""
        now = time.monotonic() if now is None else now
        return self._run_sent - self._played_in_run(now)

    @property
    def audible_frames_sent(self) -> int:
        return (self._played_before + self._played_in_run(time.monotonic())) // FRAME

    # --- the ReplySink face (generation, expect_reply, pause and resume: SinkBase) -------------------
    async def write(self, pcm: np.ndarray, generation: int | None = None) -> bool:
        gen = self._generation if generation is None else generation
        pcm = np.asarray(pcm, dtype=np.int16)
        for at in range(0, len(pcm), PIECE):
            piece = pcm[at : at + PIECE]
            if not await self._room(len(piece), gen):
                return False
            now = time.monotonic()
            if not self.discard:
                if self._run_start is None:
                    self._run_start = now
                self._run_sent += len(piece)
            if piece.size and int(np.abs(piece).max()) > SILENCE_PEAK_S16:
                self._first_audible.heard(time.time())
            if not self.discard and self.send_audio is not None:
                self.send_audio(piece)
        return gen == self._generation

    async def _room(self, n: int, gen: int) -> bool:
        """Wait until ``n`` more samples keep the client's buffer within the lead; False if interrupted."""
        while True:
            if gen != self._generation or self._stopped:
                return False
            now = time.monotonic()
            self._settle(now)
            ahead = self.ahead_samples(now)
            if not self._paused and (self.discard or ahead == 0 or ahead + n <= self.lead):
                return True
            wait = POLL_S if self._paused else (ahead + n - self.lead) / SAMPLE_RATE
            await asyncio.sleep(min(POLL_S, max(0.001, wait)))

    async def flush(self, generation: int | None = None) -> bool:
        """Wait until the client has played everything sent (by the estimate)."""
        gen = self._generation if generation is None else generation
        while gen == self._generation and not self._stopped:
            now = time.monotonic()
            ahead = self.ahead_samples(now)
            if ahead <= 0:
                self._settle(now)
                break
            await asyncio.sleep(min(POLL_S, ahead / SAMPLE_RATE))
        return gen == self._generation

    def interrupt(self) -> int:
        """Stop the reply where the client's playout is; returns the frames sent but not played (dropped)."""
        now = time.monotonic()
        played = self._played_in_run(now)
        dropped = self._run_sent - played
        self._run_sent = played
        self._settle(now)
        self._new_generation()
        self._paused = False
        return dropped // FRAME

    def stop(self) -> None:
        self._stopped = True
        self._new_generation()
