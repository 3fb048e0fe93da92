"""A voice per language: which engine and voice speak a reply in the language it is in (``tts.voices``).

``tts.voices`` maps a language to ``ENGINE`` or ``ENGINE:VOICE``. :class:`LanguageRouter` is a TTS engine made of
the configured one (``tts.engine``, "the main engine") and the engines those entries name, and sends each
request to the engine for its ``language``:

- a language in the map goes to its entry: the main engine when the entry names it (with the entry's voice, or
  the session's when the entry has none), else that engine, loaded once per ``ENGINE:VOICE``;
- any other language goes to the main engine if it speaks it, in the session's voice;
- a language nobody speaks goes to the main engine without a language: its default voice reads the text as
  best it can (never silence, never an error mid-call); :func:`choose_voice` says so (``fallback``), and the
  conversation tells the page with a ``voice_fallback`` event.

Every engine's audio leaves at the main engine's rate (a routed engine's is resampled on the way), so the
speech path and the TTS API see one engine. Engines are imported only when named: the CPU stack (Piper,
Kokoro) never loads torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import TTSEngine, TTSRequest, with_streaming

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VoiceChoice:
    """Who speaks a reply: the engine's name, its voice (None: its default), the language it is told (None:
    none), and whether this is the fallback (no voice for the reply's language)."""

    engine: str
    voice: str | None
    language: str | None
    fallback: bool = False


def parse_voice(spec: str) -> tuple[str, str | None]:
    """``"piper:zh_CN-huayan-medium"`` → ``("piper", "zh_CN-huayan-medium")``; ``"kokoro"`` → ``("kokoro", None)``."""
    engine, _, voice = spec.strip().partition(":")
    return engine.strip(), voice.strip() or None


def speaks(engine: Any, language: str) -> bool:
    return language in getattr(getattr(engine, "capabilities", None), "languages", ())


def choose_voice(engine: TTSEngine, language: str | None, voice: str | None) -> VoiceChoice:
    """Who speaks a reply in ``language`` with the session's ``voice`` on ``engine`` (a router or one engine)."""
    route = getattr(engine, "route", None)
    if callable(route):
        choice: VoiceChoice = route(language, voice)[1]
        return choice
    if language is None or speaks(engine, language):
        return VoiceChoice(engine.name, voice, language)
    return VoiceChoice(engine.name, voice, None, fallback=True)


class LanguageRouter:
    """The main engine and the engines of ``tts.voices``, as one engine (module docstring)."""

    def __init__(self, main: TTSEngine, routes: dict[str, tuple[TTSEngine, str | None]]) -> None:
        self.main = with_streaming(main)
        self.routes = {lang: (with_streaming(e), voice) for lang, (e, voice) in routes.items()}
        self.name = main.name
        self.sample_rate = main.sample_rate
        langs = (*main.capabilities.languages, *routes)
        self.capabilities = dataclasses.replace(main.capabilities, languages=tuple(dict.fromkeys(langs)))
        self.piece_by_piece = speaks_piece_by_piece(main)

    def __getattr__(self, name: str) -> Any:  # the main engine's voices, stats, cloning (VoiceCloner)
        if name == "main":
            raise AttributeError(name)
        return getattr(self.main, name)

    @property
    def engines(self) -> list[TTSEngine]:
        """Each engine once: the main one first."""
        out: dict[int, TTSEngine] = {id(self.main): self.main}
        for engine, _ in self.routes.values():
            out.setdefault(id(engine), engine)
        return list(out.values())

    def route(self, language: str | None, voice: str | None) -> tuple[TTSEngine, VoiceChoice]:
        """The engine for a request in ``language`` with the session's ``voice``, and the choice."""
        if language in self.routes:
            engine, own = self.routes[language]
            if engine is self.main:
                return engine, VoiceChoice(self.name, own or voice, language)
            return engine, VoiceChoice(engine.name, own, language)
        if language is None or speaks(self.main, language):
            return self.main, VoiceChoice(self.name, voice, language)
        return self.main, VoiceChoice(self.name, voice, None, fallback=True)

    def _routed(self, request: TTSRequest) -> tuple[TTSEngine, TTSRequest]:
        if request.reference is not None:  # an ad-hoc clone: only the main engine can (or says it cannot)
            return self.main, request
        engine, choice = self.route(request.language, request.voice)
        return engine, dataclasses.replace(request, voice=choice.voice, language=choice.language)

    def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        engine, routed = self._routed(request)
        return self._at_main_rate(engine, lambda: engine.synthesize(routed))

    def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        engine, routed = self._routed(request)
        return self._at_main_rate(engine, lambda: engine.synthesize_stream(pieces, routed))

    async def _at_main_rate(self, engine: TTSEngine,
                            make: Callable[[], AsyncIterator[np.ndarray]]) -> AsyncIterator[np.ndarray]:
        chunks = make()
        resampler = None
        if engine.sample_rate != self.sample_rate:
            import soxr  # lazy, as in the speech path

            resampler = soxr.ResampleStream(engine.sample_rate, self.sample_rate, 1, dtype="float32", quality="HQ")
        try:
            async for chunk in chunks:
                x = np.asarray(chunk, dtype=np.float32).reshape(-1)
                if resampler is not None:
                    x = resampler.resample_chunk(x)
                if x.size:
                    yield x
            if resampler is not None:
                tail = resampler.resample_chunk(np.zeros(0, np.float32), last=True)
                if tail.size:
                    yield tail
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def warmup(self) -> None:
        for engine in self.engines:
            await engine.warmup()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.close()


def speaks_piece_by_piece(engine: Any) -> bool:
    """The engine speaks a piece only once it has all of it (Piper, Kokoro): the reply's first piece should be
    short. A router answers for its main engine."""
    from assistant.tts.base import PieceByPiece

    flag = getattr(engine, "piece_by_piece", None)
    return flag if isinstance(flag, bool) else isinstance(with_streaming(engine), PieceByPiece)


def build_router(cfg: TTSConfig, main: TTSEngine, load: Callable[[TTSConfig], TTSEngine]) -> TTSEngine:
    """``main`` alone when ``tts.voices`` routes nothing away from it, else a :class:`LanguageRouter`; ``load``
    makes an engine from a config (``tts.create_tts``'s loader)."""
    if not cfg.voices:
        return main
    loaded: dict[tuple[str, str | None], TTSEngine] = {}
    routes: dict[str, tuple[TTSEngine, str | None]] = {}
    cloner = callable(getattr(main, "add_voice", None))
    for language, spec in cfg.voices.items():
        name, voice = parse_voice(spec)
        if name == cfg.engine.strip() and (voice is None or cloner):
            routes[language] = (main, voice)  # the main engine in the entry's voice (a cloner keeps many)
            continue
        key = (name, voice)
        if key not in loaded:
            loaded[key] = load(dataclasses.replace(cfg, engine=name, voice=voice or "", voices={}))
            log.info("tts.voice_route engine=%s voice=%s", name, voice or "default")
        engine = loaded[key]
        if not speaks(engine, language):
            raise ValueError(f"tts.voices: {spec!r} cannot speak {language!r} (it speaks "
                             f"{', '.join(engine.capabilities.languages)})")
        routes[language] = (engine, None)
    log.info("tts.voices %s", " ".join(f"{lang}={spec}" for lang, spec in cfg.voices.items()))
    return LanguageRouter(main, routes)
