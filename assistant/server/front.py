"""What every HTTP front shares (the server in ``app.py``, the dispatcher in ``dispatch/``): the middlewares
(JSON errors, the bearer token, CORS, the guard), the page and its static files, liveness.

Both fronts build their middleware list with :func:`middlewares`, so a token, an allowed origin or a budget
means the same thing on a gateway and on the dispatcher in front of it.

The guard reads each route's facts from its row of the route table (``routes.py``): a foreign ``Origin`` is
refused where the route says so (any page the user visits could otherwise post to a server on 127.0.0.1), the
body's media type is checked, and the per-client budget is spent, all before the handler reads a byte. A server
listening on a loopback address answers only to loopback host names, so DNS rebinding cannot make a foreign
page "same-origin".
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiohttp import web
from yarl import URL

from assistant.config import PROJECT_ROOT, Config, ServerConfig
from assistant.server.http import CONFIG, APIError, HTTPJSONError, json_error
from assistant.server.limits import Limits
from assistant.server.openai_front import from_api_error, subprotocol_key
from assistant.server.openapi import documented, json_body
from assistant.server.routes import OPENAI_PREFIX, ROUTES, Route

log = logging.getLogger(__name__)

WEB_DIR = PROJECT_ROOT / "web"
PROTECTED = ("/api/", "/ws/")  # what the bearer token guards (the server's /v1 sub-app checks it itself)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
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


def auth_middleware(token: str, protected: tuple[str, ...] = PROTECTED) -> Any:
    """``Authorization: Bearer <token>`` on paths starting with one of ``protected`` (``?token=`` on /ws/)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if token and request.path.startswith(protected) and request.method != "OPTIONS":
            got = request.headers.get("Authorization", "")
            if not got and request.path.startswith("/ws/"):
                # Browsers cannot set headers on WebSocket upgrades: accept ?token= there.
                got = f"Bearer {request.query.get('token', '')}"
            elif not got and request.path.startswith(OPENAI_PREFIX + "/"):
                # OpenAI's browser clients send the key as a WebSocket subprotocol (the /v1 front accepts it too).
                got = subprotocol_key(request).decode()
            if not hmac.compare_digest(got.encode(), expected):
                return json_error(
                    401,
                    "unauthorized",
                    "missing or wrong bearer token",
                )
        return await handler(request)

    return auth


def cors_middleware(origins: list[str]) -> Any:
    allowed = set(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Any) -> web.StreamResponse:
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
        # DNS rebinding reaches a local server without a token; with one, a foreign page has nothing to send.
        self.loopback_only = not self.hosts and _is_loopback(server.host) and not server.auth_token

    def check_host(self, request: web.Request) -> None:
        name, _ = _split_host(request.host)
        if self.hosts and name not in self.hosts and not _is_loopback(name):
            raise APIError(421, "wrong_host", f"this server does not answer to {name!r} (server.allowed_hosts)")
        if self.loopback_only and not _is_loopback(name) and not self.limits.via_trusted_proxy(request):
            raise APIError(421, "wrong_host", f"this server listens on a loopback address without a token and "
                           f"answers only to loopback names, not {name!r}: behind a proxy, name it in "
                           "server.trusted_proxies (or the host in server.allowed_hosts)")

    def check_origin(self, request: web.Request) -> None:
        """A browser's Origin must be this server's own (as its Host header names it) or allow-listed."""
        origin = request.headers.get("Origin")
        if origin is None or origin in self.origins:
            return
        try:
            url = URL(origin)
        except ValueError:
            url = URL()
        hosts = [request.host]
        if self.limits.via_trusted_proxy(request):  # the Host the browser used, as the proxy passes it on
            hosts += request.headers.getall("X-Forwarded-Host", [])
        for host in hosts:
            name, port = _split_host(host.split(",")[0])
            if url.host is not None and url.host.lower().strip("[]") == name and url.port == (port or url.port):
                return
        raise APIError(403, "forbidden_origin", f"requests from the page at {origin!r} are refused (the server's "
                       "own origin and server.cors_origins may call it)")

    @staticmethod
    def check_media_type(request: web.Request, route: Route) -> None:
        if request.content_type not in route.content_types:
            raise APIError(415, "unsupported_media_type", f"Content-Type must be {' or '.join(route.content_types)}, "
                           f"got {request.headers.get('Content-Type', 'none')!r}")

    def row(self, request: web.Request) -> Route | None:
        resource = request.match_info.route.resource
        return self.rows.get((request.method, resource.canonical)) if resource is not None else None

    def check(self, request: web.Request) -> None:
        self.check_host(request)
        route = self.row(request)
        if route is None:
            return
        if route.refuses_foreign_origin:
            self.check_origin(request)
        if route.content_types:
            self.check_media_type(request, route)
        if route.budget is not None:
            self.limits.take(route.budget, self.limits.client(request))

    def middleware(self) -> Any:
        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
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


def middlewares(cfg: Config, limits: Limits, protected: tuple[str, ...] = PROTECTED) -> list[Any]:
    """CORS (outermost, so refusals carry its headers), JSON errors, the token, then the guard (host, origin,
    media type, budget: after the token, so a request without it spends nothing)."""
    server = cfg.server
    out: list[Any] = [error_middleware]
    if server.cors_origins:
        out.insert(0, cors_middleware(server.cors_origins))
    if server.auth_token:
        out.append(auth_middleware(server.auth_token, protected))
    out.append(Guard(server, limits).middleware())
    return out


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
