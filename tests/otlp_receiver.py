"""A real OTLP/HTTP receiver for tests: an aiohttp server on 127.0.0.1 that decodes what an OpenTelemetry exporter
sends (``/v1/traces``, ``/v1/metrics``: protobuf, optionally gzipped) with the ``opentelemetry-proto`` types, and
keeps it as plain Python. ``mode`` says how it answers: ``ok``; ``refuse`` (400: the exporter does not retry);
``hang`` (never answers until the receiver stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    resource: dict[str, Any]
    status_message: str = ""

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class Receiver:
    mode: str = "ok"
    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    metric_names: set[str] = field(default_factory=set)
    histograms: dict[str, list[Any]] = field(default_factory=dict)  # name → its data points
    requests: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _body(self, request: web.Request) -> bytes:
        raw = await request.read()
        return gzip.decompress(raw) if request.headers.get("Content-Encoding") == "gzip" else raw

    async def _answer(self) -> web.Response | None:
        self.requests += 1
        if self.mode == "refuse":
            return web.Response(status=400, text="refused")
        if self.mode == "hang":
            await self._stop.wait()
            return web.Response(status=503)
        return None

    async def traces(self, request: web.Request) -> web.Response:
        if (refusal := await self._answer()) is not None:
            return refusal
        req = ExportTraceServiceRequest.FromString(await self._body(request))
        for rs in req.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(ReceivedSpan(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.start_time_unix_nano,
                        s.end_time_unix_nano, s.kind, attrs(s.attributes),
                        [(e.name, e.time_unix_nano, attrs(e.attributes)) for e in s.events], s.status.code, resource,
                        s.status.message))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def metrics(self, request: web.Request) -> web.Response:
        if (refusal := await self._answer()) is not None:
            return refusal
        req = ExportMetricsServiceRequest.FromString(await self._body(request))
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    self.metric_names.add(m.name)
                    if m.WhichOneof("data") == "histogram":
                        self.histograms.setdefault(m.name, []).extend(m.histogram.data_points)
        return web.Response(body=ExportMetricsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.parent_id == parent.span_id]


@contextlib.asynccontextmanager
async def otlp_receiver(mode: str = "ok") -> AsyncIterator[Receiver]:
    receiver = Receiver(mode)
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", receiver.traces)
    app.router.add_post("/v1/metrics", receiver.metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    receiver.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield receiver
    finally:
        receiver._stop.set()
        await runner.cleanup()


@contextlib.contextmanager
def threaded_otlp_receiver() -> Iterator[Receiver]:
    """:func:`otlp_receiver` on a thread and loop of its own: for a module whose processes (gateways, replicas)
    export between its tests, when no test's loop is running to answer them."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    held: dict[str, Any] = {}

    async def run() -> None:
        held["stop"] = asyncio.Event()
        async with otlp_receiver() as receiver:
            held["receiver"] = receiver
            started.set()
            await held["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="otlp-receiver", daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the OTLP receiver did not start")
    try:
        yield held["receiver"]
    finally:
        loop.call_soon_threadsafe(held["stop"].set)
        thread.join(10)
        loop.close()
