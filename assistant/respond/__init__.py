"""Responders: what the assistant says back. Chosen by name in ``[respond] engine``.

Built in: ``echo`` (default, no model), ``rules`` (offline regex table), ``openai`` (any OpenAI-compatible
chat server). Anything else of the form ``package.module:Class`` is imported and used as a plug-in.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any

from assistant.config import RespondConfig
from assistant.loading import load_named
from assistant.respond.base import Message, Responder, ResponderError
from assistant.respond.history import ConversationHistory

log = logging.getLogger(__name__)

# Responder name (respond.engine) → its class, imported only when chosen.
BUILTIN = {
    "echo": "assistant.respond.echo:EchoResponder",
    "rules": "assistant.respond.rules:RulesResponder",
    "openai": "assistant.respond.openai:OpenAIResponder",
    "llama": "assistant.respond.llama:LlamaResponder",
}

__all__ = ["BUILTIN", "ConversationHistory", "Message", "Responder", "ResponderError", "create_responder"]


def create_responder(cfg: RespondConfig, *, debug_content: bool = False) -> Responder:
    """Make the responder ``cfg.engine`` names; ``ValueError`` with a clear reason if it cannot.

    Plug-ins (``module:Class``) get ``**cfg.options`` when options are set; else ``(cfg)`` when the
    constructor's first parameter is ``cfg``/``config`` (or typed ``RespondConfig``) or is required;
    else no arguments. The module is imported from ``sys.path``; only the
    operator's config should name one (never a value a remote client sent).
    """
    name = cfg.engine.strip()
    cls = load_named(name, BUILTIN, kind="responder")
    if name == "openai":
        return cls(cfg, debug_content=debug_content)
    if name == "llama":
        from assistant.respond.hub import resolve_model

        if cfg.model_path.strip() == "auto":  # the pulled copy of the machine's model, else the bundled one
            from assistant.respond.auto import resolve_auto

            cfg, _ = resolve_auto(cfg)
        cfg = resolve_model(cfg)  # respond.model_path may name a hub file (respond/hub.py)
    if name in BUILTIN:
        return cls(cfg)
    instance = _instantiate(name, cls, cfg)
    if not callable(getattr(instance, "respond", None)):
        raise ValueError(f"responder plug-in {name!r}: {cls.__name__} has no respond(text, history) method")
    if not isinstance(getattr(instance, "name", None), str):
        with contextlib.suppress(AttributeError):
            instance.name = name
    log.info("respond.plugin_loaded spec=%s", name)
    return instance


def _instantiate(spec: str, cls: Any, cfg: RespondConfig) -> Any:
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        sig = None
    if cfg.options:
        if sig is not None:
            try:
                sig.bind(**cfg.options)
            except TypeError as exc:
                raise ValueError(
                    f"responder plug-in {spec!r}: options do not fit its constructor: {exc}"
                ) from exc
        return cls(**cfg.options)
    if sig is None:
        return cls()
    params = list(sig.parameters.values())
    wants_cfg = bool(params) and (
        params[0].name in ("cfg", "config") or "RespondConfig" in str(params[0].annotation)
    )
    if wants_cfg:
        return cls(cfg)
    try:
        sig.bind()
    except TypeError:
        pass
    else:
        return cls()
    try:
        sig.bind(cfg)
    except TypeError as exc:
        raise ValueError(f"responder plug-in {spec!r}: cannot construct it from the config: {exc}") from exc
    return cls(cfg)
