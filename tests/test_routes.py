"""The one route table (``server/routes.py``) is what the server registers, what the dispatcher forwards and what
OpenAPI documents: nothing is listed twice, so nothing can drift."""

from __future__ import annotations

import inspect

from assistant.config import Config
from assistant.server.openapi import build_openapi, operation_of
from assistant.server.routes import OPENAI_PREFIX, ROUTES

PRODUCT_MODULES = {"front": ("front", "app", "openapi", "keys"), "voice": ("voice.", "app"),
                   "tts": ("tts_api.",), "realtime": ("realtime.",), "telephony": ("telephony.",), "sip": ("sip.",)}


def _registered(app) -> set[tuple[str, str]]:
    """(method, path) of every resource route of ``app`` and its sub-apps (static files and HEAD left out)."""
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        if "prefix" in info or route.method == "HEAD":
            continue
        path = info.get("path") or info.get("formatter")
        if path is None:
            continue
        out.add((route.method, path))
    return out


def test_every_row_resolves_to_a_documented_handler_of_its_product() -> None:
    seen = set()
    for route in ROUTES:
        assert (route.method, route.path) not in seen, f"{route.method} {route.path} is listed twice"
        seen.add((route.method, route.path))
        handler = route.resolve()
        assert inspect.iscoroutinefunction(handler), route
        assert route.handler.startswith(PRODUCT_MODULES[route.product]), route
        if route.path != "/":
            assert operation_of(route) is not None, f"{route.method} {route.path} has no OpenAPI description"


def test_openapi_documents_exactly_the_table() -> None:
    doc = build_openapi(Config())
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(r.method, r.path) for r in ROUTES if r.path != "/"}


def test_gateway_and_dispatcher_register_exactly_the_table(tmp_path) -> None:
    from assistant.server.app import create_app
    from assistant.server.dispatch.app import create_dispatch_app

    cfg = Config()
    cfg.server.data_dir = str(tmp_path)
    table = {(r.method, r.path) for r in ROUTES}
    gateway = create_app(cfg)
    sub = {(m, OPENAI_PREFIX + p) for app in [r.resource._app for r in gateway.router.routes()  # the /v1 sub-app
                                             if hasattr(r.resource, "_app")] for m, p in _registered(app)}
    assert _registered(gateway) | sub == table
    cfg.dispatch.gateways = ["http://127.0.0.1:9"]
    assert _registered(create_dispatch_app(cfg)) == table


def test_the_guard_reads_each_route_from_its_row() -> None:
    """Every route with a body names the media types it takes; the costly ones spend a per-client budget that
    exists; every state-changing route (and the TTS WebSocket) refuses a foreign Origin."""
    from assistant.server.limits import BUDGETS
    from assistant.server.routes import SAFE_METHODS

    for route in ROUTES:
        if route.max_body is not None:
            assert route.content_types, f"{route.method} {route.path}: which media types does its body take?"
        assert route.budget is None or route.budget in BUDGETS, route
        if route.method not in SAFE_METHODS:
            assert route.refuses_foreign_origin, route
    budgeted = {(r.method, r.path) for r in ROUTES if r.budget}
    assert {("POST", "/api/offer"), ("POST", "/api/whip"), ("PATCH", "/api/sessions/{session_id}"),
            ("GET", "/api/ice"), ("POST", "/api/tts"), ("POST", "/v1/audio/speech"), ("POST", "/api/voices"),
            ("DELETE", "/api/voices/{voice_id}")} <= budgeted
    assert next(r for r in ROUTES if r.path == "/ws/tts").refuses_foreign_origin


def test_every_route_that_mints_or_opens_spends_a_budget_and_needs_a_scope() -> None:
    """What a caller gets is bounded: opening a session, minting a key or a TURN credential each spend a per-client
    budget; opening or acting on a session needs a key of the call scope, minting the admin's."""
    from assistant.server.front import PROTECTED
    from assistant.server.keys import SCOPES

    mints = {("GET", "/api/ice"), ("GET", "/v1/realtime/ice-servers"), ("POST", "/api/keys"),
             ("POST", "/v1/realtime/client_secrets")}
    for route in ROUTES:
        assert route.scope is None or route.scope in SCOPES, route
        if route.opens_session or (route.method, route.path) in mints:
            assert route.budget is not None, f"{route.method} {route.path} opens or mints without a budget"
        if (route.opens_session or route.acts_on_own_session) and route.path.startswith(PROTECTED):
            assert route.scope == "call", route  # (a carrier's signed webhook is checked by its own room)
    assert {r.path for r in ROUTES if r.scope == "admin"} >= {"/api/keys", "/v1/realtime/client_secrets",
                                                               "/api/voices", "/api/voices/{voice_id}"}
    assert {(r.method, r.path) for r in ROUTES if r.opens_session} >= {
        ("POST", "/api/offer"), ("POST", "/api/whip"), ("POST", "/v1/realtime/calls"), ("GET", "/v1/realtime")}
