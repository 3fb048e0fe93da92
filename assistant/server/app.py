"""The aiohttp app: the page, WebRTC signaling, health, metrics; the TTS API plugs in from ``tts_api``.

Errors reach clients as JSON ``{"error": ..., "detail": ...}`` with a 4xx/5xx status, never a stack trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from assistant.config import Config, check_gateway_id
from assistant.pipeline.trace import stage_legend
from assistant.server.front import add_page_routes, middlewares
from assistant.server.http import CONFIG, SERVICES, HTTPJSONError, read_json
from assistant.server.ice import setup_ice_routes
from assistant.server.services import Services
from assistant.server.signaling import SESSIONS, check_choices, check_ready, check_sdp, open_session, trickle
from assistant.server.tts_api import setup_tts_routes
from assistant.server.whip import setup_whip_routes

log = logging.getLogger(__name__)

OWNS_SERVICES: web.AppKey[bool] = web.AppKey("owns_services", bool)


# --- handlers ------------------------------------------------------------------------------------------
async def readyz(request: web.Request) -> web.Response:
    """Readiness, and this gateway's load: the heartbeat ``assistant dispatch`` polls."""
    app = request.app
    services = app[SERVICES]
    load = {
        "gateway": app[CONFIG].server.gateway_id,
        "sessions": len(app[SESSIONS]),
        "max_sessions": app[CONFIG].server.max_sessions,
    }
    if not services.ready:
        return web.json_response({"status": "loading", **load}, status=503)
    return web.json_response({"status": "ready", "load_seconds": services.load_seconds, **load})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[SERVICES].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def stages(request: web.Request) -> web.Response:
    """The turn stages the page draws (names, colours, labels): one source, ``pipeline/trace.py``."""
    return web.json_response({"stages": stage_legend()})


async def offer(request: web.Request) -> web.Response:
    """``POST /api/offer``: the page's JSON signaling; WHIP (``whip.py``) opens sessions the same way."""
    app = request.app
    cfg = app[CONFIG]
    check_ready(app)
    data = await read_json(request, cfg.server.max_body_bytes)
    sdp, type_ = data.get("sdp"), data.get("type")
    if not isinstance(sdp, str) or not sdp.strip():
        raise HTTPJSONError(400, "bad_offer", "field 'sdp' must be a non-empty string")
    if type_ != "offer":
        raise HTTPJSONError(400, "bad_offer", "field 'type' must be \"offer\"")
    check_sdp(sdp, cfg.server.max_sdp_bytes)
    responder, voice = data.get("responder"), data.get("voice")
    check_choices(app, responder, voice)
    session = await open_session(app, sdp, responder=responder, voice=voice)
    answer = session.pc.localDescription
    return web.json_response(
        {
            "sdp": answer.sdp,
            "type": answer.type,
            "session_id": session.id,
            "location": f"/api/sessions/{session.id}",  # PATCH trickled candidates here, DELETE to hang up
            "etag": session.etag,
        }
    )


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
    check_gateway_id(cfg.server.gateway_id)
    # Uploads (reference clips) are bounded by the TTS API's own cap; everything else by max_body_bytes.
    client_max = max(cfg.server.max_body_bytes, cfg.tts_api.max_upload_bytes + 65_536)
    app = web.Application(middlewares=middlewares(cfg.server), client_max_size=client_max)
    app[CONFIG] = cfg
    app[SERVICES] = services or Services(cfg)
    # Services passed in belong to the caller (tests share one set across apps); ours we close.
    app[OWNS_SERVICES] = services is None
    app[SESSIONS] = {}
    add_page_routes(app)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/api/offer", offer)
    app.router.add_get("/api/sessions", list_sessions)
    app.router.add_get("/api/stages", stages)
    app.router.add_delete("/api/sessions/{session_id}", delete_session)
    app.router.add_patch("/api/sessions/{session_id}", trickle)
    setup_ice_routes(app)
    setup_whip_routes(app)
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
