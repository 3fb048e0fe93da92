"""``asr.backend = "process"``: the ASR engine (CTranslate2's faster-whisper, native code) in a supervised child
process, so a crash in it costs one turn's transcript, not every call.

:class:`ChildASREngine` is an :class:`~assistant.asr.base.ASREngine` (blocking ``transcribe``), so the
:class:`~assistant.asr.runner.ASRRunner` schedules its passes exactly as for an engine in process; each pass is one
call over the socket pair (``engine_host/``). A pass the child dies under fails (the turn's ``error`` event, stage
``asr``, and the apology); the child restarts at once and warms up; a pass asked meanwhile waits for it (within
the runner's ``asr.timeout_s``). The child runs each pass on a thread, so it answers the watchdog's pings while
it transcribes; a pass running longer than twice ``asr.timeout_s`` (at least 30 s) counts as a hang and the child
is killed and restarted.

What crossing the boundary costs by itself (``python -m lab isolation``): well under a millisecond for a turn's
audio, against hundreds of milliseconds for the pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from assistant.asr.base import PassTiming, Transcript
from assistant.config import ASRConfig
from assistant.engine_host.supervisor import EngineDied, EngineProcess, EngineUnavailable, Health, RemoteError

log = logging.getLogger(__name__)

FACTORY = "assistant.asr.hosted:serve_asr"
MIN_HANG_S = 30.0


class ASRService:
    """The ASR engine as the child serves it."""

    CALLS = ("transcribe",)
    STREAMS = ()

    def __init__(self, config: dict[str, Any]) -> None:
        from assistant.asr import create_asr, hearing

        self.cfg = ASRConfig(**{**config, "backend": "local"})
        self.engine = create_asr(self.cfg)
        self.languages, self.detects = hearing(self.cfg, self.engine)
        self._lock = threading.Lock()
        self.running = 0
        self.done = 0

    async def start(self) -> dict[str, Any]:
        await asyncio.to_thread(self.engine.warmup)
        return {"engine": self.engine.name, "languages": self.languages, "detects": self.detects}

    def transcribe(self, audio: np.ndarray, language: str | None, prompt: str | None) -> Transcript:
        with self._lock:
            self.running += 1
        try:
            return self.engine.transcribe(audio, language=language, prompt=prompt)
        finally:
            with self._lock:
                self.running -= 1
                self.done += 1

    def progress(self) -> tuple[bool, int]:
        """(a pass is running, passes done): a pass that runs past the watchdog's limit is a hang."""
        return self.running > 0, self.done


def serve_asr(config: dict[str, Any]) -> ASRService:
    """The child's factory (``FACTORY``)."""
    return ASRService(config)


class ChildASREngine:
    """The configured ASR engine in its supervised child process, with an engine's blocking face."""

    def __init__(self, cfg: ASRConfig, on_change: Callable[[Health], None] | None = None,
                 restart_wait_s: float = 10.0) -> None:
        self.cfg = cfg
        self.name = cfg.engine
        self.languages: tuple[str, ...] = ()
        self.detects = False
        self.restart_wait_s = restart_wait_s
        self.host = EngineProcess("asr", FACTORY, dataclasses.asdict(cfg),
                                  hang_timeout_s=max(MIN_HANG_S, 2 * cfg.timeout_s), on_change=on_change,
                                  wire_types=(Transcript, PassTiming))
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Start the child: loaded and warmed up, or failed for good (then every pass fails, saying why)."""
        self._loop = asyncio.get_running_loop()
        await self.host.start()
        info = self.host.info or {}
        self.name = f"{info.get('engine', self.cfg.engine)}"
        self.languages = tuple(info.get("languages", ()))
        self.detects = bool(info.get("detects", False))

    def warmup(self) -> None:
        """The child warms up before it says ready (:meth:`start`)."""

    def transcribe(self, audio: np.ndarray, *, language: str | None = None,
                   prompt: str | None = None) -> Transcript:
        """One pass in the child (blocking: the runner calls it on its worker thread)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the ASR child process is not started")
        t0 = time.perf_counter()
        result: Transcript = asyncio.run_coroutine_threadsafe(self._pass(audio, language, prompt), loop).result()
        log.debug("asr.child_pass ms=%.0f", (time.perf_counter() - t0) * 1000)
        return result

    async def _pass(self, audio: np.ndarray, language: str | None, prompt: str | None) -> Transcript:
        if not await self.host.wait_ready(self.restart_wait_s):
            health = self.host.health
            raise RuntimeError(f"the ASR engine is {health.state}: {health.reason}")
        try:
            result = await self.host.call("transcribe", np.ascontiguousarray(audio, dtype=np.float32), language,
                                          prompt)
        except (EngineDied, EngineUnavailable) as exc:
            log.warning("asr.engine_died reason=%s", exc)
            raise RuntimeError(f"the ASR engine stopped: {exc}") from exc
        except RemoteError as exc:
            raise RuntimeError(f"the ASR engine failed: {exc.kind}: {exc}") from exc
        if not isinstance(result, Transcript):
            raise RuntimeError(f"the ASR child answered {type(result).__name__}, not a transcript")
        return result

    async def aclose(self) -> None:
        await self.host.close()
