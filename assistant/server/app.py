"""The aiohttp app of one gateway: the voice session (signaling, sessions, ICE), the TTS API (``tts_api/``),
the page, health and metrics, every route registered from the one table in ``routes.py``.

Errors reach clients as JSON ``{"error": ..., "detail": ...}`` with a 4xx/5xx status, never a stack trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from assistant.config import Config, check_gateway_id
from assistant.pipeline.trace import gap_legend, stage_legend
from assistant.server import sip, telephony, tts_api
from assistant.server.front import (
    add_metrics_listener,
    add_static_routes,
    check_exposure,
    middlewares,
    refuse_unless_admin,
)
from assistant.server.http import CONFIG
from assistant.server.keys import principal_of
from assistant.server.limits import LIMITS, Limits
from assistant.server.openai_front import create_openai_app
from assistant.server.openapi import documented, json_body
from assistant.server.routes import OPENAI_PREFIX, register, routes
from assistant.server.services import SERVICES, Services
from assistant.server.voice.ice import check_ice_config
from assistant.server.voice.signaling import SESSIONS
from assistant.telemetry import start as start_telemetry

if TYPE_CHECKING:
    from assistant.telemetry.setup import Telemetry

log = logging.getLogger(__name__)

OWNS_SERVICES: web.AppKey[bool] = web.AppKey("owns_services", bool)


READYZ_SCHEMA = {
    "type": "object", "required": ["status"],
    "description": "without the admin key only status; with it (or with no server token) the rest",
    "properties": {
        "status": {"type": "string", "enum": ["ready", "degraded", "loading", "failed"]},
        "reason": {"type": "string", "description": "why loading failed (failed), or which engine is down and why "
                   "(degraded: an engine's child process restarts or failed for good, and a fallback answers)"},
        "engines": {"type": "object", "description": "engines in supervised child processes: state (starting, "
                    "ready, restarting, failed, closed), reason, restarts, failures, pid, since"},
        "gateway": {"type": "string", "description": "server.gateway_id (empty: none)"},
        "sessions": {"type": "integer", "description": "open voice sessions"},
        "max_sessions": {"type": "integer"},
        "load_seconds": {"type": "object", "description": "time each model took to load (when ready)"},
        "model": {"type": "object", "description": "respond.model_path = auto: answers (the model that answers "
                  "now), why, state (bundled, pulling, loading, ready, offline, failed), target (the model chosen "
                  "for this machine), progress (of its pull, 0 to 1)"},
    },
}


# --- handlers ------------------------------------------------------------------------------------------
@documented("Readiness: models loaded and warmed; to the admin key also this gateway's load and why loading "
            "failed (the heartbeat `assistant dispatch` reads)", public=True,
            responses={"200": json_body(READYZ_SCHEMA, "ready, or degraded (answering with a fallback)"),
                       "503": json_body(READYZ_SCHEMA, "still loading, or loading failed (the reason)")})
async def readyz(request: web.Request) -> web.Response:
    """Readiness; for the admin, this gateway's load too: the heartbeat ``assistant dispatch`` polls."""
    app = request.app
    services = app[SERVICES]
    if not principal_of(request).admin:  # the public learn ready (or degraded: answering, worse) or not
        state = "failed" if services.load_error else "loading" if not services.ready else (
            "degraded" if services.degraded else "ready")
        return web.json_response({"status": state}, status=200 if state in ("ready", "degraded") else 503)
    load = {
        "gateway": app[CONFIG].server.gateway_id,
        "sessions": len(app[SESSIONS]),
        "max_sessions": app[CONFIG].server.max_sessions,
    }
    engines = services.engine_health()
    if engines:  # engines in supervised child processes: each one's state and why
        load["engines"] = engines
    if services.model is not None:  # respond.model_path = auto: which model answers, why, a pull's progress
        load["model"] = services.model.as_dict()
    failed = services.load_error
    if failed:
        return web.json_response({"status": "failed", "reason": failed, **load}, status=503)
    if not services.ready:
        return web.json_response({"status": "loading", **load}, status=503)
    if services.degraded:  # calls are answered (a fallback stands in): ready for them, and says what is wrong
        reasons = "; ".join(f"{name} {e['state']}: {e['reason']}" for name, e in engines.items()
                            if e["state"] != "ready")
        return web.json_response({"status": "degraded", "reason": reasons, "load_seconds": services.load_seconds,
                                  **load})
    return web.json_response({"status": "ready", "load_seconds": services.load_seconds, **load})


@documented("Prometheus metrics (the admin key, or server.metrics_port's listener without one)", public=True,
            responses={"200": {"description": "text exposition format"}, "401": {"description": "not the admin"}})
async def metrics(request: web.Request) -> web.Response:
    refuse_unless_admin(request)
    body, content_type = request.app[SERVICES].metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


@documented("The turn stages the page draws: names, colours, labels", responses={
    "200": json_body({"type": "object"}, "{stages: [...]}")})
async def stages(request: web.Request) -> web.Response:
    """The turn stages the page draws (names, colours, labels) and the idle gaps it lists: one source,
    ``pipeline/trace.py``."""
    return web.json_response({"stages": stage_legend(), "gaps": gap_legend()})


# --- app -----------------------------------------------------------------------------------------------
def create_app(cfg: Config, services: Services | None = None) -> web.Application:
    """Build the app; models load in the background at startup (``/readyz`` says when they are done)."""
    check_gateway_id(cfg.server.gateway_id)
    check_exposure(cfg.server)
    # Uploads (reference clips) are bounded by the TTS API's own cap; everything else by max_body_bytes.
    client_max = max(cfg.server.max_body_bytes, cfg.tts_api.max_upload_bytes + 65_536)
    limits = Limits(cfg)
    app = web.Application(middlewares=middlewares(cfg, limits), client_max_size=client_max)
    app[CONFIG] = cfg
    app[LIMITS] = limits
    app[SERVICES] = services or Services(cfg)
    # Services passed in belong to the caller (tests share one set across apps); ours we close.
    app[OWNS_SERVICES] = services is None
    app[SESSIONS] = {}
    check_ice_config(cfg.ice)
    tts_api.setup(app)
    telephony.setup(app)
    sip.setup(app)
    openai_app = create_openai_app(cfg)
    register(app, routes(), openai_app)
    add_static_routes(app)
    app.add_subapp(OPENAI_PREFIX, openai_app)
    add_metrics_listener(app, cfg.server, app[SERVICES].metrics.render)
    app.on_startup.append(_start_telemetry)
    app.on_startup.append(_start_loading)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_stop_telemetry)
    app.on_cleanup.append(_close_services)
    return app


LOADER: web.AppKey[asyncio.Task[None]] = web.AppKey("loader", asyncio.Task)


async def _start_loading(app: web.Application) -> None:
    async def load() -> None:
        try:
            await app[SERVICES].load()
            log.info("Service Ready")
        except Exception as exc:
            app[SERVICES].load_error = f"{type(exc).__name__}: {exc}"[:500]
            log.exception("service_load_failed")
            raise

    app[LOADER] = asyncio.get_running_loop().create_task(load(), name="load-services")


TELEMETRY: web.AppKey[Telemetry] = web.AppKey("telemetry")


async def _start_telemetry(app: web.Application) -> None:
    """OpenTelemetry for this app's sessions when ``[telemetry]`` or the OTEL_* environment asks for it (off: not
    even imported)."""
    services = app[SERVICES]
    telemetry = start_telemetry(app[CONFIG].telemetry, on_dropped=services.metrics.count_dropped_spans)
    if telemetry is not None:
        app[TELEMETRY] = services.telemetry = telemetry


async def _stop_telemetry(app: web.Application) -> None:
    """After the sessions closed (their call spans ended): send what is held, within telemetry.export_timeout_s."""
    telemetry = app.get(TELEMETRY)
    if telemetry is not None:
        if app[SERVICES].telemetry is telemetry:
            app[SERVICES].telemetry = None
        await asyncio.to_thread(telemetry.shutdown)


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


def load_failure(app: web.Application) -> str:
    """Why loading failed ("" while it has not)."""
    return app[SERVICES].load_error
