"""Text to speech: the engine protocol, text chunking, and the engines, chosen by name in ``[tts] engine``.

``piper`` is the CPU voice (English by default), ``kokoro`` the CPU's Japanese voice; ``cosyvoice2`` (GPU) is
imported only when asked for, so the CPU stack never loads torch. ``package.module:Class`` loads a plug-in
engine constructed with the :class:`TTSConfig`. ``tts.voices`` adds a voice per language (``routing.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from assistant.config import TTSConfig
from assistant.loading import load_named
from assistant.tts.base import TTSCapabilities, TTSEngine, TTSRequest, TTSUnsupported, with_streaming

log = logging.getLogger(__name__)

# Engine name (tts.engine) → its class, imported only when chosen. Add an engine here.
ENGINES = {
    "piper": "assistant.tts.piper_engine:PiperEngine",
    "cosyvoice2": "assistant.tts.cosyvoice.engine:CosyVoiceEngine",
    "kokoro": "assistant.tts.kokoro_engine:KokoroEngine",
}

__all__ = ["ENGINES", "TTSCapabilities", "TTSEngine", "TTSRequest", "TTSUnsupported", "create_tts"]


def create_tts(cfg: TTSConfig, reachable: Collection[str] = ()) -> TTSEngine:
    """Make the engine ``cfg.engine`` names, with the voices ``tts.voices`` adds per language (loaded now for the
    languages in ``reachable``, else on first use: ``routing.py``); ``ValueError`` for an unknown name or a bad
    plug-in."""
    from assistant.tts.routing import build_router

    return build_router(cfg, _create_one(cfg), _create_one, reachable)


def _create_one(cfg: TTSConfig) -> TTSEngine:
    engine = load_named(cfg.engine, ENGINES, kind="TTS engine")(cfg)
    if cfg.engine.strip() not in ENGINES:
        if not callable(getattr(engine, "synthesize", None)) or not hasattr(engine, "sample_rate"):
            raise ValueError(f"TTS plug-in {cfg.engine!r} lacks synthesize() or sample_rate")
        log.info("tts.plugin_loaded spec=%s", cfg.engine)
    return with_streaming(engine)
