"""A voice per language: which engine and voice speak a reply in the language it is in (``tts.voices``).

``tts.voices`` maps a language to ``ENGINE`` or ``ENGINE:VOICE``. :class:`LanguageRouter` is a TTS engine made of
the configured one (``tts.engine``, "the main engine") and the engines those entries name, and sends each
request to the engine for its ``language``:

- a language in the map goes to its entry: the main engine when the entry names it (with the entry's voice, or
  the session's when the entry has none), else that engine (one per ``ENGINE:VOICE``);
- any other language goes to the main engine if it speaks it, in the session's voice;
- a language nobody speaks goes to the main engine without a language: its default voice reads the text as
  best it can (never silence, never an error mid-call); :func:`choose_voice` says so (``fallback``), and the
  conversation tells the page with a ``voice_fallback`` event.

An entry's engine is loaded at start only when a turn can be in one of its languages (the ASR hears it, or it is
``tts.language``): the default CPU config hears English alone, so its Japanese voice costs neither start time
nor memory. Any other is loaded on its first request (the TTS API's ``language``, a typed turn's script), once,
then kept; that request waits for the load (seconds), no other does.

Every engine's audio leaves at the main engine's rate (a routed engine's is resampled on the way), so the
speech path and the TTS API see one engine. Engines are imported only when named: the CPU stack (Piper,
Kokoro) never loads torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import PieceByPiece, TTSCapabilities, TTSEngine, TTSRequest, with_streaming

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


class RoutedVoice:
    """One engine of ``tts.voices`` (an ``ENGINE:VOICE``) and the languages it speaks here: loaded at start when a
    turn can reach one of them, else on the first request for one (once, under a lock: callers wait in threads,
    not on the event loop). A load that fails is not tried again: its languages fall back to the main engine."""

    def __init__(self, spec: str, languages: list[str], make: Callable[[], TTSEngine]) -> None:
        self.spec, self.languages = spec, languages
        self.name, self.voice = parse_voice(spec)
        self._make: Callable[[], TTSEngine] | None = make
        self._lock = threading.Lock()
        self.engine: TTSEngine | None = None
        self.error = ""  # why it could not be loaded (then it never is)

    def load(self) -> TTSEngine:
        """The engine, loaded now if it is not yet (blocking); ``RuntimeError`` if it cannot be."""
        with self._lock:
            if self.engine is None:
                if self._make is None:
                    raise RuntimeError(self.error or f"tts.voices: {self.spec!r} is closed")
                t0 = time.monotonic()
                try:
                    engine = with_streaming(self._make())
                    unspoken = [lang for lang in self.languages if not speaks(engine, lang)]
                    if unspoken:
                        raise ValueError(f"tts.voices: {self.spec!r} cannot speak {', '.join(map(repr, unspoken))} "
                                         f"(it speaks {', '.join(engine.capabilities.languages)})")
                except Exception as exc:
                    self._make = None
                    self.error = f"the voice {self.spec!r} for {', '.join(self.languages)} could not be loaded: {exc}"
                    log.warning("tts.voice_load_failed spec=%s error=%s", self.spec, exc)
                    raise RuntimeError(self.error) from exc
                self.engine, self._make = engine, None
                log.info("tts.voice_loaded spec=%s languages=%s ms=%.0f", self.spec, ",".join(self.languages),
                         (time.monotonic() - t0) * 1000)
            return self.engine

    def close(self) -> None:
        """No load from now on (one running finishes; its engine is left to the process's end)."""
        with self._lock:
            if self.engine is None and self._make is not None:
                self._make, self.error = None, f"tts.voices: {self.spec!r} is closed"


class LanguageRouter:
    """The main engine and the engines of ``tts.voices``, as one engine (module docstring)."""

    def __init__(self, main: TTSEngine, routes: dict[str, RoutedVoice | tuple[None, str | None]]) -> None:
        """``routes``: a language → its :class:`RoutedVoice`, or ``(None, voice)`` for the main engine in ``voice``
        (None: the session's)."""
        self.main = with_streaming(main)
        self.routes = routes
        self.name = main.name
        self.sample_rate = main.sample_rate
        self.piece_by_piece = speaks_piece_by_piece(main)
        self.capabilities = self._capabilities()

    def __getattr__(self, name: str) -> Any:  # the main engine's voices, stats, cloning (VoiceCloner)
        if name == "main":
            raise AttributeError(name)
        return getattr(self.main, name)

    def _capabilities(self) -> TTSCapabilities:
        """The main engine's, speaking its languages and those of every voice that has not failed to load."""
        routed = [lang for lang, r in self.routes.items() if not isinstance(r, RoutedVoice) or not r.error]
        langs = tuple(dict.fromkeys((*self.main.capabilities.languages, *routed)))
        return dataclasses.replace(self.main.capabilities, languages=langs)

    @property
    def voices_routed(self) -> list[RoutedVoice]:
        """Each engine of ``tts.voices`` once, loaded or not."""
        return list({id(r): r for r in self.routes.values() if isinstance(r, RoutedVoice)}.values())

    def route(self, language: str | None, voice: str | None) -> tuple[RoutedVoice | None, VoiceChoice]:
        """Who speaks a request in ``language`` with the session's ``voice``: the routed voice (None: the main
        engine), and the choice."""
        target = self.routes.get(language) if language is not None else None
        if isinstance(target, RoutedVoice) and not target.error:
            return target, VoiceChoice(target.name, None, language)  # its voice is the one it was loaded with
        if isinstance(target, tuple):
            return None, VoiceChoice(self.name, target[1] or voice, language)
        if language is None or speaks(self.main, language):
            return None, VoiceChoice(self.name, voice, language)
        return None, VoiceChoice(self.name, voice, None, fallback=True)

    def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        return self._speak(request, lambda engine, routed: engine.synthesize(routed))

    def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        return self._speak(request, lambda engine, routed: engine.synthesize_stream(pieces, routed))

    def _speak(self, request: TTSRequest, make: Callable[[TTSEngine, TTSRequest], AsyncIterator[np.ndarray]]
               ) -> AsyncIterator[np.ndarray]:
        """The main engine's own stream when it speaks the request (nothing in between), else the routed voice's,
        loaded first if need be and resampled to the main engine's rate."""
        if request.reference is not None:  # an ad-hoc clone: only the main engine can (or says it cannot)
            return make(self.main, request)
        target, choice = self.route(request.language, request.voice)
        routed = dataclasses.replace(request, voice=choice.voice, language=choice.language)
        if target is None:
            return make(self.main, routed)
        return self._routed(target, lambda engine: make(engine, routed))

    async def _routed(self, target: RoutedVoice,
                      make: Callable[[TTSEngine], AsyncIterator[np.ndarray]]) -> AsyncIterator[np.ndarray]:
        engine = target.engine
        if engine is None:
            try:
                engine = await asyncio.to_thread(target.load)
            finally:
                if target.error:  # its languages go to the main engine from now on (and the TTS API refuses them)
                    self.capabilities = self._capabilities()
        chunks = make(engine)
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
        """The main engine and the voices loaded at start (one loaded later is warmed by its first request)."""
        await self.main.warmup()
        for routed in self.voices_routed:
            if routed.engine is not None:
                await routed.engine.warmup()

    async def close(self) -> None:
        await self.main.close()
        for routed in self.voices_routed:
            routed.close()
            if routed.engine is not None:
                await routed.engine.close()


def speaks_piece_by_piece(engine: Any) -> bool:
    """The engine speaks a piece only once it has all of it (Piper, Kokoro): the reply's first piece should be
    short. A router answers for its main engine."""
    flag = getattr(engine, "piece_by_piece", None)
    return flag if isinstance(flag, bool) else isinstance(with_streaming(engine), PieceByPiece)


def build_router(cfg: TTSConfig, main: TTSEngine, load: Callable[[TTSConfig], TTSEngine],
                 reachable: Collection[str] = ()) -> TTSEngine:
    """``main`` alone when ``tts.voices`` routes nothing away from it, else a :class:`LanguageRouter`. ``load``
    makes an engine from a config (``tts.create_tts``'s loader); a voice for a language in ``reachable`` (what
    a turn can be in) is loaded now, any other on its first request."""
    if not cfg.voices:
        return main
    routes: dict[str, RoutedVoice | tuple[None, str | None]] = {}
    voices: dict[tuple[str, str | None], RoutedVoice] = {}
    cloner = callable(getattr(main, "add_voice", None))
    for language, spec in cfg.voices.items():
        name, voice = parse_voice(spec)
        if name == cfg.engine.strip() and (voice is None or cloner):
            routes[language] = (None, voice)  # the main engine in the entry's voice (a cloner keeps many)
            continue
        routed = voices.get((name, voice))
        if routed is None:
            one = dataclasses.replace(cfg, engine=name, voice=voice or "", voices={})
            routed = voices[(name, voice)] = RoutedVoice(f"{name}:{voice}" if voice else name, [], partial(load, one))
        routed.languages.append(language)
        routes[language] = routed
    for routed in voices.values():
        now = any(lang in reachable for lang in routed.languages)
        log.info("tts.voice_route languages=%s spec=%s load=%s", ",".join(routed.languages), routed.spec,
                 "now" if now else "on first use")
        if now:
            try:
                routed.load()
            except RuntimeError as exc:
                raise ValueError(str(exc)) from exc.__cause__
    return LanguageRouter(main, routes)
