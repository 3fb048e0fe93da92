"""One trace across processes: a call's context carried with its engine requests (``telemetry/carry.py``), the
spans a replica adds under it (``serve_ray/traced.py``), and the dispatcher's own span between a client's trace
and the gateway's call span, each checked with a real OTLP/HTTP receiver. (Through Ray itself:
``tests/test_serve_ray_gateways.py``.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from assistant.config import load_config
from assistant.telemetry import carry
from tests.needs import module
from tests.waiting import until, until_async

module("opentelemetry.sdk.trace")

from assistant.serve_ray.traced import ReplicaTelemetry  # noqa: E402
from assistant.telemetry import names  # noqa: E402
from tests.otlp_receiver import otlp_receiver  # noqa: E402

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def telemetry_config(url: str, **more: Any) -> Any:
    return load_config(environ={}, overrides={"telemetry": {"otlp_endpoint": url, "schedule_delay_ms": 50, **more}})


def test_the_context_table_is_bounded_forgets_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(carry, "MAX_CALLS", 3)
    monkeypatch.setattr(carry, "_calls", type(carry._calls)())
    for i in range(5):
        carry.register(f"s{i}", lambda i=i: {"traceparent": f"tp{i}"})
    assert carry.registered() == 3
    assert carry.headers("s0") == {} and carry.headers("s4") == {"traceparent": "tp4"}  # the oldest went first
    carry.forget("s4")
    assert carry.headers("s4") == {} and carry.headers("") == {} and carry.headers("nobody") == {}

    def broken() -> dict[str, str]:
        raise RuntimeError("a span gone wrong")

    carry.register("s9", broken)
    assert carry.headers("s9") == {}  # a failing lookup costs the request nothing


async def test_a_replica_span_joins_the_call_it_was_sent_for() -> None:
    """The replica's span has the call's trace id and the call span as parent, its service names the role, and
    a request that carried no context makes no span (it would be a trace of its own)."""
    async with otlp_receiver() as rx:
        traced = ReplicaTelemetry(telemetry_config(rx.url), "ASR", "replica-1")
        try:
            t0 = time.time()
            traced.span(names.REPLICA_ASR, {"traceparent": TRACEPARENT}, t0, t0 + 0.25,
                        {names.QUEUE_MS: 3.0, names.AUDIO_S: 1.5})
            traced.span(names.REPLICA_ASR, {}, t0, t0 + 0.1, {})
            traced.span(names.REPLICA_ASR, None, t0, t0 + 0.1, {})
            with pytest.raises(RuntimeError), traced.recording(names.REPLICA_ASR, {"traceparent": TRACEPARENT},
                                                               time.time(), {}):
                raise RuntimeError("the engine failed on the user's words")
            with pytest.raises(asyncio.CancelledError), traced.recording(names.REPLICA_TTS, {
                    "traceparent": TRACEPARENT}, time.time(), {names.TTS_CHUNKS: 0}) as attrs:
                attrs[names.TTS_CHUNKS] = 2
                raise asyncio.CancelledError  # the gateway stopped it (a barge-in)
            await until(lambda: len(rx.named(names.REPLICA_ASR)) >= 2 and rx.named(names.REPLICA_TTS),
                        "the spans with a context", 10)
        finally:
            traced.close()
    ok, failed = sorted(rx.named(names.REPLICA_ASR), key=lambda s: s.status_code)
    assert len(rx.named(names.REPLICA_ASR)) == 2
    assert failed.status_message == "RuntimeError"  # the exception's kind only: its message may hold words
    cut = rx.named(names.REPLICA_TTS)[0]
    assert cut.attributes[names.CANCELLED] is True and cut.attributes[names.TTS_CHUNKS] == 2
    assert cut.status_code == 0  # a cancel is not a failure
    for s in (ok, failed):
        assert (s.trace_id, s.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
        assert s.resource["service.name"] == "assistant-asr" and s.resource[names.ROLE] == "asr"
        assert s.attributes[names.RAY_DEPLOYMENT] == "ASR" and s.attributes[names.RAY_REPLICA] == "replica-1"
    assert ok.kind == 2 and round(ok.ms) == 250 and ok.attributes[names.AUDIO_S] == 1.5  # SPAN_KIND_SERVER
    assert failed.status_code == 2  # STATUS_CODE_ERROR


def test_a_replica_without_an_endpoint_starts_nothing() -> None:
    traced = ReplicaTelemetry(load_config(environ={}), "TTS", "r")
    assert traced.telemetry is None
    traced.span(names.REPLICA_TTS, {"traceparent": TRACEPARENT}, 0.0, 1.0, {})  # nothing to do, nothing raised
    traced.close()


@contextlib.asynccontextmanager
async def fake_gateway() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A gateway as the dispatcher sees it: a ready report, and offers answered (their headers kept)."""
    from assistant.server.local import serve_on_loopback

    seen: list[dict[str, str]] = []

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready", "gateway": "gX", "sessions": 0, "max_sessions": 4})

    async def offer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"sdp": "v=0", "type": "answer", "session_id": "gX-1"})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_post("/api/offer", offer)
    async with serve_on_loopback(app) as url:
        yield url, seen


async def test_the_dispatcher_s_span_is_between_the_client_s_trace_and_the_gateway() -> None:
    """With telemetry on, ``assistant dispatch`` makes a ``dispatch`` span under the client's traceparent and
    forwards its own context, so the gateway's call span is the dispatcher span's child, in the client's trace."""
    from assistant.server.dispatch.app import create_dispatch_app
    from assistant.server.local import serve_on_loopback

    async with otlp_receiver() as rx, fake_gateway() as (gateway, seen):
        cfg = load_config(environ={}, overrides={
            "dispatch": {"gateways": [gateway], "poll_interval_s": 0.2},
            "telemetry": {"otlp_endpoint": rx.url, "schedule_delay_ms": 50}})
        async with serve_on_loopback(create_dispatch_app(cfg)) as front, aiohttp.ClientSession() as http:
            async def ready() -> bool:
                async with http.get(f"{front}/readyz") as r:
                    return r.status == 200

            await until_async(ready, "the dispatcher ready", 10)
            async with http.post(f"{front}/api/offer", json={"sdp": "v=0", "type": "offer"},
                                 headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"}) as r:
                assert r.status == 200
            await until(lambda: bool(rx.named(names.DISPATCH)), "the dispatch span", 10)
    span = rx.named(names.DISPATCH)[0]
    assert (span.trace_id, span.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert span.attributes[names.DISPATCH_GATEWAY] == "gX" and span.attributes[names.HTTP_STATUS] == 200
    assert span.attributes[names.DISPATCH_TRIES] == 1 and span.attributes[names.HTTP_ROUTE] == "/api/offer"
    assert span.resource["service.name"] == "assistant-dispatch"
    forwarded = seen[0]["traceparent"].split("-")
    assert forwarded[1] == CLIENT_TRACE and forwarded[2] == span.span_id  # the gateway's parent: the dispatch span
    assert seen[0].get("tracestate") == "vendor=1"
