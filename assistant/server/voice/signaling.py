"""Signaling: the session table, opening a session from an offer (the JSON ``POST /api/offer`` here; WHIP in
``whip.py`` opens them the same way), the session resource (``GET /api/sessions``, trickled candidates by
``PATCH /api/sessions/{id}``, hang-up by ``DELETE``).

The table is where ownership lives, for every kind of session (the page's, WHIP's, the Realtime API's calls and
WebSockets, phone calls): :func:`admit` binds each new session to the key that opened it (its :class:`Caller`) and
holds each client and each key to its cap of sessions at once; :func:`owned_session` finds a session only for its
owner or the admin, and the list shows a caller only its own. Anyone else is told "no such session" (404), so
session ids cannot be probed.

Every failure answers a JSON 4xx/5xx and closes only the session it concerns.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from aiohttp.helpers import ChainMapProxy

from assistant.server.http import CONFIG, HTTPJSONError, read_body, read_json
from assistant.server.keys import principal_of
from assistant.server.limits import LIMITS
from assistant.server.openapi import documented, error, json_body, ref
from assistant.server.services import SERVICES
from assistant.server.voice.sdpfrag import CONTENT_TYPE as SDPFRAG
from assistant.server.voice.sdpfrag import FragmentError, parse_sdpfrag
from assistant.server.voice.session import ConversationSession, Session, choose_language

log = logging.getLogger(__name__)

SESSIONS: web.AppKey[dict[str, ConversationSession]] = web.AppKey("sessions", dict)
# Where handlers read the app's state: the app itself, or ``request.config_dict`` in a sub-app (``/v1``).
AppState = web.Application | ChainMapProxy
VOICE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
CONNECT_GRACE_S = 5.0  # a real peer connects within this; an older unconnected session may give its place up
TRACEPARENT_MAX = 128  # a W3C traceparent is 55 characters; a longer header is not one (kept bounded, then parsed)


def check_sdp(sdp: object, max_bytes: int) -> str:
    """The offer's SDP, or a 400/413 that says what is wrong with it."""
    if not isinstance(sdp, str) or not sdp.strip():
        raise HTTPJSONError(400, "bad_offer", "the offer's sdp must be a non-empty string")
    if len(sdp.encode()) > max_bytes:
        raise HTTPJSONError(413, "too_large", f"sdp over {max_bytes} bytes")
    if not sdp.lstrip().startswith("v=0"):
        raise HTTPJSONError(400, "bad_offer", "sdp must start with v=0")
    return sdp


def check_choices(app: AppState, responder: object, voice: object) -> None:
    services = app[SERVICES]
    if responder is not None and responder not in services.allowed_responders():
        raise HTTPJSONError(400, "bad_offer", f"field 'responder' must be one of {services.allowed_responders()}")
    if voice is not None and (not isinstance(voice, str) or not VOICE_ID.fullmatch(voice)):
        raise HTTPJSONError(400, "bad_offer", "field 'voice' must be a voice id (letters, digits, - and _)")


def check_language(app: AppState, language: object) -> str:
    """A session's language as the offer asks for it (:func:`~assistant.server.voice.session.choose_language`),
    or a 400 that lists what it may be."""
    try:
        return choose_language(app[SERVICES], language)
    except ValueError as exc:
        raise HTTPJSONError(400, "bad_language", f"field 'language': {exc}") from None


def check_ready(app: AppState) -> None:
    if not app[SERVICES].ready:
        raise HTTPJSONError(503, "not_ready", "models are still loading; retry shortly", headers={"Retry-After": "2"})


async def make_room_to_connect(app: AppState, client: str) -> None:
    """Sessions still connecting have a budget of their own (``server.max_connecting``, and per client
    ``max_connecting_per_client``), so offers that never connect cannot hold the slots real calls need: when that
    budget or the session slots are full, the oldest one that had CONNECT_GRACE_S to connect gives its place up."""
    server = app[CONFIG].server
    sessions = app[SESSIONS]
    connecting = [s for s in sessions.values() if not s.connected and not s.closed]
    if sum(s.client == client for s in connecting) >= server.max_connecting_per_client:
        raise HTTPJSONError(429, "too_many_connecting", f"this client already has {server.max_connecting_per_client} "
                            "sessions that have not connected yet", headers={"Retry-After": "5"})
    if len(connecting) < server.max_connecting and len(sessions) < server.max_sessions:
        return
    stale = [s for s in connecting if time.monotonic() - s.created >= CONNECT_GRACE_S]
    if stale:
        await min(stale, key=lambda s: s.created).close("connect_evicted")
    elif len(connecting) >= server.max_connecting:
        app[SERVICES].metrics.errors_total.labels(stage="capacity").inc()
        raise HTTPJSONError(503, "busy", f"{server.max_connecting} sessions are still connecting; retry shortly",
                            headers={"Retry-After": "2"})


S = TypeVar("S", bound=ConversationSession)
OnClosed = Callable[[ConversationSession], None]


@dataclass(frozen=True)
class Caller:
    """Who opens a session: the key it is bound to (``keys.Principal.id``: only that key, or the admin, may see and
    act on it), the client the per-client limits count, and the key's own cap on sessions at once."""

    owner: str = ""
    client: str = ""
    key_cap: int | None = None
    cap_group: str = ""  # whose sessions key_cap counts (keys.Principal.group)
    traceparent: str = ""  # the W3C trace context the request carried: the call span becomes its child


def caller(request: web.Request) -> Caller:
    """The :class:`Caller` of a request that opens a session (its key, its client past trusted proxies, and the
    ``traceparent`` header it sent, if any)."""
    who = principal_of(request)
    traceparent = request.headers.get("traceparent", "")[:TRACEPARENT_MAX]
    return Caller(who.id, request.config_dict[LIMITS].client(request), who.max_sessions, who.group, traceparent)


def check_held(app: AppState, who: Caller) -> None:
    """429 when ``who``'s client already holds ``server.max_sessions_per_client`` sessions (connected or not), or its
    key the sessions it may hold at once."""
    per_client = app[CONFIG].server.max_sessions_per_client
    live = [s for s in app[SESSIONS].values() if not s.closed]
    if per_client > 0 and who.client and sum(s.client == who.client for s in live) >= per_client:
        raise HTTPJSONError(429, "too_many_sessions", f"this client already holds {per_client} sessions "
                            "(server.max_sessions_per_client)", headers={"Retry-After": "5"})
    group = who.cap_group or who.owner
    if who.key_cap is not None and sum((s.cap_group or s.owner) == group for s in live) >= who.key_cap:
        raise HTTPJSONError(429, "key_session_limit", f"this key may hold {who.key_cap} sessions at once",
                            headers={"Retry-After": "5"})


def admit(app: AppState, make: Callable[[OnClosed], S], who: Caller | None = None) -> S:
    """A new session in the table, made by ``make(on_closed)`` and bound to ``who`` (None: to nobody, so only the
    admin sees it); 429 past the caller's caps (:func:`check_held`), 503 ``busy`` when every slot is taken."""
    cfg = app[CONFIG]
    services = app[SERVICES]
    sessions = app[SESSIONS]
    if who is not None:
        check_held(app, who)
    if len(sessions) >= cfg.server.max_sessions:
        services.metrics.errors_total.labels(stage="capacity").inc()
        raise HTTPJSONError(
            503, "busy", f"all {cfg.server.max_sessions} session slots are in use", headers={"Retry-After": "5"}
        )
    session = make(lambda s: forget(app, s))
    if who is not None:
        session.owner = who.owner
        session.cap_group = who.cap_group
        session.client = session.client or who.client
        session.traceparent = who.traceparent
    sessions[session.id] = session
    services.metrics.sessions_total.inc()
    services.metrics.sessions_active.set(len(sessions))
    return session


async def open_session(
    app: AppState, sdp: str, who: Caller, *, responder: str | None = None, voice: str | None = None,
    make: Callable[[OnClosed], Session] | None = None, language: str | None = None, transport: str = "page",
) -> Session:
    """Start a session for this offer, bound to ``who``, and apply it; the answer is
    ``session.pc.localDescription``.

    ``make(on_closed)`` builds the session (default: a :class:`Session` with ``responder``, ``voice`` and the
    caller's client, the key of the per-client limits)."""
    cfg = app[CONFIG]
    services = app[SERVICES]
    check_held(app, who)  # before anyone's connecting session is evicted to make room for this one
    await make_room_to_connect(app, who.client)
    session = admit(app, make or (lambda on_closed: Session(
        services, cfg, on_closed=on_closed, responder=responder, voice=voice, client=who.client)), who)
    session.transport = transport
    if language is not None:
        session.conversation.set_language(language)
    try:
        await asyncio.wait_for(session.accept(sdp, "offer"), timeout=cfg.server.connect_timeout_s)
    except Exception as exc:
        await session.close("bad_offer")
        if isinstance(exc, TimeoutError):
            raise HTTPJSONError(504, "offer_timeout", "could not gather ICE candidates in time") from None
        log.info("offer_rejected error=%s", type(exc).__name__)
        raise HTTPJSONError(400, "bad_offer", f"the offer could not be applied: {type(exc).__name__}") from None
    log.info("session_open session=%s active=%d", session.id, len(app[SESSIONS]))
    return session


def forget(app: AppState, session: ConversationSession) -> None:
    sessions = app[SESSIONS]
    sessions.pop(session.id, None)
    app[SERVICES].metrics.sessions_active.set(len(sessions))


def owned_session(request: web.Request) -> ConversationSession | None:
    """The open session the path's ``{session_id}`` names, if the caller's key opened it (or is the admin's);
    None otherwise, so another caller's session looks like no session at all."""
    session = request.config_dict[SESSIONS].get(request.match_info["session_id"])
    if session is None or session.closed or not principal_of(request).owns(session.owner):
        return None
    return session


def session_or_404(request: web.Request) -> Session:
    """The caller's peer session the path names (a Realtime WebSocket session has no peer: 404 here too)."""
    session = owned_session(request)
    if not isinstance(session, Session):
        raise HTTPJSONError(404, "unknown_session", "no such session")
    return session


async def read_text(request: web.Request, content_type: str, max_bytes: int) -> str:
    """A bounded UTF-8 body of exactly this media type (415 for another, 413 when too big)."""
    if request.content_type != content_type:
        raise HTTPJSONError(
            415, "unsupported_media_type", f"Content-Type must be {content_type}, got {request.content_type!r}"
        )
    raw = await read_body(request, max_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPJSONError(400, "bad_encoding", "body must be UTF-8 text") from None


OFFER_SCHEMA = {
    "type": "object", "required": ["sdp", "type"],
    "properties": {"sdp": {"type": "string", "maxLength": lambda cfg: cfg.server.max_sdp_bytes},
                   "type": {"const": "offer"}, "voice": {"type": "string"},
                   "responder": {"type": "string"},
                   "language": {"type": "string", "description": "the language the session is heard in: auto "
                                "(each turn's detected) or a code the ASR hears (the session event lists them); "
                                "the data channel's {type: language} changes it mid-call"}},
}
ANSWER_SCHEMA = {
    "type": "object", "required": ["sdp", "type", "session_id"],
    "properties": {"sdp": {"type": "string"}, "type": {"const": "answer"},
                   "session_id": {"type": "string"},
                   "location": {"type": "string", "description": "the session resource: PATCH "
                                "trickled candidates there, DELETE to hang up"},
                   "etag": {"type": "string", "description": "If-Match value for PATCH"},
                   "responder": {"type": "object", "description": "who answers: {engine, model}; why that model "
                                 "(respond.model_path = auto) and, while its engine is down, {state, reason} too",
                                 "properties": {"engine": {"type": "string"}, "model": {"type": "string"}}}},
}
SESSION_ID = [{"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}]


@documented(
    "Start a voice chat session (WebRTC offer → answer)",
    request={"application/json": {"schema": ref("Offer")}},
    responses={
        "200": json_body(ref("Answer"), "SDP answer and the session id"),
        "400": error("bad offer"), "413": error("SDP too large"),
        "503": error("not ready, or all session slots busy"), "504": error("ICE gathering timeout"),
    },
    schemas={"Offer": OFFER_SCHEMA, "Answer": ANSWER_SCHEMA},
)
async def offer(request: web.Request) -> web.Response:
    """``POST /api/offer``: the page's JSON signaling."""
    app = request.app
    cfg = app[CONFIG]
    check_ready(app)
    data = await read_json(request, cfg.server.max_body_bytes)
    sdp, type_ = data.get("sdp"), data.get("type")
    if not isinstance(sdp, str) or not sdp.strip():
        raise HTTPJSONError(400, "bad_offer", "field 'sdp' must be a non-empty string")
    if type_ != "offer":
        raise HTTPJSONError(400, "bad_offer", "field 'type' must be \"offer\"")
    check_sdp(sdp, cfg.server.max_sdp_bytes)
    responder, voice = data.get("responder"), data.get("voice")
    check_choices(app, responder, voice)
    language = check_language(app, data["language"]) if data.get("language") is not None else None
    session = await open_session(app, sdp, caller(request), responder=responder, voice=voice, language=language)
    answer = session.pc.localDescription
    return web.json_response(
        {
            "sdp": answer.sdp,
            "type": answer.type,
            "session_id": session.id,
            "location": f"/api/sessions/{session.id}",  # PATCH trickled candidates here, DELETE to hang up
            "etag": session.etag,
            "responder": _who_answers(app, responder),
        }
    )


def _who_answers(app: AppState, responder: object) -> dict[str, str]:
    """The responder (and its model) this session talks to: the page shows it."""
    info = app[SERVICES].describe_responder(responder if isinstance(responder, str) else None)
    who = {"engine": str(info.get("engine", "")), "model": str(info.get("model", ""))}
    if info.get("why"):  # respond.model_path = auto: why this model answers
        who["why"] = str(info["why"])
    if info.get("state"):  # its engine is down (its child process restarting, or failed for good): why
        who["state"], who["reason"] = str(info["state"]), str(info.get("reason", ""))
    return who


@documented("The caller's open sessions on this gateway (the admin's key: every session, with its owner and "
            "client)", responses={"200": json_body({"type": "object"}, "{sessions: [{session_id, turns, tasks}]}")})
async def list_sessions(request: web.Request) -> web.Response:
    who = principal_of(request)
    listed = []
    for s in request.app[SESSIONS].values():
        if s.closed or not who.owns(s.owner):
            continue
        entry: dict[str, object] = {"session_id": s.id, "turns": s.conversation.turns, "tasks": s.task_count}
        if who.admin:
            entry |= {"owner": s.owner, "client": s.client}
        listed.append(entry)
    return web.json_response({"sessions": listed})


@documented("Hang up one of the caller's sessions (WHIP DELETE too)", parameters=SESSION_ID, responses={
    "200": json_body({"type": "object"}, "closed"), "404": error("no such session (or not the caller's)")})
async def hang_up(request: web.Request) -> web.Response:
    """``DELETE /api/sessions/{id}``."""
    session = owned_session(request)
    if session is None:
        raise HTTPJSONError(404, "unknown_session", "no such session")
    await session.close("hangup")
    return web.json_response({"status": "closed", "session_id": session.id})


@documented(
    "Trickle ICE: the client's candidates as an RFC 8840 fragment (If-Match: the ETag)",
    parameters=SESSION_ID,
    request={"application/trickle-ice-sdpfrag": {"schema": {
        "type": "string", "maxLength": lambda cfg: cfg.ice.max_fragment_bytes}}},
    responses={
        "204": {"description": "candidates applied"}, "400": error("bad fragment"),
        "404": error("unknown session"), "412": error("If-Match is not this session's ETag"),
        "413": error("fragment too large"), "415": error("wrong Content-Type"),
        "422": error("ICE restart (new ufrag/pwd) or too many candidates"),
    },
)
async def trickle(request: web.Request) -> web.Response:
    """``PATCH /api/sessions/{id}``: the client's trickled candidates (RFC 8840 fragment, RFC 9725 rules)."""
    ice = request.app[CONFIG].ice
    session = session_or_404(request)
    if_match = request.headers.get("If-Match")
    if if_match is not None and if_match.strip() != "*" and not hmac.compare_digest(if_match.strip(), session.etag):
        raise HTTPJSONError(412, "precondition_failed", "If-Match does not name this session's ICE session (ETag)")
    text = await read_text(request, SDPFRAG, ice.max_fragment_bytes)
    try:
        frag = parse_sdpfrag(text, ice.max_remote_candidates)
    except FragmentError as exc:
        raise HTTPJSONError(400, "bad_fragment", str(exc)) from None
    ufrag, pwd = session.remote_ice
    if (frag.ufrag is not None and frag.ufrag != ufrag) or (frag.pwd is not None and frag.pwd != pwd):
        # New credentials mean an ICE restart, which aiortc cannot do (RFC 9725: 422 when unsupported).
        raise HTTPJSONError(422, "ice_restart_unsupported", "ice-ufrag/ice-pwd differ from the offer's; no restarts")
    try:
        await session.add_remote_candidates(frag.candidates, frag.end_of_candidates)
    except OverflowError as exc:
        raise HTTPJSONError(422, "too_many_candidates", str(exc)) from None
    return web.Response(status=204)
