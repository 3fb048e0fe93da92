"""The TTS protocol: a request in, an async stream of float32 PCM chunks at the engine's rate out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

LANGUAGES = ("zh", "en", "ja", "yue", "ko")
# The one speed range: what any route may ask for (OpenAI's speech API allows the same 0.25–4.0). Engines
# with native speed take all of it; the service time-stretches for engines without.
SPEED_RANGE = (0.25, 4.0)


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
    speed: float = 1.0                  # within SPEED_RANGE, engine-native where the engine supports it
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
    # The names a request's ``vocoder`` may give for the vocoder this engine has (first: its own name).
    vocoders: tuple[str, ...] = ()


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


class TTSUnsupported(ValueError):
    """The engine cannot honour an option (e.g. cloning on Piper); the message names it."""
