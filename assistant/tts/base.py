"""The TTS protocol: a request in, an async stream of float32 PCM chunks at the engine's rate out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

LANGUAGES = ("zh", "en", "ja", "yue", "ko")


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
    streaming: bool = True


@dataclass
class VoicePrompt:
    """An engine's cached form of a voice (speaker embedding, prompt tokens, ...), opaque to callers."""

    voice_id: str
    data: dict = field(default_factory=dict)


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

    async def warmup(self) -> None:
        """Load and run once so the first request pays no load or JIT cost."""
        ...

    async def close(self) -> None:
        ...


class TTSUnsupported(ValueError):
    """The engine cannot honour an option (e.g. cloning on Piper); the message names it."""
