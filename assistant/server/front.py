"""What every HTTP front shares (the server in ``app.py``, the dispatcher in ``dispatch/``): the middlewares
(JSON errors, the bearer token, CORS), the page and its static files, liveness.

Both fronts build their middleware list with :func:`middlewares`, so a token or an allowed origin means the
same thing on a gateway and on the dispatcher in front of it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from assistant.config import PROJECT_ROOT, ServerConfig
from assistant.server.http import CONFIG, APIError, HTTPJSONError, json_error
from assistant.server.openapi import documented, json_body

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
    except Exception:
        log.exception("request_failed method=%s path=%s", request.method, request.path)
        return json_error(500, "internal_error", "the server could not handle this request")


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


def middlewares(server: ServerConfig, protected: tuple[str, ...] = PROTECTED) -> list[Any]:
    """CORS (outermost, so refusals carry its headers), JSON errors, then the token."""
    out: list[Any] = [error_middleware]
    if server.cors_origins:
        out.insert(0, cors_middleware(server.cors_origins))
    if server.auth_token:
        out.append(auth_middleware(server.auth_token, protected))
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
