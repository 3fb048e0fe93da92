"""A replica's own spans, in the trace of the call each request is for (docs/telemetry.md).

A gateway sends each engine request with the W3C context of the call it serves (``telemetry/carry.py``); the
replica starts telemetry from the same ``[telemetry]`` settings (handed over with its config; the standard
``OTEL_*`` variables of the replica's node apply as anywhere), as service ``<service_name>-<asr|tts|llm>``, and
records its work on each request as one span under the call span, built after the fact from the times it took
anyway: ``ray.replica.asr``, ``ray.replica.tts``, ``ray.replica.llm`` (names in ``telemetry/names.py``). A request
without a context (telemetry off at the gateway, a TTS API request) adds nothing. Off (no endpoint anywhere),
nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from assistant.config import Config
from assistant.telemetry import names, start

log = logging.getLogger(__name__)

Headers = dict[str, str]
SHUTDOWN_S = 2.0  # what a replica's stop waits for its last spans to go


class ReplicaTelemetry:
    """The spans one replica adds to its callers' traces."""

    def __init__(self, cfg: Config, deployment: str, replica: str) -> None:
        # No histograms here: the turn's latencies are the gateway's (it sees the whole turn).
        self.telemetry = start(dataclasses.replace(cfg.telemetry, metrics=False), role=deployment.lower())
        self.include_text = cfg.telemetry.include_text
        self.where = {names.RAY_DEPLOYMENT: deployment, names.RAY_REPLICA: replica}

    def span(self, name: str, headers: Mapping[str, str] | None, start_s: float, end_s: float,
             attributes: Mapping[str, Any], error: str = "") -> None:
        """One span of this replica's work on a request, under the context the request carried. Never raises:
        telemetry must not fail the request it describes."""
        if self.telemetry is None or not headers:
            return
        try:
            self.telemetry.served(name, headers, start_s, end_s, {**self.where, **attributes}, error)
        except Exception as exc:
            log.debug("replica_span_failed name=%s error=%r", name, exc)

    @contextlib.contextmanager
    def recording(self, name: str, headers: Mapping[str, str] | None, start_s: float,
                  attributes: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """One span of the work done in the block (from ``start_s`` to the block's end), with ``attributes`` as
        the block leaves them; a block cancelled (the caller stopped it) says so, a failing one is an ERROR."""
        error = ""
        try:
            yield attributes
        except (GeneratorExit, asyncio.CancelledError):
            attributes[names.CANCELLED] = True
            raise
        except Exception as exc:
            error = type(exc).__name__  # its kind only: its message may hold the user's words
            raise
        finally:
            self.span(name, headers, start_s, time.time(), attributes, error)

    def close(self) -> None:
        """Send what is held (the replica is stopping)."""
        telemetry, self.telemetry = self.telemetry, None
        if telemetry is not None:
            telemetry.shutdown(SHUTDOWN_S)


class TracedReplica:
    """A replica class that adds spans (``traced``, set in its ``__init__``): the last of them go out when Serve
    stops the replica (it calls ``__del__``)."""

    traced: ReplicaTelemetry

    def __del__(self) -> None:
        traced = getattr(self, "traced", None)  # not there when __init__ failed before it
        if traced is not None:
            traced.close()
