"""The Realtime API over WebRTC: ``POST /v1/realtime/calls`` (the SDKs' ``client.realtime.calls.create()``, and
browsers that post their offer as OpenAI's WebRTC guide does), ``POST /v1/realtime/calls/{id}/hangup`` and
``GET /v1/realtime/ice-servers``.

A call is our voice session, peer and all (``server/voice/session.Session``, opened by ``signaling.open_session`` as
the page's and WHIP's are): audio travels on the track, events on the ``oai-events`` data channel, and the
Realtime layer translates between that channel and the session's conversation.

The body is the offer as ``application/sdp``, or a multipart form with an ``sdp`` part and an optional
``session`` part (JSON, what ``session.update`` takes). The answer is ``201`` with the SDP and the call's path
in ``Location``; the call id is the session id (behind a dispatcher it names the gateway that holds the call).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import weakref
from collections import deque

from aiohttp import web

from assistant.body import loads_bounded
from assistant.pipeline.events import DataChannel
from assistant.server.http import CONFIG, APIError, read_multipart
from assistant.server.keys import principal_of
from assistant.server.openapi import documented, json_body, openai_error
from assistant.server.realtime.protocol import ClientError, RealtimeProtocol
from assistant.server.realtime.settings import SettingsError
from assistant.server.realtime.setup import make_protocol, prepare
from assistant.server.services import SERVICES
from assistant.server.voice.ice import browser_config
from assistant.server.voice.session import Session
from assistant.server.voice.signaling import (
    SESSIONS,
    caller,
    check_ready,
    check_sdp,
    open_session,
    owned_session,
    read_text,
)

log = logging.getLogger(__name__)

SDP = "application/sdp"
EVENTS_LABEL = "oai-events"
MAX_PENDING = 256  # events kept until the data channel opens; older ones go first
INBOX = 256  # client events waiting to be handled; past it, an error event and the event is dropped
# Each open call's protocol by call id, for a control socket beside it (GET /v1/realtime?call_id=); weak: a call
# that ends leaves the table with its session.
PROTOCOLS: weakref.WeakValueDictionary[str, RealtimeProtocol] = weakref.WeakValueDictionary()
CALL_ID = [{"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "the call id (from the Location of POST /v1/realtime/calls)"}]


class ChannelEvents:
    """Server events on the ``oai-events`` data channel (kept, bounded, until it opens), and client events
    from it handled one at a time, in order, by one task of the session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.channel: DataChannel | None = None
        self.pending: deque[str] = deque(maxlen=MAX_PENDING)
        self.inbox: asyncio.Queue[str | bytes] = asyncio.Queue(maxsize=INBOX)
        self.protocol: RealtimeProtocol | None = None

    def send(self, event: dict[str, object]) -> None:
        text = json.dumps(event, ensure_ascii=False)
        ch = self.channel
        if ch is not None and ch.readyState == "open":
            try:
                ch.send(text)
            except Exception as exc:  # closed under our feet: the session is going away
                log.debug("realtime_send_failed session=%s error=%s", self.session.id, exc)
        else:
            self.pending.append(text)

    def attach(self, channel: DataChannel) -> None:
        self.channel = channel

        def on_message(message: str | bytes) -> None:
            try:
                self.inbox.put_nowait(message)
            except asyncio.QueueFull:
                if self.protocol is not None:
                    self.protocol.error("too many events at once: this one was dropped", code="rate_limited")

        channel.add_listener("open", self._drain)
        channel.add_listener("message", on_message)

        if channel.readyState == "open":
            self._drain()
        self.session.spawn(self._handle(), "realtime-in")

    def _drain(self) -> None:
        while self.pending and self.channel is not None and self.channel.readyState == "open":
            self.channel.send(self.pending.popleft())

    async def _handle(self) -> None:
        while True:
            message = await self.inbox.get()
            if self.protocol is not None:
                await self.protocol.receive(message)


def call_protocol(request: web.Request, call_id: str) -> RealtimeProtocol | None:
    """The protocol of an open call of this gateway that the caller's key opened (or any, for the admin's key);
    None otherwise: another caller's call looks like no call at all."""
    session = request.config_dict[SESSIONS].get(call_id)
    protocol = PROTOCOLS.get(call_id)
    if (session is None or session.closed or protocol is None or protocol.session is not session
            or not principal_of(request).owns(session.owner)):
        return None
    return protocol


async def read_offer(request: web.Request, max_sdp: int, max_session: int) -> tuple[str, object]:
    """The offer's SDP and the optional ``session`` object, from either body shape."""
    if request.content_type == "multipart/form-data":
        parts = await read_multipart(request, {"sdp": max_sdp, "session": max_session})
        if "sdp" not in parts:
            raise APIError(400, "bad_offer", "the form has no 'sdp' part", param="sdp")
        try:
            sdp = parts["sdp"].decode("utf-8")
            session = loads_bounded(parts["session"]) if "session" in parts else None
        except (UnicodeDecodeError, ValueError):
            raise APIError(400, "bad_offer", "the 'session' part must be JSON (and 'sdp' UTF-8 text)",
                           param="session") from None
        return sdp, session
    return await read_text(request, SDP, max_sdp), None


@documented(
    "Start a Realtime call over WebRTC: the offer in, the SDP answer out (201, Location: the call)",
    description="Body: the offer as application/sdp, or multipart/form-data with an `sdp` part and an optional "
                "`session` part (JSON, as in session.update). Events travel on the `oai-events` data channel, "
                "audio on the track. See docs/realtime.md.",
    request={"application/sdp": {"schema": {"type": "string", "maxLength": lambda cfg: cfg.server.max_sdp_bytes}},
             "multipart/form-data": {"schema": {"type": "object", "required": ["sdp"], "properties": {
                 "sdp": {"type": "string"}, "session": {"type": "object"}}}}},
    responses={"201": {"description": "the SDP answer; Location: /v1/realtime/calls/{call_id}",
                       "content": {SDP: {"schema": {"type": "string"}}}},
               "400": openai_error("bad offer or session"), "413": openai_error("offer too large"),
               "415": openai_error("neither application/sdp nor multipart/form-data"),
               "503": openai_error("not ready, or every session slot is taken"),
               "504": openai_error("ICE gathering timeout")},
)
async def create_call(request: web.Request) -> web.Response:
    """``POST /v1/realtime/calls``."""
    state = request.config_dict
    cfg = state[CONFIG]
    check_ready(state)
    sdp, session_json = await read_offer(request, cfg.server.max_sdp_bytes, cfg.server.max_body_bytes)
    check_sdp(sdp, cfg.server.max_sdp_bytes)
    model = session_json.get("model") if isinstance(session_json, dict) else None
    key_session = principal_of(request).session  # a client secret's session: the call's starting point
    try:
        start = await prepare(state, model if isinstance(model, str) else request.query.get("model"), session_json,
                              base=key_session)
    except (ClientError, SettingsError) as exc:
        raise APIError(400, exc.code, str(exc), param=exc.param) from None
    services = state[SERVICES]
    who = caller(request)
    session = await open_session(state, sdp, who, make=lambda on_closed: Session(
        services, start.cfg, on_closed=on_closed, responder=start.responder, client=who.client),
        transport="realtime_webrtc")
    events = ChannelEvents(session)
    try:
        protocol = make_protocol(state, session, start, events.send, webrtc=True, beta=False, query=request.query)
    except BaseException:  # the slot goes back now, not when the peer's connect timeout ends it
        await asyncio.shield(session.close("open_failed"))
        raise
    events.protocol = protocol
    PROTOCOLS[session.id] = protocol
    session.channels[EVENTS_LABEL] = events.attach
    session.on_audio = protocol.on_track_audio
    log.info("realtime_open session=%s transport=webrtc", session.id)
    location = f"/v1/realtime/calls/{session.id}"
    return web.Response(status=201, text=session.pc.localDescription.sdp, content_type=SDP,
                        headers={"Location": location, "Access-Control-Expose-Headers": "Location"})


@documented("Hang up a Realtime call", parameters=CALL_ID,
            responses={"200": {"description": "hung up"}, "404": openai_error("no such call")})
async def hangup(request: web.Request) -> web.Response:
    """``POST /v1/realtime/calls/{id}/hangup``: the caller's own call (or any, with the admin's key)."""
    session = owned_session(request)
    if session is None:
        raise APIError(404, "call_not_found", "no such call", param="call_id")
    await session.close("hangup")
    return web.Response(status=200)


ICE_SCHEMA = {
    "type": "object", "required": ["ice_servers"],
    "properties": {
        "ice_servers": {"type": "array", "items": {"type": "object", "properties": {
            "urls": {"type": "array", "items": {"type": "string"}}, "username": {"type": "string"},
            "credential": {"type": "string"}}}},
        "ice_transport_policy": {"type": "string", "enum": ["all", "relay"]},
        "expires_at": {"type": "integer", "description": "when TURN REST credentials expire (Unix time)"},
    },
}


@documented("STUN/TURN servers for a Realtime WebRTC client (TURN credentials minted per call)",
            responses={"200": json_body(ICE_SCHEMA, "the ICE servers")})
async def ice_servers(request: web.Request) -> web.Response:
    """``GET /v1/realtime/ice-servers``: what ``new RTCPeerConnection({iceServers})`` takes."""
    ice = browser_config(request.config_dict[CONFIG].ice, f"realtime-{secrets.token_urlsafe(9)}")
    body: dict[str, object] = {"ice_servers": ice["iceServers"], "ice_transport_policy": ice["iceTransportPolicy"]}
    if "expires_at" in ice:
        body["expires_at"] = ice["expires_at"]
    return web.json_response(body, headers={"Cache-Control": "no-store"})
