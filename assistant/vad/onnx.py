"""The ONNX models of the turn (Silero VAD, the end-of-turn model): one CPU session each, shared by every
session in the process, set up one way.

``InferenceSession.run`` is thread-safe, so one session per model serves every conversation; these models are
small and many sessions share few cores, so each run gets few threads and runs its graph sequentially.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar, Self

import onnxruntime as ort


def cpu_session(path: Path, threads: int = 1) -> ort.InferenceSession:
    """A CPU ``InferenceSession`` for ``path`` with ``threads`` intra-op threads and errors-only logging (the
    shipped graphs trigger harmless warnings at load)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class SharedModel:
    """Mixin: ``Model.shared()`` is the process-wide instance of that class, built with no arguments on first
    use (thread-safe)."""

    _instances: ClassVar[dict[type, Any]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def shared(cls) -> Self:
        with SharedModel._lock:
            if cls not in SharedModel._instances:
                SharedModel._instances[cls] = cls()
            return SharedModel._instances[cls]
