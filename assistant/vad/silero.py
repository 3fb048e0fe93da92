"""Silero VAD through onnxruntime: one shared model per process, one small state object per session.

The weights are Silero VAD v6 as faster-whisper ships them (``faster_whisper/assets/silero_vad_v6.onnx``),
found without importing faster-whisper. Not the ``silero-vad`` package's copy: that package requires torch,
which would make a CPU voice chat install several GB for a model onnxruntime runs alone.

Silero v6 at 16 kHz takes 512-sample (32 ms) windows, each prefixed with the previous window's last 64
samples (its context), and carries an LSTM state (h, c), each of shape (1, 1, 128), from window to window.
This export takes one stream's windows as rows of one sequence, so every session runs its own windows.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np

from assistant.vad.onnx import SharedModel, cpu_session

log = logging.getLogger(__name__)

WINDOW_SAMPLES = 512  # the only window size Silero v5+ accepts at 16 kHz (32 ms)
CONTEXT_SAMPLES = 64  # samples of the previous window the model sees in front of each window at 16 kHz
STATE_SHAPE = (2, 1, 128)  # the LSTM's (h, c) for one stream
# One intra-op thread: a 32 ms window costs well under a millisecond, and many sessions share few cores.
INTRA_OP_THREADS = 1
ONNX_FILE = "assets/silero_vad_v6.onnx"  # inside the faster_whisper package
# Digital silence (all-zero windows: the inbound reader's fill for lost or skipped audio, a muted sender) runs
# through the model this many windows (0.5 s); after that the stream starts afresh and further zero windows cost
# nothing, so seconds of filled silence never run the model window by window.
ZERO_RUN_WINDOWS = 16


class SileroModelMissing(RuntimeError):
    """faster-whisper (which ships the Silero ONNX weights) is not installed."""


def find_model_path() -> Path:
    """The Silero v6 ONNX file inside the installed faster-whisper package, found without importing it."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise SileroModelMissing(
            "Silero VAD weights not found: install faster-whisper (pip install faster-whisper)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / ONNX_FILE
    if not path.is_file():
        raise SileroModelMissing(f"Silero VAD weights missing at {path}: reinstall faster-whisper (>= 1.2)")
    return path


class SileroModel(SharedModel):
    """One onnxruntime session, shared by every session's ``SileroStream``. Use ``SileroModel.shared()`` to get
    the process-wide instance (``vad/onnx.py``)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else find_model_path()
        self.session = cpu_session(self.path, INTRA_OP_THREADS)
        names = {i.name for i in self.session.get_inputs()}
        if names != {"input", "h", "c"}:
            raise RuntimeError(f"unexpected Silero ONNX inputs {sorted(names)} in {self.path}")
        log.info("vad.model_loaded path=%s", self.path)

    def run(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x (windows, CONTEXT_SAMPLES + WINDOW_SAMPLES) of one stream, in order; state (2, 1, 128) (h, c)
        → each window's speech probability (windows,), and the state after the last window."""
        probs, h, c = self.session.run(None, {"input": x, "h": state[:1], "c": state[1:]})
        return np.asarray(probs).reshape(-1), np.concatenate([h, c])

    def stream(self) -> SileroStream:
        return SileroStream(self)


class SileroStream:
    """Per-session VAD state: the recurrent state and the 64-sample context. Not shared between sessions."""

    def __init__(self, model: SileroModel | None = None) -> None:
        self.model = model or SileroModel.shared()
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._zero_run = 0
        self._zero_prob = 0.0

    def prob(self, window: np.ndarray) -> float:
        """Speech probability of one 512-sample (32 ms) 16 kHz float32 window."""
        if window.shape != (WINDOW_SAMPLES,):
            raise ValueError(f"Silero needs {WINDOW_SAMPLES}-sample windows at 16 kHz, got {window.shape}")
        if window.any():
            self._zero_run = 0
        else:
            self._zero_run += 1
            if self._zero_run > ZERO_RUN_WINDOWS:
                return self._zero_prob
        x = np.concatenate([self._context, window.astype(np.float32, copy=False)])[None, :]
        probs, self._state = self.model.run(x, self._state)
        self._context = x[0, -CONTEXT_SAMPLES:].copy()
        if self._zero_run == ZERO_RUN_WINDOWS:  # a long digital silence: afresh, as a new stream after it
            self._zero_prob = float(probs[0])
            self._state = np.zeros(STATE_SHAPE, dtype=np.float32)
        return float(probs[0])
