"""Every route of the HTTP API, once: the server registers it, the dispatcher forwards it, OpenAPI documents it.

A row names its handler as ``"module:function"`` under ``assistant.server`` (``"voice.signaling:offer"`` is
``assistant.server.voice.signaling.offer``), so this table imports nothing: the dispatcher reads it without loading
the voice session or the TTS engines. Each handler carries its own OpenAPI description, written beside it with
:func:`assistant.server.openapi.documented`.

How the dispatcher (``assistant dispatch``) handles a route is its :class:`Forward` kind. What every request
passes before its handler (``front.guard_middleware``, on the gateway and the dispatcher alike) is read from the
row too: the per-client budget it spends, the media types its body may have, whether a foreign ``Origin`` is
refused, and the scope a caller's key needs (``keys.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

    from assistant.config import Config

Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]
HANDLER_PACKAGE = "assistant.server"
OPENAI_PREFIX = "/v1"  # OpenAI's API family: its own error shape and token check (``openai_front``)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
CALL, TTS, DIAL, ADMIN = "call", "tts", "dial", "admin"  # the scopes a key may have (``keys.py``)
# Media types a body may have (``Route.content_types``).
JSON, SDP, FORM = "application/json", "application/sdp", "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"  # the carriers' webhooks
SDPFRAG = "application/trickle-ice-sdpfrag"  # RFC 8840


class Forward(StrEnum):
    """What the dispatcher does with a request for this route."""

    FRONT = "front"          # each front answers it itself (the page, liveness, readiness, metrics)
    OFFER = "offer"          # opens a session: the ready gateway with the most free slots
    OWNER = "owner"          # acts on a session: the gateway its ``{session_id}`` names
    GATHER = "gather"        # every gateway's answer, merged (the session list)
    PROXY = "proxy"          # one ready gateway, its answer streamed back
    WEBSOCKET = "websocket"  # one ready gateway, the WebSocket joined both ways
    GATEWAY = "gateway"      # state each gateway keeps for itself: refused at the dispatcher (501)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: str  # "module:function" under assistant.server
    forward: Forward
    product: str  # "front", "voice" (the voice session), "tts" (the TTS API), "realtime" (OpenAI's Realtime API),
    # "telephony" (phone calls through a carrier), "sip" (outgoing calls through a SIP trunk)
    max_body: Callable[[Config], int] | None = None  # the largest body the dispatcher passes on (None: no body)
    budget: str | None = None  # the per-client budget a request spends (``limits.BUDGETS``); None: none
    content_types: tuple[str, ...] = ()  # what its body's Content-Type must be (415 otherwise); (): not checked
    checks_origin: bool | None = None  # refuse a foreign Origin (403); None: when the method changes state
    scope: str | None = None  # what a caller's key must allow (keys.SCOPES); None: any valid key (public rows: none)

    @property
    def refuses_foreign_origin(self) -> bool:
        return self.checks_origin if self.checks_origin is not None else self.method not in SAFE_METHODS

    @property
    def acts_on_own_session(self) -> bool:
        """It acts on the one session its path names, which must be the caller's (``signaling.owned_session``)."""
        return self.forward is Forward.OWNER

    @property
    def opens_session(self) -> bool:
        """It opens a session (an offer, or the Realtime WebSocket): the per-client and per-key caps apply."""
        return self.forward is Forward.OFFER or self.budget == "offer"

    def resolve(self) -> Handler:
        """The handler function (imports its module)."""
        module, _, name = self.handler.partition(":")
        handler: Handler = getattr(importlib.import_module(f"{HANDLER_PACKAGE}.{module}"), name)
        return handler


def _sdp(cfg: Config) -> int:
    return cfg.server.max_sdp_bytes


def _json(cfg: Config) -> int:
    return cfg.server.max_body_bytes


def _fragment(cfg: Config) -> int:
    return cfg.ice.max_fragment_bytes


def tts_body(cfg: Config) -> int:
    """A TTS request's largest body: the JSON fields plus a base64 reference clip."""
    return cfg.server.max_body_bytes + (cfg.tts_api.max_upload_bytes * 4) // 3 + 16


def _upload(cfg: Config) -> int:
    return cfg.tts_api.max_upload_bytes + 65_536


def _webhook(cfg: Config) -> int:
    return cfg.telephony.max_webhook_bytes


def _call(cfg: Config) -> int:
    """A Realtime call's offer: the SDP, or a form with the SDP and the session's JSON."""
    return cfg.server.max_sdp_bytes + cfg.server.max_body_bytes + 65_536


F = Forward
ROUTES: tuple[Route, ...] = (
    # What every front serves for itself.
    Route("GET", "/", "front:index", F.FRONT, "front"),
    Route("GET", "/healthz", "front:healthz", F.FRONT, "front"),
    Route("GET", "/readyz", "app:readyz", F.FRONT, "front"),
    Route("GET", "/metrics", "app:metrics", F.FRONT, "front"),
    Route("GET", "/api/openapi.json", "openapi:serve_openapi", F.PROXY, "front"),
    # The voice session: signaling (JSON and WHIP), the session resource, ICE, the page's stage legend.
    Route("POST", "/api/offer", "voice.signaling:offer", F.OFFER, "voice", _json, budget="offer",
          content_types=(JSON,), scope=CALL),
    Route("POST", "/api/whip", "voice.whip:whip_offer", F.OFFER, "voice", _sdp, budget="offer", content_types=(SDP,),
          scope=CALL),
    Route("GET", "/api/sessions", "voice.signaling:list_sessions", F.GATHER, "voice", scope=CALL),
    Route("PATCH", "/api/sessions/{session_id}", "voice.signaling:trickle", F.OWNER, "voice", _fragment,
          budget="trickle", content_types=(SDPFRAG,), scope=CALL),
    Route("DELETE", "/api/sessions/{session_id}", "voice.signaling:hang_up", F.OWNER, "voice", budget="trickle",
          scope=CALL),
    Route("GET", "/api/ice", "voice.ice:get_ice", F.PROXY, "voice", budget="ice", scope=CALL),
    Route("GET", "/api/stages", "app:stages", F.PROXY, "voice"),
    # The TTS API.
    Route("POST", "/api/tts", "tts_api.routes:tts_http", F.PROXY, "tts", tts_body, budget="tts",
          content_types=(JSON, FORM), scope=TTS),
    # A WebSocket upgrade is a GET, but a page on another site could open one to spend this server's voice.
    Route("GET", "/ws/tts", "tts_api.routes:tts_ws", F.WEBSOCKET, "tts", checks_origin=True, scope=TTS),
    Route("GET", "/api/voices", "tts_api.routes:list_voices", F.PROXY, "tts", scope=TTS),
    # Registered voices are shared by every caller: only the admin changes them.
    Route("POST", "/api/voices", "tts_api.routes:create_voice", F.GATEWAY, "tts", _upload, budget="voices",
          content_types=(FORM,), scope=ADMIN),
    Route("DELETE", "/api/voices/{voice_id}", "tts_api.routes:delete_voice", F.GATEWAY, "tts", budget="voices",
          scope=ADMIN),
    Route("POST", "/v1/audio/speech", "tts_api.openai_speech:speech", F.PROXY, "tts", _json, budget="tts",
          content_types=(JSON,), scope=TTS),
    Route("GET", "/v1/models", "tts_api.openai_speech:list_models", F.PROXY, "tts"),
    Route("GET", "/v1/models/{model}", "tts_api.openai_speech:get_model", F.PROXY, "tts"),
    Route("GET", "/v1/audio/models", "tts_api.openai_speech:list_audio_models", F.PROXY, "tts"),
    Route("GET", "/v1/audio/voices", "tts_api.openai_speech:list_voices", F.PROXY, "tts"),
    # OpenAI's Realtime API: a WebSocket session, or a WebRTC call (our voice session with the oai-events channel).
    Route("GET", "/v1/realtime", "realtime.websocket:realtime_ws", F.WEBSOCKET, "realtime", budget="offer",
          checks_origin=True, scope=CALL),
    Route("POST", "/v1/realtime/calls", "realtime.calls:create_call", F.OFFER, "realtime", _call, budget="offer",
          content_types=(SDP, FORM), scope=CALL),
    Route("POST", "/v1/realtime/calls/{session_id}/hangup", "realtime.calls:hangup", F.OWNER, "realtime",
          budget="trickle", scope=CALL),  # no body
    Route("GET", "/v1/realtime/ice-servers", "realtime.calls:ice_servers", F.PROXY, "realtime", budget="ice",
          scope=CALL),
    # Keys (``keys.py``): the admin mints short-lived, scoped ones; the Realtime API's client secrets are such keys.
    # Gateways and the dispatcher that share the token verify each other's keys (they are signed, not stored).
    Route("POST", "/api/keys", "keys:create_key", F.PROXY, "front", _json, budget="keys", content_types=(JSON,),
          scope=ADMIN),
    Route("POST", "/v1/realtime/client_secrets", "realtime.client_secrets:create_client_secret", F.PROXY,
          "realtime", _json, budget="keys", content_types=(JSON,), scope=ADMIN),
    # Phone calls: each carrier's signed webhook and its media stream. The media token the webhook mints is kept by
    # the gateway that answered, so the carrier calls a gateway, not the dispatcher (501 there). The media sockets
    # refuse a foreign Origin: carriers send none, and a page has no business opening one.
    Route("POST", "/telephony/twilio/voice", "telephony.webhooks:twilio_voice", F.GATEWAY, "telephony", _webhook,
          content_types=(URLENCODED,)),
    Route("GET", "/telephony/twilio/media", "telephony.media:twilio_media", F.GATEWAY, "telephony",
          checks_origin=True),
    Route("POST", "/telephony/telnyx/voice", "telephony.webhooks:telnyx_voice", F.GATEWAY, "telephony", _webhook,
          content_types=(URLENCODED,)),
    Route("GET", "/telephony/telnyx/media", "telephony.media:telnyx_media", F.GATEWAY, "telephony",
          checks_origin=True),
    # SIP: outgoing calls through the configured trunk (incoming calls come on the SIP socket, not over HTTP). The
    # gateway that dials holds the call, its record and its events: not through the dispatcher (501 there).
    Route("POST", "/api/sip/calls", "sip.api:dial", F.GATEWAY, "sip", _json, budget="dial", content_types=(JSON,),
          scope=DIAL),
    Route("GET", "/api/sip/calls/{call_id}", "sip.api:get_call", F.GATEWAY, "sip", scope=DIAL),
    Route("GET", "/api/sip/calls/{call_id}/events", "sip.api:call_events", F.GATEWAY, "sip", scope=DIAL),
)


def routes(products: Iterable[str] | None = None) -> list[Route]:
    """The table's rows, or those of the named products."""
    wanted = None if products is None else set(products)
    return [r for r in ROUTES if wanted is None or r.product in wanted]


def register(app: web.Application, table: Iterable[Route], openai_app: web.Application | None = None) -> None:
    """Add ``table``'s routes to ``app``; ``/v1`` routes go to ``openai_app`` (mounted by the caller)."""
    for route in table:
        if route.path.startswith(OPENAI_PREFIX + "/"):
            if openai_app is None:
                raise ValueError(f"{route.method} {route.path} needs the {OPENAI_PREFIX} sub-application")
            openai_app.router.add_route(route.method, route.path[len(OPENAI_PREFIX):], route.resolve())
        else:
            app.router.add_route(route.method, route.path, route.resolve())
