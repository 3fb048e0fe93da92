"""The end-of-turn model: Smart Turn v3.2, which judges from how the speech sounds whether the user is done.

One of the end-of-turn family: this module hears the audio; ``pipeline/end_of_turn.py`` reads the transcript
and weighs both (its ``EndOfTurnModel`` protocol is the face :class:`SmartTurnBatcher` shows the pipeline).

The model (8 M parameters, BSD-2-Clause, by Daily; ``data/smart-turn-v3.2-cpu.onnx`` with its licence
beside it) ships inside this package, so ``pip install -e .`` sets it up and nothing downloads at run time.
It is the file the ``pipecat-ai`` 1.14 wheel carries; only the file is taken, none of that framework.

Input ``input_features`` [batch, 80, 800]: a Whisper-style 80-bin log-mel spectrogram (25 ms window, 10 ms
hop) of the last 8 s of the turn at 16 kHz, zero-padded at the front, computed from the waveform after
zero-mean unit-variance normalisation. Output ``logits`` [batch, 1]: already a sigmoid, the probability that
the turn is complete. Runs through onnxruntime only (no torch, no transformers).

Trained on human speech: on synthetic voices it misses prosodic cues, so the turn-taking policy combines it
with the transcript rule (``pipeline/end_of_turn.py``) rather than trusting it alone; the threshold that
counts as "done" is ``turn.end_of_turn_threshold``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from assistant.audio import SPEECH_RATE
from assistant.vad.onnx import SharedModel, cpu_session

log = logging.getLogger(__name__)

MODEL_FILE = Path(__file__).with_name("data") / "smart-turn-v3.2-cpu.onnx"
WINDOW_S = 8
WINDOW_SAMPLES = WINDOW_S * SPEECH_RATE
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
N_FRAMES = WINDOW_SAMPLES // HOP  # 800
# A 200 ms pause costs one call of ~40 ms on one core; more threads would only steal from ASR and TTS.
INTRA_OP_THREADS = 1
# Requests from other sessions that arrive within this long of the first are run in the same batch.
BATCH_WINDOW_S = 0.005
# Batching does not pay on CPU: measured here, 4 rows in one run took 1.2x the time of 4 single runs
# (the model is compute-bound; a batch only delays the first answer). Worth raising on a GPU provider.
DEFAULT_MAX_BATCH = 1


class SmartTurnMissing(RuntimeError):
    """The end-of-turn model file is not where the package puts it."""


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (what Whisper's filter bank uses)."""
    f = np.asarray(f, dtype=np.float64)
    lin = 3.0 * f / 200.0
    log_part = 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log_part, lin)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    lin = 200.0 * m / 3.0
    log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    return np.where(m >= 15.0, log_part, lin)


def mel_filter_bank(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SPEECH_RATE) -> np.ndarray:
    """Triangular, area-normalised ("slaney") mel filters, shape (n_fft // 2 + 1, n_mels)."""
    fft_hz = np.linspace(0.0, sr / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(sr / 2)), n_mels + 2))
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (fft_hz[:, None] - lower) / (centre - lower)
    falling = (upper - fft_hz[:, None]) / (upper - centre)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return tri * (2.0 / (upper - lower))


_MEL = mel_filter_bank()
_HANN = np.hanning(N_FFT + 1)[:-1]  # periodic Hann


def last_window(audio: np.ndarray) -> np.ndarray:
    """The last 8 s of ``audio`` (16 kHz), zero-padded at the front to exactly 8 s."""
    x = np.asarray(audio, dtype=np.float32).reshape(-1)[-WINDOW_SAMPLES:]
    if x.size < WINDOW_SAMPLES:
        x = np.concatenate([np.zeros(WINDOW_SAMPLES - x.size, np.float32), x])
    return x


def log_mel(audio: np.ndarray) -> np.ndarray:
    """Whisper-style features of one turn: (80, 800) float32 from the last 8 s of 16 kHz audio."""
    x = last_window(audio).astype(np.float64)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:N_FRAMES]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # (800, 201)
    mel = np.log10(np.maximum(power @ _MEL, 1e-10)).T  # (80, 800)
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


class SmartTurnModel(SharedModel):
    """One onnxruntime session shared by every session (``run`` is thread-safe); ``shared()`` for the
    process-wide one (``vad/onnx.py``)."""

    def __init__(self, path: str | Path | None = None, threads: int = INTRA_OP_THREADS) -> None:
        self.path = Path(path) if path else MODEL_FILE
        if not self.path.is_file():
            raise SmartTurnMissing(f"Smart Turn model missing at {self.path}: reinstall the assistant package")
        self.session = cpu_session(self.path, threads)
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        if list(inputs) != ["input_features"] or list(inputs["input_features"])[1:] != [N_MELS, N_FRAMES]:
            raise RuntimeError(f"unexpected Smart Turn ONNX inputs {inputs} in {self.path}")
        log.info("end_of_turn.model_loaded path=%s", self.path)

    def predict(self, audios: list[np.ndarray]) -> np.ndarray:
        """Probability that each turn is complete, one per 16 kHz float32 audio (batched in one run)."""
        if not audios:
            return np.zeros(0, np.float32)
        feats = np.stack([log_mel(a) for a in audios])
        (probs,) = self.session.run(["logits"], {"input_features": feats})
        return np.asarray(probs, dtype=np.float32).reshape(-1)

    def probability(self, audio: np.ndarray) -> float:
        return float(self.predict([audio])[0])


class SmartTurnBatcher:
    """Async front of the model for many sessions: calls that arrive together run as one batch in a worker
    thread, so the event loop never waits on the model and concurrent pauses share one ONNX run.

    The thread is its own (one worker): in the loop's default executor a batch would queue behind TTS work and
    voice loading, and the end of a turn would wait for them."""

    def __init__(
        self,
        model: SmartTurnModel | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        window_s: float = BATCH_WINDOW_S,
    ) -> None:
        self.model = model or SmartTurnModel.shared()
        self.max_batch = max(1, max_batch)
        self.window_s = window_s
        self._pending: list[tuple[np.ndarray, asyncio.Future[float]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self.batches = 0
        self.calls = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")

    def close(self) -> None:
        """Let the worker thread go (a batch running finishes first)."""
        self._executor.shutdown(wait=False)

    async def probability(self, audio: np.ndarray) -> float:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        self._pending.append((last_window(audio), fut))
        self.calls += 1
        if len(self._pending) >= self.max_batch:
            self._run_batch()
        elif self._flush is None:
            self._flush = loop.call_later(self.window_s, self._run_batch)
        return await fut

    def _run_batch(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        batch, self._pending = self._pending, []
        batch = [(a, f) for a, f in batch if not f.cancelled()]
        if not batch:
            return
        self.batches += 1
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, self.model.predict, [a for a, _ in batch])

        def deliver(done: asyncio.Future[np.ndarray]) -> None:
            exc = None if done.cancelled() else done.exception()
            for i, (_, fut) in enumerate(batch):
                if fut.done():
                    continue
                if done.cancelled():
                    fut.cancel()
                elif exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(float(done.result()[i]))

        work.add_done_callback(deliver)
