"""A voice per language (``tts.voices``, assistant/tts/routing.py): which engine speaks a request, when a routed
engine is loaded (at start for a language a turn can reach, else on its first request, once), and what happens
when it cannot be loaded. Engines here are small in-process ones; the real voices are in test_tts_api.py and
test_languages.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest

from assistant.config import TTSConfig
from assistant.tts.base import PieceByPiece, TTSCapabilities, TTSRequest
from assistant.tts.routing import LanguageRouter, build_router, choose_voice


class Tone(PieceByPiece):
    """Speaks ``len(text)`` ms of a constant level per request (its languages and rate as configured)."""

    def __init__(self, name: str, rate: int, languages: tuple[str, ...]) -> None:
        self.name, self.sample_rate = name, rate
        self.capabilities = TTSCapabilities(languages=languages)
        self.requests: list[TTSRequest] = []
        self.closed = False

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        self.requests.append(request)
        yield np.full(self.sample_rate * len(request.text) // 1000, 0.1, np.float32)

    async def warmup(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class Loader:
    """``tts.create_tts``'s loader for the routed engines: counts loads, and can be slow or fail."""

    def __init__(self, *, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.loads: list[TTSConfig] = []
        self.fail, self.gate = fail, gate
        self.made: list[Tone] = []

    def __call__(self, cfg: TTSConfig) -> Tone:
        self.loads.append(cfg)
        if self.gate is not None:
            assert self.gate.wait(10), "the test never let the load finish"
        if self.fail:
            raise RuntimeError("the package is not installed")
        engine = Tone(cfg.engine, 24_000, ("ja",))
        self.made.append(engine)
        return engine


CFG = TTSConfig(engine="main", voices={"ja": "kokoro:jf_alpha", "en": "main"})


def router(loader: Loader, reachable: tuple[str, ...] = ()) -> LanguageRouter:
    built = build_router(CFG, Tone("main", 16_000, ("en",)), loader, reachable)
    assert isinstance(built, LanguageRouter)
    return built


async def speak(engine: LanguageRouter, text: str, language: str | None) -> np.ndarray:
    return np.concatenate([c async for c in engine.synthesize(TTSRequest(text=text, language=language))])


async def test_a_voice_no_turn_can_reach_loads_on_its_first_request_once() -> None:
    gate = threading.Event()
    loader = Loader(gate=gate)
    engine = router(loader)  # nothing reachable: the Japanese voice waits for a request
    assert loader.loads == [] and "ja" in engine.capabilities.languages  # the TTS API may still ask for it
    assert choose_voice(engine, "ja", None).engine == "kokoro"  # and a reply in it will be spoken by it
    # Three requests at once while it loads: one load, every request waits for it, none fails.
    tasks = [asyncio.create_task(speak(engine, "こんにちは" * 20, "ja")) for _ in range(3)]
    while not loader.loads:
        await asyncio.sleep(0.01)
    assert not any(t.done() for t in tasks)
    gate.set()
    spoken = await asyncio.gather(*tasks)
    assert len(loader.loads) == 1
    assert loader.loads[0].engine == "kokoro" and loader.loads[0].voice == "jf_alpha" and not loader.loads[0].voices
    # 100 ms at the routed engine's 24 kHz, resampled to the main engine's 16 kHz on the way.
    assert all(abs(len(a) - 1600) <= 16 for a in spoken), [len(a) for a in spoken]
    assert [r.language for r in loader.made[0].requests] == ["ja"] * 3
    # English stays with the main engine, untouched (its own stream, at its own rate).
    assert len(await speak(engine, "hello", "en")) == 80
    await engine.close()
    assert loader.made[0].closed


async def test_a_voice_a_turn_can_reach_loads_at_start() -> None:
    loader = Loader()
    engine = router(loader, reachable=("en", "ja"))
    assert len(loader.loads) == 1
    await speak(engine, "こんにちは", "ja")
    assert len(loader.loads) == 1
    await engine.close()


async def test_a_voice_that_cannot_load_fails_once_then_its_language_falls_back() -> None:
    loader = Loader(fail=True)
    engine = router(loader)
    with pytest.raises(RuntimeError, match="'kokoro:jf_alpha' for ja could not be loaded: the package is not"):
        await speak(engine, "こんにちは", "ja")
    # Never tried again; the language is no longer offered, and a reply in it gets the default voice and says so.
    assert "ja" not in engine.capabilities.languages
    choice = choose_voice(engine, "ja", None)
    assert choice.fallback and choice.engine == "main"
    assert len(await speak(engine, "こんにちは", "ja")) == 80
    assert len(loader.loads) == 1
    await engine.close()


def test_a_voice_that_cannot_load_at_start_stops_the_start() -> None:
    with pytest.raises(ValueError, match="could not be loaded: the package is not installed"):
        router(Loader(fail=True), reachable=("ja",))
    wrong = TTSConfig(engine="main", voices={"de": "kokoro"})
    with pytest.raises(ValueError, match="'kokoro' cannot speak 'de'"):
        build_router(wrong, Tone("main", 16_000, ("en",)), Loader(), ("de",))
