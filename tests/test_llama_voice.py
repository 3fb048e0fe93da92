"""The embedded model in the voice chat, end to end: real aiortc peers on loopback speak the shared clips through
the page protocol to the real app, and the packaged SmolLM2 answers (no stub)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.respond.llama import LlamaResponder
from assistant.server.app import create_app
from assistant.server.local import serve_on_loopback
from assistant.server.services import Services
from assistant.server.voice.signaling import SESSIONS
from tests.conftest import serve, test_config
from tests.waiting import until, until_async

pytestmark = [pytest.mark.slow]
LOOP = pytest.mark.asyncio(loop_scope="module")

SETTINGS = TurnSettings(timeout_s=60.0, silence_ms=1500, settle_ms=300)
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
STORYTELLER = "You are a storyteller. Every answer is a long story of many paragraphs; never stop early."


def llama_config(**respond: object) -> object:
    # Greedy (temperature 0), so each clip always gets the same reply; one thread: the suite shares two cores.
    return test_config(server={"idle_timeout_s": 60.0},
                       respond={"engine": "llama", "backend": "local", "temperature": 0.0, "threads": 1, "slots": 2,
                                **respond})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llama_services() -> AsyncIterator[Services]:
    svc = Services(llama_config())  # type: ignore[arg-type]
    await svc.load()
    yield svc
    await svc.close()


def model_of(services: Services) -> LlamaResponder:
    assert isinstance(services.responder, LlamaResponder)
    return services.responder


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


async def connect(url: str, http: aiohttp.ClientSession, index: int = 0) -> BenchSession:
    client = BenchSession(index=index, url=url, http=http)
    await client.connect()
    return client


@LOOP
async def test_ready_means_loaded_and_warm_and_the_page_is_told_who_answers(llama_services: Services) -> None:
    llama = model_of(llama_services)
    assert {"respond", "respond_warmup"} <= set(llama_services.load_seconds)
    system = llama.engine.tokenize(f"<|im_start|>system\n{llama.cfg.system_prompt}<|im_end|>\n")
    assert min(llama.engine.slot_caches()) >= len(system)  # every slot already holds the system prompt
    async with serve(llama_config(), llama_services) as (url, _app), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/readyz") as r:
            assert r.status == 200 and "respond_warmup" in (await r.json())["load_seconds"]
        client = await connect(url, http)
        await client.close()
    assert client.answer["responder"] == {"engine": "llama", "model": MODEL}


@LOOP
async def test_a_spoken_turn_gets_the_models_answer_and_the_next_turn_remembers_it(
        llama_services: Services, shared_audio: Path) -> None:
    llama = model_of(llama_services)
    async with serve(llama_config(), llama_services) as (url, _app), aiohttp.ClientSession() as http:
        client = await connect(url, http)
        try:
            first = await client.run_turn(load_utterance(shared_audio / "en_weather.wav"), 0, SETTINGS)
            first_request = llama.last_request
            # Not en_timer.wav: a timer is a skill's now (respond/skills/), the model would not be asked.
            second = await client.run_turn(load_utterance(shared_audio / "en_story.wav"), 1, SETTINGS)
            second_request = llama.last_request
        finally:
            await client.close()
    assert first.status == "ok" and second.status == "ok", (first.reason, second.reason)
    assert "weather" in first.transcript.lower()
    heard, said = words(first.transcript), words(first.reply_text)
    assert said and said != heard and "you said" not in first.reply_text.lower()  # not the words read back
    assert first.columns["v2v_ms"] is not None and first.columns["llm_first_text_ms"] is not None
    # The second turn's prompt holds the first turn: what the user said and what the model answered.
    prompt = llama.last_prompt_text
    assert first.transcript.strip() in prompt and first.reply_text.strip()[:60] in prompt
    assert second.transcript.strip() in prompt
    # ...and only its new words were evaluated: the first turn was still in the slot's cache.
    assert first_request is not None and second_request is not None
    assert second_request.slot == first_request.slot
    assert second_request.reused >= len(first_request.prompt)


@LOOP
async def test_barge_in_stops_the_models_generation(llama_services: Services, shared_audio: Path) -> None:
    """A story interrupted while it plays: the reply's generation stops within a token or two of the cancel, and
    the engine is free. The speech path takes text far ahead of what is heard (whole sentences of audio wait to be
    played), so the reply must still be being made when the user talks over it: up to 800 tokens, and a
    storyteller's system prompt (without it, whether greedy SmolLM2 ends its story after ~90 tokens or runs on
    turns on near ties that the weights' encoding moves: Q4_1 ran on, its Q8_0 rewrite stopped; with it both run
    to 800 tokens)."""
    llama = model_of(llama_services)
    llama.cfg.max_tokens, max_tokens = 800, llama.cfg.max_tokens
    prompts = llama.prompts
    saved = prompts.system_prompt, prompts.examples
    prompts.system_prompt, prompts.examples = STORYTELLER, []
    story = load_utterance(shared_audio / "en_story.wav")
    timer = load_utterance(shared_audio / "en_timer.wav")
    before = llama.engine.stats["tokens_after_cancel"]
    async with serve(llama_config(), llama_services) as (url, app), aiohttp.ClientSession() as http:
        client = await connect(url, http)
        try:
            track = next(iter(app[SESSIONS].values())).track
            client.source.play(story, on_speech_end=client.listener.arm)
            await until(lambda: track.audible_frames_sent > 0, "the story to start playing", 60)
            request = llama.last_request  # the story's reply, playing now
            assert request is not None and not request.done, "the story was made whole before it played"
            playing = track.audible_frames_sent
            await until(lambda: track.audible_frames_sent >= playing + 25, "half a second of the story to play", 60)
            client.source.play(timer)  # talk over it
            await until(lambda: any(e.body.get("type") == "interrupted" for e in client.events),
                        "the story to be interrupted", 60)
            await until(lambda: request.done, "the story's generation to stop", 60)
        finally:
            await client.close()
            llama.cfg.max_tokens = max_tokens
            prompts.system_prompt, prompts.examples = saved
    assert request.cancelled, ("the story ran to its end instead of being cancelled", request.generated)
    assert request.after_cancel <= 2, request.after_cancel
    assert llama.engine.stats["tokens_after_cancel"] - before >= request.after_cancel
    assert request.generated < request.max_tokens


@LOOP
async def test_two_sessions_at_once_both_get_answers(llama_services: Services, shared_audio: Path) -> None:
    files = {"en_weather.wav": "weather", "en_timer.wav": "timer"}
    async with serve(llama_config(), llama_services) as (url, _app), aiohttp.ClientSession() as http:
        clients = [await connect(url, http, i) for i in range(2)]
        try:
            results = await asyncio.gather(*(c.run_turn(load_utterance(shared_audio / name), 0, SETTINGS)
                                             for c, name in zip(clients, files, strict=True)))
        finally:
            for c in clients:
                await c.close()
    for result, word in zip(results, files.values(), strict=True):
        assert result.status == "ok", result.reason
        assert word in result.transcript.lower()
        assert words(result.reply_text) and words(result.reply_text) != words(result.transcript)
    assert results[0].reply_text != results[1].reply_text  # each session its own answer


@LOOP
async def test_a_missing_model_file_fails_readyz_naming_it(llama_services: Services, tmp_path: Path) -> None:
    missing = tmp_path / "models" / "qwen2.5-0.5b-instruct-q4_k_m.gguf"
    cfg = llama_config(model_path=str(missing))
    # The other engines are the loaded ones: only the responder is made here.
    svc = Services(cfg, vad_model=llama_services.vad_model, asr=llama_services.asr,  # type: ignore[arg-type]
                   tts=llama_services.tts, end_of_turn=llama_services.end_of_turn)
    app = create_app(cfg, svc)  # type: ignore[arg-type]
    answers: list[tuple[int, dict]] = []

    async def settled() -> bool:
        async with http.get(f"{url}/readyz") as r:
            answers.append((r.status, await r.json()))
        return answers[-1][1]["status"] != "loading"

    async with serve_on_loopback(app) as url, aiohttp.ClientSession() as http:
        await until_async(settled, "/readyz to say ready or failed", 30)
    status, body = answers[-1]
    assert status == 503 and body["status"] == "failed"
    assert str(missing) in body["reason"] and "not found" in body["reason"]
