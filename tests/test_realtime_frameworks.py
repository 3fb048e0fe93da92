"""The frameworks people build on hold whole conversations with our Realtime API: the OpenAI Agents SDK's realtime
runner (``openai-agents``) and LiveKit Agents' OpenAI realtime plugin (``livekit-plugins-openai``), each pointed
at our server over WebSocket, with their own parsing, validation, tool handling and interruption logic. An
OpenAI-compatible chat server on loopback plays the model (so tools are called); speech, ASR, end of turn and
voice are our real CPU stack, the user's turns the recordings in ../shared/audio."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from assistant.server.services import Services
from tests import needs
from tests.conftest import serve, test_config
from tests.test_realtime_ws import RATE, pcm24
from tests.test_respond import FakeLLM, chunk, sse, stream

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

STORY = ("Once upon a time a small grey cat lived above a music shop. Every night she listened to the old piano "
         "below. One evening she jumped onto the keys and found that each one sang a different note. She practised "
         "every night until the whole street stopped to listen. ")
USAGE = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}}


def call_piece(**fields: object) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}, "finish_reason": None}]})


async def llm(request: web.Request) -> web.StreamResponse:
    """The model: asked about the weather with a weather tool, it calls it; given the tool's answer, says it;
    asked for a story, tells a long one (so it can be interrupted); asked to go on, says the user's last words again
    (not its own: "You said: You said: …" is a stutter, which the loop guard stops); otherwise repeats what it
    heard."""
    body = await request.json()
    last = body["messages"][-1]
    content = str(last.get("content") or "")
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    if last["role"] == "tool":
        parts = [sse(chunk(f"It is {json.loads(content)['sky']} in Lisbon today.")), sse(chunk(None, "stop"))]
    elif "get_weather" in tools and "weather" in content.lower():
        parts = [call_piece(id="call_w1", type="function", function={"name": "get_weather", "arguments": ""}),
                 call_piece(function={"arguments": '{"city": '}), call_piece(function={"arguments": '"Lisbon"}'}),
                 sse(chunk(None, "tool_calls"))]
    elif "story" in content.lower():
        parts = [sse(chunk(sentence + ".")) for sentence in STORY.split(".") if sentence.strip()]
        parts.append(sse(chunk(None, "stop")))
    elif last["role"] == "assistant":  # asked to go on (generate_reply() with no new input): the user's last words
        asked = next(str(m.get("content") or "") for m in reversed(body["messages"]) if m["role"] == "user")
        parts = [sse(chunk(f"Once more, you asked: {asked}")), sse(chunk(None, "stop"))]
    else:
        parts = [sse(chunk(f"You said: {content}")), sse(chunk(None, "stop"))]
    return await stream(request, [*parts, sse(USAGE), b"data: [DONE]\n\n"])


@asynccontextmanager
async def model_server(services: Services) -> AsyncIterator[tuple[str, FakeLLM]]:
    """Our app with the OpenAI-compatible responder pointed at the fake model; yields (base URL, the model)."""
    async with FakeLLM(llm) as fake:
        cfg = test_config(respond={"engine": "openai", "base_url": fake.cfg().base_url, "model": "tiny-llm",
                                   "first_token_timeout_s": 10.0})
        own = Services(cfg)  # the module's loaded engines, with this config's responder
        own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                           services.end_of_turn)
        try:
            async with serve(cfg, own) as (url, _app):
                yield url, fake
        finally:
            await own.responder.aclose()


async def stream_audio(send: Callable[[bytes], Any], pcm: np.ndarray, speed: float = 1.0,
                       chunk_s: float = 0.02) -> None:
    """``pcm`` (24 kHz int16) in ``chunk_s`` pieces, ``speed`` × real time, as a microphone would send it."""
    step = int(chunk_s * RATE)
    t0 = time.monotonic()
    for k, at in enumerate(range(0, len(pcm), step)):
        await asyncio.sleep(max(0.0, t0 + k * chunk_s / speed - time.monotonic()))
        out = send(pcm[at: at + step].tobytes())
        if asyncio.iscoroutine(out):
            await out


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# --- the OpenAI Agents SDK ---------------------------------------------------------------------------------------
async def test_agents_sdk_holds_two_spoken_turns_with_a_tool_and_an_interruption(services: Services,
                                                                                  shared_audio) -> None:
    agents = needs.module("agents")
    from agents.realtime import RealtimeAgent, RealtimeRunner

    ran: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return json.dumps({"sky": "sunny"})

    agent = RealtimeAgent(name="Assistant", instructions="You are helpful.", tools=[get_weather])
    async with model_server(services) as (url, fake):
        ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime"
        session = await RealtimeRunner(agent).run(model_config={"url": ws_url, "api_key": "unused"})
        events: list[Any] = []
        raw: list[dict[str, Any]] = []
        async with session:
            async def read() -> None:
                async for event in session:
                    events.append(event)
                    if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                        raw.append(event.data.data)

            reader = asyncio.create_task(read())
            try:
                await until(lambda: any(e.get("type") == "session.updated" for e in raw), 20, "session.updated")
                # Turn 1: a spoken question that needs the tool; the agent runs it and speaks the answer.
                await stream_audio(session.send_audio, pcm24(shared_audio / "en_weather.wav", 2.5), speed=2.0)
                await until(lambda: sum(1 for e in raw if e["type"] == "response.done") >= 2, 60, "the tool's answer")
                assert ran == ["Lisbon"]
                answer = [e for e in raw if e["type"] == "response.done"][1]["response"]
                assert answer["status"] == "completed"
                assert answer["output"][0]["content"][0]["transcript"] == "It is sunny in Lisbon today."
                assert any(e.type == "audio" for e in events)
                # Turn 2: a story, interrupted by the next question while it plays.
                mark = len(raw)
                await stream_audio(session.send_audio, pcm24(shared_audio / "en_story.wav", 1.5), speed=2.0)
                await until(lambda: any(e["type"] == "response.output_audio.delta" for e in raw[mark:]), 60,
                            "the story's audio")
                await asyncio.sleep(2.0)  # the story plays (the SDK's own playback clock)
                await stream_audio(session.send_audio, pcm24(shared_audio / "en_timer.wav", 2.5))
                await until(lambda: sum(1 for e in raw[mark:] if e["type"] == "response.done") >= 2, 60,
                            "the answer after the interruption")
            finally:
                reader.cancel()
        dones = [e["response"] for e in raw[mark:] if e["type"] == "response.done"]
        story, timer = dones[0], dones[1]
        assert story["status"] == "cancelled" and timer["status"] == "completed"
        assert "timer" in timer["output"][0]["content"][0]["transcript"].lower()
        truncated = [e for e in raw[mark:] if e["type"] == "conversation.item.truncated"]
        assert len(truncated) == 1 and 1000 < truncated[0]["audio_end_ms"] < 6000, truncated  # the SDK's cut
        assert any(e.type == "audio_interrupted" for e in events)
        # The agent's history keeps the story as far as it was heard: a start of it, not all of it.
        history = [e.history for e in events if e.type == "history_updated"][-1]
        heard = next(i for i in history if i.item_id == story["output"][0]["id"])
        kept = heard.content[0].transcript
        assert kept and STORY.startswith(kept) and len(kept) < len(STORY.strip())
        # Transcripts of what the user said, and no error of any kind on the way.
        said = [e.data.transcript for e in events if e.type == "raw_model_event"
                and e.data.type == "input_audio_transcription_completed"]
        assert any("weather" in s.lower() for s in said) and any("timer" in s.lower() for s in said)
        assert not [e for e in events if e.type == "error"], [e for e in events if e.type == "error"]
        assert not [e for e in raw if e["type"] == "error"]
    # The model's call after the tool held the tool's output and no new user words. (Not "the second call": a
    # speculative turn at a pause may ask the model too, e.g. on "Hello?" before "what is the weather like today?",
    # when its transcript lands before the speaker goes on, as it does on a fast machine.)
    after_tool = next(r[0]["messages"] for r in fake.requests if any(m["role"] == "tool" for m in r[0]["messages"]))
    assert after_tool[-1]["role"] == "tool" and after_tool[-2]["tool_calls"][0]["function"]["name"] == "get_weather"


# --- LiveKit Agents' OpenAI realtime plugin ---------------------------------------------------------------------
async def test_livekit_realtime_session_turn_generate_reply_and_interruption(services: Services,
                                                                             shared_audio) -> None:
    """LiveKit's ``RealtimeModel(base_url=...)`` session driven directly (no room: its session API takes audio
    frames and calls like an AgentSession would): a spoken turn, ``generate_reply()`` with no new input, and an
    interruption (``interrupt()`` and ``truncate()`` at its own playout position)."""
    needs.module("livekit.plugins.openai")
    from livekit import rtc
    from livekit.plugins.openai.realtime import RealtimeModel

    async with model_server(services) as (url, _fake):
        model = RealtimeModel(base_url=f"{url}/v1", api_key="unused", voice="marin")
        session = model.session()
        errors: list[Any] = []
        generations: list[Any] = []
        transcripts: list[str] = []
        raw: list[dict[str, Any]] = []
        session.on("error", errors.append)
        session.on("generation_created", generations.append)
        session.on("openai_server_event_received", raw.append)
        session.on("input_audio_transcription_completed",
                   lambda ev: transcripts.append(ev.transcript) if ev.is_final else None)

        def push(data: bytes) -> None:
            session.push_audio(rtc.AudioFrame(data=data, sample_rate=RATE, num_channels=1,
                                              samples_per_channel=len(data) // 2))

        async def reply_of(generation: Any) -> tuple[str, int]:
            """Read a generation as LiveKit's player would: its text and its audio samples."""
            text, samples = "", 0
            async for message in generation.message_stream:
                async def audio(message: Any = message) -> int:
                    n = 0
                    async for frame in message.audio_stream:
                        n += frame.samples_per_channel
                    return n
                counting = asyncio.create_task(audio())
                async for piece in message.text_stream:
                    text += piece
                samples += await counting
            return text, samples

        try:
            await until(lambda: any(e.get("type") == "session.updated" for e in raw), 20, "session.updated")
            # A spoken turn.
            await stream_audio(push, pcm24(shared_audio / "en_timer.wav", 2.5), speed=2.0)
            await until(lambda: generations, 60, "a generation")
            text, samples = await asyncio.wait_for(reply_of(generations[0]), 60)
            assert "timer" in text.lower() and samples > RATE
            assert any("timer" in t.lower() for t in transcripts)
            # generate_reply() with no new input: answered from the conversation so far.
            created = await asyncio.wait_for(session.generate_reply(), 20)
            text, samples = await asyncio.wait_for(reply_of(created), 60)
            assert "timer" in text.lower() and samples > RATE
            # An interruption: a story starts, the user talks over it; the plugin cancels and truncates.
            mark = len(raw)
            await stream_audio(push, pcm24(shared_audio / "en_story.wav", 1.5), speed=2.0)
            await until(lambda: len(generations) >= 3 or any(
                e["type"] == "response.output_audio.delta" for e in raw[mark:]), 60, "the story")
            story = next(e for e in raw[mark:] if e["type"] == "response.created")["response"]["id"]
            await until(lambda: any(e["type"] == "response.output_audio.delta" for e in raw[mark:]), 60, "audio")
            await asyncio.sleep(1.5)
            item = next(e for e in raw[mark:] if e["type"] == "response.output_item.added")["item"]["id"]
            session.interrupt()
            session.truncate(message_id=item, modalities=["audio", "text"], audio_end_ms=1500)
            await until(lambda: any(e["type"] == "response.done" and e["response"]["id"] == story
                                    for e in raw[mark:]), 30, "the story's end")
            await until(lambda: any(e["type"] == "conversation.item.truncated" for e in raw[mark:]), 10, "truncated")
            done = next(e for e in raw[mark:] if e["type"] == "response.done")["response"]
            assert done["status"] == "cancelled"
            cut = [e for e in raw[mark:] if e["type"] == "conversation.item.truncated"]
            assert [c["audio_end_ms"] for c in cut] == [1500]
            remote = session.chat_ctx.get_by_id(item)
            assert remote is not None
            assert not errors, errors
            assert not [e for e in raw if e["type"] == "error"]
            assert any(isinstance(e.get("response", {}).get("usage"), dict) for e in raw
                       if e["type"] == "response.done")
        finally:
            await session.aclose()
            await model.aclose()
