"""Responders: echo, rules, plug-ins, history, and the OpenAI-compatible client against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from assistant.config import RespondConfig
from assistant.respond import ConversationHistory, Message, ResponderError, create_responder
from assistant.respond.base import ReplyOptions, ToolCall, ToolCallDelta, Usage
from assistant.respond.echo import EchoResponder
from assistant.respond.openai import OpenAIResponder
from assistant.respond.rules import RulesResponder
from assistant.server.local import serve_on_loopback

ROOT = Path(__file__).resolve().parent.parent


async def collect(it: AsyncIterator[str]) -> list[str]:
    return [d async for d in it]


# --- echo, rules, factory ------------------------------------------------------------------------------


async def test_echo_streams_words() -> None:
    r = create_responder(RespondConfig(engine="echo"))
    assert isinstance(r, EchoResponder) and r.name == "echo"
    deltas = await collect(r.respond("  hello   there  world ", []))
    assert len(deltas) == 5
    assert "".join(deltas) == "You said: hello there world"
    assert await collect(r.respond("   ", [])) == ["I", " did", " not", " catch", " that."]


async def test_rules_time_date_and_fallback() -> None:
    fixed = dt.datetime(2024, 3, 5, 14, 7)
    r = RulesResponder(RespondConfig(engine="rules"), now=lambda: fixed)
    assert "".join(await collect(r.respond("Hey, what time is it?", []))) == "It is 2:07 PM."
    assert r.reply_for("what's the date today") == "Today is Tuesday, March 5, 2024."
    assert r.reply_for("hello there") == "Hello! How can I help you?"
    assert r.reply_for("tell me about cats.") == (
        "I heard you say: tell me about cats. I can tell you the time or the date.")
    cfg = RespondConfig(engine="rules", options={
        "rules": [[r"my name is (?P<who>\w+)", "Nice to meet you, {who}. {nope}"]],
        "fallback": "No idea about {text}.",
    })
    r2 = create_responder(cfg)
    assert isinstance(r2, RulesResponder)
    assert r2.reply_for("My name is Ada") == "Nice to meet you, Ada. {nope}"
    assert r2.reply_for("{text.__class__}") == "No idea about {text.__class__}."
    with pytest.raises(ValueError, match="bad pattern"):
        RulesResponder(RespondConfig(options={"rules": [["(", "x"]]}))


def test_unknown_responder_name() -> None:
    with pytest.raises(ValueError, match=r"unknown responder 'nope'.*echo, rules, openai"):
        create_responder(RespondConfig(engine="nope"))


async def test_plugin_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    r = create_responder(RespondConfig(engine="tests.plugins:Shout"))
    assert r.name == "shout"
    assert "".join(await collect(r.respond("hi you", []))) == "HI YOU !"
    r = create_responder(RespondConfig(engine="tests.plugins:Shout", options={"suffix": "?!"}))
    assert "".join(await collect(r.respond("ok", []))) == "OK ?!"
    with pytest.raises(ValueError, match="options do not fit"):
        create_responder(RespondConfig(engine="tests.plugins:Shout", options={"bogus": 1}))
    with pytest.raises(ValueError, match="no respond"):
        create_responder(RespondConfig(engine="tests.plugins:NotAResponder"))
    with pytest.raises(ValueError, match="has no class 'Missing'"):
        create_responder(RespondConfig(engine="tests.plugins:Missing"))
    with pytest.raises(ValueError, match="cannot import module"):
        create_responder(RespondConfig(engine="tests.no_such_module:X"))
    with pytest.raises(ValueError, match=r"expected 'package\.module:Class'"):
        create_responder(RespondConfig(engine=":X"))


def test_history_bounded() -> None:
    h = ConversationHistory(max_turns=2)
    for i in range(5):
        h.add_turn(f"u{i}", f"a{i}")
    assert len(h) == 2
    assert h.messages == [
        Message("user", "u3"), Message("assistant", "a3"), Message("user", "u4"), Message("assistant", "a4"),
    ]
    h.add_turn("u5", "")  # interrupted before any word was spoken
    assert h.messages[-1] == Message("user", "u5")
    assert ConversationHistory(0).messages == []
    with pytest.raises(ValueError):
        ConversationHistory(-1)


# --- OpenAI-compatible client against a real aiohttp server ------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeLLM:
    """A local chat-completions server; ``handler`` decides how it answers, ``requests`` records bodies."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[dict, dict[str, str]]] = []
        self._served: contextlib.AbstractAsyncContextManager[str]
        self.port = 0

    async def _route(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((await request.json(), dict(request.headers)))
        return await self.handler(request)

    async def __aenter__(self) -> FakeLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._route)
        self._served = serve_on_loopback(app, shutdown_timeout=0.1)
        self.port = int((await self._served.__aenter__()).rsplit(":", 1)[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._served.__aexit__(None, None, None)

    def cfg(self, **kw: object) -> RespondConfig:
        base = dict(engine="openai", base_url=f"http://127.0.0.1:{self.port}/v1", model="tiny-llm",
                    api_key="sk-test", temperature=0.2, max_tokens=64, system_prompt="Be brief.",
                    connect_timeout_s=1.0, first_token_timeout_s=2.0, total_timeout_s=5.0)
        base.update(kw)
        return RespondConfig(**base)  # type: ignore[arg-type]


def sse(obj: object) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def chunk(content: str | None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}


async def stream(request: web.Request, parts: list[bytes], *, delay: float = 0.0) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for p in parts:
        await resp.write(p)
        if delay:
            await asyncio.sleep(delay)
    await resp.write_eof()
    return resp


async def test_openai_streams_deltas_and_sends_request() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        parts = [b": keep-alive\n\n", sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})]
        parts += [sse(chunk(w)) for w in ["Hello", " there", ", friend."]]
        parts += [sse(chunk(None, "stop")), b"data: [DONE]\n\n"]
        return await stream(request, parts)

    async with FakeLLM(handler) as srv:
        r = create_responder(srv.cfg())
        assert isinstance(r, OpenAIResponder)
        history = [Message("user", "hi"), Message("assistant", "Hello!")]
        try:
            deltas = await collect(r.respond("How are you?", history))
            assert deltas == ["Hello", " there", ", friend."]
            # The shared session is reused for the next turn.
            session = r._session
            assert await collect(r.respond("again", [])) == deltas
            assert r._session is session
        finally:
            await r.aclose()
        assert r._session is None
    body, headers = srv.requests[0]
    assert body["model"] == "tiny-llm" and body["stream"] is True
    assert body["max_tokens"] == 64 and body["temperature"] == 0.2
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
    ]
    assert headers["Authorization"] == "Bearer sk-test"


async def test_openai_api_key_from_env_and_history_system(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")

    async def handler(request: web.Request) -> web.StreamResponse:
        # One line per event with CRLF endings and no [DONE]: finish_reason ends the reply.
        line = b'data: {"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}\r\n'
        return await stream(request, [line])

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg(api_key=""))
        hist = ConversationHistory(2)
        hist.add_turn("a", "b")
        try:
            assert await collect(r.respond("c", [Message("system", "Custom system."), *hist.messages])) == ["ok"]
        finally:
            await r.aclose()
    body, headers = srv.requests[0]
    assert headers["Authorization"] == "Bearer sk-env"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == "Custom system."


async def test_openai_non_streaming_json_answer() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        message = {"role": "assistant", "content": "Whole answer."}
        return web.json_response({"choices": [{"message": message}]})

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        try:
            assert await collect(r.respond("x", [])) == ["Whole answer."]
        finally:
            await r.aclose()


@pytest.mark.parametrize("status", [500, 401, 404, 429])
async def test_openai_http_error(status: int) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text="Traceback (most recent call last): secret internals")

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        try:
            with pytest.raises(ResponderError) as ei:
                await collect(r.respond("x", []))
        finally:
            await r.aclose()
    msg = str(ei.value)
    assert "Traceback" not in msg and "secret" not in msg and len(msg) < 100


async def test_openai_first_token_timeout() -> None:
    answered = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)  # never answers in time
        answered.set()
        return web.Response()

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg(first_token_timeout_s=0.3))
        try:
            with pytest.raises(ResponderError, match="too long to answer"):
                await collect(r.respond("x", []))
        finally:
            await r.aclose()
        assert not answered.is_set()  # the client's limit ended it, before the server ever answered


async def test_openai_headers_then_silence_is_first_token_timeout() -> None:
    finished = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await stream(request, [b": still thinking\n\n", b""], delay=30)
        finished.set()
        return resp

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg(first_token_timeout_s=0.3))
        try:
            with pytest.raises(ResponderError, match="too long to answer"):
                await collect(r.respond("x", []))
        finally:
            await r.aclose()
        assert not finished.is_set()  # ended by the first-token limit while the server was still silent


async def test_openai_total_timeout_after_first_token() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, [sse(chunk("Hi")), sse(chunk(" there"))], delay=30)

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg(total_timeout_s=0.4))
        got: list[str] = []
        try:
            with pytest.raises(ResponderError, match="too long to finish"):
                async for d in r.respond("x", []):
                    got.append(d)
        finally:
            await r.aclose()
        assert got == ["Hi"]  # the first delta, then the total limit: " there" (30 s later) never came


async def test_openai_server_closes_mid_stream() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse(chunk("Partial")))
        await resp.write(sse(chunk(" text")))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # drop the connection without [DONE]
        return resp

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        got: list[str] = []
        try:
            with pytest.raises(ResponderError, match="stopped in the middle"):
                async for d in r.respond("x", []):
                    got.append(d)
        finally:
            await r.aclose()
    assert "".join(got) == "Partial text"  # what arrived was yielded, then the error


async def test_openai_clean_eof_without_done_or_finish_is_an_error() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, [sse(chunk("Half"))])

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        try:
            with pytest.raises(ResponderError, match="stopped in the middle"):
                await collect(r.respond("x", []))
        finally:
            await r.aclose()


@pytest.mark.parametrize("payload", [
    b"data: {not json}\n\n",
    b'data: ["a list"]\n\n',
    b'data: {"error": {"message": "CUDA out of memory at /opt/vllm/x.py"}}\n\n',
])
async def test_openai_malformed_sse(payload: bytes) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream(request, [sse(chunk("A")), payload, b"data: [DONE]\n\n"])

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        try:
            with pytest.raises(ResponderError) as ei:
                await collect(r.respond("x", []))
        finally:
            await r.aclose()
    assert "CUDA" not in str(ei.value)


async def test_openai_unreachable_port() -> None:
    port = free_port()  # nothing listens there now
    r = OpenAIResponder(RespondConfig(engine="openai", base_url=f"http://127.0.0.1:{port}/v1",
                                      connect_timeout_s=1.0))
    try:
        with pytest.raises(ResponderError, match="could not reach"):
            await collect(r.respond("x", []))
    finally:
        await r.aclose()


async def test_openai_consumer_stops_early_closes_stream() -> None:
    disconnected = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(200):
                await resp.write(sse(chunk(f"w{i} ")))
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            disconnected.set()
            raise
        return resp

    async with FakeLLM(handler) as srv:
        r = OpenAIResponder(srv.cfg())
        try:
            gen = r.respond("x", [])
            assert await gen.__anext__() == "w0 "
            await gen.aclose()  # barge-in: the loop stops listening
            await asyncio.wait_for(disconnected.wait(), 2.0)
        finally:
            await r.aclose()


async def test_openai_tools_in_the_request_and_tool_calls_streamed_back() -> None:
    """Function tools go out in chat-completions' shape; a streamed tool call (its arguments in pieces) comes back as
    its pieces, then one ToolCall; tool calls and tool results in the history go out as the API wants them."""

    def call_chunk(**fields: object) -> dict:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}, "finish_reason": None}]}

    async def handler(request: web.Request) -> web.StreamResponse:
        parts = [sse(chunk("Let me look.")),
                 sse(call_chunk(id="call_1", type="function", function={"name": "get_weather", "arguments": ""})),
                 sse(call_chunk(function={"arguments": '{"city": '})),
                 sse(call_chunk(function={"arguments": '"Oslo"}'})),
                 sse(chunk(None, "tool_calls")), b"data: [DONE]\n\n"]
        return await stream(request, parts)

    tools = [{"type": "function", "name": "get_weather", "description": "Weather by city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    history = [Message("system", "Use tools."), Message("user", "weather in Rome?"),
               Message("assistant", "", tool_calls=(ToolCall("call_0", "get_weather", '{"city": "Rome"}'),)),
               Message("tool", '{"sky": "clear"}', call_id="call_0"), Message("user", "and in Oslo?")]
    async with FakeLLM(handler) as srv:
        r = create_responder(srv.cfg())
        try:
            out = [x async for x in r.respond_messages(history, tools, "auto")]
        finally:
            await r.aclose()
    # The call's pieces as they come (its name first), then the whole call.
    assert out == ["Let me look.", ToolCallDelta(0, "call_1", "get_weather", ""),
                   ToolCallDelta(0, "call_1", "get_weather", '{"city": '),
                   ToolCallDelta(0, "call_1", "get_weather", '"Oslo"}'),
                   ToolCall("call_1", "get_weather", '{"city": "Oslo"}')]
    body, _ = srv.requests[0]
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                                               "parameters": tools[0]["parameters"]}}]
    assert body["tool_choice"] == "auto"
    assert body["messages"][0] == {"role": "system", "content": "Use tools."}  # the history's own system prompt
    assert body["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
    assert body["messages"][3] == {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_0"}


async def test_reply_options_reach_responders_that_take_them_and_only_those() -> None:
    """``reply_stream`` hands ``options`` to a responder whose ``respond`` takes them; a two-argument plug-in
    keeps working, and a responder reports its usage in the same options object."""
    from assistant.respond.base import ReplyOptions, Usage, reply_stream

    class Plain:
        name = "plain"

        async def respond(self, text, history):
            yield text

    class WithOptions:
        name = "with-options"

        async def respond(self, text, history, options=None):
            yield f"{text}/{options.language}"
            options.usage = Usage(3, 1, exact=True)

    options = ReplyOptions(language="ja")
    assert [d async for d in reply_stream(Plain(), "hi", [], options)] == ["hi"]
    assert [d async for d in reply_stream(WithOptions(), "hi", [], options)] == ["hi/ja"]
    assert options.usage == Usage(3, 1, exact=True)


async def test_openai_reports_the_servers_token_counts_and_takes_sampling_options() -> None:
    """With ``stream_options.include_usage`` the server's last chunk counts the tokens: the responder puts them in
    ``options.usage`` (exact); the options' temperature and token limit go into the request."""

    async def handler(request: web.Request) -> web.StreamResponse:
        usage = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
                 "usage": {"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25}}
        return await stream(request, [sse(chunk("Hi there.")), sse(chunk(None, "stop")), sse(usage),
                                      b"data: [DONE]\n\n"])

    options = ReplyOptions(temperature=0.2, max_tokens=33)
    async with FakeLLM(handler) as srv:
        r = create_responder(srv.cfg())
        try:
            out = [x async for x in r.respond("hello", [], options=options)]
        finally:
            await r.aclose()
    assert out == ["Hi there."]
    assert options.usage == Usage(21, 4, exact=True)
    body, _ = srv.requests[0]
    assert (body["temperature"], body["max_tokens"]) == (0.2, 33)
