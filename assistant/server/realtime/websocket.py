"""``GET /v1/realtime``: the Realtime API over a WebSocket (the SDKs' ``client.realtime.connect()``).

A session without a peer: audio arrives in ``input_audio_buffer.append`` events and leaves as
``response.output_audio.delta`` events (:class:`~assistant.server.realtime.sink.StreamSink`), around the same
conversation a peer has. The session takes one of the server's session slots, is listed by
``GET /api/sessions`` and can be hung up by ``DELETE /api/sessions/{id}``.

Events to the client wait in a bounded queue; a client that does not read them is closed (1008), not
buffered for without limit. A message over 4 × ``realtime.max_event_bytes`` closes the socket (1009); a
smaller one over the limit is answered with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from assistant.server.http import CONFIG, APIError
from assistant.server.keys import principal_of
from assistant.server.openapi import documented, openai_error
from assistant.server.realtime.protocol import ClientError
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


class SocketSession(ConversationSession):
    """A Realtime session over a WebSocket: closing the session closes the socket."""

    ws: web.WebSocketResponse | None = None

    async def _release(self) -> None:
        if self.ws is not None and not self.ws.closed:
            code = 1008 if self.close_reason == "client_too_slow" else 1000
            with contextlib.suppress(Exception):
                await self.ws.close(code=code, message=self.close_reason.encode()[:120])


class Outbox:
    """Server events to the socket, in order, through a bounded queue (``on_full`` when a client lags)."""

    def __init__(self, ws: web.WebSocketResponse, limit: int, on_full: Callable[[], None]) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=limit)
        self.on_full = on_full
        self.full = False

    def put(self, event: dict[str, Any]) -> None:
        if self.full:
            return
        try:
            self.queue.put_nowait(json.dumps(event, ensure_ascii=False))
        except asyncio.QueueFull:
            self.full = True
            self.on_full()

    async def run(self) -> None:
        while True:
            text = await self.queue.get()
            if self.ws.closed:
                return
            await self.ws.send_str(text)


def is_beta(request: web.Request) -> bool:
    """The client speaks the beta dialect (``OpenAI-Beta: realtime=v1``, or the beta subprotocol)."""
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    return "realtime=v1" in request.headers.get("OpenAI-Beta", "") or BETA_SUBPROTOCOL in offered


@documented(
    "The OpenAI Realtime API over a WebSocket (upgrade): JSON client events in, server events out",
    description="OpenAI's Realtime protocol (see docs/realtime.md for what is supported). Query: `model` (any "
                "name; echo, rules or the configured responder's name pick that responder), `turn_metrics=0` to "
                "leave out our per-turn latency event. The bearer token may come as the subprotocol "
                "`openai-insecure-api-key.<token>` (browsers). `OpenAI-Beta: realtime=v1` gets the beta event "
                "names.",
    parameters=[{"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "turn_metrics", "in": "query", "required": False, "schema": {"type": "string"}}],
    responses={"101": {"description": "switching protocols: the Realtime session"},
               "400": openai_error("not a WebSocket upgrade"), "401": openai_error("missing or wrong token"),
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
    try:
        async for msg in ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await protocol.receive(msg.data)
            elif msg.type is WSMsgType.ERROR:
                break
        if ws.close_code == 1009:
            log.info("realtime_message_too_large session=%s", session.id)
    finally:
        await protocol.close()
        sink.stop()
        await session.close("websocket_closed")
    return ws
