"""Responders: what the assistant says back. Chosen by name in ``[respond] engine``.

Built in: ``echo`` (default, no model), ``rules`` (offline regex table), ``openai`` (any OpenAI-compatible
chat server). Anything else of the form ``package.module:Class`` is imported and used as a plug-in.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from typing import Any

from assistant.config import RespondConfig
from assistant.respond.base import Message, Responder, ResponderError
from assistant.respond.history import ConversationHistory

log = logging.getLogger(__name__)

BUILTIN = ("echo", "rules", "openai")

__all__ = ["BUILTIN", "ConversationHistory", "Message", "Responder", "ResponderError", "create_responder"]


def create_responder(cfg: RespondConfig, *, debug_content: bool = False) -> Responder:
    """Make the responder ``cfg.engine`` names; ``ValueError`` with a clear reason if it cannot.

    Plug-ins (``module:Class``) get ``**cfg.options`` when options are set; else ``(cfg)`` when the
    constructor's first parameter is ``cfg``/``config`` (or typed ``RespondConfig``) or is required;
    else no arguments. The module is imported from ``sys.path``; only the
    operator's config should name one (never a value a remote client sent).
    """
    name = cfg.engine.strip()
    if name == "echo":
        from assistant.respond.echo import EchoResponder

        return EchoResponder(cfg)
    if name == "rules":
        from assistant.respond.rules import RulesResponder

        return RulesResponder(cfg)
    if name == "openai":
        from assistant.respond.openai import OpenAIResponder

        return OpenAIResponder(cfg, debug_content=debug_content)
    if ":" in name:
        return _load_plugin(name, cfg)
    raise ValueError(
        f"unknown responder {name!r}: use one of {', '.join(BUILTIN)}, "
        "or 'package.module:Class' for a plug-in"
    )


def _load_plugin(spec: str, cfg: RespondConfig) -> Responder:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"responder plug-in {spec!r}: expected 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"responder plug-in {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None or not callable(cls):
        raise ValueError(f"responder plug-in {spec!r}: module {module_name!r} has no class {class_name!r}")
    instance = _instantiate(spec, cls, cfg)
    if not callable(getattr(instance, "respond", None)):
        raise ValueError(f"responder plug-in {spec!r}: {class_name} has no respond(text, history) method")
    if not isinstance(getattr(instance, "name", None), str):
        with contextlib.suppress(AttributeError):
            instance.name = spec
    log.info("respond.plugin_loaded spec=%s", spec)
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
