"""``GET /telephony/{twilio,telnyx}/media``: a carrier's media stream, as one session of the conversation.

The carrier opens the WebSocket our webhook answer named. Before its ``start`` the socket is nobody's: it holds
one of ``telephony.max_pending_calls`` places and has ``telephony.start_timeout_s`` to send a ``start`` that
carries a valid media token (``tokens.py``) and μ-law 8 kHz mono. Then it becomes a session like any other
(``voice/signaling.admit``: it takes a session slot, is listed by ``GET /api/sessions``, hung up by ``DELETE``,
counted in the metrics): a :class:`CallSession`, a peerless ``ConversationSession`` whose audio comes from the
``media`` messages (``caller.py``) and whose reply sink is a :class:`~assistant.server.telephony.sink.CallSink`.
The layer translates; turns, barge-in and the heard history are the conversation's.

Whatever a carrier sends that no carrier sends (malformed JSON, a binary frame, an unknown event, a second
``start``, oversized, late or too fast media, a flood of DTMF) closes that call's socket with the reason in the
log and in the close frame; no other call sees it. A call ends on ``stop``, on a closed socket, when the media
stops for ``telephony.media_timeout_s``, or when nobody spoke for ``server.max_silence_s``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial

from aiohttp import WSMessage, WSMsgType, web
from aiohttp.typedefs import Handler

from assistant.body import loads_bounded
from assistant.config import Config
from assistant.server.http import CONFIG, HTTPJSONError, Outbox
from assistant.server.limits import LIMITS, RateLimiter
from assistant.server.openapi import documented, error
from assistant.server.services import SERVICES
from assistant.server.telephony.caller import CallerAudio
from assistant.server.telephony.dialects import (
    TELNYX,
    TOKEN_PARAMETER,
    TWILIO,
    CarrierError,
    Connected,
    Dialect,
    Dtmf,
    Event,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
)
from assistant.server.telephony.sink import CallSink
from assistant.server.telephony.state import TELEPHONY
from assistant.server.telephony.tokens import TokenError
from assistant.server.voice.session import ConversationSession
from assistant.server.voice.signaling import SESSIONS, admit, check_ready

log = logging.getLogger(__name__)

MESSAGE_SLACK = 4096  # the JSON around a media payload
# One client may hold this share of telephony.max_pending_calls before their start: a carrier opens streams from
# several addresses (Twilio's media edge has many), and one host can no longer take every place.
PENDING_SHARE = 4
OUTBOX_LIMIT = 256  # messages to the carrier not yet written (the sink keeps ~10 in flight); past it, closed
# Close codes (RFC 6455): a call that ended is 1000; a carrier that broke the protocol 1008, sent data we cannot
# take 1003 (a format) or 1007 (not JSON); 1013 when there is no room; 1011 when we failed.
NORMAL = {"stop", "websocket_closed", "media_timeout", "silence_timeout", "hangup", "server_shutdown",
          "max_call_length"}
CLOSE_CODES = {"unsupported_media_format": 1003, "malformed_json": 1007, "busy": 1013, "server_error": 1011}


def close_code(reason: str) -> int:
    return 1000 if reason in NORMAL else CLOSE_CODES.get(reason, 1008)


class CallSession(ConversationSession):
    """A phone call: the conversation, its socket to the carrier, and the carrier's media state."""

    ws: web.WebSocketResponse | None = None
    transport = "phone"
    carrier = ""
    call_id = ""
    media_timeout_s = 0.0
    last_media = 0.0  # monotonic time of the latest media message

    max_call_s = 0.0

    def _stale(self) -> str:
        if self.media_timeout_s and time.monotonic() - self.last_media > self.media_timeout_s:
            return "media_timeout"
        if self.max_call_s and time.monotonic() - self.created > self.max_call_s:
            return "max_call_length"  # past it, the call's id is no longer remembered as answered
        return super()._stale()

    async def _release(self) -> None:
        if isinstance(self.sink, CallSink):
            self.sink.stop()
        if self.ws is not None and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close(code=close_code(self.close_reason), message=self.close_reason.encode()[:120])


class Refused(Exception):
    """A media socket refused before it became a call: the reason goes to the log and the close frame."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def decode(msg: WSMessage, dialect: Dialect) -> Event:
    """One WebSocket message → the carrier's event, or :class:`ProtocolError`."""
    if msg.type is WSMsgType.BINARY:
        raise ProtocolError("binary_frame", "carriers send JSON text")
    try:
        message = loads_bounded(msg.data)  # nesting and members bounded: never a RecursionError
    except ValueError:
        raise ProtocolError("malformed_json") from None
    return dialect.parse(message)


async def await_start(ws: web.WebSocketResponse, dialect: Dialect, timeout_s: float) -> Start:
    """Read up to the ``start`` (a ``connected`` may come first); anything else refuses the socket."""
    try:
        async with asyncio.timeout(timeout_s):
            async for msg in ws:
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                try:
                    event = decode(msg, dialect)
                except ProtocolError as exc:
                    raise Refused(exc.reason, str(exc)) from None
                if isinstance(event, Start):
                    return event
                if not isinstance(event, Connected):
                    raise Refused("expected_start", f"{type(event).__name__.lower()} before start")
    except TimeoutError:
        raise Refused("start_timeout", f"no start within {timeout_s:g} s") from None
    raise Refused("websocket_closed", "closed before start")


class CallStream:
    """The carrier's messages after ``start``, turned into calls on the session (see the module docstring)."""

    def __init__(self, session: CallSession, sink: CallSink, dialect: Dialect, cfg: Config) -> None:
        self.session, self.sink, self.dialect = session, sink, dialect
        self.audio = CallerAudio(cfg.telephony.max_media_bytes)
        self.dtmf = RateLimiter(cfg.telephony.dtmf_per_minute)
        self.debug_content = cfg.log.debug_content
        self.media = 0
        self.other_track = 0
        self.dtmf_count = 0

    async def run(self, ws: web.WebSocketResponse) -> str:
        """Until the call ends: returns why (the session's close reason)."""
        async for msg in ws:
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                break
            try:
                reason = self.on_event(decode(msg, self.dialect))
            except ProtocolError as exc:
                log.info("call_refused_message session=%s carrier=%s reason=%s detail=%s", self.session.id,
                         self.dialect.name, exc.reason, str(exc)[:200])
                self.session.services.metrics.telephony_refusals_total.labels(
                    carrier=self.dialect.name, reason=exc.reason).inc()
                return exc.reason
            if reason:
                return reason
        return "websocket_closed"

    def on_event(self, event: Event) -> str:
        """Handle one event; a non-empty return ends the call with that reason."""
        if isinstance(event, Media):
            self.on_media(event)
        elif isinstance(event, Mark):
            self.sink.on_mark(event.name)
        elif isinstance(event, Dtmf):
            self.dtmf_count += 1
            if self.dtmf.take("call") > 0:
                raise ProtocolError("dtmf_flood", f"over {self.dtmf.per_minute} key presses a minute")
            log.info("call_dtmf session=%s count=%d%s", self.session.id, self.dtmf_count,
                     f" digit={event.digit}" if self.debug_content else "")
        elif isinstance(event, Stop):
            return "stop"
        elif isinstance(event, Start):
            raise ProtocolError("second_start")
        elif isinstance(event, Connected):
            raise ProtocolError("connected_after_start")
        elif isinstance(event, CarrierError):
            log.warning("call_carrier_error session=%s carrier=%s code=%s detail=%s", self.session.id,
                        self.dialect.name, event.code, event.detail)
        return ""

    def on_media(self, media: Media) -> None:
        now = time.monotonic()
        self.session.last_media = now
        if media.track != "inbound":  # only the caller's own track is speech for us (never our echo)
            self.other_track += 1
            return
        if not self.audio.accept_order(media.chunk):
            return
        try:
            data = base64.b64decode(media.payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("bad_media", "the payload is not base64") from None
        self.media += 1
        chunk = self.audio.push(data, time.time(), now)
        if chunk is not None:
            self.session.feed(chunk)


async def media_socket(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """The media WebSocket of ``dialect``'s calls (see the module docstring)."""
    state = request.config_dict
    tel = state[TELEPHONY]
    tel.require(dialect)
    cfg: Config = state[CONFIG]
    settings = cfg.telephony
    # No pings: a carrier sends media every 20 ms, and telephony.media_timeout_s closes a stream whose media stopped.
    ws = web.WebSocketResponse(max_msg_size=settings.max_media_bytes * 4 // 3 + MESSAGE_SLACK)
    if not ws.can_prepare(request).ok:
        raise HTTPJSONError(400, "websocket_expected", f"{request.path} is a WebSocket: send an Upgrade request")
    if "Origin" in request.headers:  # a carrier sends none: this is a browser page, on whatever site
        raise HTTPJSONError(403, "origin_refused", "a call's media stream is opened by the carrier, not a web page")
    check_ready(state)
    limits = state[LIMITS]
    client = limits.client(request)
    refusal = ""
    per_client = max(1, settings.max_pending_calls // PENDING_SHARE)
    with limits.holding("telephony_start", client, per_client, settings.max_pending_calls,
                        "call media streams before their start"):
        await ws.prepare(request)
        try:
            start = await await_start(ws, dialect, settings.start_timeout_s)
            try:
                tel.tokens.redeem(start.parameters.get(TOKEN_PARAMETER), dialect.name, start.call_id)
            except TokenError as exc:
                raise Refused(exc.reason) from None
            if problem := dialect.format_problem(start):
                raise Refused("unsupported_media_format", problem)
        except Refused as exc:
            refusal = exc.reason
            log.info("call_refused carrier=%s client=%s reason=%s %s", dialect.name, client, exc.reason, exc.detail)
    if refusal:
        state[SERVICES].metrics.telephony_refusals_total.labels(carrier=dialect.name, reason=refusal).inc()
        await ws.close(code=close_code(refusal), message=refusal.encode()[:120])
        return ws
    await run_call(request, ws, dialect, start, client)
    return ws


async def run_call(request: web.Request, ws: web.WebSocketResponse, dialect: Dialect, start: Start,
                   client: str) -> None:
    """The call, from its valid ``start`` to its end: a session in the table for as long as it lasts."""
    state = request.config_dict
    cfg: Config = state[CONFIG]
    settings = cfg.telephony
    services = state[SERVICES]
    holder: list[CallSession] = []

    def too_slow() -> None:
        if holder:
            holder[0].spawn(holder[0].close("carrier_too_slow"), "close")

    outbox = Outbox(ws, OUTBOX_LIMIT, too_slow)
    sid = start.stream_id
    sink = CallSink(outbox.put, partial(dialect.media, sid), partial(dialect.mark, sid), partial(dialect.clear, sid),
                    settings.audio_lead_ms)
    try:
        session = admit(state, lambda on_closed: CallSession(
            services, cfg, sink, on_closed, responder=settings.responder or None, voice=settings.voice or None,
            client=client))
    except HTTPJSONError:
        log.info("call_refused carrier=%s client=%s reason=busy", dialect.name, client)
        services.metrics.telephony_refusals_total.labels(carrier=dialect.name, reason="busy").inc()
        await ws.close(code=close_code("busy"), message=b"busy")
        return
    holder.append(session)
    stream: CallStream | None = None
    reason = "open_failed"
    try:  # from admit on, every exit gives the slot back
        sink.session_id = session.id
        session.ws, session.carrier, session.call_id = ws, dialect.name, start.call_id
        # Telemetry's call span: the carrier's trace (if it sent one) and the media format.
        session.traceparent = request.headers.get("traceparent", "")[:128]
        session.codec = f"{start.encoding}/{start.sample_rate}"
        session.media_timeout_s, session.last_media = settings.media_timeout_s, time.monotonic()
        session.max_call_s = settings.max_call_s
        session.events.subscribe(partial(log_turn, session))
        stream = CallStream(session, sink, dialect, cfg)
        session.spawn(outbox.run(), "call-out")
        session.watch()
        log.info("call_open session=%s carrier=%s call=%s active=%d", session.id, dialect.name,
                 start.call_id[:64], len(state[SESSIONS]))
        reason = "websocket_closed"
        reason = await stream.run(ws)
    finally:
        if stream is not None:
            log.info("call_media session=%s media=%d late=%d missing=%d other_track=%d dtmf=%d clears=%d "
                     "marks_ignored=%d marks_overdue=%d", session.id, stream.media, stream.audio.late,
                     stream.audio.missing, stream.other_track, stream.dtmf_count, sink.clears, sink.marks_ignored,
                     sink.marks_overdue)
        sink.stop()
        await asyncio.shield(session.close(reason))


def log_turn(session: CallSession, event: dict[str, object]) -> None:
    """A call has no events channel: each turn's server-side voice-to-voice goes to the log."""
    if event.get("type") == "turn_metrics":
        durations = event.get("durations_ms")
        log.info("call_turn session=%s carrier=%s turn=%s server_v2v_ms=%s", session.id, session.carrier,
                 event.get("turn"), durations.get("server_v2v_ms") if isinstance(durations, dict) else None)


def media_doc(carrier: str) -> Callable[[Handler], Handler]:
    return documented(
        f"{carrier}: a call's media stream, audio both ways (WebSocket)", public=True,
        description="The carrier opens it where the webhook's answer says (no bearer token: the media token does "
                    "it). JSON text messages in the carrier's media stream protocol (docs/telephony.md); the first "
                    "`start` must carry the call's `token` stream parameter and μ-law 8 kHz mono audio. A refusal "
                    "closes the socket with the reason.",
        responses={"101": {"description": "switching protocols: the call's media stream"},
                   "400": error("not a WebSocket upgrade"), "404": error("this carrier's calls are off"),
                   "403": error("opened from a web page (an Origin header)"),
                   "429": error("too many streams waiting for their start from this client"),
                   "503": error("not ready, or too many streams waiting for their start")},
    )


@media_doc("Twilio Media Streams")
async def twilio_media(request: web.Request) -> web.StreamResponse:
    """``GET /telephony/twilio/media``."""
    return await media_socket(request, TWILIO)


@media_doc("Telnyx media streaming")
async def telnyx_media(request: web.Request) -> web.StreamResponse:
    """``GET /telephony/telnyx/media``."""
    return await media_socket(request, TELNYX)
