"""The process's OpenTelemetry: a tracer and a meter of our own (the global providers are left to the application
that embeds us), OTLP/HTTP exporters, the bounded span processor, and the turn histograms.

The standard environment is honoured: ``OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT``, ``_HEADERS`` (Honeycomb's
team key, Langfuse's basic auth), ``_TIMEOUT``, ``_COMPRESSION`` and ``_CERTIFICATE`` by the exporters themselves;
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` by the resource; ``OTEL_TRACES_SAMPLER`` by the tracer
provider (parent-based by default: a caller's unsampled ``traceparent`` is respected); ``OTEL_METRIC_EXPORT_INTERVAL``
by the metric reader. ``telemetry.otlp_endpoint``, when set, is the base URL both signals go under.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from assistant.config import TelemetryConfig
from assistant.telemetry import names
from assistant.telemetry.export import BoundedSpanProcessor
from assistant.telemetry.spans import PROPAGATOR, CallTrace, clean_attributes, ns, parent_context

log = logging.getLogger(__name__)

SCOPE = "assistant"  # the instrumentation scope our spans and histograms carry
TRACE_HEADERS = ("traceparent", "tracestate")  # the W3C trace context's headers
# ``note(gateway=..., status=..., tries=...)``'s short keys (the dispatcher's), as attribute names.
NOTE_NAMES = {"gateway": names.DISPATCH_GATEWAY, "status": names.HTTP_STATUS, "tries": names.DISPATCH_TRIES}
# Bucket bounds in seconds for the turn histograms: the same as /metrics' stage histograms (server/metrics.py).
LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


def _env_set(*variables: str) -> bool:
    return any(os.environ.get(v, "").strip() for v in variables)


class Telemetry:
    """Tracer, meter and exporters for one process; :meth:`call` gives each session its spans."""

    def __init__(self, cfg: TelemetryConfig, on_dropped: Callable[[int], None] | None = None,
                 role: str = "") -> None:
        self.cfg = cfg
        service = f"{cfg.service_name}-{role}" if role else cfg.service_name
        attributes: dict[str, str] = {names.ROLE: role or "gateway"}
        if not _env_set("OTEL_SERVICE_NAME"):
            attributes["service.name"] = service
        resource = Resource.create(attributes)
        base = cfg.otlp_endpoint.strip().rstrip("/")
        # The exporter reads its own timeout variable when given none: ours only where the environment is silent.
        timeout = None if _env_set("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") \
            else cfg.export_timeout_s
        span_exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None, timeout=timeout)
        self.processor = BoundedSpanProcessor(span_exporter, cfg.max_queue_size, cfg.schedule_delay_ms / 1000,
                                              on_dropped)
        # shutdown_on_exit off: the app stops us itself (server/app.py), once; a second stop at exit only warns.
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(self.processor)
        self.tracer = self.tracer_provider.get_tracer(SCOPE)
        self.meter_provider: MeterProvider | None = None
        self.histograms: dict[str, Histogram] = {}
        if cfg.metrics:
            metric_exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None, timeout=timeout)
            reader = PeriodicExportingMetricReader(metric_exporter)
            self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
            self.histograms = _histograms(self.meter_provider.get_meter(SCOPE))
        log.info("telemetry_on role=%s endpoint=%s metrics=%s include_text=%s queue=%d", role or "gateway",
                 base or "(environment)", cfg.metrics, cfg.include_text, cfg.max_queue_size)

    @property
    def dropped(self) -> int:
        return self.processor.dropped

    def call(self, session_id: str, started: float, traceparent: str = "",
             describe: Callable[[], Mapping[str, Any]] | None = None) -> CallTrace:
        """One session's spans: its call span begins at ``started`` (wall s), under the caller's ``traceparent``
        when it sent a valid one; ``describe()`` gives the call's attributes once they are all known."""
        return CallTrace(self.tracer, self.observe, session_id, started, traceparent, describe,
                         include_text=self.cfg.include_text)

    def served(self, name: str, headers: Mapping[str, str], start: float, end: float,
               attributes: Mapping[str, Any], error: str = "") -> None:
        """A span of work this process did for a request that carried ``headers`` (a call's W3C context:
        ``carry.py``), from ``start`` to ``end`` (wall s), built after the fact as the turn's spans are. A request
        without a context (telemetry off at the gateway, a TTS API call) makes no span: it would be a trace of its
        own, with nothing to join it to."""
        traceparent = headers.get("traceparent", "")
        if not traceparent:
            return
        context = parent_context(traceparent, headers.get("tracestate", ""))
        span = self.tracer.start_span(name, context=context, kind=SpanKind.SERVER,
                                      attributes=clean_attributes(attributes), start_time=ns(start))
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=ns(max(start, end)))

    @contextlib.contextmanager
    def forwarding(self, name: str, headers: dict[str, str],
                   attributes: Mapping[str, Any]) -> Iterator[Callable[..., None]]:
        """A span around forwarding one request (the dispatcher's): under the client's ``traceparent`` in
        ``headers``, which it replaces with its own, so what the next process makes is its child. Yields
        ``note(key=value, ...)`` for attributes learnt on the way (names from :mod:`names`)."""
        context = parent_context(headers.get("traceparent", ""), headers.get("tracestate", ""))
        span = self.tracer.start_span(name, context=context, kind=SpanKind.SERVER,
                                      attributes=clean_attributes(attributes))
        for key in TRACE_HEADERS:
            headers.pop(key, None)
        PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))

        def note(**values: Any) -> None:
            span.set_attributes(clean_attributes({NOTE_NAMES.get(k, k): v for k, v in values.items()}))

        try:
            yield note
        except BaseException as exc:
            status = getattr(exc, "status", None)
            if isinstance(status, int):
                span.set_attribute(names.HTTP_STATUS, status)
            if not isinstance(status, int) or status >= 500:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    def observe(self, name: str, seconds: float | None, **attributes: str) -> None:
        """One measurement of a histogram of :mod:`names` (``H_*``), in seconds; None is no measurement."""
        hist = self.histograms.get(name)
        if hist is not None and seconds is not None:
            hist.record(max(seconds, 0.0), attributes or None)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Send what is held (within ``export_timeout_s``), then stop; what is left is counted dropped."""
        timeout_s = self.cfg.export_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        self.processor.shutdown(timeout_s)
        if self.meter_provider is not None:
            left_ms = max(0.0, timeout_s - (time.monotonic() - t0)) * 1000
            try:
                self.meter_provider.shutdown(timeout_millis=left_ms)
            except Exception as exc:  # a collector gone at shutdown
                log.debug("otel_meter_shutdown_failed error=%r", exc)
        log.info("telemetry_off exported=%d dropped=%d", self.processor.exported, self.processor.dropped)


def _histograms(meter: Meter) -> dict[str, Histogram]:
    """The turn histograms (names.H_*), all in seconds with the buckets /metrics uses."""
    described = {
        names.H_V2V: "the user's speech end to the reply's first frame sent (server voice-to-voice)",
        names.H_EOT: "the user's speech end to the turn committed (end-of-turn delay)",
        names.H_ASR: "the turn's ASR pass, its wait for a worker included",
        names.H_TTFT: "the responder asked to its first text (time to first token)",
        names.H_TTS_TTFB: "first text handed to TTS to its first audio",
        names.H_STAGE: "every part of a turn's turn_metrics durations, by stage (as /metrics' assistant_stage_seconds)",
    }
    out: dict[str, Histogram] = {}
    for name, description in described.items():
        try:
            out[name] = meter.create_histogram(name, unit="s", description=description,
                                               explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS))
        except TypeError:  # an API older than bucket advice: the SDK's default buckets
            out[name] = meter.create_histogram(name, unit="s", description=description)
    return out
