"""The outgoing-call API: ``POST /api/sip/calls`` dials, ``GET /api/sip/calls/{call_id}`` says how it went, and
``GET /api/sip/calls/{call_id}/events`` streams its events (Server-Sent Events) until it ends.

The key needs the ``dial`` scope (or is the admin's): a browser's ``call`` key cannot dial out. A call's record
is its dialer's: another key is told "no such call" (404), as with sessions. What may be dialed is
``sip.dial_allow``'s (``dialer.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import web

from assistant.server.http import CONFIG, HTTPJSONError, WriteStalled, read_json, write_within
from assistant.server.keys import principal_of
from assistant.server.openapi import documented, error, json_body
from assistant.server.sip.dialer import OutgoingCall
from assistant.server.sip.state import require
from assistant.server.voice.signaling import caller, check_choices, check_language

EVENT_WRITE_TIMEOUT_S = 10.0  # an event stream whose reader takes nothing this long is cut
KEEPALIVE_S = 15.0  # an SSE comment this often, so proxies keep the stream open while a call lasts
FIELDS = {"to", "responder", "voice", "language"}

DIAL_REQUEST = {
    "type": "object", "required": ["to"],
    "properties": {
        "to": {"type": "string", "description": "a number (+15551234567) or a SIP URI, dialed through sip.trunk; "
               "it must match sip.dial_allow"},
        "responder": {"type": "string"}, "voice": {"type": "string"},
        "language": {"type": "string", "description": "the language the call is heard in (auto or a code)"},
    },
}
CALL_RECORD = {
    "type": "object", "required": ["call_id", "to", "state", "events"],
    "properties": {
        "call_id": {"type": "string"}, "to": {"type": "string"},
        "state": {"type": "string", "enum": ["dialing", "ringing", "answered", "busy", "no_answer", "failed",
                                            "ended"]},
        "status": {"type": ["integer", "null"], "description": "the final SIP status"},
        "session_id": {"type": ["string", "null"], "description": "once answered: the session (DELETE "
                       "/api/sessions/{id} hangs up)"},
        "events": {"type": "array", "items": {"type": "object"}},
    },
}
CALL_ID = [{"name": "call_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _record(request: web.Request) -> OutgoingCall:
    dialer = require(request.app).dialer
    assert dialer is not None
    record = dialer.records.get(request.match_info["call_id"])
    if record is None or not principal_of(request).owns(record.owner):
        raise HTTPJSONError(404, "unknown_call", "no such call")
    return record


@documented("Dial out through the SIP trunk and put the assistant on the line (admin, or a key with the dial scope)",
            request={"application/json": {"schema": DIAL_REQUEST}},
            responses={"202": json_body(CALL_RECORD, "dialing: follow it at its location or its events"),
                       "400": error("bad request"), "403": error("the destination is not in sip.dial_allow"),
                       "404": error("SIP is off"), "409": error("no trunk configured"),
                       "429": error("too many dials or sessions"), "503": error("every line or slot is busy")})
async def dial(request: web.Request) -> web.Response:
    """``POST /api/sip/calls``."""
    service = require(request.app)
    cfg = request.app[CONFIG]
    data = await read_json(request, cfg.server.max_body_bytes)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise HTTPJSONError(400, "bad_request", f"unknown field {unknown[0]!r}; known: {', '.join(sorted(FIELDS))}")
    to = data.get("to")
    if not isinstance(to, str) or not to.strip() or len(to) > 256:
        raise HTTPJSONError(400, "bad_request", "'to' must be a number or a SIP URI")
    responder, voice = data.get("responder"), data.get("voice")
    check_choices(request.app, responder, voice)
    language = check_language(request.app, data["language"]) if data.get("language") is not None else None
    assert service.dialer is not None
    record = service.dialer.start(to, caller(request), responder, voice, language)
    return web.json_response({**record.describe(), "location": f"/api/sip/calls/{record.id}",
                              "events_url": f"/api/sip/calls/{record.id}/events"}, status=202)


@documented("An outgoing call's state and events (its dialer's key, or the admin)", parameters=CALL_ID,
            responses={"200": json_body(CALL_RECORD, "the call"), "404": error("no such call")})
async def get_call(request: web.Request) -> web.Response:
    """``GET /api/sip/calls/{call_id}``."""
    return web.json_response(_record(request).describe())


@documented("An outgoing call's events as Server-Sent Events (dialing, ringing, answered, busy, no_answer, failed, "
            "ended), those so far first; the stream ends with the call", parameters=CALL_ID,
            responses={"200": {"description": "text/event-stream"}, "404": error("no such call")})
async def call_events(request: web.Request) -> web.StreamResponse:
    """``GET /api/sip/calls/{call_id}/events``."""
    record = _record(request)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await resp.prepare(request)
    sent = 0
    try:
        while True:
            while sent < len(record.events):
                event = record.events[sent]
                sent += 1
                data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                await write_within(request, resp.write(data), EVENT_WRITE_TIMEOUT_S)
            if record.finished:
                break
            record.changed.clear()
            if sent < len(record.events):  # one came between the loop and the clear
                continue
            try:
                await asyncio.wait_for(record.changed.wait(), KEEPALIVE_S)
            except TimeoutError:
                await write_within(request, resp.write(b": keepalive\n\n"), EVENT_WRITE_TIMEOUT_S)
    except (ConnectionResetError, WriteStalled):
        return resp
    with contextlib.suppress(ConnectionResetError):
        await resp.write_eof()
    return resp
