"""``ASRRunner``: the async face of a blocking ``ASREngine`` (a ``Transcriber``), shared by every session.

One ``ThreadPoolExecutor(max_workers=asr.workers)`` runs all transcriptions, so ASR never blocks the event
loop and the number of transcriptions at once is bounded for the whole process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from assistant.asr.base import ASREngine, PassKind, PassTiming, Transcript
from assistant.config import ASRConfig

log = logging.getLogger(__name__)


# A stuck engine call strands one worker pool; past this many the runner stops replacing them (each holds
# a thread and the memory of its call) and the timeout error is all that is left.
MAX_ABANDONED_POOLS = 4


class ASRRunner:
    """Runs ``engine.transcribe`` on a shared worker pool with a timeout (``asr.timeout_s``)."""

    def __init__(self, engine: ASREngine, cfg: ASRConfig | None = None) -> None:
        self.engine = engine
        self.cfg = cfg or ASRConfig()
        self.workers = max(1, self.cfg.workers)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="asr")
        self._in_flight = 0
        self._abandoned = 0  # pools left behind a stuck transcription

    @property
    def busy(self) -> bool:
        """True when every worker is taken (a new job would wait in the pool's queue)."""
        return self._in_flight >= self.workers

    async def _run(self, fn: functools.partial[object]) -> object:
        loop = asyncio.get_running_loop()
        pool = self._pool
        fut = loop.run_in_executor(pool, fn)
        self._in_flight += 1
        fut.add_done_callback(lambda _: self._release())
        try:
            # shield: on timeout/cancel the thread keeps running (threads cannot be stopped) and still
            # frees its worker slot when it finishes; only our wait ends.
            return await asyncio.wait_for(asyncio.shield(fut), self.cfg.timeout_s)
        except TimeoutError:
            log.error("asr.timeout timeout_s=%.1f", self.cfg.timeout_s)
            self._replace_stuck_pool(pool)
            raise

    def _replace_stuck_pool(self, pool: ThreadPoolExecutor) -> None:
        """A transcription that overran its time limit may never return: give the other sessions a fresh
        worker pool instead of queueing them behind it (at most ``MAX_ABANDONED_POOLS`` left behind)."""
        if pool is not self._pool or self._abandoned >= MAX_ABANDONED_POOLS:
            return
        self._abandoned += 1
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="asr")
        self._in_flight = 0
        pool.shutdown(wait=False, cancel_futures=True)
        log.warning("asr.pool_replaced abandoned=%d", self._abandoned)

    def _release(self) -> None:
        self._in_flight = max(0, self._in_flight - 1)

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
        asked = time.time()
        started: list[float] = []

        def run() -> Transcript:
            started.append(time.time())
            return self.engine.transcribe(audio, language=language, prompt=prompt)

        result = await self._run(functools.partial(run))
        assert isinstance(result, Transcript)
        return dataclasses.replace(result, timing=PassTiming(asked, started[0] if started else asked, time.time()))

    async def transcribe_partial(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None, session: str = ""
    ) -> Transcript | None:
        """A partial hypothesis while the user speaks; None (skipped) when all workers are busy, so
        partials never queue up in front of a final transcript."""
        if self.busy:
            return None
        return await self.transcribe(audio, language=language, prompt=prompt, session=session, kind=PassKind.PARTIAL)

    async def warmup(self) -> None:
        await self._run(functools.partial(self.engine.warmup))

    def close(self) -> None:
        """Stop accepting work; queued jobs are cancelled, a running one finishes in its thread."""
        self._pool.shutdown(wait=False, cancel_futures=True)
