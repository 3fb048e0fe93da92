"""Telemetry's parts without a call: off by default (nothing imported), switched on by the standard environment,
and the span processor that keeps memory bounded and counts what a refusing or hanging collector costs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import pytest

from assistant.config import TelemetryConfig, load_config
from assistant.telemetry import wanted

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from assistant.telemetry.export import BoundedSpanProcessor
from assistant.telemetry.spans import parent_context


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
    """With telemetry off, a whole app is built without importing OpenTelemetry at all: no cost to pay."""
    code = (
        "import sys\n"
        "from assistant.config import load_config\n"
        "from assistant.server.app import create_app\n"
        "create_app(load_config(environ={}))\n"
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
