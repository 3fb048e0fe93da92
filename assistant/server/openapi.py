"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /api/openapi.json``.

Paths come from the route table (``routes.py``) that the server registers and the dispatcher forwards; each
operation is written beside its handler with :func:`documented`. Request bodies of the TTS routes come from the
request table (``tts_api/request.py``) that the parsers use, so the document and the checks cannot drift apart.
Any value in a description may be a function of the :class:`Config`: the document states the limits this server
enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from aiohttp import web

from assistant.config import Config
from assistant.server.http import CONFIG
from assistant.server.routes import ROUTES, Route

OPENAPI_VERSION = "3.1.0"
OPERATION_ATTR = "__openapi__"

H = TypeVar("H", bound=Callable[..., object])
# A piece of the document: JSON, where a value may still be a function of the Config (filled in by build_openapi).
Doc = dict[str, object]


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def error(description: str) -> Doc:
    """A response with our JSON error body."""
    return {"description": description, "content": {"application/json": {"schema": ref("Error")}}}


def openai_error(description: str) -> Doc:
    """A response with OpenAI's error body (the ``/v1`` routes)."""
    return {"description": description, "content": {"application/json": {"schema": ref("OpenAIError")}}}


def json_body(schema: Mapping[str, object], description: str) -> Doc:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def documented(summary: str, *, responses: Mapping[str, object],
               description: str | Callable[[Config], str] | None = None, request: Mapping[str, object] | None = None,
               parameters: list[Doc] | None = None, public: bool = False,
               schemas: Mapping[str, object] | None = None) -> Callable[[H], H]:
    """Attach a handler's OpenAPI operation to it. ``public``: no token needed. ``schemas``: named schemas the
    operation refers to (added to the document's components)."""
    op: Doc = {"summary": summary}
    if description is not None:
        op["description"] = description
    if parameters is not None:
        op["parameters"] = parameters
    if request is not None:
        op["requestBody"] = {"required": True, "content": request}
    op["responses"] = responses
    if public:
        op["security"] = []

    def attach(handler: H) -> H:
        setattr(handler, OPERATION_ATTR, (op, dict(schemas or {})))
        return handler

    return attach


def operation_of(route: Route) -> tuple[Doc, Doc] | None:
    """The (operation, schemas) written beside ``route``'s handler, or None where it has none."""
    found: tuple[Doc, Doc] | None = getattr(route.resolve(), OPERATION_ATTR, None)
    return found


def _fill(value: object, cfg: Config) -> object:
    """Values that depend on the config (limits) are functions of it: call them."""
    if callable(value):
        return value(cfg)
    if isinstance(value, dict):
        return {k: _fill(v, cfg) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, cfg) for v in value]
    return value


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "short code: bad_request, bad_json, "
                  "too_large, text_too_long, clip_too_long, clip_too_short, bad_audio, "
                  "unsupported, unknown_voice, url_not_allowed, url_fetch_failed, rate_limited, "
                  "busy, not_ready, timeout, voice_limit, unauthorized, synthesis_failed, bad_offer, "
                  "bad_fragment, unknown_session, unsupported_media_type, precondition_failed, "
                  "ice_restart_unsupported, too_many_candidates, invalid_key, key_expired, forbidden_scope, "
                  "too_many_sessions, key_session_limit"},
        "detail": {"type": "string", "description": "what was wrong, naming the field"},
    },
}
OPENAI_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "enum": ["invalid_request_error", "authentication_error",
                                               "permission_error", "rate_limit_error", "server_error"]},
            "param": {"type": ["string", "null"], "description": "the request field at fault"},
            "code": {"type": ["string", "null"], "description": "as Error.error, or model_not_found, "
                                                                "invalid_api_key"},
        },
    }},
}


def build_openapi(cfg: Config, table: Iterable[Route] = ROUTES) -> Doc:
    """The whole document, with this server's limits filled in."""
    paths: dict[str, Doc] = {}
    schemas: Doc = {"Error": ERROR_SCHEMA, "OpenAIError": OPENAI_ERROR_SCHEMA}
    for route in table:
        found = operation_of(route)
        if found is None:
            continue
        op, own_schemas = found
        filled = _fill(op, cfg)
        if isinstance(filled, dict) and route.scope is not None:
            filled["x-key-scope"] = route.scope  # what a minted key must allow (docs/security.md)
        paths.setdefault(route.path, {})[route.method.lower()] = filled
        schemas.update({name: _fill(schema, cfg) for name, schema in own_schemas.items()})
    bearer: list[dict[str, list[str]]] = [{"bearer": []}] if cfg.server.auth_token else []
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "assistant",
            "version": "0.1.0",
            "description": "Real-time spoken assistant: WebRTC voice chat and a TTS API. Errors are JSON "
                           "{error, detail} (OpenAI's shape under /v1). With server.auth_token set, /api/*, "
                           "/v1/* and /ws/* need 'Authorization: Bearer <token>' (WebSocket: ?token=<token>), or "
                           "a key the token minted (POST /api/keys) whose scope (x-key-scope: call, tts, admin) "
                           "allows the operation; a session belongs to the key that opened it.",
        },
        "security": bearer,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": schemas},
        "paths": paths,
    }


@documented("This document", responses={"200": {"description": "OpenAPI 3.1 JSON"}})
async def serve_openapi(request: web.Request) -> web.Response:
    """``GET /api/openapi.json``."""
    return web.json_response(build_openapi(request.app[CONFIG]))
