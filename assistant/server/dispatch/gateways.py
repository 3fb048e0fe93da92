"""The gateways behind ``assistant dispatch``: the table of what each last reported, the one HTTP client every call
to a gateway uses, and the heartbeat.

Every gateway is polled (``GET /readyz``, with the server token: the load is shown only to the admin) each
``dispatch.poll_interval_s``; one that fails a poll is down until it answers again. Requests go only to the
configured gateway URLs (redirects included: a client middleware refuses any other origin), and every call to a
gateway has a time limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.client_middlewares import ClientHandlerType
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from yarl import URL

from assistant.body import loads_bounded, read_capped
from assistant.config import GATEWAY_ID, Config, ConfigError
from assistant.telemetry.names import DROPPED_METRIC

if TYPE_CHECKING:
    from assistant.telemetry.setup import Telemetry

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # a gateway on the same network connects in milliseconds; after 5 s it is gone
READYZ_CAP = 65_536
# Gateway states a heartbeat leads to; only "ready" takes requests.
READY, LOADING, DOWN, UNKNOWN, NO_ID, DUPLICATE_ID = "ready", "loading", "down", "unknown", "no_id", "duplicate_id"


def failure_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


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


# --- the gateways ----------------------------------------------------------------------------------------
@dataclass
class Gateway:
    """One configured gateway, as its last heartbeat (and the offers since) describe it."""

    base: URL
    id: str = ""
    state: str = UNKNOWN
    sessions: int = 0
    max_sessions: int = 0
    polled_at: float | None = None  # when the heartbeat whose answer this row holds was asked (epoch s)

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

    def to_json(self) -> dict[str, object]:
        return {"url": str(self.base), "gateway": self.id, "state": self.state, "sessions": self.sessions,
                "max_sessions": self.max_sessions, "polled_at": self.polled_at}


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
        self.spans_dropped_total = Counter(
            DROPPED_METRIC.removesuffix("_total"), "OpenTelemetry spans of the dispatcher that never reached the "
            "collector (its queue was full, or the collector refused or did not answer in time)",
            registry=self.registry)

    def count_dropped_spans(self, n: int) -> None:
        self.spans_dropped_total.inc(n)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Dispatcher:
    """The gateway table, the one HTTP client every call to a gateway uses, and the heartbeat."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.gateways = [Gateway(url) for url in check_dispatch_config(cfg)]
        self.metrics = DispatchMetrics()
        self.telemetry: Telemetry | None = None  # OpenTelemetry, when [telemetry] asks for it (app.py starts it)
        self._origins = {(g.base.scheme, g.base.host, g.base.port) for g in self.gateways}
        self._turn = 0  # round robin among equals
        self._admin = {"Authorization": f"Bearer {cfg.server.auth_token}"} if cfg.server.auth_token else {}
        self._opening: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # per client: its lock and how many use it
        self._http: aiohttp.ClientSession | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        """What the dispatcher's own calls to gateways send: the server token (the gateways share it)."""
        return dict(self._admin)

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, client: str) -> AsyncIterator[None]:
        """Hold ``client``'s lock: its sessions are counted and opened one after the other (no burst slips past
        the caps between the count and the gateway's answer)."""
        lock, users = self._opening.setdefault(client, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._opening[client]

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

    async def _only_gateways(self, req: aiohttp.ClientRequest, handler: ClientHandlerType) -> aiohttp.ClientResponse:
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
        asked = time.time()
        try:
            async with self.http.get(g.url("/readyz"), allow_redirects=False, headers=self._admin,
                                     timeout=aiohttp.ClientTimeout(total=self.cfg.dispatch.poll_timeout_s)) as r:
                raw = await read_capped(r, READYZ_CAP)  # BodyTooLarge is a ValueError: not a readiness report
                status = r.status
            data = loads_bounded(raw)
            if status not in (200, 503) or not isinstance(data, dict):
                raise ValueError(f"HTTP {status}, not a readiness report")
            gid, sessions, cap = data.get("gateway", ""), data.get("sessions"), data.get("max_sessions")
            if not isinstance(gid, str) or not isinstance(sessions, int) or not isinstance(cap, int):
                raise ValueError("no gateway/sessions/max_sessions in the report (a gateway of an older version, or "
                                 "one with another server token?)")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            if g.state != DOWN:
                log.warning("gateway_down url=%s gateway=%s error=%s", g.base, g.id, failure_text(exc))
            return DOWN
        g.sessions, g.max_sessions, g.polled_at = max(sessions, 0), max(cap, 0), asked
        if gid != g.id:
            log.info("gateway_id url=%s gateway=%s", g.base, gid)
            g.id = gid
        if not GATEWAY_ID.fullmatch(gid):
            return NO_ID  # its session ids would name no gateway: PATCH and DELETE could not find it again
        # A degraded gateway (an engine restarting, a fallback answering) still takes calls.
        return READY if status == 200 and data.get("status") in ("ready", "degraded") else LOADING

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


