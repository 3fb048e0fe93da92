"""``POST /v1/realtime/client_secrets``: the reference's ephemeral keys, as keys of our own (``server/keys.py``).

A server-side app that holds the server token asks for one (``client.realtime.client_secrets.create()`` in the
SDKs) and hands its ``value`` to a browser or a phone, which opens Realtime calls or WebSockets with it as its
API key. Request and answer are in the reference's shape::

    {"expires_after": {"anchor": "created_at", "seconds": 600}, "session": {"type": "realtime", ...}}
    → {"value": "ek_...", "expires_at": 1700000600, "session": {the session object, as session.created shows}}

The key has the ``call`` scope, expires when asked (10 s to 2 h, 10 minutes by default, as the reference), and
carries the session configuration: every session opened with it starts from that configuration (a call's own
``session`` form part, and later ``session.update`` events, apply on top). It can open several sessions until it
expires; a session lives on after that.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from assistant.server import keys
from assistant.server.http import CONFIG, APIError, HTTPJSONError, read_json
from assistant.server.keys import CALL, cap_within_parent, key_lifetime, mint, principal_of, within_parent
from assistant.server.openapi import documented, json_body, openai_error
from assistant.server.realtime.protocol import ClientError
from assistant.server.realtime.settings import Settings, SettingsError
from assistant.server.realtime.setup import DEFAULT_MODEL, voice_resolver

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 600  # the reference's default
MAX_TTL_S = 7200  # and its longest

REQUEST_SCHEMA = {
    "type": "object",
    "properties": {
        "expires_after": {"type": "object", "properties": {
            "anchor": {"const": "created_at"},
            "seconds": {"type": "integer", "minimum": 10, "maximum": MAX_TTL_S, "default": DEFAULT_TTL_S}}},
        "session": {"type": "object", "description": "a Realtime session configuration (type: realtime), as "
                    "session.update takes it"},
    },
}
ANSWER_SCHEMA = {
    "type": "object", "required": ["value", "expires_at", "session"],
    "properties": {"value": {"type": "string", "description": "ek_...: the client's API key"},
                   "expires_at": {"type": "integer", "description": "Unix time"},
                   "session": {"type": "object", "description": "the session object"}},
}


def _expiry(value: object) -> int:
    if value is None:
        return DEFAULT_TTL_S
    if not isinstance(value, dict):
        raise APIError(400, "invalid_type", "'expires_after' must be an object", param="expires_after")
    anchor = value.get("anchor", "created_at")
    if anchor != "created_at":
        raise APIError(400, "invalid_value", f"Invalid value: {anchor!r}. Supported values are: 'created_at'.",
                       param="expires_after.anchor")
    unknown = sorted(set(value) - {"anchor", "seconds"})
    if unknown:
        raise APIError(400, "unknown_parameter", f"Unknown parameter: 'expires_after.{unknown[0]}'.",
                       param=f"expires_after.{unknown[0]}")
    try:
        return key_lifetime(value.get("seconds"), DEFAULT_TTL_S, MAX_TTL_S, "expires_after.seconds")
    except HTTPJSONError:
        raise APIError(400, "invalid_value", f"'expires_after.seconds' must be a whole number from 10 to {MAX_TTL_S}",
                       param="expires_after.seconds") from None


@documented(
    "Mint a client secret (an ephemeral key for a browser or phone) with a Realtime session configuration",
    description="The admin key only. The key (value) opens Realtime calls and WebSockets (scope call) until "
                "expires_at; each session starts from the given configuration. See docs/realtime.md.",
    request={"application/json": {"schema": REQUEST_SCHEMA}},
    responses={"200": json_body(ANSWER_SCHEMA, "the client secret"),
               "400": openai_error("bad expiry or session"), "403": openai_error("not the admin key")},
)
async def create_client_secret(request: web.Request) -> web.Response:
    """``POST /v1/realtime/client_secrets``."""
    state = request.config_dict
    cfg = state[CONFIG]
    data = await read_json(request, cfg.server.max_body_bytes)
    unknown = sorted(set(data) - {"expires_after", "session"})
    if unknown:
        raise APIError(400, "unknown_parameter", f"Unknown parameter: '{unknown[0]}'.", param=unknown[0])
    ttl = _expiry(data.get("expires_after"))
    session: Any = data.get("session")
    if session is not None and not isinstance(session, dict):
        raise APIError(400, "invalid_type", "'session' must be an object", param="session")
    if isinstance(session, dict) and session.get("type", "realtime") != "realtime":
        raise APIError(400, "invalid_value", "only realtime sessions are supported (type: realtime), not "
                       f"{session.get('type')!r}", param="session.type")
    model = session.get("model") if isinstance(session, dict) else None
    try:
        settings = Settings.defaults(cfg, model if isinstance(model, str) else DEFAULT_MODEL)
        if session is not None:
            settings = settings.updated(session)
        if settings.voice != "default":
            await voice_resolver(state)(settings.voice)  # an unknown voice is refused now, not at every call
    except (ClientError, SettingsError) as exc:
        raise APIError(400, exc.code, str(exc), param=exc.param) from None
    now = int(keys.wall_clock())
    try:
        parent = principal_of(request)
        cap, group = cap_within_parent(parent, None)
        minted = mint(cfg.server.auth_token, [CALL], within_parent(parent, ttl, now), max_sessions=cap,
                      session=session, now=now, cap_group=group)
    except ValueError as exc:
        raise APIError(400, "session_too_large", str(exc), param="session") from None
    log.info("client_secret_minted key=%s ttl_s=%d", minted.principal.id, ttl)
    body = {"value": minted.value, "expires_at": minted.principal.expires_at,
            "session": {**settings.to_json(), "expires_at": minted.principal.expires_at}}
    return web.json_response(body, headers={"Cache-Control": "no-store"})
