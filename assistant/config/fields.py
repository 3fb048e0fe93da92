"""What every section of the config is made of: a setting is a dataclass field with its help text, and a bad value
raises :class:`ConfigError`."""

from __future__ import annotations

import copy
from dataclasses import field
from typing import TypeVar

_T = TypeVar("_T")


def setting(default: _T, help: str, **kw: object) -> _T:
    """A config field with its help text (shown by ``--help``); a list or dict default is copied per instance."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.copy(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


class ConfigError(ValueError):
    """A config file, variable or flag names an unknown setting or holds a bad value."""
