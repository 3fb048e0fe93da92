"""Telemetry's parts without a call: off by default (nothing imported), switched on by the standard environment,
and the span processor that keeps memory bounded and counts what a refusing or hanging collector costs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from assistant.config import TelemetryConfig, load_config
from assistant.telemetry import wanted
from tests.needs import module

module("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from assistant.telemetry.export import BoundedSpanProcessor  # noqa: E402
from assistant.telemetry.spans import ns, parent_context  # noqa: E402


def test_off_unless_an_endpoint_is_set() -> None:
    cfg = TelemetryConfig()
    assert not wanted(cfg, {})
    assert wanted(cfg, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(cfg, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert wanted(TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318"), {})
    assert not wanted(TelemetryConfig(otlp_endpoint="http://127.0.0.1:4318"), {"OTEL_SDK_DISABLED": "true"})
    cfg = load_config(environ={"ASSISTANT_TELEMETRY__OTLP_ENDPOINT": "http://x:4318",
                               "ASSISTANT_TELEMETRY__INCLUDE_TEXT": "true"})
    assert cfg.telemetry.otlp_endpoint == "http://x:4318" and cfg.telemetry.include_text
    assert TelemetryConfig().include_text is False  # text stays out of spans unless asked for


def test_off_imports_no_opentelemetry() -> None:
    """With telemetry off, a whole app (and a dispatcher's) is built without importing OpenTelemetry at all: no
    cost to pay."""
    code = (
        "import sys\n"
        "from assistant.config import load_config\n"
        "from assistant.server.app import create_app\n"
        "from assistant.server.dispatch.app import create_dispatch_app\n"
        "create_app(load_config(environ={}))\n"
        "create_dispatch_app(load_config(environ={}, overrides={'dispatch': {'gateways': ['http://127.0.0.1:9']}}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_traceparent_is_the_parent_and_a_bad_one_is_ignored() -> None:
    from opentelemetry import trace

    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = trace.get_current_span(parent_context(good)).get_span_context()
    assert (format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")) == (
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    for bad in ("", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"):
        assert not trace.get_current_span(parent_context(bad)).get_span_context().is_valid


class Exporter(SpanExporter):
    """Answers as told: ``ok``, ``refuse``, or ``hang`` (until released)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()
        self.got = 0
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.mode == "hang":
            self.release.wait(10)
            return SpanExportResult.FAILURE
        if self.mode == "refuse":
            return SpanExportResult.FAILURE
        self.got += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def _spans(processor: BoundedSpanProcessor, n: int) -> float:
    """End ``n`` spans through ``processor``; the longest ``end()`` took (seconds)."""
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    worst = 0.0
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        t0 = time.perf_counter()
        span.end()
        worst = max(worst, time.perf_counter() - t0)
    return worst


def test_a_live_exporter_gets_every_span() -> None:
    counted: list[int] = []
    exporter = Exporter("ok")
    processor = BoundedSpanProcessor(exporter, 64, 0.05, counted.append, max_batch=8)
    _spans(processor, 50)
    assert processor.force_flush(5000)
    processor.shutdown(1)
    assert exporter.got == 50 and processor.dropped == 0 and not counted


def test_a_hanging_collector_holds_memory_to_the_queue_and_counts_the_rest() -> None:
    counted: list[int] = []
    exporter = Exporter("hang")
    processor = BoundedSpanProcessor(exporter, 16, 0.01, counted.append, max_batch=4)
    worst = _spans(processor, 500)
    assert len(processor._queue) <= 16  # memory stays at the bound while the collector hangs
    assert processor.dropped >= 500 - 16 - 4  # everything past the queue (and one batch in flight) is counted
    assert sum(counted) == processor.dropped
    assert worst < 0.05, f"a span's end() waited {worst * 1000:.1f} ms on a hanging collector"
    exporter.release.set()
    processor.shutdown(2)
    assert processor.dropped == 500  # the hung batches failed too: not one span got out, and each is counted


def test_a_refusing_collector_counts_every_span_dropped() -> None:
    counted: list[int] = []
    exporter = Exporter("refuse")
    processor = BoundedSpanProcessor(exporter, 64, 0.01, counted.append, max_batch=8)
    _spans(processor, 40)
    processor.force_flush(5000)
    processor.shutdown(1)
    assert processor.dropped == 40 == sum(counted) and exporter.calls >= 5


async def test_a_turn_s_spans_from_its_own_marks_barge_in_tools_and_failure() -> None:
    """A turn built by hand (no call needed): its stages hang under it with the turn's own times, a barge-in is an
    event with what was heard (its text only with include_text), each tool call the model wrote is an
    ``execute_tool`` span under the responder's, and a failed stage marks the turn and its span as errors."""
    import numpy as np
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from assistant.pipeline.trace import Ending, Span
    from assistant.pipeline.turn import BargeIn, Turn
    from assistant.respond.base import ToolCallTiming, Usage
    from assistant.telemetry import names
    from assistant.telemetry.spans import CallTrace

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[tuple[str, float | None, dict[str, str]]] = []

    def observe(name: str, seconds: float | None, **attributes: str) -> None:
        seen.append((name, seconds, attributes))

    s = 1_000.0  # the user's speech end (wall s)
    turn = Turn(3, np.zeros(160, np.float32), 160, 0, speculative=True)
    turn.transcript, turn.language, turn.reply.text = "what's the weather", "en", "Sunny. And"
    turn.reply.spoken.append((0, "Sunny."))
    for stage, at in {"speech_end": s, "vad_end": s + 0.3, "asr_done": s + 0.35, "first_text": s + 0.4,
                      "first_tts_text": s + 0.42, "first_audio": s + 0.5, "first_frame_sent": s + 0.52,
                      "reply_done": s + 1.2}.items():
        turn.trace.mark(stage, at)
    turn.trace.asr = Span(s + 0.2, s + 0.21, s + 0.35)
    turn.trace.ending = Ending(s, s + 0.3, s + 0.2, text=True, model=Span(s + 0.2, s + 0.2, s + 0.29),
                               reason="model_complete")
    n = turn.notes
    n.asr_kind, n.respond_started, n.respond_done = "speculative", s + 0.36, s + 0.9
    n.asr_remote = (s + 0.205, s + 0.345)  # the pass ran on a Ray replica: 5 ms there, 5 ms back
    n.usage = Usage(12, 5)
    n.tool_calls.append(ToolCallTiming("call_1", "lookup_forecast", '{"city": "Paris"}', s + 0.37, s + 0.39))
    n.tts_engine, n.tts_voice, n.tts_done = "piper", "en_US-amy", s + 1.0
    n.barge_ins.append(BargeIn(s + 1.1, "speech", False, "Sunny."))
    n.ended = s + 1.2
    turn.failed = "tts"

    for include_text in (False, True):
        exporter.clear()
        call = CallTrace(provider.get_tracer("t"), observe, "sid", s - 5, describe=lambda: {
            names.TRANSPORT: "phone", names.PROVIDER: "openai", names.REQUEST_MODEL: "gpt-x"},
            include_text=include_text)
        call.turn_ended(turn)
        call.end("hangup", s + 2)
        spans = {sp.name: sp for sp in exporter.get_finished_spans()}
        hops = [sp for sp in exporter.get_finished_spans() if sp.name == "ray.hop"]
        assert set(spans) == {"call", "turn", "vad.endpoint", "end_of_turn", "end_of_turn.model", "asr", "ray.hop",
                              "chat gpt-x", "execute_tool lookup_forecast", "tts", "playout"}
        assert sorted(h.attributes[names.RAY_LEG] for h in hops) == ["request", "response"]
        assert all(h.parent.span_id == spans["asr"].context.span_id for h in hops)
        assert spans["asr"].attributes[names.RAY_HOP_MS] == 10.0
        root, t = spans["call"], spans["turn"]
        assert root.parent is None and t.parent.span_id == root.context.span_id
        assert spans["end_of_turn.model"].parent.span_id == spans["end_of_turn"].context.span_id
        assert spans["execute_tool lookup_forecast"].parent.span_id == spans["chat gpt-x"].context.span_id
        assert (t.start_time, t.end_time) == (ns(s), ns(s + 1.2))  # from the speech end to the turn's end
        assert (spans["asr"].start_time, spans["asr"].end_time) == (ns(s + 0.2), ns(s + 0.35))
        assert spans["end_of_turn"].end_time - spans["end_of_turn"].start_time == ns(s + 0.3) - ns(s)
        assert t.attributes[names.INTERRUPTED] is True and t.attributes[names.TURN_NUMBER] == 3
        assert t.attributes[names.FAILED_STAGE] == "tts" and t.status.status_code.name == "ERROR"
        assert spans["tts"].status.status_code.name == "ERROR"
        assert t.attributes[names.EOT_REASON] == "model_complete"
        assert t.attributes["assistant.turn.server_v2v_ms"] == turn.trace.durations_ms()["server_v2v_ms"]
        llm = spans["chat gpt-x"].attributes
        assert (llm[names.INPUT_TOKENS], llm[names.OUTPUT_TOKENS], llm[names.TTFT_MS]) == (12, 5, 40.0)
        (barge,) = t.events
        assert barge.name == "barge_in" and barge.attributes[names.BARGE_IN_HEARD_CHARS] == 6
        texts = [v for sp in spans.values() for v in sp.attributes.values() if "weather" in str(v).lower()]
        texts += [v for v in barge.attributes.values() if "Sunny" in str(v)]
        tool = spans["execute_tool lookup_forecast"].attributes
        if include_text:
            assert t.attributes[names.INPUT] == "what's the weather" and llm[names.COMPLETION] == "Sunny. And"
            assert barge.attributes[names.BARGE_IN_HEARD] == "Sunny." and "Paris" in tool[names.TOOL_ARGUMENTS]
        else:
            assert not texts and names.TOOL_ARGUMENTS not in tool  # no words of the user's or the reply's
        assert root.attributes[names.CALL_TURNS] == 1 and root.attributes[names.CLOSE_REASON] == "hangup"
    observed = {name for name, _, _ in seen}
    assert {names.H_V2V, names.H_EOT, names.H_ASR, names.H_TTFT, names.H_TTS_TTFB, names.H_STAGE} <= observed
    assert ("assistant.turn.server_v2v", 0.52, {}) in [(a, round(b or 0, 3), c) for a, b, c in seen]


def test_the_dispatcher_passes_the_trace_context_on() -> None:
    """``assistant dispatch`` forwards a client's traceparent and tracestate to the gateway (offers, WHIP, trickle,
    WebSockets), so the gateway's call span joins the client's trace; what is not named still stays behind."""
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from assistant.server.dispatch.forward import WS_FORWARD_HEADERS, forward_headers
    from assistant.server.limits import LIMITS, Limits

    app = web.Application()
    app[LIMITS] = Limits(load_config(environ={}))
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    request = make_mocked_request("POST", "/api/offer", app=app, headers={
        "traceparent": traceparent, "tracestate": "vendor=1", "Cookie": "secret=1"})
    for names_ in ((), WS_FORWARD_HEADERS):
        out = forward_headers(request, *([names_] if names_ else []))
        assert out["traceparent"] == traceparent and out["tracestate"] == "vendor=1" and "Cookie" not in out
