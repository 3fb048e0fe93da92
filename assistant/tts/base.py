"""The TTS protocol: a request in, an async stream of float32 PCM chunks at the engine's rate out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

LANGUAGES = ("zh", "en", "ja", "yue", "ko")
SPEED_RANGE = (0.5, 2.0)  # what an engine is asked for; the TTS service stretches beyond it with DSP


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
    language: str | None = None         # zh / en / ja / yue / ko
    instruct: str | None = None         # instruction / emotion prompt
    speed: float = 1.0                  # 0.5–2.0, engine-native where the engine supports it
    pitch: float = 0.0                  # semitones; only engines with ``native_pitch`` take it here
    seed: int | None = None


@dataclass(frozen=True)
class TTSCapabilities:
    """What an engine honours itself; the service does the rest (or refuses with a reason)."""

    voice_cloning: bool = False
    instruct: bool = False
    native_speed: bool = False
    native_pitch: bool = False
    languages: tuple[str, ...] = ("en",)


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


class TTSUnsupported(ValueError):
    """The engine cannot honour an option (e.g. cloning on Piper); the message names it."""


class PieceByPiece:
    """``synthesize_stream`` for an engine that speaks one whole text per request (Piper, plug-ins).

    Each piece is one ``synthesize`` call, made when the piece arrives.
    """

    async def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        async for piece in pieces:
            chunks = self.synthesize(replace(request, text=piece))  # type: ignore[attr-defined]
            try:
                async for chunk in chunks:
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
