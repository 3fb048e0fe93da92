"""Makes this Python look like the GPU machine: the project's other dependencies cannot be imported.

On ``PYTHONPATH``, Python imports this file at start-up; every import of a module listed in
``GPU_CHECK_BLOCKED`` (comma separated) then raises ImportError, as on a machine that lacks it.
"""

import importlib.abc
import os
import sys

_BLOCKED = {m.strip() for m in os.environ.get("GPU_CHECK_BLOCKED", "").split(",") if m.strip()}


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not on the GPU machine)", name=name)
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _Absent())
