"""The aiohttp app: the page, WebRTC signaling, health, metrics; the TTS API plugs in from ``tts_api``.

Errors reach clients as JSON ``{"error": ..., "detail": ...}`` with a 4xx/5xx status, never a stack trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from assistant.config import PROJECT_ROOT, Config
from assistant.pipeline.trace import stage_legend
from assistant.server.http import CONFIG, SERVICES, HTTPJSONError, json_error, read_json
from assistant.server.services import Services
from assistant.server.session import Session
from assistant.server.tts_api import setup_tts_routes

log = logging.getLogger(__name__)

SESSIONS: web.AppKey[dict[str, Session]] = web.AppKey("sessions", dict)
OWNS_SERVICES: web.AppKey[bool] = web.AppKey("owns_services", bool)
WEB_DIR = PROJECT_ROOT / "web"
VOICE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _protected(path: str) -> bool:
    return path.startswith("/api/") or path.startswith("/ws/")


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPJSONError:
        raise
    except web.HTTPRequestEntityTooLarge as exc:
        return json_error(413, "too_large", f"request body over {exc.max_size} bytes")
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            return json_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or "")
        raise
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("request_failed method=%s path=%s", request.method, request.path)
        return json_error(500, "internal_error", "the server could not handle this request")


def _auth_middleware(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if token and _protected(request.path) and request.method != "OPTIONS":
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


def _cors_middleware(origins: list[str]) -> Any:
    allowed = set(origins)

    @web.middleware
    async def cors(request: web.Request, handler: Any) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")

        def allow(resp: web.StreamResponse) -> None:
            if origin and origin in allowed and not resp.prepared:
                resp.headers["Access-Control-Allow-Origin"] = origin
                resp.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
                resp.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
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


# --- handlers ------------------------------------------------------------------------------------------
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    if not services.ready:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ready", "load_seconds": services.load_seconds})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[SERVICES].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def stages(request: web.Request) -> web.Response:
    """The turn stages the page draws (names, colours, labels): one source, ``pipeline/trace.py``."""
    return web.json_response({"stages": stage_legend()})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(Path(request.app[CONFIG].server.web_dir or WEB_DIR) / "index.html")


async def offer(request: web.Request) -> web.Response:
    app = request.app
    cfg = app[CONFIG]
    services = app[SERVICES]
    if not services.ready:
        raise HTTPJSONError(503, "not_ready", "models are still loading; retry shortly", headers={"Retry-After": "2"})
    data = await read_json(request, cfg.server.max_body_bytes)
    sdp, type_ = data.get("sdp"), data.get("type")
    if not isinstance(sdp, str) or not sdp.strip():
        raise HTTPJSONError(400, "bad_offer", "field 'sdp' must be a non-empty string")
    if type_ != "offer":
        raise HTTPJSONError(400, "bad_offer", "field 'type' must be \"offer\"")
    if len(sdp.encode()) > cfg.server.max_sdp_bytes:
        raise HTTPJSONError(413, "too_large", f"sdp over {cfg.server.max_sdp_bytes} bytes")
    if not sdp.lstrip().startswith("v=0"):
        raise HTTPJSONError(400, "bad_offer", "sdp must start with v=0")
    responder, voice = data.get("responder"), data.get("voice")
    if responder is not None and responder not in services.allowed_responders():
        raise HTTPJSONError(400, "bad_offer", f"field 'responder' must be one of {services.allowed_responders()}")
    if voice is not None and (not isinstance(voice, str) or not VOICE_ID.fullmatch(voice)):
        raise HTTPJSONError(400, "bad_offer", "field 'voice' must be a voice id (letters, digits, - and _)")
    sessions = app[SESSIONS]
    if len(sessions) >= cfg.server.max_sessions:
        services.metrics.errors_total.labels(stage="capacity").inc()
        raise HTTPJSONError(
            503, "busy", f"all {cfg.server.max_sessions} session slots are in use", headers={"Retry-After": "5"}
        )
    session = Session(services, cfg, on_closed=lambda s: _forget(app, s), responder=responder, voice=voice)
    sessions[session.id] = session
    services.metrics.sessions_total.inc()
    services.metrics.sessions_active.set(len(sessions))
    try:
        answer = await asyncio.wait_for(session.accept(sdp, type_), timeout=cfg.server.connect_timeout_s)
    except Exception as exc:
        await session.close("bad_offer")
        if isinstance(exc, TimeoutError):
            raise HTTPJSONError(504, "offer_timeout", "could not gather ICE candidates in time") from None
        log.info("offer_rejected error=%s", type(exc).__name__)
        raise HTTPJSONError(400, "bad_offer", f"the offer could not be applied: {type(exc).__name__}") from None
    log.info("session_open session=%s active=%d", session.id, len(sessions))
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session.id})


def _forget(app: web.Application, session: Session) -> None:
    sessions = app[SESSIONS]
    sessions.pop(session.id, None)
    app[SERVICES].metrics.sessions_active.set(len(sessions))


async def delete_session(request: web.Request) -> web.Response:
    session = request.app[SESSIONS].get(request.match_info["session_id"])
    if session is None:
        raise HTTPJSONError(404, "unknown_session", "no such session")
    await session.close("hangup")
    return web.json_response({"status": "closed", "session_id": session.id})


async def list_sessions(request: web.Request) -> web.Response:
    sessions = request.app[SESSIONS]
    return web.json_response(
        {
            "sessions": [
                {"session_id": s.id, "turns": s.conversation.turns, "tasks": s.task_count} for s in sessions.values()
            ]
        }
    )


# --- app -----------------------------------------------------------------------------------------------
def create_app(cfg: Config, services: Services | None = None) -> web.Application:
    """Build the app; models load in the background at startup (``/readyz`` says when they are done)."""
    middlewares = [error_middleware]
    if cfg.server.cors_origins:
        middlewares.insert(0, _cors_middleware(cfg.server.cors_origins))
    if cfg.server.auth_token:
        middlewares.append(_auth_middleware(cfg.server.auth_token))
    # Uploads (reference clips) are bounded by the TTS API's own cap; everything else by max_body_bytes.
    client_max = max(cfg.server.max_body_bytes, cfg.tts_api.max_upload_bytes + 65_536)
    app = web.Application(middlewares=middlewares, client_max_size=client_max)
    app[CONFIG] = cfg
    app[SERVICES] = services or Services(cfg)
    # Services passed in belong to the caller (tests share one set across apps); ours we close.
    app[OWNS_SERVICES] = services is None
    app[SESSIONS] = {}
    web_dir = Path(cfg.server.web_dir or WEB_DIR)
    app.router.add_get("/", index)
    app.router.add_static("/static/", web_dir, show_index=False, follow_symlinks=False)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/api/offer", offer)
    app.router.add_get("/api/sessions", list_sessions)
    app.router.add_get("/api/stages", stages)
    app.router.add_delete("/api/sessions/{session_id}", delete_session)
    setup_tts_routes(app)
    app.on_startup.append(_start_loading)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_close_services)
    return app


LOADER: web.AppKey[asyncio.Task[None]] = web.AppKey("loader", asyncio.Task)


async def _start_loading(app: web.Application) -> None:
    async def load() -> None:
        try:
            await app[SERVICES].load()
            log.info("Service Ready")
        except Exception:
            log.exception("service_load_failed")
            raise

    app[LOADER] = asyncio.get_running_loop().create_task(load(), name="load-services")


async def _close_sessions(app: web.Application) -> None:
    sessions = list(app[SESSIONS].values())
    if sessions:
        log.info("shutdown_closing_sessions count=%d", len(sessions))
        timeout = app[CONFIG].server.shutdown_timeout_s
        await asyncio.wait_for(
            asyncio.gather(*(s.close("server_shutdown") for s in sessions), return_exceptions=True), timeout
        )


async def _close_services(app: web.Application) -> None:
    loader = app.get(LOADER)
    if loader is not None and not loader.done():
        loader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loader
    if app[OWNS_SERVICES]:
        await app[SERVICES].close()


async def wait_ready(app: web.Application) -> None:
    """Wait until every model is loaded (raises what loading raised)."""
    await app[LOADER]
