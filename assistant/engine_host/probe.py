"""A hosted object that does nothing but carry data: what crossing the process boundary costs by itself
(``python -m lab isolation``: an ASR pass's audio in, a TTS reply's chunks out), with no engine's time in it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import numpy as np


class Probe:
    CALLS = ("take",)
    STREAMS = ("chunks",)

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start(self) -> dict[str, Any]:
        return {"engine": "probe"}

    def take(self, audio: np.ndarray) -> int:
        """An ASR pass's shape: the audio in, a small answer out."""
        return int(audio.size)

    async def chunks(self, n: int, samples: int) -> AsyncGenerator[np.ndarray, None]:
        """A TTS reply's shape: ``n`` chunks of ``samples`` float32 samples out."""
        chunk = np.zeros(samples, dtype=np.float32)
        for _ in range(n):
            yield chunk


def make_probe(config: dict[str, Any]) -> Probe:
    return Probe(config)
