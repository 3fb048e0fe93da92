"""Telemetry end to end: a spoken turn through the page protocol (real aiortc peers on loopback, the default CPU
stack, the echo responder) reaches a real OTLP/HTTP receiver as the call → turn → stage tree, under the trace the
client's ``traceparent`` named, with the turn's own numbers; and a collector that is absent, refuses or hangs
costs the turn nothing but dropped spans, counted on /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.needs import module

module("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from assistant.bench.audio_source import load_utterance  # noqa: E402
from assistant.bench.report import TurnResult  # noqa: E402
from assistant.bench.v2v import BenchSession, TurnSettings  # noqa: E402
from assistant.server.app import TELEMETRY  # noqa: E402
from assistant.server.services import Services  # noqa: E402
from assistant.telemetry import names  # noqa: E402
from tests.conftest import serve, test_config  # noqa: E402
from tests.otlp_receiver import ReceivedSpan, otlp_receiver  # noqa: E402
from tests.waiting import until  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STAGE_SPANS = {names.ENDPOINT, names.END_OF_TURN, names.ASR, names.LLM_OPERATION, names.TTS, names.PLAYOUT}


class TracedSession(BenchSession):
    """The bench's page client, sending a W3C traceparent with its offer (as an instrumented app would)."""

    def _headers(self) -> dict[str, str]:
        return {**super()._headers(), "traceparent": TRACEPARENT}


def telemetry_cfg(endpoint: str, **telemetry: Any) -> Any:
    return test_config(server={"idle_timeout_s": 30.0},
                       telemetry={"otlp_endpoint": endpoint, "schedule_delay_ms": 50, **telemetry})


async def dropped_on_metrics(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[1]) for line in text.splitlines()
               if line.startswith(names.DROPPED_METRIC + " "))


def event_body(client: BenchSession, kind: str) -> dict[str, Any]:
    return next(e.body for e in reversed(client.events) if e.body.get("type") == kind)


async def test_a_page_turn_is_a_call_turn_stage_tree(services: Services, shared_audio) -> None:
    async with otlp_receiver() as rx:
        cfg = telemetry_cfg(rx.url, include_text=True)
        async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
            client = TracedSession(index=0, url=url, http=http)
            await client.connect()
            try:
                result = await client.run_turn(load_utterance(shared_audio / "en_weather.wav"), 0, SETTINGS)
                await until(lambda: any(e.body.get("type") == "reply_done" for e in client.events), "reply_done")
            finally:
                await client.close()
            await until(lambda: rx.named(names.TURN), "the turn's spans at the receiver", 20)
            assert await dropped_on_metrics(http, url) == 0
        # The app is gone: its call span (ended at hang-up) and the histograms were sent at shutdown.
    assert result.status == "ok", result.reason
    metrics, done = event_body(client, "turn_metrics"), event_body(client, "reply_done")

    (call,) = rx.named(names.CALL)
    assert (call.trace_id, call.parent_id) == (TRACE_ID, PARENT_ID)  # the client's trace, its span our parent
    assert call.kind == 2  # SERVER
    a = call.attributes
    assert client.session_id == a[names.SESSION_ID] == a[names.CONVERSATION_ID]
    assert (a[names.TRANSPORT], a[names.CODEC], a[names.PROVIDER]) == ("page", "opus/48000/2", "echo")
    assert a[names.LANGUAGE] and a[names.CALL_TURNS] >= 1 and a[names.CLOSE_REASON] == "hangup"
    assert call.resource["service.name"] == "assistant"

    turns = {s.attributes[names.TURN_NUMBER]: s for s in rx.named(names.TURN)}
    turn = turns[metrics["turn"]]
    assert turn.parent_id == call.span_id and turn.trace_id == TRACE_ID
    t = turn.attributes
    # The turn's own numbers, the same as its turn_metrics and reply_done events said.
    for name, value in done["durations_ms"].items():
        assert t[names.TURN_PREFIX + name] == value, name
    assert t[names.INTERRUPTED] is False and t[names.EOT_REASON]
    assert "weather" in t[names.INPUT].lower() and "weather" in t[names.OUTPUT].lower()  # include_text

    stages = {s.name.split(" ")[0]: s for s in rx.children(turn)}
    assert set(stages) >= STAGE_SPANS, sorted(stages)
    assert all(s.trace_id == TRACE_ID for s in rx.spans)
    for s in stages.values():  # every stage inside its turn
        assert turn.start_ns <= s.start_ns <= s.end_ns <= turn.end_ns, s.name

    # Durations match the turn's marks (turn_metrics' timestamps are rounded to 0.1 ms).
    marks = metrics["timestamps_ms"]
    eot = stages[names.END_OF_TURN]
    assert abs(eot.ms - (marks["vad_end"] - marks["speech_end"])) <= 0.2
    assert eot.attributes[names.EOT_REASON] == t[names.EOT_REASON]
    assert abs(stages[names.ENDPOINT].start_ns / 1e6 - marks["speech_end"]) <= 0.2
    first_frame = _event(stages[names.PLAYOUT], names.FIRST_FRAME)
    v2v = (first_frame - stages[names.ENDPOINT].start_ns) / 1e6
    assert abs(v2v - metrics["durations_ms"]["server_v2v_ms"]) <= 0.2, (v2v, metrics["durations_ms"])
    asr = stages[names.ASR].attributes
    assert asr[names.ASR_PASS] in ("speculative", "final") and "weather" in asr[names.OUTPUT].lower()
    llm = stages[names.LLM_OPERATION].attributes
    assert llm[names.OPERATION] == "chat" and llm[names.PROVIDER] == "echo" and names.TTFT_MS in llm
    assert "weather" in llm[names.PROMPT].lower() and "weather" in llm[names.COMPLETION].lower()
    tts = stages[names.TTS].attributes
    assert tts[names.TTS_ENGINE] and tts[names.TTS_CHARS] > 0 and tts[names.TTS_TTFB_MS] >= 0
    # A span shows when a stage really happened; turn_metrics' marks are as the turn experienced them (a
    # speculative reply's audio, made before the commit, counts from the commit): never later than the real one.
    assert _event(stages[names.TTS], names.FIRST_AUDIO) / 1e6 <= marks["first_audio"] + 0.2

    # The same latencies as OTel histograms.
    assert {names.H_V2V, names.H_EOT, names.H_ASR, names.H_TTFT, names.H_TTS_TTFB, names.H_STAGE} <= rx.metric_names
    (v2v_point,) = rx.histograms[names.H_V2V][-1:]
    assert v2v_point.count >= 1


async def test_text_stays_out_of_spans_by_default(services: Services, shared_audio) -> None:
    async with otlp_receiver() as rx, serve(telemetry_cfg(rx.url), services) as (url, _app), \
            aiohttp.ClientSession() as http:
        result = await one_turn(url, http, shared_audio / "en_timer.wav")
    assert result.status == "ok", result.reason
    (call,) = rx.named(names.CALL)
    assert call.parent_id == "" and call.trace_id != TRACE_ID  # no traceparent: a trace of its own
    text_keys = {names.INPUT, names.OUTPUT, names.PROMPT, names.COMPLETION, names.BARGE_IN_HEARD}
    assert rx.named(names.TURN)
    for s in rx.spans:
        assert not text_keys & set(s.attributes), (s.name, s.attributes)
        assert not any("timer" in str(v).lower() for v in s.attributes.values()), s.name


@pytest.mark.parametrize("collector", ["absent", "refuse", "hang"])
async def test_a_collector_down_costs_the_turn_nothing(services: Services, shared_audio, collector: str) -> None:
    async with otlp_receiver("hang" if collector == "hang" else "refuse") as rx:
        endpoint = "http://127.0.0.1:9" if collector == "absent" else rx.url  # port 9 (discard): nobody there
        cfg = telemetry_cfg(endpoint, max_queue_size=4, export_timeout_s=0.5)
        async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
            result = await one_turn(url, http, shared_audio / "en_weather.wav")
            processor = app[TELEMETRY].processor
            await until_dropped(http, url)
            assert len(processor._queue) <= 4  # memory bounded by telemetry.max_queue_size
    assert result.status == "ok", result.reason  # answered as before
    assert "weather" in result.reply_text.lower()
    assert not rx.spans


async def one_turn(url: str, http: aiohttp.ClientSession, wav: Path) -> TurnResult:
    """One spoken turn over a fresh page session, hung up after."""
    client = BenchSession(index=0, url=url, http=http)
    await client.connect()
    try:
        return await client.run_turn(load_utterance(wav), 0, SETTINGS)
    finally:
        await client.close()


async def until_dropped(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(100):
        if await dropped_on_metrics(http, url) > 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the dropped-span counter never moved")


def _event(span: ReceivedSpan, name: str) -> int:
    return next(at for n, at, _ in span.events if n == name)


async def test_a_realtime_websocket_turn_is_the_same_tree(services: Services) -> None:
    """The Realtime API over a WebSocket (a typed turn, as an agent framework sends one): a call span of transport
    realtime_websocket under the upgrade request's traceparent, its turn with the responder's span; no ASR span,
    since no words were heard."""
    async with otlp_receiver() as rx, serve(telemetry_cfg(rx.url), services) as (url, _app), \
            aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{url}/v1/realtime?model=echo", headers={"traceparent": TRACEPARENT}) as ws:
            await ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it"}]}})
            await ws.send_json({"type": "response.create"})
            async with asyncio.timeout(60):
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT and msg.json().get("type") == "response.done":
                        break
        await until(lambda: rx.named(names.CALL), "the call span at the receiver", 20)
    (call,) = rx.named(names.CALL)
    assert (call.trace_id, call.parent_id) == (TRACE_ID, PARENT_ID)
    assert call.attributes[names.TRANSPORT] == "realtime_websocket"
    (turn,) = rx.named(names.TURN)
    assert turn.parent_id == call.span_id
    stages = {s.name for s in rx.children(turn)}
    assert names.LLM_OPERATION in stages and names.TTS in stages and names.ASR not in stages, stages


async def test_a_call_whose_span_cannot_end_still_frees_its_session_slot(services: Services) -> None:
    """Closing a session ends its call span, which reads the responder's ``describe()``; a plug-in whose describe
    raises by then costs the span, not the session's slot: the table empties, and with one slot a next call opens."""
    import json

    from assistant.server.app import SESSIONS

    async with otlp_receiver() as rx:
        cfg = telemetry_cfg(rx.url)
        cfg.server.max_sessions = 1
        cfg.respond.engine = "tests.fault_engines:DescribeFails"
        own = Services(cfg)
        own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                           services.end_of_turn)
        async with serve(cfg, own) as (url, app), aiohttp.ClientSession() as http:
            realtime = url.replace("http", "ws", 1) + "/v1/realtime"
            for _ in range(2):
                async with http.ws_connect(realtime, protocols=("realtime",)) as ws:
                    created = json.loads((await ws.receive(timeout=30)).data)
                    assert created["type"] == "session.created", created
                    own.responder.broken = True  # type: ignore[union-attr]
                await until(lambda: not app[SESSIONS], "the closed session's slot to be free", 30)
                own.responder.broken = False  # type: ignore[union-attr]
