"""ASR: the ``ASREngine`` protocol, engines chosen by name, and the async ``ASRRunner``."""

from __future__ import annotations

from collections.abc import Callable

from assistant.asr.base import ASREngine, ASRModelMissing, Transcript
from assistant.config import ASRConfig

__all__ = ["ENGINES", "ASREngine", "ASRModelMissing", "Transcript", "create_asr"]


def _faster_whisper(cfg: ASRConfig) -> ASREngine:
    from assistant.asr.whisper import FasterWhisperEngine  # lazy: keeps CTranslate2 out until needed

    return FasterWhisperEngine(cfg)


# Engine name (asr.engine) → factory. Add an engine here.
ENGINES: dict[str, Callable[[ASRConfig], ASREngine]] = {
    "faster-whisper": _faster_whisper,
}


def create_asr(cfg: ASRConfig) -> ASREngine:
    """Build the engine named by ``cfg.engine``."""
    try:
        factory = ENGINES[cfg.engine]
    except KeyError:
        raise ValueError(
            f"unknown ASR engine {cfg.engine!r}; known engines: {', '.join(sorted(ENGINES))}"
        ) from None
    return factory(cfg)
