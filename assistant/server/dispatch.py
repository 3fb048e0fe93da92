"""``assistant dispatch``: one front for several gateways (each an ``assistant serve`` with a ``server.gateway_id``).

Only signaling passes through here: a gateway's SDP answer carries its own ICE candidates, so the media of a
session flows between the browser and that gateway, and no load-balancer stickiness is needed.

- ``POST /api/offer``, ``POST /api/whip``: the ready gateway with the most free slots (ties: fewest sessions, then
  round robin) gets the offer. A ``503`` (``busy``, ``not_ready``) or a connection that fails moves it to the next
  one; each gateway is tried at most once per offer. The chosen gateway's session count goes up at once, so a burst
  of offers spreads before the next heartbeat.
- ``PATCH``/``DELETE /api/sessions/{id}``: the gateway named by the id's prefix (``gA.<token>``).
- ``GET /api/sessions``: every gateway's list, merged.
- Any other ``GET /api/*``, ``POST /api/tts``, ``/v1/*``: one ready gateway, the answer streamed back;
  ``/ws/*``: a WebSocket proxied both ways.
- ``GET /readyz`` (ready while one gateway is), ``/healthz``, ``/metrics``, and the page.

Every gateway is polled (``GET /readyz``) each ``dispatch.poll_interval_s``; one that fails a poll is down until it
answers again. Requests go only to the configured gateway URLs (redirects included: a client middleware refuses any
other origin), bodies are bounded before anything is forwarded, and every call to a gateway has a time limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from yarl import URL

from assistant.config import GATEWAY_ID, Config, ConfigError
from assistant.server.front import PROTECTED, add_page_routes, middlewares
from assistant.server.http import CONFIG, HTTPJSONError, json_error, read_body

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # a gateway on the same network connects in milliseconds; after 5 s it is gone
ANSWER_CAP = 1 << 20  # an SDP answer, a session list or a JSON error: a few KB; more is a broken gateway
READYZ_CAP = 65_536
WS_HEARTBEAT_S = 30.0  # as the gateway's /ws/tts: a peer silent this long is dead
WS_CLOSE_TIMEOUT_S = 5.0
# Request headers a gateway needs; nothing else (cookies, Origin, hop-by-hop) leaves the dispatcher.
FORWARD_HEADERS = ("Authorization", "Content-Type", "If-Match", "Accept")
# Answer headers of the signaling routes (WHIP: RFC 9725) relayed to the client.
OFFER_HEADERS = ("Content-Type", "Location", "ETag", "Link", "Accept-Patch", "Access-Control-Expose-Headers",
                 "Retry-After")
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Transfer-Encoding",
    "Upgrade", "Date", "Server", "Set-Cookie",
    "Access-Control-Allow-Origin", "Access-Control-Allow-Headers", "Access-Control-Allow-Methods", "Vary",
))
# Gateway states a heartbeat leads to; only "ready" takes requests.
READY, LOADING, DOWN, UNKNOWN, NO_ID, DUPLICATE_ID = "ready", "loading", "down", "unknown", "no_id", "duplicate_id"


# --- config ----------------------------------------------------------------------------------------------
def check_dispatch_config(cfg: Config) -> list[URL]:
    """The gateway base URLs, or a ConfigError that says what is wrong with ``[dispatch]``."""
    d = cfg.dispatch
    if not d.gateways:
        raise ConfigError("dispatch.gateways is empty: name each gateway's base URL (--dispatch.gateways "
                          "http://10.0.0.5:8081,http://10.0.0.5:8082)")
    urls: list[URL] = []
    for text in d.gateways:
        try:
            url = URL(text.strip())
        except ValueError as exc:
            raise ConfigError(f"dispatch.gateways: {text!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"dispatch.gateways: {text!r} must be an http:// or https:// URL with a host")
        if url.user or url.password or url.query_string or url.fragment:
            raise ConfigError(f"dispatch.gateways: {text!r} must be a base URL (no user, query or fragment)")
        url = url.with_path(url.path.rstrip("/"))
        if url in urls:
            raise ConfigError(f"dispatch.gateways: {text!r} is named twice")
        urls.append(url)
    for name in ("poll_interval_s", "poll_timeout_s", "request_timeout_s"):
        if getattr(d, name) <= 0:
            raise ConfigError(f"dispatch.{name} must be above 0")
    if d.request_timeout_s <= cfg.server.connect_timeout_s:
        raise ConfigError(
            f"dispatch.request_timeout_s ({d.request_timeout_s:g}) must exceed server.connect_timeout_s "
            f"({cfg.server.connect_timeout_s:g}): a gateway may take that long to answer an offer"
        )
    if d.max_connections < 1:
        raise ConfigError("dispatch.max_connections must be at least 1")
    return urls


def forward_cap(cfg: Config) -> int:
    """Largest body forwarded on the pass-through routes: a gateway's largest JSON TTS request (a base64 clip)."""
    return cfg.server.max_body_bytes + (cfg.tts_api.max_upload_bytes * 4) // 3 + 16


# --- the gateways ----------------------------------------------------------------------------------------
@dataclass
class Gateway:
    """One configured gateway, as its last heartbeat (and the offers since) describe it."""

    base: URL
    id: str = ""
    state: str = UNKNOWN
    sessions: int = 0
    max_sessions: int = 0

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def free(self) -> int:
        return self.max_sessions - self.sessions

    def url(self, path: str, query: str = "") -> URL:
        """``path`` (the client's, as received) on this gateway: appended to the base, never resolved against it."""
        b = self.base
        return URL.build(scheme=b.scheme, host=b.raw_host or "", port=b.explicit_port,
                         path=b.raw_path.rstrip("/") + path, query_string=query, encoded=True)

    def to_json(self) -> dict[str, Any]:
        return {"url": str(self.base), "gateway": self.id, "state": self.state, "sessions": self.sessions,
                "max_sessions": self.max_sessions}


class DispatchMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.offers_total = Counter("assistant_dispatch_offers_total",
                                    "offers by the gateway tried and what it answered (gateway=none: nobody took it)",
                                    ["gateway", "outcome"], registry=self.registry)
        self.gateways_up = Gauge("assistant_dispatch_gateways_up", "gateways answering their heartbeat",
                                 registry=self.registry)
        self.gateways_ready = Gauge("assistant_dispatch_gateways_ready", "gateways taking sessions",
                                    registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Dispatcher:
    """The gateway table, the one HTTP client every call to a gateway uses, and the heartbeat."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.gateways = [Gateway(url) for url in check_dispatch_config(cfg)]
        self.metrics = DispatchMetrics()
        self._origins = {(g.base.scheme, g.base.host, g.base.port) for g in self.gateways}
        self._turn = 0  # round robin among equals
        self._http: aiohttp.ClientSession | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "the dispatcher is not started"
        return self._http

    async def start(self) -> None:
        d = self.cfg.dispatch
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=d.max_connections),
            timeout=aiohttp.ClientTimeout(total=d.request_timeout_s, sock_connect=CONNECT_TIMEOUT_S),
            cookie_jar=aiohttp.DummyCookieJar(),  # one client for every user: it must remember nothing
            auto_decompress=False,  # bodies are relayed as the gateway sent them
            middlewares=(self._only_gateways,),
        )
        await self.poll()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="dispatch-heartbeat")

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self._http is not None:
            await self._http.close()

    async def _only_gateways(self, req: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        """Every request leaving the dispatcher (a redirect's next hop too) goes to a configured gateway."""
        if (req.url.scheme, req.url.host, req.url.port) not in self._origins:
            raise aiohttp.InvalidURL(req.url, "not a configured gateway")
        return await handler(req)

    # --- heartbeat ------------------------------------------------------------------------------------
    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.dispatch.poll_interval_s)
            try:
                await self.poll()
            except Exception:  # a bug here must not freeze the table for good: log it, beat again
                log.exception("dispatch_heartbeat_failed")

    async def poll(self) -> None:
        """One heartbeat to every gateway at once; then the table and the gauges say what they answered."""
        states = await asyncio.gather(*(self._poll_one(g) for g in self.gateways))
        seen: set[str] = set()
        for g, state in zip(self.gateways, states, strict=True):
            if state in (READY, LOADING):  # two gateways with one id cannot both be routed to: the first keeps it
                if g.id in seen:
                    state = DUPLICATE_ID
                seen.add(g.id)
            self._set_state(g, state)

    async def _poll_one(self, g: Gateway) -> str:
        """Ask one gateway for its report; its id and load are taken, its new state returned."""
        try:
            async with self.http.get(g.url("/readyz"), allow_redirects=False,
                                     timeout=aiohttp.ClientTimeout(total=self.cfg.dispatch.poll_timeout_s)) as r:
                raw = await r.content.read(READYZ_CAP + 1)
                status = r.status
            data = json.loads(raw) if len(raw) <= READYZ_CAP else None
            if status not in (200, 503) or not isinstance(data, dict):
                raise ValueError(f"HTTP {status}, not a readiness report")
            gid, sessions, cap = data.get("gateway", ""), data.get("sessions"), data.get("max_sessions")
            if not isinstance(gid, str) or not isinstance(sessions, int) or not isinstance(cap, int):
                raise ValueError("no gateway/sessions/max_sessions in the report (a gateway of an older version?)")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            if g.state != DOWN:
                log.warning("gateway_down url=%s gateway=%s error=%s", g.base, g.id, _gateway_failed(exc))
            return DOWN
        g.sessions, g.max_sessions = max(sessions, 0), max(cap, 0)
        if gid != g.id:
            log.info("gateway_id url=%s gateway=%s", g.base, gid)
            g.id = gid
        if not GATEWAY_ID.fullmatch(gid):
            return NO_ID  # its session ids would name no gateway: PATCH and DELETE could not find it again
        return READY if status == 200 and data.get("status") == "ready" else LOADING

    def _set_state(self, g: Gateway, state: str) -> None:
        if g.state != state and state != DOWN:  # going down is logged with its reason where it is seen
            log.info("gateway_state url=%s gateway=%s state=%s sessions=%d max_sessions=%d",
                     g.base, g.id, state, g.sessions, g.max_sessions)
            if state == NO_ID:
                log.error("gateway_without_id url=%s: start it with --server.gateway_id NAME to take sessions",
                          g.base)
            elif state == DUPLICATE_ID:
                log.error("gateway_duplicate_id url=%s gateway=%s: another gateway has this id", g.base, g.id)
        g.state = state
        self.metrics.gateways_up.set(sum(g.state not in (DOWN, UNKNOWN) for g in self.gateways))
        self.metrics.gateways_ready.set(sum(g.ready for g in self.gateways))

    def mark_down(self, g: Gateway, why: str) -> None:
        log.warning("gateway_down url=%s gateway=%s error=%s", g.base, g.id, why)
        self._set_state(g, DOWN)

    # --- choosing -------------------------------------------------------------------------------------
    def _round_robin(self, gateways: list[Gateway]) -> dict[int, int]:
        """Each gateway's place in this turn's rotation of the configured order (keys: ``id(gateway)``)."""
        n = len(self.gateways)
        turn, self._turn = self._turn, self._turn + 1
        place = {id(g): i for i, g in enumerate(self.gateways)}
        return {id(g): (place[id(g)] - turn) % n for g in gateways}

    def for_offer(self) -> list[Gateway]:
        """Ready gateways with a free slot: most free slots first, then fewest sessions, then round robin."""
        ready = [g for g in self.gateways if g.ready and g.free > 0]
        rr = self._round_robin(ready)
        return sorted(ready, key=lambda g: (-g.free, g.sessions, rr[id(g)]))

    def for_request(self) -> list[Gateway]:
        """Ready gateways in round-robin order (TTS, ICE, voices: anything that is not a session)."""
        ready = [g for g in self.gateways if g.ready]
        rr = self._round_robin(ready)
        return sorted(ready, key=lambda g: rr[id(g)])

    def owner(self, session_id: str) -> Gateway | None:
        """The gateway a session id names (``gA.<token>``), if it is one we know."""
        gid, dot, _ = session_id.partition(".")
        if not dot:
            return None
        return next((g for g in self.gateways if g.id == gid and g.state != DUPLICATE_ID), None)


DISPATCHER: web.AppKey[Dispatcher] = web.AppKey("dispatcher", Dispatcher)


# --- helpers ---------------------------------------------------------------------------------------------
def forward_headers(request: web.Request, names: Iterable[str] = FORWARD_HEADERS) -> dict[str, str]:
    return {n: request.headers[n] for n in names if n in request.headers}


async def read_answer(up: aiohttp.ClientResponse) -> bytes:
    raw = await up.content.read(ANSWER_CAP + 1)
    if len(raw) > ANSWER_CAP:
        raise ValueError(f"the gateway's answer is over {ANSWER_CAP} bytes")
    return raw


def relay(up: aiohttp.ClientResponse, body: bytes, names: Iterable[str] = OFFER_HEADERS) -> web.Response:
    """A gateway's buffered answer: its status, its body and the named headers (every value of each)."""
    resp = web.Response(status=up.status, body=body)
    for name in names:
        for value in up.headers.getall(name, ()):
            resp.headers.add(name, value)
    return resp


def _error_of(body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(body).get("error", ""))
    return ""


def _target(g: Gateway, request: web.Request) -> URL:
    return g.url(request.rel_url.raw_path, request.rel_url.raw_query_string)


def _gateway_failed(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


# --- signaling -------------------------------------------------------------------------------------------
async def offer(request: web.Request) -> web.Response:
    """``POST /api/offer`` (JSON): to the least-loaded gateway; see the module docstring."""
    return await _place_offer(request, request.app[CONFIG].server.max_body_bytes)


async def whip(request: web.Request) -> web.Response:
    """``POST /api/whip`` (``application/sdp``): as ``/api/offer``; ``Location``, ``ETag`` and ``Link`` relayed."""
    return await _place_offer(request, request.app[CONFIG].server.max_sdp_bytes)


async def _place_offer(request: web.Request, cap: int) -> web.Response:
    d = request.app[DISPATCHER]
    body = await read_body(request, cap)
    headers = forward_headers(request)
    busy = False
    for g in d.for_offer():
        t0 = time.perf_counter()
        g.sessions += 1  # the slot is taken now, so offers arriving meanwhile see it (the heartbeat corrects)
        try:
            async with d.http.post(_target(g, request), data=body, headers=headers, allow_redirects=False) as up:
                answer = await read_answer(up)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: nothing reached this gateway
            g.sessions = max(0, g.sessions - 1)
            d.metrics.offers_total.labels(gateway=g.id, outcome="unreachable").inc()
            d.mark_down(g, _gateway_failed(exc))
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
            d.mark_down(g, _gateway_failed(exc))
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
        return relay(up, answer)
    if busy or any(g.ready for g in d.gateways):
        d.metrics.offers_total.labels(gateway="none", outcome="busy").inc()
        log.info("dispatch_offer gateway=none status=503 error=busy")
        raise HTTPJSONError(503, "busy", "every gateway's session slots are in use", headers={"Retry-After": "5"})
    d.metrics.offers_total.labels(gateway="none", outcome="not_ready").inc()
    log.info("dispatch_offer gateway=none status=503 error=not_ready")
    raise HTTPJSONError(503, "not_ready", "no gateway is ready; retry shortly", headers={"Retry-After": "2"})


async def session_call(request: web.Request) -> web.Response:
    """``PATCH`` (trickled candidates) and ``DELETE`` (hang up) ``/api/sessions/{id}``: to the id's gateway."""
    d = request.app[DISPATCHER]
    g = d.owner(request.match_info["session_id"])
    if g is None:
        raise HTTPJSONError(404, "unknown_session", "no such session")
    body = await read_body(request, request.app[CONFIG].ice.max_fragment_bytes)
    t0 = time.perf_counter()
    try:
        async with d.http.request(request.method, _target(g, request), data=body or None,
                                  headers=forward_headers(request), allow_redirects=False) as up:
            answer = await read_answer(up)
    except TimeoutError:
        raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        d.mark_down(g, _gateway_failed(exc))
        raise HTTPJSONError(502, "gateway_unreachable", f"gateway {g.id} holds this session and is not answering",
                            headers={"Retry-After": "2"}) from None
    if request.method == "DELETE" and up.status == 200:
        g.sessions = max(0, g.sessions - 1)
    log.info("dispatch_session method=%s gateway=%s status=%d ms=%.1f", request.method, g.id, up.status,
             1000 * (time.perf_counter() - t0))
    return relay(up, answer)


async def list_sessions(request: web.Request) -> web.Response:
    """``GET /api/sessions``: every answering gateway's sessions in one list (``unreachable``: who did not)."""
    d = request.app[DISPATCHER]
    gateways = [g for g in d.gateways if g.state in (READY, LOADING)]
    headers = forward_headers(request, ("Authorization",))

    async def one(g: Gateway) -> tuple[int, bytes]:
        async with d.http.get(_target(g, request), headers=headers, allow_redirects=False) as up:
            return up.status, await read_answer(up)

    answers = await asyncio.gather(*(one(g) for g in gateways), return_exceptions=True)
    sessions: list[Any] = []
    unreachable: list[str] = []
    for g, answer in zip(gateways, answers, strict=True):
        if isinstance(answer, BaseException):
            unreachable.append(g.id)
            continue
        status, body = answer
        if status in (401, 403):  # the token is wrong for the gateways too: say so, not "no sessions"
            return web.Response(status=status, body=body, content_type="application/json")
        try:
            listed = json.loads(body)["sessions"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            listed = None
        if not isinstance(listed, list):
            unreachable.append(g.id)
            continue
        sessions.extend(listed)
    out: dict[str, Any] = {"sessions": sessions}
    if unreachable:
        out["unreachable"] = unreachable
    return web.json_response(out)


# --- everything else: pass-through ----------------------------------------------------------------------
async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other ``/api/*`` or ``/v1/*`` call: to one ready gateway, its answer streamed back as it comes."""
    d = request.app[DISPATCHER]
    body = await read_body(request, forward_cap(request.app[CONFIG])) if request.method == "POST" else b""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                    sock_read=d.cfg.dispatch.request_timeout_s)
    for g in d.for_request():
        try:
            up = await d.http.request(request.method, _target(g, request), data=body or None,
                                      headers=forward_headers(request), allow_redirects=False, timeout=timeout)
        except aiohttp.ConnectionTimeoutError as exc:
            d.mark_down(g, _gateway_failed(exc))
            continue
        except TimeoutError:
            raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:  # nothing was answered: another gateway may
            d.mark_down(g, _gateway_failed(exc))
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
            log.warning("dispatch_stream_cut gateway=%s path=%s error=%s", g.id, request.path, _gateway_failed(exc))
            if request.transport is not None:
                request.transport.abort()
            return resp
        if not chunk:
            break
        await resp.write(chunk)  # a client that went away raises here, and the gateway's answer is dropped
    await resp.write_eof()
    return resp


async def voices_not_here(request: web.Request) -> web.Response:
    raise HTTPJSONError(
        501, "not_supported",
        "voices are stored on each gateway: add or remove them on every gateway, not through the dispatcher",
    )


async def ws_proxy(request: web.Request) -> web.StreamResponse:
    """``/ws/*``: the client's WebSocket joined to one on a ready gateway; frames both ways, closes propagated."""
    d = request.app[DISPATCHER]
    cap = forward_cap(request.app[CONFIG])
    ws = web.WebSocketResponse(heartbeat=WS_HEARTBEAT_S, max_msg_size=cap)
    if not ws.can_prepare(request).ok:
        raise HTTPJSONError(400, "bad_request", "expected a WebSocket upgrade")
    upstream: aiohttp.ClientWebSocketResponse | None = None
    for g in d.for_request():
        try:
            upstream = await d.http.ws_connect(
                _target(g, request), headers=forward_headers(request, ("Authorization",)), max_msg_size=cap,
                heartbeat=WS_HEARTBEAT_S, timeout=aiohttp.ClientWSTimeout(ws_close=WS_CLOSE_TIMEOUT_S),
            )
        except aiohttp.WSServerHandshakeError as exc:  # the gateway refused the upgrade: tell the client why
            error = (exc.message or "refused").lower().replace(" ", "_")
            return json_error(exc.status, error, f"gateway {g.id} refused the WebSocket")
        except aiohttp.ConnectionTimeoutError as exc:
            d.mark_down(g, _gateway_failed(exc))
            continue
        except TimeoutError:
            raise HTTPJSONError(504, "gateway_timeout", f"gateway {g.id} did not answer in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            d.mark_down(g, _gateway_failed(exc))
            continue
        break
    if upstream is None:
        raise HTTPJSONError(503, "not_ready", "no gateway is ready; retry shortly", headers={"Retry-After": "2"})
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


async def _pump(src: Any, dst: Any) -> tuple[int, str]:
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
    """Ready while at least one gateway is; the gateways and their last heartbeat."""
    d = request.app[DISPATCHER]
    ready = [g for g in d.gateways if g.ready]
    body = {
        "status": "ready" if ready else "no_gateway",
        "sessions": sum(g.sessions for g in ready),
        "max_sessions": sum(g.max_sessions for g in ready),
        "gateways": [g.to_json() for g in d.gateways],
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[DISPATCHER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


# --- app --------------------------------------------------------------------------------------------------
def create_dispatch_app(cfg: Config) -> web.Application:
    """The dispatcher's app (a ConfigError for a bad ``[dispatch]``); the heartbeat starts with the app."""
    dispatcher = Dispatcher(cfg)
    # The token guards /v1 here too: gateways behind a dispatcher may leave it off on their private network.
    app = web.Application(middlewares=middlewares(cfg.server, (*PROTECTED, "/v1/")),
                          client_max_size=forward_cap(cfg))
    app[CONFIG] = cfg
    app[DISPATCHER] = dispatcher
    add_page_routes(app)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/api/offer", offer)
    app.router.add_post("/api/whip", whip)
    app.router.add_get("/api/sessions", list_sessions)
    app.router.add_patch("/api/sessions/{session_id}", session_call)
    app.router.add_delete("/api/sessions/{session_id}", session_call)
    app.router.add_post("/api/voices", voices_not_here)
    app.router.add_delete("/api/voices/{voice_id}", voices_not_here)
    app.router.add_post("/api/tts", passthrough)
    app.router.add_get("/api/{tail:.*}", passthrough)
    app.router.add_route("GET", "/v1/{tail:.*}", passthrough)
    app.router.add_route("POST", "/v1/{tail:.*}", passthrough)
    app.router.add_get("/ws/{tail:.*}", ws_proxy)

    async def start(app: web.Application) -> None:
        await dispatcher.start()
        log.info("dispatch_ready gateways=%d ready=%d", len(dispatcher.gateways),
                 sum(g.ready for g in dispatcher.gateways))

    async def stop(app: web.Application) -> None:
        await dispatcher.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
