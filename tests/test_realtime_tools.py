"""Function calling through the Realtime API: tools go to an OpenAI-compatible responder that takes them (a local
chat-completions server here), its tool call comes back as a function_call item, the client's output is sent back
and the model's answer is spoken. The official SDK is the client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from assistant.respond.base import ReplyOptions, ToolCall
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_realtime_ws import connected, heard, reply_audio
from tests.test_respond import FakeLLM, chunk, sse, stream

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


USAGE = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 37, "completion_tokens": 9, "total_tokens": 46}}


def call_piece(**fields: object) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}, "finish_reason": None}]})


async def llm(request: web.Request) -> web.StreamResponse:
    """Calls get_weather when asked about the weather and given the tool (its arguments in three pieces); speaks
    the tool's answer after; counts tokens in a last chunk. Asked about the time, it starts a call to a tool of the
    client's (not our get_time skill, which would run on the server) and stalls."""
    body = await request.json()
    last = body["messages"][-1]
    if last["role"] == "tool":
        sky = json.loads(last["content"])["sky"]
        parts = [sse(chunk(f"It is {sky} in Paris.")), sse(chunk(None, "stop")), sse(USAGE)]
    elif body.get("tools") and "weather" in last["content"]:
        parts = [call_piece(id="call_7", type="function", function={"name": "get_weather", "arguments": ""}),
                 call_piece(function={"arguments": '{"city": '}), call_piece(function={"arguments": '"Paris"}'}),
                 sse(chunk(None, "tool_calls")), sse(USAGE)]
    elif body.get("tools") and "time" in last["content"]:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(call_piece(id="call_8", type="function", function={"name": "get_world_time",
                                                                             "arguments": '{"tz'}))
        await asyncio.sleep(30)  # the response is cancelled meanwhile
        return resp
    else:
        parts = [sse(chunk("Hello.")), sse(chunk(None, "stop"))]
    return await stream(request, [*parts, b"data: [DONE]\n\n"])


@pytest.mark.parametrize("backend", ["local", "process"])
async def test_tool_call_round_trip(services: Services, backend: str) -> None:
    """In process and with the responder in its supervised child process (respond.backend = process): the tools
    reach the model either way (in a child they were dropped without a word)."""
    async with FakeLLM(llm) as fake:
        rc = fake.cfg()
        cfg = test_config(respond={"engine": "openai", "base_url": rc.base_url, "model": "tiny-llm",
                                   "first_token_timeout_s": 5.0, "backend": backend})
        own = Services(cfg)  # the loaded engines, with this config's responder (any model name picks it)
        own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                           services.end_of_turn)
        async with serve(cfg, own) as (url, _app), connected(url, model="gpt-realtime") as (conn, ev):
            await conn.session.update(session={"type": "realtime", "instructions": "Use the tools.",
                                               "tools": [WEATHER_TOOL]})
            assert (await ev.wait("session.updated"))["session"]["tools"][0]["name"] == "get_weather"
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is the weather in Paris?"}]})
            await conn.response.create()
            first = await ev.wait("response.done")
            assert first["response"]["status"] == "completed", first
            call = first["response"]["output"][-1]
            assert (call["type"], call["name"], call["call_id"]) == ("function_call", "get_weather", "call_7")
            assert json.loads(call["arguments"]) == {"city": "Paris"}
            args_done = await ev.wait("response.function_call_arguments.done")
            assert args_done["arguments"] == call["arguments"] and args_done["item_id"] == call["id"]
            # The arguments came as the model wrote them, before the call was done.
            deltas = ev.of("response.function_call_arguments.delta")
            assert [d["delta"] for d in deltas] == ['{"city": ', '"Paris"}']
            assert ev.all.index(deltas[-1]) < ev.all.index(args_done)
            usage = first["response"]["usage"]  # the model's own count
            counted = (usage["input_token_details"]["text_tokens"], usage["output_token_details"]["text_tokens"])
            assert counted == (37, 9)

            since = len(ev.all)
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": "call_7",
                                                      "output": json.dumps({"sky": "sunny"})})
            await conn.response.create()
            second = await ev.wait("response.done", since)
            assert second["response"]["status"] == "completed", second
            said = second["response"]["output"][0]["content"][0]["transcript"]
            assert said == "It is sunny in Paris."
            assert "sunny" in await heard(services, reply_audio(ev, second["response"]["id"]))

            # A call the response was cancelled in the middle of: incomplete, its arguments never done.
            since = len(ev.all)
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What time is it?"}]})
            await conn.response.create()
            await ev.wait("response.function_call_arguments.delta", since)
            await conn.response.cancel()
            third = await ev.wait("response.done", since)
            assert third["response"]["status"] == "cancelled"
            cut = third["response"]["output"][-1]
            assert (cut["type"], cut["status"], cut["name"]) == ("function_call", "incomplete", "get_world_time")
            assert not ev.of("response.function_call_arguments.done", since)
        await own.responder.aclose()  # the engines are the module's: only the responder is ours
    # What the model was given the second time: the instructions (and the session's language rule after them), the
    # user, its own call, the tool's output.
    continued = next(body for body, _ in fake.requests if body["messages"][-1]["role"] == "tool")
    messages = continued["messages"]
    assert messages[0] == {"role": "system", "content": "Use the tools."}
    assert messages[1]["role"] == "system" and "Answer in English" in messages[1]["content"]
    assert messages[2] == {"role": "user", "content": "What is the weather in Paris?"}
    assert messages[3]["tool_calls"][0]["id"] == "call_7"
    assert messages[4] == {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "call_7"}
    assert len(messages) == 5  # the continuation adds no user words
    assert continued["tools"][0]["function"]["name"] == "get_weather"
    # Our skills are offered beside the client's own tool, after it (respond/skills/responder.py).
    assert [t["function"]["name"] for t in continued["tools"]][1:4] == ["get_time", "calculate", "convert_units"]


TIMER_TOOL = {"type": "function", "name": "set_timer", "description": "Start a timer",
              "parameters": {"type": "object", "properties": {"minutes": {"type": "number"}}}}


async def test_a_gpt_class_model_gets_what_a_realtime_client_expects(services: Services) -> None:
    """The default [respond] with an OpenAI-compatible model: no 48-token cap (a long answer and a tool call's
    arguments come whole), no temperature forced to 0, and no "you cannot set timers" when the client's tools can;
    the small model's persona is the embedded engine's, not every engine's. ``max_output_tokens`` the client asks
    for goes through; "inf" sends none."""
    async with FakeLLM(llm) as fake:
        base = f"http://127.0.0.1:{fake.port}/v1"
        cfg = test_config(respond={"engine": "openai", "base_url": base, "model": "gpt-class"})
        own = Services(cfg)
        own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                           services.end_of_turn)
        async with serve(cfg, own) as (url, _app), connected(url, model="gpt-realtime") as (conn, ev):
            created = ev.of("session.created")[0]["session"]
            assert created["instructions"] == "" and created["max_output_tokens"] == "inf"
            await conn.session.update(session={"type": "realtime", "tools": [TIMER_TOOL]})
            await ev.wait("session.updated")
            for limit in ("inf", 200):
                since = len(ev.all)
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Start a five minute countdown."}]})
                await conn.response.create(response={"max_output_tokens": limit})
                done = await ev.wait("response.done", since)
                assert done["response"]["status"] == "completed", done
        await own.responder.aclose()
    (unlimited, _), (limited, _) = fake.requests
    for body in (unlimited, limited):
        assert "temperature" not in body, body
        system = " ".join(m["content"] for m in body["messages"] if m["role"] == "system")
        assert "cannot" not in system and "spoken" in system, system
        assert body["tools"][0]["function"]["name"] == "set_timer"
    assert "max_tokens" not in unlimited and limited["max_tokens"] == 200


class _CallingModel:
    """A responder that takes tools and calls one at once (the model's first words are a call)."""

    name = "calling"

    async def respond(self, text: str, history: object, options: object = None) -> AsyncIterator[str]:
        yield ""

    async def respond_messages(self, messages: object, tools: object = (), tool_choice: object = "auto",
                               options: object = None) -> AsyncIterator[ToolCall | str]:
        yield ToolCall("call_1", "get_weather", '{"city": "Paris"}')
        yield "Checking."


async def test_a_clients_call_waits_for_its_turn_to_be_sure() -> None:
    """A turn committed on an unsure end is still dropped if the speaker goes on: its model's call to a tool of the
    client's goes to the client only once the end is sure (the words come again, whole, in the next turn)."""
    ctx = ReplyContext(tools=[WEATHER_TOOL])
    got: list[object] = []
    ctx.claim("What's the weather?", got.append)
    sure = asyncio.Event()
    words: list[str] = []

    async def run() -> None:
        async for delta in RealtimeResponder(_CallingModel(), ctx).respond("What's the weather?", [],
                                                                           ReplyOptions(sure=sure)):
            words.append(delta)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.05)
    assert got == [] and words == [] and not task.done()  # held, and the reply behind it
    sure.set()
    await task
    assert [getattr(e, "name", None) for e in got] == ["get_weather"] and words == ["Checking."]
    # Sure from the start (a typed turn, a client's commit): at once.
    ctx2 = ReplyContext(tools=[WEATHER_TOOL])
    got2: list[object] = []
    ctx2.claim("Hi", got2.append)
    async for _ in RealtimeResponder(_CallingModel(), ctx2).respond("Hi", [], ReplyOptions()):
        pass
    assert len(got2) == 1
