"""A call's trace context, carried with its engine requests to other processes (the Ray Serve replicas).

A turn's spans are built when the turn has ended (``spans.py``), so while a turn runs the only span of the call
that has a context is the call span. A session registers how to get it (:func:`register`, only with telemetry on)
under its id; an engine client that sends work to another process (``serve_ray/client.py``) asks
:func:`headers` for the W3C ``traceparent``/``tracestate`` of the session a request is for and sends them along;
the replica hangs its own span under them (``serve_ray/traced.py``), so one trace crosses every process of a call.

No OpenTelemetry import here: with telemetry off nothing is registered and :func:`headers` answers ``{}``. The
table is bounded (:data:`MAX_CALLS`, least recently registered first out) and a session leaves it at its close.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_CALLS = 4096  # sessions whose context is kept: far more than a process holds at once
Headers = dict[str, str]

_calls: OrderedDict[str, Callable[[], Headers]] = OrderedDict()


def register(session_id: str, context_of: Callable[[], Headers]) -> None:
    """``context_of()`` gives the session's call-span context as W3C headers, when an engine request asks."""
    if not session_id:
        return
    _calls.pop(session_id, None)
    _calls[session_id] = context_of
    while len(_calls) > MAX_CALLS:
        _calls.popitem(last=False)


def forget(session_id: str) -> None:
    """The session closed: its requests carry no context from now on."""
    _calls.pop(session_id, None)


def headers(session_id: str) -> Headers:
    """The W3C trace headers of the session's call span (``{}`` when telemetry is off, the session unknown or
    its context unsampled). Never raises: a failure here must not fail the request it was for."""
    context_of = _calls.get(session_id) if session_id else None
    if context_of is None:
        return {}
    try:
        return dict(context_of())
    except Exception as exc:
        log.debug("telemetry_context_failed session=%s error=%r", session_id, exc)
        return {}


def registered() -> int:
    """How many sessions are in the table (tests)."""
    return len(_calls)
