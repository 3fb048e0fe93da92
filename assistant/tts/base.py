"""The TTS protocol: a request in, an async stream of float32 PCM chunks at the engine's rate out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

LANGUAGES = ("zh", "en", "ja", "yue", "ko")
SPEED_RANGE = (0.5, 2.0)  # what an engine is asked for; the TTS service stretches beyond it with DSP
# What a request may ask for on any route (OpenAI's speech API allows the same): within SPEED_RANGE the
# engine speeds up natively where it can, beyond it the service time-stretches the rest.
STRETCH_RANGE = (0.25, 4.0)
# A reply's later piece is made below the first pieces other callers wait for (``TTSRequest.ahead``) only while
# this much of the audio before it is still to be played: four sessions on two cores starved a 39-letter Piper
# piece at nice 10 for 1.8 s behind a 0.8 s "I'm sorry," (alone: ~0.24 s), and the caller heard the reply stop.
# 1.5 s covers a long piece's synthesis on a busy CPU at normal priority.
AHEAD_BUFFER_S = 1.5


@dataclass(frozen=True)
class ReferenceClip:
    """A voice to clone: mono float32 audio, its rate, and (optionally) what it says."""

    audio: np.ndarray
    sample_rate: int
    text: str = ""


@dataclass(frozen=True)
class TTSRequest:
    text: str
    voice: str | None = None            # a registered voice id, or None for the engine's default
    reference: ReferenceClip | None = None  # an ad-hoc voice (cloning) instead of ``voice``
    language: str | None = None         # a language code (assistant/languages.py): en, zh, ja, yue, ko, ...
    instruct: str | None = None         # instruction / emotion prompt
    speed: float = 1.0                  # within SPEED_RANGE, engine-native where the engine supports it
    pitch: float = 0.0                  # semitones; only engines with ``native_pitch`` take it here
    seed: int | None = None
    session: str = ""                   # the call it is for ("" outside one): a remote engine joins its trace
    ahead: bool = False                 # made ahead of playout (a reply's later piece, its listener has audio queued):
                                        # a CPU engine runs it below a first piece someone is waiting for
    reuse_audio: bool = False           # may be answered with the audio of the same short piece made before, and
                                        # fill it (a conversation's reply; CPU voices: tts/phrase_cache.py)


@dataclass(frozen=True)
class TTSCapabilities:
    """What an engine honours itself; the service does the rest (or refuses with a reason)."""

    voice_cloning: bool = False
    instruct: bool = False
    native_speed: bool = False
    native_pitch: bool = False
    languages: tuple[str, ...] = ("en",)
    # The names a request's ``vocoder`` may give for the vocoder this engine has (first: its own name).
    vocoders: tuple[str, ...] = ()


@runtime_checkable
class TTSEngine(Protocol):
    name: str
    sample_rate: int
    capabilities: TTSCapabilities

    def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """Yield mono float32 chunks (−1…1) at ``sample_rate`` as soon as each exists.

        Cancelling the iteration (``aclose`` / task cancel) must stop the work promptly.
        """
        ...

    def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """Speak one utterance whose text arrives in pieces (already chunked: each piece is spoken as it is).

        ``request`` carries everything but the text. The first piece is spoken as soon as it arrives; an
        engine may prepare later pieces while earlier ones play. Same cancellation rule as ``synthesize``.
        """
        ...

    async def warmup(self) -> None:
        """Load and run once so the first request pays no load or JIT cost."""
        ...

    async def close(self) -> None:
        ...


@runtime_checkable
class VoiceCloner(Protocol):
    """An engine that speaks in registered voices: it prepares a voice once and can keep, reload and drop it.

    ``add_voice`` returns the prepared form; if that has ``save(path)``, the service stores it next to the
    voice's clip and after a restart hands the file to ``load_voice`` instead of recomputing it.
    """

    async def add_voice(self, voice_id: str, clip: ReferenceClip) -> object:
        ...

    async def load_voice(self, voice_id: str, path: Path) -> object:
        ...

    def forget_voice(self, voice_id: str) -> None:
        ...


class TTSBusy(RuntimeError):
    """Every synthesis place is taken (slots and waiting room, here or on every replica); retry shortly."""


class TTSUnsupported(ValueError):
    """The engine cannot honour an option (e.g. cloning on Piper); the message names it."""


class PieceByPiece:
    """``synthesize_stream`` for an engine that speaks one whole text per request (Piper, plug-ins).

    Each piece is one ``synthesize`` call, made when the piece arrives. A later piece is made ``ahead`` of playout
    (below the first pieces other callers wait for) only while the audio made before it still covers
    ``AHEAD_BUFFER_S`` of playout; with less, a busy machine would starve it past the end of what plays, and the
    caller would hear the reply stop mid-way.
    """

    async def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        rate = int(getattr(self, "sample_rate", 0) or 0)
        first = True
        made_s = 0.0  # audio yielded so far
        started: float | None = None  # when its first chunk was (playout starts about then)
        async for piece in pieces:
            if first or request.ahead:
                ahead = request.ahead
            elif rate <= 0:  # an engine that names no rate: no clock for its audio, every later piece ahead
                ahead = True
            else:  # nothing heard yet (an earlier piece made no audio): this one is waited for
                to_play = made_s - (time.monotonic() - started) if started is not None else 0.0
                ahead = to_play >= AHEAD_BUFFER_S
            first = False
            chunks = self.synthesize(replace(request, text=piece, ahead=ahead))  # type: ignore[attr-defined]
            try:
                async for chunk in chunks:
                    if started is None:
                        started = time.monotonic()
                    made_s += len(chunk) / rate if rate > 0 else 0.0
                    yield chunk
            finally:
                await chunks.aclose()


class PieceByPieceAdapter(PieceByPiece):
    """Wraps a plug-in engine that has only ``synthesize``, so it serves the speech path too."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        return self._engine.synthesize(request)


def with_streaming(engine: Any) -> TTSEngine:
    """``engine`` itself if its class has ``synthesize_stream``, else wrapped so that it has (piece by piece).

    The class, not the instance: a proxy that forwards attributes to an inner engine (and changes
    ``synthesize``) must not hand out the inner engine's ``synthesize_stream``.
    """
    return engine if callable(getattr(type(engine), "synthesize_stream", None)) else PieceByPieceAdapter(engine)
