"""Stand-in engines and responders that fail on purpose: raise, hang, return NaN audio, close mid-stream.

Each one wraps or imitates a real component and misbehaves only for the turns a test asks it to, so a
fault can be switched per turn and per session while the rest of the stack stays real:

- ``FaultyResponder`` (plug-in: ``respond.engine = "tests.fault_engines:FaultyResponder"``) echoes like
  the echo responder unless the user's text contains a keyword of its ``faults`` table;
- ``RaisingResponder`` / ``HangingResponder`` fail on every turn;
- ``FaultyTTS(real_engine)`` goes into ``services.tts``; it fails for text containing a keyword of its
  ``faults`` table (the spoken apology carries no keyword, so it still works);
- ``FaultyASR(runner)`` wraps ``services.asr``; ``fail_next`` is a list of modes used by the next final
  transcriptions, one each;
- ``ToneTTS`` is a TTS engine that answers instantly (a sine tone): it produces audio far faster than
  real time, to check that nothing downstream of it grows without bound.

Modes: ``raise`` (an exception), ``hang`` (never answers; only a time limit ends it), ``nan`` (NaN audio),
``close`` (one good chunk, then the stream breaks), ``garbage`` (responder: deltas that are not text).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from assistant.asr.base import Transcript
from assistant.respond.base import Message
from assistant.tts.base import TTSBusy, TTSCapabilities, TTSRequest

HANG_S = 3600.0  # "forever" for a test: only a time limit or a cancel ends it


class InjectedFault(RuntimeError):
    """The failure a stand-in raises on purpose."""


def _mode_for(text: str, faults: dict[str, str]) -> str:
    low = text.lower()
    return next((mode for word, mode in faults.items() if word in low), "ok")


# --- responders --------------------------------------------------------------------------------------
class FaultyResponder:
    """Echo (``"You said: ..."``) unless the text holds a keyword of ``faults`` (keyword → mode)."""

    name = "faulty"
    default_mode = "ok"

    def __init__(self) -> None:
        self.faults: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []  # (text, mode) per turn

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[Any]:
        mode = _mode_for(text, self.faults) if self.faults else self.default_mode
        self.calls.append((text, mode))
        if mode == "raise":
            raise InjectedFault("responder exploded")
        if mode == "hang":
            await asyncio.sleep(HANG_S)
        if mode == "garbage":
            yield "You said "
            yield {"not": "text"}  # a responder bug: a delta that is not a string
            return
        for word in f"You said: {text}".split():
            yield word + " "
            if mode == "hang_after_first":
                await asyncio.sleep(HANG_S)


class DescribeFails(FaultyResponder):
    """Echoes; its ``describe()`` (read into a call's telemetry span) raises once ``broken`` is set, as a plug-in's
    whose backend went away might."""

    name = "describe-fails"

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def describe(self) -> dict[str, str]:
        if self.broken:
            raise InjectedFault("describe exploded")
        return {"engine": self.name, "model": "echo"}


class RaisingResponder(FaultyResponder):
    """Raises on every turn."""

    default_mode = "raise"


class HangingResponder(FaultyResponder):
    """Never yields anything: only ``respond.total_timeout_s`` ends the turn."""

    default_mode = "hang"


# --- TTS -----------------------------------------------------------------------------------------------
class FaultyTTS:
    """Wraps a real engine; text holding a keyword of ``faults`` (keyword → mode) makes it misbehave."""

    def __init__(self, inner: Any, faults: dict[str, str] | None = None) -> None:
        self.inner = inner
        self.faults: dict[str, str] = dict(faults or {})
        self.name = f"faulty-{inner.name}"
        self.sample_rate = inner.sample_rate
        self.capabilities: TTSCapabilities = inner.capabilities
        self.requests: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        mode = _mode_for(request.text, self.faults)
        self.requests.append((request.text, mode))
        if mode == "raise":
            raise InjectedFault("voice exploded")
        if mode == "busy":  # every slot taken (in-process, or every Ray replica full)
            raise TTSBusy("every synthesis place is taken")
        if mode == "hang":
            await asyncio.sleep(HANG_S)
        if mode == "nan":
            yield np.full(self.sample_rate // 10, np.nan, dtype=np.float32)
            return
        gen = self.inner.synthesize(request)
        try:
            async for chunk in gen:
                yield chunk
                if mode == "close":
                    raise ConnectionResetError("engine closed the stream mid-reply")
        finally:
            await gen.aclose()

    async def warmup(self) -> None:
        await self.inner.warmup()

    async def close(self) -> None:
        """The wrapped engine belongs to the test module; closing an app must not close it."""


class ToneTTS:
    """An instant engine: each request is ``chunks`` chunks of ``chunk_s`` seconds of a 220 Hz tone."""

    name = "tone"
    capabilities = TTSCapabilities()
    voices: tuple[str, ...] = ()

    def __init__(self, sample_rate: int = 22_050, chunk_s: float = 0.1, chunks: int = 3) -> None:
        self.sample_rate = sample_rate
        self.chunk_s = chunk_s
        self.chunks = chunks
        self.yielded_s = 0.0  # audio handed out so far, all requests together
        self.requests = 0
        t = np.arange(int(chunk_s * sample_rate)) / sample_rate
        self._chunk = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        self.requests += 1
        for _ in range(self.chunks):
            self.yielded_s += self.chunk_s
            yield self._chunk
            await asyncio.sleep(0)

    async def warmup(self) -> None:
        pass

    async def close(self) -> None:
        pass


class FloodResponder:
    """Yields ``sentences`` short sentences as fast as it is allowed to; counts what it handed out."""

    name = "flood"

    def __init__(self, sentences: int = 400) -> None:
        self.sentences = sentences
        self.yielded = 0

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        for i in range(self.sentences):
            self.yielded += 1
            yield f"This is sentence number {i}. "


# --- ASR -----------------------------------------------------------------------------------------------
class FaultyASR:
    """Wraps the ``ASRRunner``; ``fail_next`` modes apply to the next *final* transcriptions, one each:
    ``raise``, or ``hang`` (``hang_s``, beyond ``asr.timeout_s``). Partial hypotheses pass through."""

    def __init__(self, runner: Any, hang_s: float = HANG_S) -> None:
        self.runner = runner
        self.fail_next: list[str] = []
        self.hang_s = hang_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    async def transcribe(self, audio: np.ndarray, **kw: Any) -> Transcript:
        mode = self.fail_next.pop(0) if self.fail_next else "ok"
        if mode == "raise":
            raise InjectedFault("asr exploded")
        if mode == "hang":
            async with asyncio.timeout(self.runner.cfg.timeout_s):  # what ASRRunner does to a stuck engine
                await asyncio.sleep(self.hang_s)
        return await self.runner.transcribe(audio, **kw)


class CrashAtWarmup:
    """A responder plug-in whose warm-up crashes its process for real: a read of address 0 (SIGSEGV), as a native
    engine's bug would. Hosted in a child process (``respond.backend = "process"``), it never gets ready."""

    name = "crash-at-warmup"

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    async def warmup(self) -> None:
        import ctypes

        ctypes.string_at(0)  # SIGSEGV

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        yield text


class SlowLoadThenCrash:
    """A hosted engine (``engine_host``) that loads for ``load_s`` seconds, then crashes its process for real (a read
    of address 0: SIGSEGV) on its first call, as a big model that loads slowly and dies on its first turn would."""

    CALLS = ("crash",)
    STREAMS = ()

    def __init__(self, config: dict[str, Any]) -> None:
        self.load_s = float(config.get("load_s", 1.0))

    async def start(self) -> dict[str, Any]:
        await asyncio.sleep(self.load_s)
        return {"engine": "slow-load-then-crash"}

    def crash(self) -> None:
        import ctypes

        ctypes.string_at(0)


def slow_load_then_crash(config: dict[str, Any]) -> SlowLoadThenCrash:
    """``SlowLoadThenCrash``'s factory, as ``EngineProcess`` names one."""
    return SlowLoadThenCrash(config)


class Smuggler:
    """A hosted engine gone bad, as a model file that exploits a native bug could make one: its answer carries code
    for the server to run as it reads it, and it reports what it sees of the server's environment."""

    CALLS = ("smuggle", "environment")
    STREAMS = ()

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start(self) -> dict[str, Any]:
        return {"engine": "smuggler"}

    def smuggle(self, marker: str) -> Any:
        return _RunsWhenRead(marker)

    def environment(self) -> dict[str, str]:
        import os

        return dict(os.environ)


class _RunsWhenRead:
    """Unpickled, it runs a shell command (touches ``marker``): what ``pickle.loads`` of a hostile frame does."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def smuggler(config: dict[str, Any]) -> Smuggler:
    """``Smuggler``'s factory."""
    return Smuggler(config)


class IllegalInstruction:
    """A hosted engine whose load runs an instruction the CPU refuses (x86 ``ud2``, from an executable page): a real
    SIGILL, as a native library compiled for another CPU (``-march=native`` on a machine with AVX-512) dies."""

    CALLS = ()
    STREAMS = ()

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start(self) -> dict[str, Any]:
        import ctypes
        import mmap

        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(b"\x0f\x0b")  # ud2
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        ctypes.CFUNCTYPE(None)(address)()
        return {}


def illegal_instruction(config: dict[str, Any]) -> IllegalInstruction:
    """``IllegalInstruction``'s factory."""
    return IllegalInstruction(config)
