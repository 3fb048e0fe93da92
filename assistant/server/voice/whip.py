"""WHIP-style signaling (RFC 9725), so standard WebRTC clients can talk to the assistant without our page.

- ``POST /api/whip`` with ``Content-Type: application/sdp`` (the offer) → ``201 Created``, the answer as
  ``application/sdp``, ``Location: /api/sessions/{id}`` (the session resource), an ``ETag`` naming the ICE
  session, and one ``Link: <url>; rel="ice-server"`` per STUN/TURN URL (with this session's TURN credentials).
  ``?voice=`` and ``?responder=`` choose like the JSON route's fields.
- ``PATCH /api/sessions/{id}`` with ``application/trickle-ice-sdpfrag``: trickled candidates → ``204``.
- ``DELETE /api/sessions/{id}``: hang up.

The bearer token (or a key it minted) applies as on every ``/api/`` route, and the session belongs to that key: PATCH
and DELETE on its resource need the same key (RFC 9725: the client sends its token on every request), or the
admin's. The resource URL is unguessable and shown to nobody else, so it is a capability as the standard expects.
The ``events`` data channel is optional: a client that offers only audio gets the spoken replies all the same.
"""

from __future__ import annotations

from aiohttp import web

from assistant.server.http import CONFIG
from assistant.server.openapi import documented, error
from assistant.server.voice.ice import ice_servers, link_headers
from assistant.server.voice.sdpfrag import CONTENT_TYPE as SDPFRAG
from assistant.server.voice.signaling import caller, check_choices, check_ready, check_sdp, open_session, read_text

SDP = "application/sdp"


@documented(
    "WHIP (RFC 9725): the offer as application/sdp → 201, the answer, Location (the session "
    "resource), ETag and Link rel=ice-server headers; ?voice= and ?responder= optional",
    request={"application/sdp": {"schema": {"type": "string", "maxLength": lambda cfg: cfg.server.max_sdp_bytes}}},
    responses={
        "201": {"description": "SDP answer", "content": {"application/sdp": {"schema": {"type": "string"}}}},
        "400": error("bad offer"), "413": error("SDP too large"),
        "415": error("Content-Type is not application/sdp"),
        "503": error("not ready, or all session slots busy"), "504": error("ICE gathering timeout"),
    },
)
async def whip_offer(request: web.Request) -> web.Response:
    app = request.app
    cfg = app[CONFIG]
    check_ready(app)
    sdp = check_sdp(await read_text(request, SDP, cfg.server.max_sdp_bytes), cfg.server.max_sdp_bytes)
    responder, voice = request.query.get("responder"), request.query.get("voice")
    check_choices(app, responder, voice)
    session = await open_session(app, sdp, caller(request), responder=responder, voice=voice, transport="whip")
    location = f"/api/sessions/{session.id}"
    headers = {
        "Location": location,
        "ETag": session.etag,
        "Accept-Patch": SDPFRAG,
        "Access-Control-Expose-Headers": "Location, ETag, Link, Accept-Patch",
    }
    resp = web.Response(status=201, text=session.pc.localDescription.sdp, content_type=SDP, headers=headers)
    for value in link_headers(ice_servers(cfg.ice, session.id)):
        resp.headers.add("Link", value)
    return resp
