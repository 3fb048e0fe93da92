"""The front of OpenAI's API family under ``/v1``: OpenAI's error shape, and where OpenAI's clients put the key.

Every ``/v1`` route of the table (``routes.py``) is registered on one sub-application made here, whose
middleware answers every refusal as ``{"error": {"message", "type", "param", "code"}}``. The key is checked by
the front's auth middleware (``front.py``, ``keys.py``), in the shape OpenAI's SDKs send it: ``Authorization:
Bearer <key>``, or on a WebSocket upgrade from a browser, which cannot set headers, the subprotocol
``openai-insecure-api-key.<key>`` (:func:`subprotocol_key`). Handlers read the app's state through
``request.config_dict``, which reaches the parent app's keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from assistant.config import Config
from assistant.server.http import APIError

log = logging.getLogger(__name__)

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # how browsers send the key on a WebSocket (the SDKs do it)


def openai_error(status: int, message: str, code: str | None, param: str | None = None) -> web.Response:
    """A response in OpenAI's error shape."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def from_api_error(exc: APIError) -> web.Response:
    resp = openai_error(exc.status, exc.detail, exc.error, exc.param)
    resp.headers.update(exc.headers)
    return resp


def _errors() -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as exc:
            return from_api_error(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code, message = exc.reason.lower().replace(" ", "_"), exc.text or exc.reason
            with contextlib.suppress(ValueError, AttributeError):  # HTTPJSONError: {"error", "detail"}
                ours = json.loads(exc.text or "")
                code, message = ours["error"], ours["detail"]
            if exc.status == 405:
                message = f"{request.method} is not allowed on {request.path}"
            elif exc.status == 404 and code == "not_found":
                message = f"no route {request.method} {request.path}; see GET /api/openapi.json"
            return openai_error(exc.status, message, code)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("openai_request_failed path=%s", request.path)
            return openai_error(500, "the server could not handle this request", "internal_error")

    return middleware


def subprotocol_key(request: web.Request) -> bytes:
    """``Bearer <token>`` from a WebSocket upgrade's ``openai-insecure-api-key.<token>`` subprotocol, or b""."""
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    for proto in offered.split(","):
        proto = proto.strip()
        if proto.startswith(KEY_SUBPROTOCOL):
            return f"Bearer {proto[len(KEY_SUBPROTOCOL):]}".encode("utf-8", "surrogateescape")  # bytes as sent
    return b""


def create_openai_app(cfg: Config) -> web.Application:
    """The ``/v1`` sub-application (empty: the caller registers the table's ``/v1`` routes, then mounts it)."""
    return web.Application(middlewares=[_errors()])
