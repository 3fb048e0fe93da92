"""OpenTelemetry for calls, turns and stages: every call a trace, every turn a span, every stage a child span,
and the turn latencies as OTel histograms, sent to any OTLP/HTTP collector (docs/telemetry.md).

The spans are built **after the fact**, once a turn has ended, from the turn's own marks (``pipeline/trace.py``)
and notes (``pipeline/turn.py``: ``TurnNotes``), with explicit start and end times: telemetry adds nothing to a
turn's way, and a span's duration is the turn's own measurement, not a second clock. The call span is started
(in memory) with the call's first turn or its close, and ended at the close; each turn's spans are ended, and so
queued for export, when the turn ends.

Off by default: with no ``telemetry.otlp_endpoint`` and none of ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, :func:`start` returns None and nothing of OpenTelemetry is imported.
On, export runs on a thread of its own from a bounded queue (``export.py``): a collector that is down, refuses or
hangs never delays a turn, and what does not fit is dropped and counted.

- ``names.py``: every span and attribute name, and why it is that one.
- ``export.py``: the bounded span processor that counts what it drops.
- ``spans.py``: one call's spans (:class:`~assistant.telemetry.spans.CallTrace`).
- ``setup.py``: the providers, exporters and histograms (:class:`~assistant.telemetry.setup.Telemetry`).
- ``carry.py``: each call's trace context, for the requests it sends to other processes (the Ray replicas).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from assistant.config import TelemetryConfig

if TYPE_CHECKING:
    from assistant.telemetry.setup import Telemetry

# The standard variables that switch the OTLP exporter on without our own setting (OpenTelemetry's spec).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def wanted(cfg: TelemetryConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Whether telemetry is on: an endpoint set here or in the standard environment, and the SDK not disabled
    (``OTEL_SDK_DISABLED=true``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(cfg.otlp_endpoint.strip() or any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES))


def start(cfg: TelemetryConfig, on_dropped: Callable[[int], None] | None = None,
          environ: Mapping[str, str] | None = None, role: str = "") -> Telemetry | None:
    """The process's telemetry when it is wanted (:func:`wanted`), else None; ``on_dropped(n)`` counts spans
    that could not be sent (the queue was full, or the collector refused them). ``role`` names a process that is
    not a gateway (``dispatch``, ``asr``, ``tts``, ``llm``): its spans' service is ``<service_name>-<role>``."""
    if not wanted(cfg, environ):
        return None
    from assistant.telemetry.setup import Telemetry

    return Telemetry(cfg, on_dropped=on_dropped, role=role)


def _ignore(**values: Any) -> None:
    """What :func:`forwarding` yields with telemetry off."""


@contextlib.contextmanager
def forwarding(telemetry: Telemetry | None, name: str, headers: dict[str, str],
               attributes: Mapping[str, Any]) -> Iterator[Callable[..., None]]:
    """``Telemetry.forwarding`` when telemetry is on (a span around forwarding a request, whose trace headers in
    ``headers`` become its own); off, nothing is done and the client's trace headers go on unchanged."""
    if telemetry is None:
        yield _ignore
        return
    with telemetry.forwarding(name, headers, attributes) as note:
        yield note
