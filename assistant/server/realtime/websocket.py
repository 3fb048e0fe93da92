"""``GET /v1/realtime``: the Realtime API over a WebSocket (the SDKs' ``client.realtime.connect()``).

A session without a peer: audio arrives in ``input_audio_buffer.append`` events and leaves as
``response.output_audio.delta`` events (:class:`~assistant.server.realtime.sink.StreamSink`), around the same
conversation a peer has. The session takes one of the server's session slots, is listed by
``GET /api/sessions`` and can be hung up by ``DELETE /api/sessions/{id}``.

With ``?call_id=`` it is instead a control socket beside a WebRTC call (``POST /v1/realtime/calls``): a server
of the caller's reads and sends the call's events there while the browser holds the media; it takes no session
slot of its own and closes when the call ends.

Events to the client wait in a bounded queue; a client that does not read them is closed (1008), not
buffered for without limit. A message over 4 × ``realtime.max_event_bytes`` closes the socket (1009); a
smaller one over the limit is answered with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web

from assistant.server.http import CONFIG, APIError, Outbox
from assistant.server.keys import principal_of
from assistant.server.openapi import documented, openai_error
from assistant.server.realtime.calls import call_protocol
from assistant.server.realtime.protocol import ClientError, RealtimeProtocol
from assistant.server.realtime.settings import SettingsError
from assistant.server.realtime.setup import DEFAULT_MODEL, make_protocol, prepare
from assistant.server.realtime.sink import StreamSink
from assistant.server.services import SERVICES
from assistant.server.voice.session import ConversationSession
from assistant.server.voice.signaling import admit, caller, check_ready

log = logging.getLogger(__name__)

SUBPROTOCOL = "realtime"  # what the SDKs offer (with the key and the beta marker); we answer with it
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
HEARTBEAT_S = 30.0
HARD_LIMIT_FACTOR = 4  # a message this many times over max_event_bytes is not read at all
MAX_CONTROL_SOCKETS = 4  # control sockets one call may have at once (a server of the caller's needs one)
CONTROLS: dict[str, set[web.WebSocketResponse]] = {}  # call (session id) → its open control sockets


class SocketSession(ConversationSession):
    """A Realtime session over a WebSocket: closing the session closes the socket."""

    ws: web.WebSocketResponse | None = None
    transport = "realtime_websocket"

    async def _release(self) -> None:
        if self.ws is not None and not self.ws.closed:
            code = 1008 if self.close_reason in ("client_too_slow", "input_audio_flood") else 1000
            with contextlib.suppress(Exception):
                await self.ws.close(code=code, message=self.close_reason.encode()[:120])


async def client_events(ws: web.WebSocketResponse, protocol: RealtimeProtocol) -> None:
    """The client's events into the session, in order, until the socket closes or fails."""
    async for msg in ws:
        if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            await protocol.receive(msg.data)
        elif msg.type is WSMsgType.ERROR:
            break


def is_beta(request: web.Request) -> bool:
    """The client speaks the beta dialect (``OpenAI-Beta: realtime=v1``, or the beta subprotocol)."""
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    return "realtime=v1" in request.headers.get("OpenAI-Beta", "") or BETA_SUBPROTOCOL in offered


@documented(
    "The OpenAI Realtime API over a WebSocket (upgrade): JSON client events in, server events out",
    description="OpenAI's Realtime protocol (see docs/realtime.md for what is supported). Query: `model` (any "
                "name; echo, rules or the configured responder's name pick that responder), `extensions=1` for "
                "our own events (assistant.turn_metrics, the per-turn latency breakdown; assistant.notice), "
                "`call_id` to attach to a WebRTC call as its control socket. The bearer token may come as the "
                "subprotocol `openai-insecure-api-key.<token>` (browsers). `OpenAI-Beta: realtime=v1` gets the "
                "beta event names.",
    parameters=[{"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "extensions", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "call_id", "in": "query", "required": False, "schema": {"type": "string"}}],
    responses={"101": {"description": "switching protocols: the Realtime session"},
               "400": openai_error("not a WebSocket upgrade"), "401": openai_error("missing or wrong token"),
               "404": openai_error("call_id names no open call"),
               "503": openai_error("not ready, or every session slot is taken")},
)
async def realtime_ws(request: web.Request) -> web.StreamResponse:
    """``GET /v1/realtime``."""
    state = request.config_dict
    cfg = state[CONFIG]
    rt = cfg.realtime
    ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), heartbeat=HEARTBEAT_S,
                               max_msg_size=HARD_LIMIT_FACTOR * rt.max_event_bytes)
    if not ws.can_prepare(request).ok:
        raise APIError(400, "websocket_expected", "GET /v1/realtime is a WebSocket: send an Upgrade request")
    if "call_id" in request.query:
        return await control_socket(request, ws, request.query["call_id"])
    check_ready(state)
    key_session = principal_of(request).session  # a client secret's session: the socket's starting point
    model = request.query.get("model") or (None if key_session is not None else DEFAULT_MODEL)
    try:
        start = await prepare(state, model, base=key_session)
    except (ClientError, SettingsError) as exc:  # a key minted before the server's voices or engines changed
        raise APIError(400, exc.code, str(exc), param=exc.param) from None
    services = state[SERVICES]
    sink = StreamSink(rt.audio_lead_ms)
    who = caller(request)
    session = admit(state, lambda on_closed: SocketSession(services, start.cfg, sink, on_closed,
                                                            responder=start.responder, client=who.client), who)
    protocol: RealtimeProtocol | None = None
    try:  # from admit on, every exit (a failed upgrade, a reset, make_protocol raising) gives the slot back
        await ws.prepare(request)
        session.ws = ws

        def too_slow() -> None:
            session.spawn(session.close("client_too_slow"), "close")

        outbox = Outbox(ws, rt.max_pending_events, too_slow)
        protocol = make_protocol(state, session, start, outbox.put, webrtc=False, beta=is_beta(request),
                                 query=request.query)
        session.spawn(outbox.run(), "realtime-out")
        session.watch()
        log.info("realtime_open session=%s transport=websocket beta=%s", session.id, protocol.beta)
        await client_events(ws, protocol)
        if ws.close_code == 1009:
            log.info("realtime_message_too_large session=%s", session.id)
    finally:
        await asyncio.shield(_end(session, protocol, sink, "websocket_closed" if protocol else "open_failed"))
    return ws


async def _end(session: SocketSession, protocol: RealtimeProtocol | None, sink: StreamSink, reason: str) -> None:
    """The session's end, shielded: a handler cancelled mid-close still frees its slot."""
    if protocol is not None:
        await protocol.close()
    sink.stop()
    await session.close(reason)


async def control_socket(request: web.Request, ws: web.WebSocketResponse, call_id: str) -> web.WebSocketResponse:
    """``GET /v1/realtime?call_id=``: the call's events, and client events into it, beside its WebRTC peer."""
    protocol = call_protocol(request, call_id)
    if protocol is None:
        raise APIError(404, "call_not_found", "no open call has this call_id", param="call_id")
    session = protocol.session
    controls = CONTROLS.setdefault(session.id, set())
    if len(controls) >= MAX_CONTROL_SOCKETS:
        raise APIError(429, "too_many_control_sockets", f"a call takes at most {MAX_CONTROL_SOCKETS} control "
                       "sockets at once", param="call_id")
    controls.add(ws)
    loop = asyncio.get_running_loop()
    closing: list[asyncio.Task[bool]] = []  # not the session's tasks: those end with the call, before this

    def close(code: int, why: bytes) -> None:
        if not ws.closed and not closing:
            closing.append(loop.create_task(ws.close(code=code, message=why)))

    def on_event(event: dict[str, object]) -> None:
        if event.get("type") == "close":  # the call ended: so does its control socket
            close(1000, b"call_ended")

    unsubscribe = session.events.subscribe(on_event)
    sender: asyncio.Task[None] | None = None
    detach = None
    try:  # the socket's place, listener and sender are given back on every exit, a failed upgrade too
        await ws.prepare(request)
        if session.closed:  # the call ended between the lookup and the upgrade: its close event was missed
            await ws.close(code=1000, message=b"call_ended")
            return ws
        outbox = Outbox(ws, request.config_dict[CONFIG].realtime.max_pending_events,
                        lambda: close(1008, b"client_too_slow"))
        sender = loop.create_task(outbox.run(), name=f"realtime-control-out-{session.id}")
        detach = protocol.attach(outbox.put)
        log.info("realtime_control_open session=%s", session.id)
        await client_events(ws, protocol)
    finally:
        unsubscribe()
        controls.discard(ws)
        if not controls:
            CONTROLS.pop(session.id, None)
        if detach is not None:
            detach()
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            log.info("realtime_control_closed session=%s", session.id)
    return ws
