"""Blocking synthesis streamed to async callers: the chunks an engine makes in a worker thread, handed over a
small bounded queue as each is made, with a stop flag the worker checks between chunks.

Why a thread and not the event loop: a sentence takes tens to hundreds of ms of CPU; the loop must keep pacing
outgoing audio for every other session meanwhile. Used by the CPU engines (Piper, Kokoro).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

QUEUE_CHUNKS = 3      # chunks made ahead of the consumer; bounds memory and wasted work on cancel
PUT_WAIT_S = 0.5      # how often a blocked worker re-checks its stop flag (only while the queue is full)

_DONE = object()

# Makes one request's chunks in the worker thread; it may check the event between chunks and stop early.
MakeChunks = Callable[[threading.Event], Iterator[np.ndarray]]


class ThreadedSynthesis:
    """Worker threads for one engine (``workers`` at once) and the hand-over of their chunks."""

    def __init__(self, engine: str, workers: int, sample_rate: int) -> None:
        self.engine = engine
        self.sample_rate = sample_rate
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                               thread_name_prefix=engine)
        self._ids = itertools.count(1)
        self._active: dict[int, threading.Event] = {}
        self.chunks_made = 0  # for tests and metrics: chunks synthesized since start

    @property
    def active(self) -> int:
        """Syntheses whose worker is still running."""
        return len(self._active)

    async def stream(self, make: MakeChunks, what: str) -> AsyncGenerator[np.ndarray, None]:
        """Yield ``make``'s chunks as the worker makes them; stop the worker when the consumer stops."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        stop = threading.Event()
        rid = next(self._ids)
        self._active[rid] = stop
        t0 = time.monotonic()
        log.info("tts.start engine=%s id=%d %s", self.engine, rid, what)

        def put(item: Any) -> bool:
            """From the worker: hand ``item`` to the loop, waiting for room; False once stopped."""
            try:
                fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            except RuntimeError:  # the event loop is gone
                return False
            while True:
                try:
                    fut.result(timeout=PUT_WAIT_S)
                    return True
                except concurrent.futures.TimeoutError:
                    if stop.is_set():
                        fut.cancel()
                        return False
                except (concurrent.futures.CancelledError, RuntimeError):
                    return False

        def work() -> None:
            try:
                if stop.is_set():
                    return
                for chunk in make(stop):
                    self.chunks_made += 1
                    if stop.is_set() or not put(np.ascontiguousarray(chunk, dtype=np.float32)):
                        return
                    if stop.is_set():
                        return
                put(_DONE)
            except Exception as exc:  # handed to the consumer, which raises it in its own task
                log.warning("tts.error engine=%s id=%d kind=%s", self.engine, rid, type(exc).__name__)
                put(RuntimeError(f"{self.engine} synthesis failed: {type(exc).__name__}"))
            finally:
                self._active.pop(rid, None)

        job = self._executor.submit(work)
        chunks = samples = 0
        finished = False
        try:
            while True:
                item = await queue.get()  # the caller's speech path owns the time budget (tts.timeout_s)
                if item is _DONE:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    raise item
                if chunks == 0:
                    log.info("tts.first_chunk engine=%s id=%d ms=%.0f", self.engine, rid,
                             (time.monotonic() - t0) * 1000)
                chunks += 1
                samples += len(item)
                yield item
        finally:
            stop.set()
            job.cancel()  # not started yet (all workers busy): never runs
            while not queue.empty():  # wake a worker blocked on a full queue so it sees ``stop``
                queue.get_nowait()
            if not job.running():
                self._active.pop(rid, None)
            elapsed = time.monotonic() - t0
            audio_s = samples / self.sample_rate
            log.info("tts.%s engine=%s id=%d chunks=%d audio_s=%.2f ms=%.0f rtf=%.3f",
                     "done" if finished else "cancelled", self.engine, rid, chunks, audio_s, elapsed * 1000,
                     elapsed / audio_s if audio_s else 0.0)

    def close(self) -> None:
        """Stop running syntheses after their current chunk and release the worker threads."""
        for stop in list(self._active.values()):
            stop.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
