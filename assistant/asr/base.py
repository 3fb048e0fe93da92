"""The ASR protocol: 16 kHz mono float32 audio in, text out.

Engines are synchronous and CPU/GPU bound; the pipeline runs them on a worker thread
(``asr.workers``) so that the event loop, and with it every session's audio, never waits on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str = ""
    # (start_s, end_s, text) per segment, relative to the audio given.
    segments: list[tuple[float, float, str]] = field(default_factory=list)
    # Time the engine itself spent, seconds.
    compute_s: float = 0.0


@runtime_checkable
class ASREngine(Protocol):
    name: str

    def transcribe(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None
    ) -> Transcript:
        """Transcribe ``audio`` (float32, mono, 16 kHz, −1…1). Blocking."""
        ...

    def warmup(self) -> None:
        """Run once at start so the first user turn pays no load or JIT cost."""
        ...


class ASRModelMissing(RuntimeError):
    """The configured model is not on disk; the message says what to do."""
