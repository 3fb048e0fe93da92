"""Text to speech: the engine protocol, text chunking, and the engines, chosen by name in ``[tts] engine``.

``piper`` is the CPU voice; ``cosyvoice2`` (GPU) is imported only when asked for, so the CPU stack never
loads torch. ``package.module:Class`` loads a plug-in engine constructed with the :class:`TTSConfig`.
"""

from __future__ import annotations

import importlib
import logging

from assistant.config import TTSConfig
from assistant.tts.base import TTSCapabilities, TTSEngine, TTSRequest, TTSUnsupported, with_streaming

log = logging.getLogger(__name__)

ENGINES = ("piper", "cosyvoice2")

__all__ = ["ENGINES", "TTSCapabilities", "TTSEngine", "TTSRequest", "TTSUnsupported", "create_tts"]


def create_tts(cfg: TTSConfig) -> TTSEngine:
    """Make the engine ``cfg.engine`` names; ``ValueError`` for an unknown name or a bad plug-in."""
    name = cfg.engine.strip()
    if name == "piper":
        from assistant.tts.piper_engine import PiperEngine

        return PiperEngine(cfg)
    if name == "cosyvoice2":
        from assistant.tts.cosyvoice.engine import CosyVoiceEngine

        return CosyVoiceEngine(cfg)
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"TTS plug-in {name!r} cannot be loaded: {exc}") from exc
        engine = cls(cfg)
        if not callable(getattr(engine, "synthesize", None)) or not hasattr(engine, "sample_rate"):
            raise ValueError(f"TTS plug-in {name!r} lacks synthesize() or sample_rate")
        log.info("tts.plugin_loaded spec=%s", name)
        return with_streaming(engine)
    raise ValueError(f"unknown TTS engine {name!r}: use one of {', '.join(ENGINES)} or 'package.module:Class'")
