"""ASR: the ``ASREngine`` protocol, engines chosen by name, and the async ``ASRRunner``."""

from __future__ import annotations

from assistant import languages
from assistant.asr.base import ASREngine, ASRModelMissing, Transcript
from assistant.config import ASRConfig
from assistant.loading import load_named

__all__ = ["ENGINES", "ASREngine", "ASRModelMissing", "Transcript", "create_asr", "hearing"]

# Engine name (asr.engine) → its class, imported only when chosen. Add an engine here.
ENGINES = {"faster-whisper": "assistant.asr.whisper:FasterWhisperEngine"}


def hearing(cfg: ASRConfig, engine: object = None) -> tuple[tuple[str, ...], bool]:
    """(the languages a pass may be asked for, whether ``auto`` may be): the engine's own when it says, else
    what the config gives (an English-only model name hears ``en`` alone; otherwise ``asr.languages``, empty:
    every language)."""
    langs, detects = getattr(engine, "languages", None), getattr(engine, "detects", None)
    if isinstance(langs, tuple) and isinstance(detects, bool):
        return langs, detects
    from assistant.asr.whisper import BUNDLED_NAMES, hearable, model_name

    name = model_name(cfg)
    if name.endswith(".en") or name in BUNDLED_NAMES:
        return ("en",), False
    return hearable(cfg, tuple(languages.NAMES)), True  # as the engine would, knowing every language


def create_asr(cfg: ASRConfig) -> ASREngine:
    """Build the engine named by ``cfg.engine`` (a built-in name or ``package.module:Class``)."""
    return load_named(cfg.engine, ENGINES, kind="ASR engine")(cfg)
