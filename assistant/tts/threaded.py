"""The CPU engines' common part (Piper, Kokoro): blocking synthesis streamed to async callers, the chunks an
engine makes in a worker thread handed over a small bounded queue as each is made, with a stop flag the worker
checks between chunks (:class:`ThreadedSynthesis`); and what such an engine does around it, the same for each:
its checks, stats, warm-up and close (:class:`ThreadedEngine`), its ONNX session on a few threads.

Why a thread and not the event loop: a sentence takes tens to hundreds of ms of CPU; the loop must keep pacing
outgoing audio for every other session meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import SPEED_RANGE, PieceByPiece, TTSCapabilities, TTSRequest, TTSUnsupported
from assistant.tts.phrase_cache import PhraseCache

log = logging.getLogger(__name__)

QUEUE_CHUNKS = 3      # chunks made ahead of the consumer; bounds memory and wasted work on cancel
PUT_WAIT_S = 0.5      # how often a blocked worker re-checks its stop flag (only while the queue is full)
# The niceness of the threads that make audio ahead of playout (a reply's later pieces): with several calls on few
# cores, a reply's first piece, which a caller is waiting for, gets the CPU first (Linux CFS: nice 10 weighs
# ~1/10 of nice 0); the ahead threads still use every idle core. Raising a thread's niceness needs no privilege.
AHEAD_NICE = 10

_DONE = object()

# Makes one request's chunks in the worker thread; it may check the event between chunks and stop early.
MakeChunks = Callable[[threading.Event], Iterator[np.ndarray]]


def lower_priority(nice: int = AHEAD_NICE) -> None:
    """Make the calling thread yield the CPU to normal threads (its own niceness; Linux: per thread). Where the
    platform has no per-thread niceness this does nothing: the work is the same, only its order on a busy CPU."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError) as exc:  # pragma: no cover - not Linux, or refused
        log.debug("tts.nice_unavailable error=%s", type(exc).__name__)


class ThreadedSynthesis:
    """Worker threads for one engine (``workers`` at once) and the hand-over of their chunks: requests someone is
    waiting for on normal threads, requests made ``ahead`` of playout on threads of lower priority."""

    def __init__(self, engine: str, workers: int, sample_rate: int) -> None:
        self.engine = engine
        self.sample_rate = sample_rate
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                               thread_name_prefix=engine)
        self._ahead = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers),
                                                            thread_name_prefix=f"{engine}-ahead",
                                                            initializer=lower_priority)
        self._ids = itertools.count(1)
        self._active: dict[int, threading.Event] = {}
        self.chunks_made = 0  # for tests and metrics: chunks synthesized since start

    @property
    def active(self) -> int:
        """Syntheses whose worker is still running."""
        return len(self._active)

    async def stream(self, make: MakeChunks, what: str, ahead: bool = False) -> AsyncGenerator[np.ndarray, None]:
        """Yield ``make``'s chunks as the worker makes them (``ahead``: on a low-priority worker); stop the worker
        when the consumer stops."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        stop = threading.Event()
        rid = next(self._ids)
        self._active[rid] = stop
        t0 = time.monotonic()
        log.info("tts.start engine=%s id=%d %s ahead=%s", self.engine, rid, what, ahead)

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

        job = (self._ahead if ahead else self._executor).submit(work)
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
        self._ahead.shutdown(wait=False, cancel_futures=True)


def onnx_session(model: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session on ``threads`` threads (a package's own loader would take every core, which
    starves the other sessions' work)."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(model), sess_options=opts, providers=["CPUExecutionProvider"])


class ThreadedEngine(PieceByPiece):
    """A TTS engine whose requests run in :class:`ThreadedSynthesis` workers, one chunk per sentence. A subclass
    sets ``name``, ``label`` (its name in messages), ``sample_rate``, ``cfg``, ``capabilities``, ``voice_name``,
    ``voices`` (the names a request may give) and ``_threads``, and makes a request's chunks in :meth:`_make`."""

    name: str
    label: str
    sample_rate: int
    cfg: TTSConfig
    capabilities: TTSCapabilities
    voice_name: str
    voices: tuple[str, ...]
    warmup_text = "Hello."
    _threads: ThreadedSynthesis

    @property
    def active(self) -> int:
        """Syntheses whose worker is still running."""
        return self._threads.active

    @property
    def sentences_made(self) -> int:
        """Sentences synthesized since start (tests, replica stats)."""
        return self._threads.chunks_made

    def check(self, request: TTSRequest) -> None:
        """Refuse what the engine cannot do, naming the option (before any work starts)."""
        if request.reference is not None:
            raise TTSUnsupported(f"{self.label} cannot clone a voice: the 'reference' (speaker_wav) option is "
                                 "unsupported")
        if request.instruct:
            raise TTSUnsupported(f"{self.label} does not take instructions: the 'instruct' option is unsupported")
        if request.language and request.language not in self.capabilities.languages:
            raise TTSUnsupported(f"language {request.language!r} is unsupported by the {self.label} voice "
                                 f"{self.voice_name} (supports: {', '.join(self.capabilities.languages)})")
        if request.voice not in (None, "", "default", *self.voices):
            raise TTSUnsupported(f"voice {request.voice!r} is unknown to {self.label} (has: {', '.join(self.voices)})")
        if not SPEED_RANGE[0] <= request.speed <= SPEED_RANGE[1]:
            raise ValueError(f"speed must be within {SPEED_RANGE[0]}–{SPEED_RANGE[1]}, got {request.speed}")
        if len(request.text) > self.cfg.max_text_chars:
            raise ValueError(f"text too long: {len(request.text)} characters (limit {self.cfg.max_text_chars})")

    def _make(self, text: str, request: TTSRequest) -> MakeChunks:
        """What the worker runs for ``text`` (stripped, not empty) with ``request``'s voice and speed."""
        raise NotImplementedError

    @functools.cached_property
    def phrases(self) -> PhraseCache:
        """The audio of short reply pieces already spoken (``tts.phrase_cache_mb``; tts/phrase_cache.py)."""
        return PhraseCache(self.cfg.phrase_cache_mb << 20, self.cfg.phrase_cache_chars)

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """Yield one float32 chunk per sentence as soon as it is made (or, for a short reply piece made before,
        at once from the phrase cache); stop the worker if abandoned."""
        self.check(request)
        text = request.text.strip()
        if not text:
            return
        key = self.phrases.key(text, request)
        cached = self.phrases.get(key) if key is not None else None
        if cached is not None:
            log.info("tts.phrase_cached engine=%s chars=%d audio_s=%.2f", self.name, len(text),
                     sum(len(c) for c in cached) / self.sample_rate)
            for chunk in cached:
                yield chunk.copy()  # the consumer's to change; the kept audio stays as made
            return
        chunks = self._threads.stream(self._make(text, request), f"chars={len(text)} speed={request.speed:.2f}",
                                      ahead=request.ahead)
        made: list[np.ndarray] | None = [] if key is not None else None
        try:
            async for chunk in chunks:
                if made is not None:
                    made.append(chunk.copy())  # the cache's own copy: the consumer may change its chunk
                yield chunk
        finally:
            await chunks.aclose()  # the worker stops now, not when the generator is collected
        if key is not None and made:  # made to its end (a stopped synthesis leaves by the finally, keeping none)
            self.phrases.put(key, made)

    async def warmup(self) -> None:
        """Speak a short phrase once, so the first real request pays no ONNX or G2P start-up cost."""
        t0 = time.monotonic()
        async for _ in self.synthesize(TTSRequest(text=self.warmup_text)):
            pass
        log.info("tts.warmup engine=%s ms=%.0f", self.name, (time.monotonic() - t0) * 1000)

    async def close(self) -> None:
        """Stop running syntheses after their current sentence and release the worker threads."""
        self._threads.close()
