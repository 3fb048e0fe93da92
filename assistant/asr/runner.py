"""``ASRRunner``: the async face of a blocking ``ASREngine`` (a :class:`~assistant.asr.base.Transcriber`),
shared by every session.

It runs at most ``asr.workers`` passes at once on its own threads, so ASR never blocks the event loop and the
CPU it takes is bounded for the whole process. Passes that must wait are scheduled, not queued in arrival
order:

- **finals first**: a committed turn's pass, then speculative passes, then partial hypotheses
  (:class:`~assistant.asr.base.PassKind`); a partial is not even queued when it would wait;
- **sessions in turn**: among passes of one kind, the session served longest ago goes first, so no session
  waits behind another's run of speculative passes;
- **useless passes never run**: a pass whose caller gave up (a speculation the user talked over, a turn
  dropped) before a worker was free is dropped from the queue. A pass already running is told to stop
  (:func:`~assistant.asr.base.stop_requested`): a thread cannot be stopped, but the engine stops at its next step
  (faster-whisper: before its decoder, about half a pass) and its worker is free for the next pass.

Every answer carries its pass's timing (asked, started, done), which the turn's trace splits the wait by.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from assistant.asr.base import ASREngine, PassKind, PassStopped, PassTiming, Transcript, stoppable
from assistant.config import ASRConfig

log = logging.getLogger(__name__)


# A stuck engine call strands one worker pool; past this many the runner stops replacing them (each holds
# a thread and the memory of its call) and the timeout error is all that is left.
MAX_ABANDONED_POOLS = 4
# Passes waiting for a worker, all sessions together; past it a pass is refused at once (an overloaded
# process answers "busy" rather than queueing work nobody will wait for).
MAX_WAITING = 256
MAX_SERVED = 1024  # sessions whose latest pass is remembered for fairness (more than are ever open at once)


class ASRBusy(RuntimeError):
    """Too many passes are waiting for a worker."""


@dataclass
class _Pass:
    kind: PassKind
    seq: int
    session: str
    fn: Callable[[], object]
    answer: asyncio.Future[object]
    asked: float
    started: float = 0.0  # when its thread began (0: still waiting)
    pool: ThreadPoolExecutor | None = None  # the pool it runs on, once dispatched
    done: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)  # set when its caller gives up


class ASRRunner:
    """Runs ``engine.transcribe`` on ``asr.workers`` threads, scheduled (module docstring), each pass under
    ``asr.timeout_s`` counted from when it was asked."""

    def __init__(self, engine: ASREngine, cfg: ASRConfig | None = None) -> None:
        self.engine = engine
        self.cfg = cfg or ASRConfig()
        self.workers = max(1, self.cfg.workers)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="asr")
        self._running = 0  # passes on the current pool
        self._waiting: list[_Pass] = []
        self._seq = itertools.count()
        self._tick = itertools.count(1)
        # session → tick of its latest dispatched pass, least recently served first; past MAX_SERVED the oldest go
        # (a session forgotten counts as never served: first in line, as it was anyway, being served longest ago)
        self._served: OrderedDict[str, int] = OrderedDict()
        self._abandoned = 0  # pools left behind a stuck transcription
        self.passes: Counter[str] = Counter()  # run per kind, and "dropped" (never run)
        from assistant.asr import hearing

        self._hearing = hearing(self.cfg, engine)

    @property
    def languages(self) -> tuple[str, ...]:
        """The language codes a pass may be asked for (the engine's, or ``asr.languages``)."""
        return self._hearing[0]

    @property
    def detects(self) -> bool:
        """Whether a pass may ask for ``auto``."""
        return self._hearing[1]

    @property
    def busy(self) -> bool:
        """True when a new pass would wait for a worker."""
        return self._running + len(self._waiting) >= self.workers

    async def transcribe(
        self,
        audio: np.ndarray,
        *,
        language: str | None = None,
        prompt: str | None = None,
        session: str = "",
        kind: PassKind = PassKind.FINAL,
    ) -> Transcript:
        """Transcript of an utterance, with its pass's timing. Raises TimeoutError after ``asr.timeout_s``."""
        job = await self._submit(lambda: self.engine.transcribe(audio, language=language, prompt=prompt),
                                 session, kind)
        result = job.answer.result()
        assert isinstance(result, Transcript)
        return dataclasses.replace(result, timing=PassTiming(job.asked, job.started, job.done))

    async def transcribe_partial(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None, session: str = ""
    ) -> Transcript | None:
        """A partial hypothesis while the user speaks; None (skipped) when it would wait for a worker, so
        partials never queue up in front of a final transcript."""
        if self.busy:
            return None
        return await self.transcribe(audio, language=language, prompt=prompt, session=session, kind=PassKind.PARTIAL)

    async def warmup(self) -> None:
        await self._submit(self.engine.warmup, "", PassKind.FINAL)

    def close(self) -> None:
        """Stop accepting work; waiting passes are cancelled, a running one finishes in its thread."""
        for job in self._waiting:
            job.answer.cancel()
        self._waiting.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the schedule --------------------------------------------------------------------------------
    async def _submit(self, fn: Callable[[], object], session: str, kind: PassKind) -> _Pass:
        if len(self._waiting) >= MAX_WAITING:
            raise ASRBusy(f"{len(self._waiting)} transcriptions are waiting for a worker")
        loop = asyncio.get_running_loop()
        job = _Pass(kind, next(self._seq), session, fn, loop.create_future(), time.time())
        self._waiting.append(job)
        self._dispatch()
        try:
            # On timeout or cancel only this wait ends (and the answer with it): a running thread goes on
            # (threads cannot be stopped) and frees its worker when it finishes.
            async with asyncio.timeout(self.cfg.timeout_s):
                await job.answer
        except TimeoutError:
            log.error("asr.timeout timeout_s=%.1f kind=%s", self.cfg.timeout_s, kind.name.lower())
            self._give_up(job)
            if job.pool is not None:
                self._replace_stuck_pool(job.pool)
            raise
        except asyncio.CancelledError:
            self._give_up(job)
            raise
        return job

    def _give_up(self, job: _Pass) -> None:
        if job in self._waiting:  # never started: it never will
            self._waiting.remove(job)
            self.passes["dropped"] += 1
            log.info("asr.pass_dropped session=%s kind=%s", job.session, job.kind.name.lower())
        if not job.answer.done():
            job.answer.cancel()
        job.stop.set()  # running: its engine stops at its next step

    def _dispatch(self) -> None:
        """Start waiting passes while workers are free: finals first, then the session served longest ago."""
        loop = asyncio.get_running_loop()
        while self._running < self.workers and self._waiting:
            job = min(self._waiting, key=lambda j: (j.kind, self._served.get(j.session, 0), j.seq))
            self._waiting.remove(job)
            self._served[job.session] = next(self._tick)
            self._served.move_to_end(job.session)
            while len(self._served) > MAX_SERVED:
                self._served.popitem(last=False)
            self._running += 1
            self.passes[job.kind.name.lower()] += 1
            job.pool = self._pool
            work = job.pool.submit(self._timed, job)
            # Straight back onto the loop from the worker thread: one hop from the answer to its waiter.
            work.add_done_callback(functools.partial(_call_soon, loop, self._finished, job))

    @staticmethod
    def _timed(job: _Pass) -> object:
        job.started = time.time()
        try:
            with stoppable(job.stop):
                return job.fn()
        finally:
            job.done = time.time()

    def _finished(self, job: _Pass, work: Future[object]) -> None:
        if job.pool is self._pool:  # passes of an abandoned pool no longer count against the workers
            self._running = max(0, self._running - 1)
        if not work.cancelled() and isinstance(work.exception(), PassStopped):
            self.passes["stopped"] += 1
            log.info("asr.pass_stopped session=%s kind=%s after_ms=%.0f", job.session, job.kind.name.lower(),
                     (job.done - job.started) * 1000)
        if not job.answer.done():
            if work.cancelled():
                job.answer.cancel()
            elif (exc := work.exception()) is not None:
                job.answer.set_exception(exc)
            else:
                job.answer.set_result(work.result())
        self._dispatch()

    def _replace_stuck_pool(self, pool: ThreadPoolExecutor) -> None:
        """A transcription that overran its time limit may never return: give the other sessions a fresh
        worker pool instead of queueing them behind it (at most ``MAX_ABANDONED_POOLS`` left behind)."""
        if pool is not self._pool or self._abandoned >= MAX_ABANDONED_POOLS:
            return
        self._abandoned += 1
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="asr")
        self._running = 0
        pool.shutdown(wait=False, cancel_futures=True)
        log.warning("asr.pool_replaced abandoned=%d", self._abandoned)
        self._dispatch()


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    """``fn(*args)`` on ``loop`` from a worker thread; nothing when the loop is gone (shutdown)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
