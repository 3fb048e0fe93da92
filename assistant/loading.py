"""Engines chosen by name: one loader for ASR engines, TTS engines and responders.

A name is either a built-in (looked up in the caller's table of ``"module:attribute"`` targets, imported only
when asked for, so the CPU stack never imports torch) or a plug-in ``package.module:Class`` from the
operator's config. Never call it with a name a remote client sent: a plug-in name imports any module.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def load_named(spec: str, builtins: Mapping[str, str], *, kind: str) -> Any:
    """The class (or factory) ``spec`` names; ``ValueError`` with a reason that names what exists."""
    name = spec.strip()
    target = builtins.get(name)
    if target is None:
        if ":" not in name:
            raise ValueError(
                f"unknown {kind} {name!r}: use one of {', '.join(builtins)}, or 'package.module:Class' for a plug-in"
            )
        target = name
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{kind} plug-in {spec!r}: expected 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{kind} {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None or not callable(obj):
        raise ValueError(f"{kind} {spec!r}: module {module_name!r} has no class {attr!r}")
    return obj
