"""The reply sink of a phone call: μ-law ``media`` to the carrier, a ``mark`` after each piece, ``clear`` to stop.

It is the pipeline's :class:`~assistant.pipeline.reply.ReplySink`, as ``rtc/outbound.ReplyTrack`` is for a peer,
so a call's turns run exactly as a peer's do. The carrier plays what we send from a buffer of its own and returns
each mark when the audio before it has been played. So:

- **what was heard** (``audible_frames_sent``) is the audio up to the last mark that came back: the history of
  an interrupted reply ends there;
- **pacing**: a piece goes out only while what was sent and not yet confirmed stays within
  ``telephony.audio_lead_ms``, so the carrier never holds more than that, and a ``clear`` drops at most that;
- **barge-in**: :meth:`pause` sends ``clear`` at once (the caller hears silence, as a paused peer track sends
  silence) and keeps the unconfirmed audio, which :meth:`resume` sends again; :meth:`interrupt` sends ``clear``
  and drops it. The carrier answers a ``clear`` by returning the marks it dropped: those belong to an older
  *epoch* (every mark name carries the epoch it was sent in) and count as not heard. A mark that was played
  just before the ``clear`` reached the carrier comes back after it too, and is also not counted: what was heard
  errs short, by at most the network's round trip.

A carrier that never returns a mark must not hang the call: a mark more than ``MARK_GRACE_S`` past the moment
its audio should have finished (by the server's clock) is taken as played, and the call's log says so once. From
that first overdue mark on, the call is paced by the clock: each piece counts as played when its playout is due,
with no grace, so a carrier (or a proxy) that drops marks costs the caller one gap of ``MARK_GRACE_S`` per call,
not one per lead's worth of audio (with 400 ms of lead, the caller heard ~8 % of the time before).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from assistant.audio import FRAME_MS, SILENCE_PEAK_S16
from assistant.g711 import ulaw_encode
from assistant.rtc.outbound import SinkBase
from assistant.server.telephony.dialects import TELEPHONE_RATE

SAMPLE_RATE = TELEPHONE_RATE  # the speech path makes the reply at 8 kHz directly (soxr, anti-aliased)
FRAME = SAMPLE_RATE * FRAME_MS // 1000  # 160: the pipeline counts what was heard in 20 ms frames
PIECE = SAMPLE_RATE // 10  # 100 ms per media message, a mark after each: what was heard is known to 100 ms
MARK_GRACE_S = 5.0  # far past any network round trip: a mark this late is not coming
POLL_S = 0.05  # a waiting writer looks again at least this often (an overdue mark is noticed within it)

log = logging.getLogger(__name__)


@dataclass
class Piece:
    """Audio sent and not yet confirmed played: its mark's name, and when its playout should be over."""

    name: str
    pcm: np.ndarray  # int16 at 8 kHz
    due: float  # monotonic time its playout ends, if the carrier plays it as it comes


class CallSink(SinkBase):
    """Reply audio to a carrier (see the module docstring). ``send`` takes one outgoing message (a dict); the
    ``media``, ``mark`` and ``clear`` messages are made by ``media(payload)``, ``mark(name)`` and ``clear()``."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        send: Callable[[dict[str, object]], None],
        media: Callable[[str], dict[str, object]],
        mark: Callable[[str], dict[str, object]],
        clear: Callable[[], dict[str, object]],
        lead_ms: int,
        session_id: str = "",
    ) -> None:
        super().__init__()
        self._send, self._media, self._mark, self._clear = send, media, mark, clear
        self.lead = max(PIECE, lead_ms * SAMPLE_RATE // 1000)
        self.session_id = session_id
        self._epoch = 0  # bumped by every clear: marks sent before it were cleared, not played
        self._seq = 0
        self._pending: deque[Piece] = deque()  # sent, mark not back, oldest first
        self._held: list[np.ndarray] = []  # cleared by a pause: sent again on resume
        self._partial = np.zeros(0, dtype=np.int16)  # under one frame, waiting for more (or flush)
        self._confirmed = 0  # samples whose mark came back: the caller heard them
        self._last_due = 0.0
        self._stopped = False
        self._changed = asyncio.Event()
        self.clears = 0
        self.marks_ignored = 0  # marks of cleared audio, and names we never sent
        self.marks_overdue = 0

    # --- what the carrier tells us --------------------------------------------------------------------
    def on_mark(self, name: str) -> None:
        """The carrier played everything up to this mark (marks come back in the order they were sent)."""
        if not any(p.name == name for p in self._pending):
            self.marks_ignored += 1
            return
        while self._pending:
            piece = self._pending.popleft()
            self._confirmed += len(piece.pcm)
            if piece.name == name:
                break
        self._changed.set()

    @property
    def unconfirmed(self) -> int:
        """Samples sent whose mark has not come back: what the carrier may still hold."""
        return sum(len(p.pcm) for p in self._pending)

    @property
    def audible_frames_sent(self) -> int:
        return self._confirmed // FRAME

    # --- the ReplySink face (generation and expect_reply: SinkBase) ---------------------------------------
    async def write(self, pcm: np.ndarray, generation: int | None = None) -> bool:
        gen = self._generation if generation is None else generation
        if gen != self._generation:
            return False
        data = np.asarray(pcm, dtype=np.int16)
        if self._partial.size:
            data = np.concatenate([self._partial, data])
        whole = len(data) // FRAME * FRAME  # whole 20 ms frames go out; the rest waits for the next write
        self._partial = np.array(data[whole:], dtype=np.int16)
        at = 0
        while at < whole:
            n = min(PIECE, whole - at)
            if not await self._room(n, gen):
                return False
            self._send_piece(data[at : at + n])
            at += n
        return gen == self._generation

    async def flush(self, generation: int | None = None) -> bool:
        """Send the last partial frame (padded with silence) and wait until every mark has come back."""
        gen = self._generation if generation is None else generation
        if self._partial.size and gen == self._generation:
            tail = np.concatenate([self._partial, np.zeros(FRAME - self._partial.size, dtype=np.int16)])
            self._partial = np.zeros(0, dtype=np.int16)
            if not await self._room(len(tail), gen):
                return False
            self._send_piece(tail)
        while gen == self._generation and not self._stopped and (self._pending or self._held):
            await self._wait()
        return gen == self._generation

    def interrupt(self) -> int:
        """Stop the reply where the caller's playout is: ``clear``, and what was not confirmed is dropped."""
        dropped = self.unconfirmed + sum(len(h) for h in self._held) + self._partial.size
        if self._pending:
            self._clear_carrier()
        self._pending.clear()
        self._held.clear()
        self._partial = np.zeros(0, dtype=np.int16)
        self._new_generation()
        self._paused = False
        self._changed.set()
        return dropped // FRAME

    def pause(self) -> None:
        """Silence at once (``clear``); the audio the caller had not heard yet is kept for :meth:`resume`."""
        if self._paused:
            return
        self._paused = True
        if self._pending:
            self._held = [p.pcm for p in self._pending] + self._held
            self._pending.clear()
            self._clear_carrier()
        self._changed.set()

    def resume(self) -> None:
        """Play on from where :meth:`pause` cleared: its audio goes out again, then the writers go on."""
        if not self._paused:
            return
        self._paused = False
        held, self._held = self._held, []
        for pcm in held:
            self._send_piece(pcm)
        self._changed.set()

    def stop(self) -> None:
        self._stopped = True
        self._new_generation()
        self._pending.clear()
        self._held.clear()
        self._changed.set()

    # --- inside ---------------------------------------------------------------------------------------
    def _send_piece(self, pcm: np.ndarray) -> None:
        now = time.monotonic()
        name = f"{self._epoch}.{self._seq}"
        self._seq += 1
        self._last_due = max(now, self._last_due) + len(pcm) / SAMPLE_RATE
        self._pending.append(Piece(name, pcm, self._last_due))
        self._send(self._media(base64.b64encode(ulaw_encode(pcm)).decode()))
        self._send(self._mark(name))
        if pcm.size and int(np.abs(pcm).max()) > SILENCE_PEAK_S16:
            self._first_audible.heard(time.time())

    def _clear_carrier(self) -> None:
        self._send(self._clear())
        self._epoch += 1
        self.clears += 1
        self._last_due = 0.0

    async def _room(self, n: int, gen: int) -> bool:
        """Wait until ``n`` more samples keep what the carrier holds within the lead; False if interrupted."""
        while True:
            if gen != self._generation or self._stopped:
                return False
            ahead = self.unconfirmed
            if not self._paused and not self._held and (ahead == 0 or ahead + n <= self.lead):
                return True
            await self._wait()

    async def _wait(self) -> None:
        """Until something changes (a mark, a clear, a resume, the end), or POLL_S; overdue marks are settled."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), POLL_S)
        self._settle_overdue()

    def _settle_overdue(self) -> None:
        now = time.monotonic()
        grace = 0.0 if self.marks_overdue else MARK_GRACE_S  # after one overdue mark: the clock paces the call
        while self._pending and now > self._pending[0].due + grace:
            piece = self._pending.popleft()
            self._confirmed += len(piece.pcm)
            self.marks_overdue += 1
            if self.marks_overdue == 1:
                log.warning("call_mark_overdue session=%s mark=%s: the carrier does not return marks; the server's "
                            "clock says what was heard and paces the call from now on", self.session_id, piece.name)
