"""ASR: the ``ASREngine`` protocol, engines chosen by name, and the async ``ASRRunner``."""

from __future__ import annotations

from assistant.asr.base import ASREngine, ASRModelMissing, Transcript
from assistant.config import ASRConfig
from assistant.loading import load_named

__all__ = ["ENGINES", "ASREngine", "ASRModelMissing", "Transcript", "create_asr"]

# Engine name (asr.engine) → its class, imported only when chosen. Add an engine here.
ENGINES = {"faster-whisper": "assistant.asr.whisper:FasterWhisperEngine"}


def create_asr(cfg: ASRConfig) -> ASREngine:
    """Build the engine named by ``cfg.engine`` (a built-in name or ``package.module:Class``)."""
    return load_named(cfg.engine, ENGINES, kind="ASR engine")(cfg)
