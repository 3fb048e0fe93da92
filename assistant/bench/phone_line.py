"""Both ends of a bench caller's phone line, for the phones that call over a carrier's media stream
(:mod:`~assistant.bench.telephony_client`) and over SIP (:mod:`~assistant.bench.sip_client`):

* :class:`Voice`: what the caller says, a frame every 20 ms from the first, in real time: the utterances queued
  with :meth:`Voice.say`, silence between them, as a phone's microphone sends;
* :class:`Playout`: what the caller hears, the reply audio as a phone plays it (each piece from its arrival, or
  from the end of the one before it), and the questions a bench asks of it (the first audible sample after the
  speech end, the last audible one, the audio heard).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from assistant.audio import SILENCE_PEAK_S16

AUDIBLE_DBFS = -40.0  # as the WebRTC bench: a reply sample at or above this peak is heard


def now() -> float:
    """The caller's clock (monotonic seconds)."""
    return time.monotonic()


@dataclass
class Saying:
    """An utterance on its way out; ``speech_end_at`` is when the frame with its speech end was sent."""

    frames: deque[bytes]
    end_frame: int
    speech_end_at: asyncio.Future[float]
    sent: int = 0


class Voice:
    """The utterances a caller has yet to say, frame by frame: :meth:`next_frame` before each frame goes out (speech
    when there is some, else ``silence``), :meth:`sent` once it has."""

    def __init__(self, silence: bytes) -> None:
        self.silence = silence
        self._saying: deque[Saying] = deque()
        self._current: Saying | None = None  # the utterance of the frame on its way

    def say(self, frames: Iterable[bytes], end_frame: int | None = None) -> asyncio.Future[float]:
        """Queue encoded frames; the future is the time the frame ``end_frame`` (default: the last) was sent."""
        queued = deque(frames)
        fut = asyncio.get_running_loop().create_future()
        if not queued:  # nothing to say: its end is now
            fut.set_result(now())
            return fut
        self._saying.append(Saying(queued, len(queued) - 1 if end_frame is None else end_frame, fut))
        return fut

    def next_frame(self) -> bytes:
        """The payload of the frame to send now."""
        self._current = self._saying[0] if self._saying else None
        return self._current.frames.popleft() if self._current is not None else self.silence

    def sent(self) -> bool:
        """The frame from :meth:`next_frame` went out: True when it carried an utterance's speech end. (An utterance
        queued while that frame was on its way starts with the next one.)"""
        saying, self._current = self._current, None
        if saying is None:
            return False
        ended = saying.sent == saying.end_frame and not saying.speech_end_at.done()
        if ended:
            saying.speech_end_at.set_result(now())
        saying.sent += 1
        if not saying.frames:
            self._saying.popleft()
            if not saying.speech_end_at.done():  # an end frame past the speech: its last frame is the end
                saying.speech_end_at.set_result(now())
        return ended


@dataclass
class Played:
    """Reply audio queued for playout: from ``at`` (the caller's clock), ``pcm`` int16 at the line's rate."""

    at: float
    pcm: np.ndarray


class Playout:
    """What a caller hears (see the module docstring); ``changed`` is set at every new piece of audio."""

    # A line whose server sends nothing between replies (a carrier's media stream) lets the queue run dry; one that
    # sends silence between them (RTP) never does, and there the last sound that is not silence counts alone.
    queue_runs_dry = True

    def __init__(self, rate: int, threshold_dbfs: float = AUDIBLE_DBFS) -> None:
        self.rate = rate
        self.threshold = 10.0 ** (threshold_dbfs / 20.0) * 32768
        self.played: list[Played] = []  # reply audio as queued for playout (cut back at each clear)
        self.changed = asyncio.Event()
        self._play_end = 0.0

    @property
    def queue_end(self) -> float:
        """When what is queued so far will have played (the caller's clock)."""
        return self._play_end

    def play(self, pcm: np.ndarray, at: float) -> None:
        """Reply audio received at ``at``: it plays from then, or when what is queued before it has played."""
        play_at = max(at, self._play_end)
        self._play_end = play_at + len(pcm) / self.rate
        self.played.append(Played(play_at, pcm))
        self.changed.set()

    def drained(self) -> None:
        """The queue starts afresh: a phone's player drains while its caller talks."""
        self._play_end = 0.0

    def cut_playout(self, at: float) -> None:
        """A clear at ``at``: what had not played by then never will."""
        kept: list[Played] = []
        for p in self.played:
            n = int(max(0.0, at - p.at) * self.rate)
            if n > 0:
                kept.append(Played(p.at, p.pcm[:n]))
        self.played = kept
        self._play_end = at

    def heard_pcm(self, since: float = 0.0) -> np.ndarray:
        """The reply audio that played (or will, if no clear comes) from ``since`` on, in order."""
        parts = [p.pcm for p in self.played if p.at + len(p.pcm) / self.rate > since]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    def first_audible(self, since: float) -> float | None:
        """The playout time of the first reply sample at or above the threshold, queued after ``since``."""
        for p in self.played:
            if p.at < since:
                continue
            loud = np.flatnonzero(np.abs(p.pcm.astype(np.int32)) >= self.threshold)
            if loud.size:
                return p.at + int(loud[0]) / self.rate
        return None

    def audible_since(self, since: float) -> int:
        """Pieces played from ``since`` on that are not silence."""
        return sum(1 for p in self.played if p.at >= since and p.pcm.size
                   and int(np.abs(p.pcm.astype(np.int32)).max()) > SILENCE_PEAK_S16)

    def last_audible_end(self) -> float:
        """When the latest reply audio that is not silence ends (the caller's clock); 0 if none."""
        for p in reversed(self.played):
            loud = np.flatnonzero(np.abs(p.pcm.astype(np.int32)) > SILENCE_PEAK_S16)
            if loud.size:
                return p.at + (int(loud[-1]) + 1) / self.rate
        return 0.0

    async def wait_for(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Until ``check()`` holds (True) or the time is up (False)."""
        deadline = now() + timeout_s
        while not check():
            left = deadline - now()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.1))
        return True

    async def reply_done(self, since: float, quiet_s: float = 1.2, timeout_s: float = 30.0) -> bool:
        """Until a reply that started after ``since`` has played and been quiet for ``quiet_s``, and, where the
        queue runs dry between replies, until everything queued has played."""
        def done() -> bool:
            return (self.first_audible(since) is not None and now() - self.last_audible_end() >= quiet_s
                    and (not self.queue_runs_dry or now() >= self._play_end))
        return await self.wait_for(done, timeout_s)
