"""What every synthesis route does around its work, whatever its protocol (``/api/tts``, ``/ws/tts``,
``/v1/audio/speech``): one outcome per request, counted on ``/metrics`` (``tts_requests_total{outcome}``) and
logged as one ``tts_request`` line when the request ends; the cut of a stream that failed after its headers
(:class:`StreamAborted`); and the error rows their documentation shares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from aiohttp import web

from assistant.server.openapi import Doc
from assistant.server.tts_api.service import TTSService

log = logging.getLogger(__name__)


class Outcome:
    """How one request ended: ``value`` is ``error`` until the handler names it; a client that went away
    (``ConnectionResetError``) and a cancelled request are named by :func:`request_outcome` itself."""

    def __init__(self) -> None:
        self.value = "error"
        self.t0 = time.perf_counter()

    @property
    def ms(self) -> float:
        """Milliseconds since the request began."""
        return (time.perf_counter() - self.t0) * 1000


@contextlib.contextmanager
def request_outcome(svc: TTSService, transport: str) -> Iterator[Outcome]:
    """The block is one request: its outcome is counted and logged when it ends, however it ends."""
    outcome = Outcome()
    try:
        yield outcome
    except ConnectionResetError:
        outcome.value = "client_gone"
        raise  # the error middleware logs nothing more than this request's line below
    except asyncio.CancelledError:
        outcome.value = "cancelled"
        raise
    finally:
        svc.metrics.tts_requests_total.labels(outcome=outcome.value).inc()
        log.info("tts_request transport=%s outcome=%s ms=%.0f", transport, outcome.value, outcome.ms)


class StreamAborted(Exception):
    """A streamed response failed after its headers were sent; the connection was cut (or, for server-sent
    events, ended with an error event)."""

    def __init__(self, outcome: str, response: web.StreamResponse) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.response = response


def synthesis_errors(make: Callable[[str], Doc], rows: dict[str, str]) -> dict[str, Doc]:
    """A synthesis route's documented errors in its API's shape (``make``), by status: what every synthesis
    shares (401 without the bearer token, 503 while the models load, 504 past ``tts.timeout_s``) and the route's
    own ``rows`` (status → description; one of the shared statuses there says it in the route's words)."""
    shared = {"401": "missing or wrong bearer token", "503": "models still loading",
              "504": "synthesis over tts.timeout_s"}
    return {status: make(text) for status, text in sorted((shared | rows).items())}
