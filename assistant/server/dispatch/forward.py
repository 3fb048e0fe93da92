"""What the dispatcher does with each kind of route (``routes.Forward``): offers to the least-loaded gateway, a
session's calls to the gateway its id names, the session list gathered from all, the rest proxied to one ready
gateway (WebSockets joined both ways). Bodies are bounded before anything is forwarded.

The caller's own credential goes to the gateway as it came (the ``Authorization`` header, a WebSocket's
``?token=`` as that header, an OpenAI browser client's key subprotocol), never the dispatcher's token: each gateway
sees who the caller is, binds the sessions it opens to that key and shows it only its own. The dispatcher's token
goes only on its own calls (the heartbeat, the count of what a client holds across gateways).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence

import aiohttp
from aiohttp import WSMsgType, web
from yarl import URL

from assistant.body import loads_bounded, read_capped
from assistant.server.dispatch.gateways import (
    CONNECT_TIMEOUT_S,
    DISPATCHER,
    LOADING,
    READY,
    Dispatcher,
    Gateway,
    failure_text,
)
from assistant.server.front import refuse_unless_admin
from assistant.server.http import CONFIG, HTTPJSONError, WriteStalled, json_error, read_body, write_within
from assistant.server.keys import principal_of
from assistant.server.limits import LIMITS
from assistant.telemetry import forwarding, names

log = logging.getLogger(__name__)

TOKEN_PARAM = "token"  # the WebSocket's query-string token (browsers cannot set headers on an upgrade)
ANSWER_CAP = 1 << 20  # an SDP answer, a session list or a JSON error: a few KB; more is a broken gateway
WS_HEARTBEAT_S = 30.0  # as the gateway's /ws/tts: a peer silent this long is dead
WS_CLOSE_TIMEOUT_S = 5.0
# Request headers a gateway needs; nothing else (cookies, Origin, hop-by-hop) leaves the dispatcher. The W3C trace
# context goes on, so a client's trace reaches the gateway's call span (telemetry) through the dispatcher.
TRACE_HEADERS = ("traceparent", "tracestate")
FORWARD_HEADERS = ("Authorization", "Content-Type", "If-Match", "Accept", "OpenAI-Beta", *TRACE_HEADERS)
WS_FORWARD_HEADERS = ("Authorization", "OpenAI-Beta", *TRACE_HEADERS)
# Answer headers of the signaling routes (WHIP: RFC 9725) relayed to the client.
OFFER_HEADERS = ("Content-Type", "Location", "ETag", "Link", "Accept-Patch", "Access-Control-Expose-Headers",
                 "Retry-After")
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding",
    "Upgrade", "Date", "Server", "Set-Cookie",
    "Access-Control-Allow-Origin", "Access-Control-Allow-Headers", "Access-Control-Allow-Methods", "Vary",
))


# --- helpers ---------------------------------------------------------------------------------------------
def forward_headers(request: web.Request, names: Iterable[str] = FORWARD_HEADERS) -> dict[str, str]:
    """The named headers, and the client's address as X-Forwarded-For (a gateway that trusts the dispatcher in
    ``server.trusted_proxies`` keys its per-client limits on it). The client's own X-Forwarded-For is not passed
    on: the address is the one the dispatcher worked out (past the proxies it trusts)."""
    out = {n: request.headers[n] for n in names if n in request.headers}
    out["X-Forwarded-For"] = request.app[LIMITS].client_address(request)
    return out


async def read_answer(up: aiohttp.ClientResponse) -> bytes:
    """A gateway's whole answer (``BodyTooLarge``, a ValueError, past ANSWER_CAP: a broken gateway)."""
    return await read_capped(up, ANSWER_CAP)


def relay(up: aiohttp.ClientResponse, body: bytes, names: Iterable[str] = OFFER_HEADERS) -> web.Response:
    """A gateway's buffered answer: its status, its body and the named headers (every value of each)."""
    resp = web.Response(status=up.status, body=body)
    for name in names:
        for value in up.headers.getall(name, ()):
            resp.headers.add(name, value)
    return resp


def _error_of(body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(loads_bounded(body).get("error", ""))
    return ""


def _target(g: Gateway, request: web.Request) -> URL:
    """The request's path and query on ``g``; a ``token`` query parameter is never passed on (a WebSocket's is
    sent as a header instead: :func:`ws_proxy`)."""
    return g.url(request.rel_url.raw_path, request.rel_url.without_query_params(TOKEN_PARAM).raw_query_string)




# --- what a client holds across gateways -----------------------------------------------------------------
async def _held(request: web.Request) -> list[dict[str, object]]:
    """Every session of every answering gateway, as the admin sees them (owner and client), for the caps."""
    d = request.app[DISPATCHER]
    gateways = [g for g in d.gateways if g.state in (READY, LOADING)]

    async def one(g: Gateway) -> list[object]:
        async with d.http.get(g.url("/api/sessions"), headers=d.admin_headers, allow_redirects=False) as up:
            listed = loads_bounded(await read_answer(up))["sessions"] if up.status == 200 else []
        return listed if isinstance(listed, list) else []

    answers = await asyncio.gather(*(one(g) for g in gateways), return_exceptions=True)
    return [s for a in answers if isinstance(a, list) for s in a if isinstance(s, dict)]


async def check_caps(request: web.Request) -> None:
    """The caps each gateway checks for its own sessions, checked across all of them before a request that opens
    one is forwarded: ``server.max_sessions_per_client`` and the caller's key's ``max_sessions``. (A gateway that
    does not answer the count is left out of it; each gateway still holds to its own.)"""
    d = request.app[DISPATCHER]
    per_client = request.app[CONFIG].server.max_sessions_per_client
    who = principal_of(request)
    if len(d.gateways) < 2 or (per_client <= 0 and who.max_sessions is None):
        return  # one gateway counts everything itself
    sessions = await _held(request)
    client = request.app[LIMITS].client(request)
    if per_client > 0 and sum(s.get("client") == client for s in sessions) >= per_client:
        raise HTTPJSONError(429, "too_many_sessions", f"this client already holds {per_client} sessions "
                            "(server.max_sessions_per_client)", headers={"Retry-After": "5"})
    if who.max_sessions is not None and sum(s.get("owner") == who.id for s in sessions) >= who.max_sessions:
        raise HTTPJSONError(429, "key_session_limit", f"this key may hold {who.max_sessions} sessions at once",
                            headers={"Retry-After": "5"})


# --- signaling -------------------------------------------------------------------------------------------
def _span_attributes(request: web.Request) -> dict[str, str]:
    """What the dispatcher's span of a forwarded request says of it (route and method: never the query, which
    may hold a token)."""
    route = request.match_info.route.resource
    return {names.HTTP_METHOD: request.method,
            names.HTTP_ROUTE: route.canonical if route is not None else request.path}


async def place_offer(request: web.Request, cap: int) -> web.Response:
    """An offer (``/api/offer`` JSON, WHIP SDP) to the least-loaded gateway; see ``dispatch/__init__.py``. With
    telemetry on, a ``dispatch`` span (under the client's traceparent) is the parent of the gateway's call span."""
    d = request.app[DISPATCHER]
    body = await read_body(request, cap)
    headers = forward_headers(request)
    with forwarding(d.telemetry, names.DISPATCH, headers, _span_attributes(request)) as note:
        return await _offer(request, body, headers, note)


async def _offer(request: web.Request, body: bytes, headers: dict[str, str],
                 note: Callable[..., None]) -> web.Response:
    d = request.app[DISPATCHER]
    busy = False
    for tries, g in enumerate(d.for_offer(), start=1):
        note(tries=tries)
        t0 = time.perf_counter()
        g.sessions += 1  # the slot is taken now, so offers arriving meanwhile see it (the heartbeat corrects)
        try:
            async with d.http.post(_target(g, request), data=body, headers=headers, allow_redirects=False) as up:
                answer = await read_answer(up)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: nothing reached this gateway
            g.sessions = max(0, g.sessions - 1)
            d.metrics.offers_total.labels(gateway=g.id, outcome="unreachable").inc()
            d.mark_down(g, failure_text(exc))
            continue
        except TimeoutError:
            # The gateway may still be applying the offer: another try could open a second session for it.
            d.metrics.offers_total.labels(gateway=g.id, outcome="timeout").inc()
            log.warning("dispatch_offer gateway=%s status=504 ms=%.1f error=timeout", g.id,
                        1000 * (time.perf_counter() - t0))
            raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer the offer in time") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            g.sessions = max(0, g.sessions - 1)
            d.metrics.offers_total.labels(gateway=g.id, outcome="unreachable").inc()
            d.mark_down(g, failure_text(exc))
            continue
        ms = 1000 * (time.perf_counter() - t0)
        if up.status == 503:
            error = _error_of(answer)
            error = error if error in ("busy", "not_ready") else "unavailable"  # a bounded label set
            d.metrics.offers_total.labels(gateway=g.id, outcome=error).inc()
            log.info("dispatch_offer gateway=%s status=503 ms=%.1f error=%s next=1", g.id, ms, error)
            if error == "busy":
                busy = True
                g.sessions = max(g.sessions, g.max_sessions)  # full until its heartbeat says otherwise
            else:
                g.sessions = max(0, g.sessions - 1)
            continue
        ok = 200 <= up.status < 300
        if not ok:
            g.sessions = max(0, g.sessions - 1)
        d.metrics.offers_total.labels(gateway=g.id, outcome="ok" if ok else "refused").inc()
        log.info("dispatch_offer gateway=%s status=%d ms=%.1f", g.id, up.status, ms)
        note(gateway=g.id, status=up.status)
        return relay(up, answer)
    if busy or any(g.ready for g in d.gateways):
        d.metrics.offers_total.labels(gateway="none", outcome="busy").inc()
        log.info("dispatch_offer gateway=none status=503 error=busy")
        raise HTTPJSONError(503, "busy", "every gateway's session slots are in use", headers={"Retry-After": "5"})
    d.metrics.offers_total.labels(gateway="none", outcome="not_ready").inc()
    log.info("dispatch_offer gateway=none status=503 error=not_ready")
    raise HTTPJSONError(503, "not_ready", "no gateway is ready; retry shortly", headers={"Retry-After": "2"})


async def session_call(request: web.Request, cap: int) -> web.Response:
    """``PATCH`` (trickled candidates) and ``DELETE`` (hang up) ``/api/sessions/{id}``: to the id's gateway."""
    d = request.app[DISPATCHER]
    g = d.owner(request.match_info["session_id"])
    if g is None:
        raise HTTPJSONError(404, "unknown_session", "no such session")
    body = await read_body(request, cap)
    t0 = time.perf_counter()
    try:
        async with d.http.request(request.method, _target(g, request), data=body or None,
                                  headers=forward_headers(request), allow_redirects=False) as up:
            answer = await read_answer(up)
    except TimeoutError:
        raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        d.mark_down(g, failure_text(exc))
        raise HTTPJSONError(502, "gateway_unreachable", f"gateway {g.id} holds this session and is not answering",
                            headers={"Retry-After": "2"}) from None
    if request.method == "DELETE" and up.status == 200:
        g.sessions = max(0, g.sessions - 1)
    log.info("dispatch_session method=%s gateway=%s status=%d ms=%.1f", request.method, g.id, up.status,
             1000 * (time.perf_counter() - t0))
    return relay(up, answer)


async def list_sessions(request: web.Request, cap: int) -> web.Response:
    """``GET /api/sessions``: every answering gateway's sessions in one list (``unreachable``: who did not)."""
    d = request.app[DISPATCHER]
    gateways = [g for g in d.gateways if g.state in (READY, LOADING)]
    headers = forward_headers(request, ("Authorization",))

    async def one(g: Gateway) -> tuple[int, bytes]:
        async with d.http.get(_target(g, request), headers=headers, allow_redirects=False) as up:
            return up.status, await read_answer(up)

    answers = await asyncio.gather(*(one(g) for g in gateways), return_exceptions=True)
    sessions: list[object] = []
    unreachable: list[str] = []
    for g, answer in zip(gateways, answers, strict=True):
        if isinstance(answer, BaseException):
            unreachable.append(g.id)
            continue
        status, body = answer
        if status in (401, 403):  # the token is wrong for the gateways too: say so, not "no sessions"
            return web.Response(status=status, body=body, content_type="application/json")
        try:
            listed = loads_bounded(body)["sessions"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            listed = None
        if not isinstance(listed, list):
            unreachable.append(g.id)
            continue
        sessions.extend(listed)
    out: dict[str, object] = {"sessions": sessions}
    if unreachable:
        out["unreachable"] = unreachable
    return web.json_response(out)


# --- everything else: pass-through ----------------------------------------------------------------------
async def passthrough(request: web.Request, cap: int) -> web.StreamResponse:
    """Any other ``/api/*`` or ``/v1/*`` call: to one ready gateway, its answer streamed back as it comes."""
    d = request.app[DISPATCHER]
    body = await read_body(request, cap) if cap else b""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                    sock_read=d.cfg.dispatch.request_timeout_s)
    for g in d.for_request():
        try:
            up = await d.http.request(request.method, _target(g, request), data=body or None,
                                      headers=forward_headers(request), allow_redirects=False, timeout=timeout)
        except aiohttp.ConnectionTimeoutError as exc:
            d.mark_down(g, failure_text(exc))
            continue
        except TimeoutError:
            raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:  # nothing was answered: another gateway may
            d.mark_down(g, failure_text(exc))
            continue
        async with up:
            return await _stream_back(request, up, g)
    raise HTTPJSONError(503, "not_ready", "no gateway is ready; retry shortly", headers={"Retry-After": "2"})


async def _stream_back(request: web.Request, up: aiohttp.ClientResponse, g: Gateway) -> web.StreamResponse:
    resp = web.StreamResponse(status=up.status, reason=up.reason)
    for name, value in up.headers.items():
        if name.lower() not in HOP_BY_HOP:
            resp.headers.add(name, value)
    await resp.prepare(request)
    while True:
        try:
            chunk = await up.content.readany()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            # The status is sent: cut the connection so the client sees a broken body, not a short complete one.
            log.warning("dispatch_stream_cut gateway=%s path=%s error=%s", g.id, request.path, failure_text(exc))
            if request.transport is not None:
                request.transport.abort()
            return resp
        if not chunk:
            break
        try:  # a client that went away raises here, and the gateway's answer is dropped
            await write_within(request, resp.write(chunk), request.app[CONFIG].tts_api.write_timeout_s)
        except WriteStalled:  # nor may a client that stopped reading hold the gateway's stream
            log.info("dispatch_stream_cut gateway=%s path=%s error=write_timeout", g.id, request.path)
            return resp
    await resp.write_eof()
    return resp


async def kept_on_gateways(request: web.Request, cap: int) -> web.Response:
    """State each gateway keeps for itself (registered voices, a phone call's media token, an outgoing SIP call)
    cannot be reached through the front."""
    if request.path.startswith("/telephony/"):
        raise HTTPJSONError(
            501, "not_supported", "a phone call's media token is kept by the gateway that answered its webhook: "
            "point the carrier at a gateway (its telephony.public_url), not at the dispatcher",
        )
    if request.path.startswith("/api/sip/"):
        raise HTTPJSONError(
            501, "not_supported", "an outgoing SIP call is placed and held by one gateway: ask that gateway (the one "
            "with sip.trunk), not the dispatcher",
        )
    raise HTTPJSONError(
        501, "not_supported",
        "voices are stored on each gateway: add or remove them on every gateway, not through the dispatcher",
    )


async def ws_proxy(request: web.Request, cap: int) -> web.StreamResponse:
    """``/ws/*``: the client's WebSocket joined to one on a ready gateway; frames both ways, closes propagated."""
    d = request.app[DISPATCHER]
    if not web.WebSocketResponse().can_prepare(request).ok:
        raise HTTPJSONError(400, "bad_request", "expected a WebSocket upgrade")
    headers = forward_headers(request, WS_FORWARD_HEADERS)
    # The subprotocols the client offers go to the gateway (OpenAI's Realtime clients name the API, a beta
    # marker, and from a browser the key); the one it picks is the one the client gets.
    offered = tuple(p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip())
    if "Authorization" not in headers and TOKEN_PARAM in request.query:  # the page's ?token=, as a header
        headers["Authorization"] = f"Bearer {request.query[TOKEN_PARAM]}"
    candidates = d.for_request()
    if "call_id" in request.query:  # a Realtime call's control socket: to the gateway that holds the call
        owner = d.owner(request.query["call_id"])
        if owner is None:
            raise HTTPJSONError(404, "call_not_found", "no open call has this call_id")
        candidates = [owner]
    # With telemetry on, a ``dispatch`` span covers the upgrade's way to a gateway (not the socket's life).
    with forwarding(d.telemetry, names.DISPATCH, headers, _span_attributes(request)) as note:
        joined = await _connect(d, request, candidates, headers, offered, cap, note)
    if isinstance(joined, web.Response):
        return joined
    upstream, g = joined
    ws = web.WebSocketResponse(heartbeat=WS_HEARTBEAT_S, max_msg_size=cap,
                               protocols=(upstream.protocol,) if upstream.protocol else ())
    # The handshake's own headers (/ws/tts: X-Sample-Rate, X-Channels, X-Sample-Format) are part of the protocol.
    handshake = getattr(upstream, "_response", None)  # aiohttp keeps the upgrade response only privately
    if handshake is not None:
        for name, value in handshake.headers.items():
            if name.lower().startswith("x-"):
                ws.headers[name] = value
    try:
        await ws.prepare(request)
        await _join(ws, upstream, f"{g.id}{request.path}")
    finally:
        await upstream.close()
    return ws


async def _connect(d: Dispatcher, request: web.Request, candidates: Sequence[Gateway], headers: dict[str, str],
                   offered: tuple[str, ...], cap: int,
                   note: Callable[..., None]) -> tuple[aiohttp.ClientWebSocketResponse, Gateway] | web.Response:
    """The upstream WebSocket on the first candidate that takes it (and which), or the refusal to answer."""
    for tries, g in enumerate(candidates, start=1):
        note(tries=tries)
        try:
            upstream = await d.http.ws_connect(
                _target(g, request), headers=headers, max_msg_size=cap, protocols=offered,
                heartbeat=WS_HEARTBEAT_S, timeout=aiohttp.ClientWSTimeout(ws_close=WS_CLOSE_TIMEOUT_S),
            )
        except aiohttp.WSServerHandshakeError as exc:  # the gateway refused the upgrade: tell the client why
            error = (exc.message or "refused").lower().replace(" ", "_")
            note(gateway=g.id, status=exc.status)
            return json_error(exc.status, error, f"gateway {g.id} refused the WebSocket")
        except aiohttp.ConnectionTimeoutError as exc:
            d.mark_down(g, failure_text(exc))
            continue
        except TimeoutError:
            raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            d.mark_down(g, failure_text(exc))
            continue
        note(gateway=g.id, status=101)
        return upstream, g
    raise HTTPJSONError(503, "not_ready", "no gateway is ready; retry shortly", headers={"Retry-After": "2"})


Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse  # either end of a forwarded WebSocket


async def _pump(src: Socket, dst: Socket) -> tuple[int, str]:
    """Frames from ``src`` to ``dst`` one at a time (each send awaited: bounded); the close code and reason."""
    while True:
        msg = await src.receive()
        if msg.type is WSMsgType.TEXT:
            await dst.send_str(msg.data)
        elif msg.type is WSMsgType.BINARY:
            await dst.send_bytes(msg.data)
        elif msg.type is WSMsgType.CLOSE:
            return int(msg.data or 1000), str(msg.extra or "")
        elif msg.type in (WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return 1011, "gone"


async def _join(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse, where: str) -> None:
    """Run both pumps until one side closes; close the other with the same code and reason."""
    down = asyncio.ensure_future(_pump(upstream, client))
    up = asyncio.ensure_future(_pump(client, upstream))
    try:
        done, _ = await asyncio.wait((down, up), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (down, up):
            task.cancel()
        for task in (down, up):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    first = done.pop()
    code, reason = (1011, "proxy error") if first.cancelled() or first.exception() else first.result()
    if code in (1005, 1006, 1015):  # reserved: they describe a close, they cannot be sent
        code = 1000 if code == 1005 else 1011
    other = upstream if first is up else client
    with contextlib.suppress(Exception):
        await other.close(code=code, message=reason.encode()[:123])
    log.info("dispatch_ws where=%s closed_by=%s code=%d", where, "client" if first is up else "gateway", code)


# --- health -----------------------------------------------------------------------------------------------
async def readyz(request: web.Request) -> web.Response:
    """Ready while at least one gateway is; to the admin also the gateways and their last heartbeat."""
    d = request.app[DISPATCHER]
    ready = [g for g in d.gateways if g.ready]
    if not principal_of(request).admin:  # gateway URLs are the operator's business
        return web.json_response({"status": "ready" if ready else "no_gateway"}, status=200 if ready else 503)
    body = {
        "status": "ready" if ready else "no_gateway",
        "sessions": sum(g.sessions for g in ready),
        "max_sessions": sum(g.max_sessions for g in ready),
        "gateways": [g.to_json() for g in d.gateways],
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    refuse_unless_admin(request)
    body, content_type = request.app[DISPATCHER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


