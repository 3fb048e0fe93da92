"""OpenTelemetry (``[telemetry]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class TelemetryConfig:
    """OpenTelemetry traces and metrics (``assistant/telemetry/``; docs/telemetry.md): every call a trace, every
    turn a span with its stages as children, the turn latencies as OTel histograms. Off unless an endpoint is set
    (here, or by the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""

    otlp_endpoint: str = setting(
        "", "OTLP/HTTP collector base URL (http://127.0.0.1:4318: traces to /v1/traces, metrics to /v1/metrics); "
        "empty: the OTEL_EXPORTER_OTLP_* environment variables, and with none of those telemetry is off"
    )
    service_name: str = setting("assistant", "service.name of the spans (OTEL_SERVICE_NAME wins when set)")
    include_text: bool = setting(
        False, "put transcripts and reply text into spans (gen_ai.prompt / gen_ai.completion, input.value / "
        "output.value): off, spans carry only sizes and timings"
    )
    metrics: bool = setting(True, "export the turn latencies as OTel histograms too (beside Prometheus' /metrics)")
    max_queue_size: int = setting(
        2048, "spans held for export at most; past it new spans are dropped and counted "
        "(assistant_telemetry_spans_dropped_total)"
    )
    export_timeout_s: float = setting(5.0, "longest one export to the collector may take (a slow collector never holds "
                                      "a turn: export runs on its own thread)")
    schedule_delay_ms: int = setting(1000, "how often the spans held are sent")
