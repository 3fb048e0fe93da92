"""Makes this Python look like the GPU machine: the project's other dependencies are absent.

On ``PYTHONPATH``, Python imports this file at start-up. Each module listed in ``GPU_CHECK_BLOCKED`` (comma
separated) is marked absent the way Python itself spells it: ``sys.modules[name] = None``, so ``import name``
raises ModuleNotFoundError and ``importlib.util.find_spec(name)`` returns None (what libraries such as
transformers use to probe optional packages).
"""

import os
import sys

for _name in os.environ.get("GPU_CHECK_BLOCKED", "").split(","):
    if _name.strip():
        sys.modules[_name.strip()] = None  # type: ignore[assignment]
