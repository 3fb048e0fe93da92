"""What every HTTP front shares (the server in ``app.py``, the dispatcher in ``dispatch/``): the middlewares
(JSON errors, who the caller is and what its key allows, CORS, the guard), the page and its static files, liveness,
the metrics listener, and the refusal to start on a public address without a token.

Both fronts build their middleware list with :func:`middlewares`, so a token, an allowed origin or a budget
means the same thing on a gateway and on the dispatcher in front of it.

The guard reads each route's facts from its row of the route table (``routes.py``): a foreign ``Origin`` is
refused where the route says so (any page the user visits could otherwise post to a server on 127.0.0.1), the
body's media type is checked, and the per-client budget is spent, all before the handler reads a byte. A server
without a token answers only to loopback names and IP addresses, so DNS rebinding cannot make a foreign page
"same-origin"; an Origin is the server's own only when its scheme, host and port all are.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from assistant.config import Config, ConfigError, ServerConfig
from assistant.server.http import CONFIG, APIError, HTTPJSONError, json_error
from assistant.server.keys import ADMIN_PRINCIPAL, NOBODY, PRINCIPAL, BadKey, identify, refusal
from assistant.server.limits import Limits
from assistant.server.openai_front import from_api_error, openai_error
from assistant.server.openapi import documented, json_body
from assistant.server.routes import OPENAI_PREFIX, ROUTES, Route

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[1] / "web"  # package data: a wheel serves the page too
PROTECTED = ("/api/", "/ws/", OPENAI_PREFIX + "/")  # what needs a key (the page, health and metrics do not)
DEFAULT_PORTS = {"http": 80, "https": 443}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure a JSON ``{"error", "detail"}``, never a stack trace."""
    try:
        return await handler(request)
    except HTTPJSONError:
        raise
    except APIError as exc:
        resp = json_error(exc.status, exc.error, exc.detail)
        resp.headers.update(exc.headers)
        return resp
    except web.HTTPRequestEntityTooLarge as exc:
        # aiohttp keeps the limit only in the text ("Maximum request body size N exceeded.")
        return json_error(413, "too_large", exc.text or "request body too large")
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            return json_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or "")
        raise
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:  # the client went away mid-answer: an event, not a failure
        log.info("client_gone method=%s path=%s", request.method, request.path)
        return _after_headers(request)
    except Exception:
        log.exception("request_failed method=%s path=%s", request.method, request.path)
        if _headers_sent(request):  # a status is out already: cut the connection rather than send a second one
            return _after_headers(request)
        return json_error(500, "internal_error", "the server could not handle this request")


def _headers_sent(request: web.Request) -> bool:
    writer = request.writer
    return writer is not None and writer.output_size > 0


def _after_headers(request: web.Request) -> web.StreamResponse:
    """What a handler that can no longer answer returns: the connection is cut, and aiohttp, finding nothing it
    can write, sends nothing (no second status, no 500 after the headers)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=499)


def route_of(request: web.Request, rows: dict[tuple[str, str], Route]) -> Route | None:
    """The route table's row of the route ``request`` matched (None: a static file, or no route)."""
    resource = request.match_info.route.resource
    return rows.get((request.method, resource.canonical)) if resource is not None else None


def _refuse(request: web.Request, status: int, error: str, detail: str) -> web.Response:
    if request.path.startswith(OPENAI_PREFIX + "/"):
        return openai_error(status, detail, "invalid_api_key" if error == "unauthorized" else error)
    return json_error(status, error, detail)


def auth_middleware(token: str, protected: tuple[str, ...] = PROTECTED, table: Iterable[Route] = ROUTES) -> Middleware:
    """Who the caller is (``keys.identify``: the server token, a key it minted, or nobody), kept on the request for
    the handlers; on paths under ``protected`` a key is needed, and its scope must allow the route's row (401
    without a valid key, 403 ``forbidden_scope``). Elsewhere (the page, health, metrics) a bad credential counts as
    none, and the handler decides what nobody may see."""
    rows = {(r.method, r.path): r for r in table}
    anonymous = NOBODY if token else ADMIN_PRINCIPAL

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS":  # a CORS preflight carries no credential
            return await handler(request)
        guarded = request.path.startswith(protected)
        try:
            who = identify(request, token)
        except BadKey as exc:
            if guarded:
                return _refuse(request, 401, exc.code, exc.detail)
            who = anonymous
        request[PRINCIPAL] = who
        if guarded:
            route = route_of(request, rows)
            problem = refusal(who, route.scope if route else None, route is not None and route.acts_on_own_session)
            if problem is not None:
                status = 403 if problem.code == "forbidden_scope" else 401
                return _refuse(request, status, problem.code, problem.detail)
        return await handler(request)

    return auth


def cors_middleware(origins: list[str]) -> Middleware:
    allowed = set(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")

        def allow(resp: web.StreamResponse) -> None:
            if origin and origin in allowed and not resp.prepared:
                resp.headers["Access-Control-Allow-Origin"] = origin
                resp.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, If-Match"
                resp.headers["Access-Control-Allow-Methods"] = "GET, POST, PATCH, DELETE, OPTIONS"
                resp.headers["Vary"] = "Origin"

        if request.method == "OPTIONS" and origin in allowed:
            resp: web.StreamResponse = web.Response(status=204)
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as exc:
                # Raised errors (HTTPJSONError) too: else the page sees a CORS failure, not the reason.
                allow(exc)
                raise
        allow(resp)
        return resp

    return cors


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_exposure(server: ServerConfig) -> None:
    """Refuse to listen on a non-loopback address with no token (a ConfigError that says what to do), unless
    ``server.allow_public_without_token`` says the operator means it: then a warning."""
    if server.auth_token or _is_loopback(server.host):
        return
    where = server.host or "every interface"
    if not server.allow_public_without_token:
        raise ConfigError(
            f"server.host is {where}, a non-loopback address, and server.auth_token is empty: anyone who reaches "
            "this port could open calls, use the TTS API and change voices. Set server.auth_token (for example "
            "--server.auth_token \"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\"), or listen on "
            "127.0.0.1 behind a proxy that checks callers, or, if you mean it, set "
            "server.allow_public_without_token = true")
    log.warning("public_without_token host=%s: no auth_token on a non-loopback address; anyone who reaches it may "
                "use it (server.allow_public_without_token)", where)


def _split_host(value: str) -> tuple[str, int | None]:
    """A Host header's name (lower case, IPv6 without brackets) and port (None: the scheme's default)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        name, _, port = value.partition(":")
    return name, int(port) if port.isdigit() else None


class Guard:
    """What every request passes before its handler: the host it names, then its route's row (Origin, media
    type, budget). Refusals are JSON (OpenAI's shape under ``/v1``)."""

    def __init__(self, server: ServerConfig, limits: Limits, table: Iterable[Route] = ROUTES) -> None:
        self.rows = {(r.method, r.path): r for r in table}
        self.limits = limits
        self.origins = set(server.cors_origins)
        self.hosts = {h.lower().strip("[]") for h in server.allowed_hosts}
        # DNS rebinding reaches a server without a token, wherever it listens; with one, a foreign page has nothing
        # to send. A rebinding page names its own host: IP addresses and loopback names are safe.
        self.names_checked = not self.hosts and not server.auth_token

    def check_host(self, request: web.Request) -> None:
        name, _ = _split_host(request.host)
        if self.hosts and name not in self.hosts and not _is_loopback(name):
            raise APIError(421, "wrong_host", f"this server does not answer to {name!r} (server.allowed_hosts)")
        if (self.names_checked and not _is_loopback(name) and not _is_ip(name)
                and not self.limits.via_trusted_proxy(request)):
            raise APIError(421, "wrong_host", f"this server has no auth_token, so it answers only to loopback names "
                           f"and IP addresses, not {name!r} (DNS rebinding): set server.auth_token, or name the host "
                           "in server.allowed_hosts (behind a proxy: server.trusted_proxies)")

    def own_origins(self, request: web.Request) -> set[tuple[str, str, int | None]]:
        """(scheme, host, port) of this server as the browser sees it: the Host it used, over this connection's
        scheme; behind a trusted proxy also X-Forwarded-Host, over X-Forwarded-Proto (either scheme when the
        proxy does not say)."""
        hosts, schemes = [request.host], [request.scheme]
        if self.limits.via_trusted_proxy(request):  # the Host and scheme the browser used, as the proxy passes on
            hosts += [h.split(",")[0] for h in request.headers.getall("X-Forwarded-Host", [])]
            protos = [p.split(",")[0].strip().lower() for p in request.headers.getall("X-Forwarded-Proto", [])]
            schemes = protos or ["http", "https"]
        out = set()
        for host in hosts:
            name, port = _split_host(host)
            for scheme in schemes:
                out.add((scheme, name, port or DEFAULT_PORTS.get(scheme)))
        return out

    def check_origin(self, request: web.Request) -> None:
        """A browser's Origin must be this server's own (scheme, host and port) or allow-listed."""
        origin = request.headers.get("Origin")
        if origin is None or origin in self.origins:
            return
        try:
            url = URL(origin)
        except ValueError:
            url = URL()
        seen = (url.scheme.lower(), (url.host or "").lower().strip("[]"), url.port)
        if url.scheme and url.host and seen in self.own_origins(request):
            return
        raise APIError(403, "forbidden_origin", f"requests from the page at {origin!r} are refused (the server's "
                       "own origin, scheme, host and port, and server.cors_origins may call it)")

    @staticmethod
    def check_media_type(request: web.Request, route: Route) -> None:
        if request.content_type not in route.content_types:
            raise APIError(415, "unsupported_media_type", f"Content-Type must be {' or '.join(route.content_types)}, "
                           f"got {request.headers.get('Content-Type', 'none')!r}")

    def check(self, request: web.Request) -> None:
        self.check_host(request)
        route = route_of(request, self.rows)
        if route is None:
            return
        if route.refuses_foreign_origin:
            self.check_origin(request)
        if route.content_types:
            self.check_media_type(request, route)
        if route.budget is not None:
            self.limits.take(route.budget, self.limits.client(request))

    def middleware(self) -> Middleware:
        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                self.check(request)
            except APIError as exc:
                if request.path.startswith(OPENAI_PREFIX + "/"):
                    return from_api_error(exc)
                resp = json_error(exc.status, exc.error, exc.detail)
                resp.headers.update(exc.headers)
                return resp
            return await handler(request)

        return guard


def middlewares(cfg: Config, limits: Limits, protected: tuple[str, ...] = PROTECTED) -> list[Middleware]:
    """CORS (outermost, so refusals carry its headers), JSON errors, the caller's key, then the guard (host,
    origin, media type, budget: after the key, so a request without one spends nothing)."""
    server = cfg.server
    out: list[Middleware] = [error_middleware]
    if server.cors_origins:
        out.insert(0, cors_middleware(server.cors_origins))
    out.append(auth_middleware(server.auth_token, protected))
    out.append(Guard(server, limits).middleware())
    return out


# --- metrics on a listener of their own ------------------------------------------------------------------
METRICS_RUNNER: web.AppKey[web.AppRunner] = web.AppKey("metrics_runner", web.AppRunner)


def add_metrics_listener(app: web.Application, server: ServerConfig, render: Callable[[], tuple[bytes, str]]) -> None:
    """With ``server.metrics_port`` set, serve ``GET /metrics`` (``render()``'s body) with no token on
    ``server.metrics_host:metrics_port`` for as long as ``app`` runs: Prometheus scrapes it there, while
    ``/metrics`` on the main port needs the admin key."""
    if not server.metrics_port:
        return

    async def scrape(request: web.Request) -> web.Response:
        body, content_type = render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def start(app: web.Application) -> None:
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", scrape)
        runner = web.AppRunner(metrics_app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, server.metrics_host, server.metrics_port).start()
        app[METRICS_RUNNER] = runner
        log.info("metrics_listener url=http://%s:%d/metrics", server.metrics_host, server.metrics_port)

    async def stop(app: web.Application) -> None:
        runner = app.get(METRICS_RUNNER)
        if runner is not None:
            await runner.cleanup()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)


def refuse_unless_admin(request: web.Request) -> None:
    """401 unless the caller holds the admin key (always passes with no server token)."""
    if not request.get(PRINCIPAL, NOBODY).admin:
        raise HTTPJSONError(401, "unauthorized", "this needs the admin key (server.auth_token), or a metrics "
                            "listener of its own (server.metrics_port)")


# --- the page and liveness ---------------------------------------------------------------------------------
@documented("Liveness", public=True, responses={"200": json_body({"type": "object"}, "{status: ok}")})
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(Path(request.app[CONFIG].server.web_dir or WEB_DIR) / "index.html")


def add_static_routes(app: web.Application) -> None:
    """``/static/``: the page's files (``GET /`` is in the route table); needs ``app[CONFIG]`` set."""
    web_dir = Path(app[CONFIG].server.web_dir or WEB_DIR)
    app.router.add_static("/static/", web_dir, show_index=False, follow_symlinks=False)
