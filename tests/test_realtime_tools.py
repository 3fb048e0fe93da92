"""Function calling through the Realtime API: tools go to an OpenAI-compatible responder that takes them (a local
chat-completions server here), its tool call comes back as a function_call item, the client's output is sent back
and the model's answer is spoken. The official SDK is the client."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_realtime_ws import connected, heard, reply_audio
from tests.test_respond import FakeLLM, chunk, sse, stream

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def llm(request: web.Request) -> web.StreamResponse:
    """Calls get_weather when asked about the weather and given the tool; speaks the tool's answer after."""
    body = await request.json()
    last = body["messages"][-1]
    if last["role"] == "tool":
        sky = json.loads(last["content"])["sky"]
        parts = [sse(chunk(f"It is {sky} in Paris.")), sse(chunk(None, "stop"))]
    elif body.get("tools") and "weather" in last["content"]:
        calls = [{"index": 0, "id": "call_7", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
        parts = [sse({"choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]}),
                 sse(chunk(None, "tool_calls"))]
    else:
        parts = [sse(chunk("Hello.")), sse(chunk(None, "stop"))]
    return await stream(request, [*parts, b"data: [DONE]\n\n"])


async def test_tool_call_round_trip(services: Services) -> None:
    async with FakeLLM(llm) as fake:
        rc = fake.cfg()
        cfg = test_config(respond={"engine": "openai", "base_url": rc.base_url, "model": "tiny-llm",
                                   "first_token_timeout_s": 5.0})
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

            since = len(ev.all)
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": "call_7",
                                                      "output": json.dumps({"sky": "sunny"})})
            await conn.response.create()
            second = await ev.wait("response.done", since)
            assert second["response"]["status"] == "completed", second
            said = second["response"]["output"][0]["content"][0]["transcript"]
            assert said == "It is sunny in Paris."
            assert "sunny" in await heard(services, reply_audio(ev, second["response"]["id"]))
        await own.responder.aclose()  # the engines are the module's: only the responder is ours
    # What the model was given the second time: the instructions, the user, its own call, the tool's output.
    messages = fake.requests[-1][0]["messages"]
    assert messages[0] == {"role": "system", "content": "Use the tools."}
    assert messages[1] == {"role": "user", "content": "What is the weather in Paris?"}
    assert messages[2]["tool_calls"][0]["id"] == "call_7"
    assert messages[3] == {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "call_7"}
    assert len(messages) == 4  # the continuation adds no user words
    assert fake.requests[-1][0]["tools"][0]["function"]["name"] == "get_weather"
