"""The dispatcher's aiohttp app: every route of the one table (``server/routes.py``), handled by its forward kind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from assistant.config import Config
from assistant.server.dispatch import forward
from assistant.server.dispatch.gateways import DISPATCHER, Dispatcher
from assistant.server.front import add_metrics_listener, add_static_routes, check_exposure, middlewares
from assistant.server.http import CONFIG
from assistant.server.limits import LIMITS, Limits
from assistant.server.routes import ROUTES, Forward, Handler, Route
from assistant.telemetry import start as start_telemetry

log = logging.getLogger(__name__)

# What the dispatcher does for each kind of route; each takes the request and the route's body cap.
FORWARDERS: dict[Forward, Callable[[web.Request, int], Awaitable[web.StreamResponse]]] = {
    Forward.OFFER: forward.place_offer,
    Forward.OWNER: forward.session_call,
    Forward.GATHER: forward.list_sessions,
    Forward.PROXY: forward.passthrough,
    Forward.WEBSOCKET: forward.ws_proxy,
    Forward.GATEWAY: forward.kept_on_gateways,
}
# The dispatcher's own answers to front routes whose gateway handler describes one gateway.
OWN_FRONT: dict[str, Handler] = {"/readyz": forward.readyz, "/metrics": forward.metrics}
SHARED_FRONT_MODULE = "front:"  # the other front routes (page, liveness) are the same handlers as a gateway's


def handler_for(route: Route, cfg: Config) -> Handler:
    """The dispatcher's handler for one row of the route table."""
    if route.forward is Forward.FRONT:
        if route.path in OWN_FRONT:
            return OWN_FRONT[route.path]
        if not route.handler.startswith(SHARED_FRONT_MODULE):
            raise ValueError(f"{route.method} {route.path}: a front route the dispatcher cannot serve itself")
        return route.resolve()
    if route.forward is Forward.WEBSOCKET:
        cap = max((r.max_body(cfg) for r in ROUTES if r.max_body), default=0)  # a message may carry any request
    else:
        cap = route.max_body(cfg) if route.max_body else 0
    kind = FORWARDERS[route.forward]
    if route.opens_session and route.forward is Forward.WEBSOCKET:
        async def handle(request: web.Request) -> web.StreamResponse:
            await forward.check_caps(request)  # not held for the socket's life: each gateway still holds its own
            return await kind(request, cap)
    elif route.opens_session:
        async def handle(request: web.Request) -> web.StreamResponse:
            async with request.app[DISPATCHER].one_at_a_time(request.app[LIMITS].client(request)):
                await forward.check_caps(request)
                return await kind(request, cap)
    else:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await kind(request, cap)

    handle.__name__ = f"{route.forward.value}_{route.method.lower()}"
    return handle


def create_dispatch_app(cfg: Config) -> web.Application:
    """The dispatcher's app (a ConfigError for a bad ``[dispatch]``); the heartbeat starts with the app."""
    check_exposure(cfg.server)
    dispatcher = Dispatcher(cfg)
    client_max = max(r.max_body(cfg) for r in ROUTES if r.max_body)
    limits = Limits(cfg)
    app = web.Application(middlewares=middlewares(cfg, limits), client_max_size=client_max)
    app[CONFIG] = cfg
    app[LIMITS] = limits
    app[DISPATCHER] = dispatcher
    for route in ROUTES:
        app.router.add_route(route.method, route.path, handler_for(route, cfg))
    add_static_routes(app)
    add_metrics_listener(app, cfg.server, dispatcher.metrics.render)

    async def start(app: web.Application) -> None:
        dispatcher.telemetry = start_telemetry(cfg.telemetry, dispatcher.metrics.count_dropped_spans,
                                               role="dispatch")
        await dispatcher.start()
        log.info("dispatch_ready gateways=%d ready=%d", len(dispatcher.gateways),
                 sum(g.ready for g in dispatcher.gateways))

    async def stop(app: web.Application) -> None:
        await dispatcher.close()
        telemetry, dispatcher.telemetry = dispatcher.telemetry, None
        if telemetry is not None:
            await asyncio.to_thread(telemetry.shutdown)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
