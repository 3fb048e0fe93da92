"""Voice prompts: what CosyVoice2 needs to speak in a reference speaker's voice, computed once per clip.

    reference clip (any rate) ─┬─ 24 kHz ─▶ prompt mel [2P, 80]          → flow (prompt frames)
                               ├─ 16 kHz ─▶ whisper mel ─▶ tokenizer.onnx → speech tokens [P] (llm + flow)
                               └─ 16 kHz ─▶ kaldi fbank ─▶ campplus.onnx  → speaker embedding [192] (flow)
    transcript ─▶ prompt text (llm)

Computed prompts are cached by voice id in memory and can be saved to / loaded from ``.npz`` files.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from assistant.tts.cosyvoice.prompt_features import (
    PROMPT_SAMPLE_RATE,
    TOKENIZER_SAMPLE_RATE,
    prompt_mel,
    resample,
    speaker_fbank,
    whisper_log_mel,
)

log = logging.getLogger(__name__)

MAX_TOKENIZER_SECONDS = 30.0  # the speech tokenizer was trained on clips up to 30 s
TOKEN_MEL_RATIO = 2  # prompt mel frames per speech token (50 Hz / 25 Hz)


class VoiceCloningUnavailable(RuntimeError):
    """The model directory has no campplus.onnx / speech_tokenizer_v2.onnx."""


@dataclass
class CosyVoicePrompt:
    """One voice, ready to use. Token/feature counts satisfy ``speech_feat frames == 2 * speech tokens``."""

    voice_id: str
    prompt_text: str                 # what the reference clip says ("" if unknown)
    speech_tokens: torch.Tensor      # [1, P] int32
    speech_feat: torch.Tensor        # [1, 2P, 80] float32
    embedding: torch.Tensor          # [1, 192] float32
    prompt_text_tokens: torch.Tensor | None = None  # [1, Tp] int64, filled in by the synthesiser when known

    def save(self, path: str | Path) -> None:
        """Write to ``.npz`` (no pickles)."""
        arrays: dict[str, Any] = {  # Any: numpy types savez's **kwds so that any name could be allow_pickle
            "voice_id": np.array(self.voice_id),
            "prompt_text": np.array(self.prompt_text),
            "speech_tokens": self.speech_tokens.cpu().numpy().astype(np.int32),
            "speech_feat": self.speech_feat.cpu().float().numpy(),
            "embedding": self.embedding.cpu().float().numpy(),
        }
        if self.prompt_text_tokens is not None:
            arrays["prompt_text_tokens"] = self.prompt_text_tokens.cpu().numpy().astype(np.int64)
        with open(path, "wb") as fh:  # np.savez on a path would append ".npz" to names without it
            np.savez(fh, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> CosyVoicePrompt:
        with np.load(path, allow_pickle=False) as z:
            ptt = torch.from_numpy(z["prompt_text_tokens"]) if "prompt_text_tokens" in z else None
            return cls(
                voice_id=str(z["voice_id"]),
                prompt_text=str(z["prompt_text"]),
                speech_tokens=torch.from_numpy(z["speech_tokens"]),
                speech_feat=torch.from_numpy(z["speech_feat"]),
                embedding=torch.from_numpy(z["embedding"]),
                prompt_text_tokens=ptt,
            )


class _NodeArg(Protocol):
    @property
    def name(self) -> str: ...


class OnnxSession(Protocol):
    """An onnxruntime ``InferenceSession`` as it is used here (onnxruntime ships no type hints)."""

    def get_inputs(self) -> Sequence[_NodeArg]: ...

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]: ...


def _session(path: Path) -> OnnxSession:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class VoiceEncoder:
    """Turns a reference clip into a ``CosyVoicePrompt`` with the two ONNX models of the release."""

    def __init__(self, campplus_path: str | Path | None, speech_tokenizer_path: str | Path | None) -> None:
        self.campplus_path = Path(campplus_path) if campplus_path else None
        self.tokenizer_path = Path(speech_tokenizer_path) if speech_tokenizer_path else None
        self._sessions_made: tuple[OnnxSession, OnnxSession] | None = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return bool(
            self.campplus_path and self.campplus_path.is_file()
            and self.tokenizer_path and self.tokenizer_path.is_file()
        )

    def _sessions(self) -> tuple[OnnxSession, OnnxSession]:
        if not self.available:
            raise VoiceCloningUnavailable(
                "voice cloning needs campplus.onnx and speech_tokenizer_v2.onnx in the model directory "
                f"(looked for {self.campplus_path} and {self.tokenizer_path})"
            )
        assert self.campplus_path is not None and self.tokenizer_path is not None  # available says so
        with self._lock:
            if self._sessions_made is None:
                self._sessions_made = (_session(self.campplus_path), _session(self.tokenizer_path))
            return self._sessions_made

    def speech_tokens(self, audio_16k: np.ndarray) -> torch.Tensor:
        """16 kHz audio (≤ 30 s) → speech tokens [1, P] int32 (25 per second)."""
        if len(audio_16k) > MAX_TOKENIZER_SECONDS * TOKENIZER_SAMPLE_RATE:
            raise ValueError(f"reference clip longer than {MAX_TOKENIZER_SECONDS:.0f} s")
        _, sess = self._sessions()
        feat = whisper_log_mel(audio_16k)[None]                              # [1, 128, T]
        inputs = sess.get_inputs()
        out = sess.run(None, {
            inputs[0].name: feat.numpy().astype(np.float32),
            inputs[1].name: np.array([feat.shape[2]], dtype=np.int32),
        })[0]
        return torch.from_numpy(np.asarray(out).reshape(1, -1).astype(np.int32))

    def speaker_embedding(self, audio_16k: np.ndarray) -> torch.Tensor:
        """16 kHz audio → speaker embedding [1, 192] float32."""
        sess, _ = self._sessions()
        feat = speaker_fbank(audio_16k)[None]                                 # [1, T, 80]
        out = sess.run(None, {sess.get_inputs()[0].name: feat.numpy().astype(np.float32)})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(1, -1))

    def encode(self, voice_id: str, audio: np.ndarray, sample_rate: int, prompt_text: str = "") -> CosyVoicePrompt:
        """Reference clip (mono, any rate) → prompt, with tokens and mel trimmed to a 1:2 ratio."""
        audio = np.asarray(audio, dtype=np.float32)
        a16 = resample(audio, sample_rate, TOKENIZER_SAMPLE_RATE)
        a24 = resample(audio, sample_rate, PROMPT_SAMPLE_RATE)
        tokens = self.speech_tokens(a16)
        feat = prompt_mel(a24)[None]                                          # [1, T, 80]
        n = min(feat.shape[1] // TOKEN_MEL_RATIO, tokens.shape[1])
        emb = self.speaker_embedding(a16)
        log.info("voice %s: %d prompt tokens, %.1f s", voice_id, n, len(audio) / sample_rate)
        return CosyVoicePrompt(
            voice_id=voice_id,
            prompt_text=prompt_text,
            speech_tokens=tokens[:, :n].contiguous(),
            speech_feat=feat[:, : TOKEN_MEL_RATIO * n].contiguous(),
            embedding=emb,
        )


class PromptStore:
    """Computed voice prompts (`CosyVoicePrompt`) by voice id: in memory, optionally persisted as
    ``<dir>/<voice_id>.npz`` and read back from there after a restart. (Not `tts.voices.VoiceStore`, which
    keeps the users' reference clips; model state derived from a prompt lives in `prompt_cache.PromptCache`.)"""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self._voices: dict[str, CosyVoicePrompt] = {}
        self._lock = threading.Lock()

    def _path(self, voice_id: str) -> Path:
        assert self.directory is not None
        if not voice_id or any(c in voice_id for c in "/\\\0") or voice_id.startswith("."):
            raise ValueError(f"bad voice id {voice_id!r}")
        return self.directory / f"{voice_id}.npz"

    def put(self, prompt: CosyVoicePrompt, persist: bool = True) -> None:
        with self._lock:
            self._voices[prompt.voice_id] = prompt
        if persist and self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            prompt.save(self._path(prompt.voice_id))

    def get(self, voice_id: str) -> CosyVoicePrompt | None:
        with self._lock:
            found = self._voices.get(voice_id)
        if found is None and self.directory is not None:
            path = self._path(voice_id)
            if path.is_file():
                found = CosyVoicePrompt.load(path)
                with self._lock:
                    self._voices[voice_id] = found
        return found

    def remove(self, voice_id: str) -> None:
        with self._lock:
            self._voices.pop(voice_id, None)
        if self.directory is not None:
            self._path(voice_id).unlink(missing_ok=True)

    def ids(self) -> list[str]:
        with self._lock:
            ids = set(self._voices)
        if self.directory is not None and self.directory.is_dir():
            ids |= {p.stem for p in self.directory.glob("*.npz")}
        return sorted(ids)


__all__ = ["CosyVoicePrompt", "PromptStore", "VoiceCloningUnavailable", "VoiceEncoder"]
