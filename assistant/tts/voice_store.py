"""Registered voices: the reference clips users registered (with transcript and engine caches), kept on disk.

One folder per voice, ``<data_dir>/voices/<voice_id>/``:

- ``clip.wav``        the reference clip (16-bit mono, its own rate)
- ``meta.json``       id, name, transcript, duration, rate, creation time
- ``cache-<engine>.*`` an engine's prepared form of the voice (speaker embedding, prompt tokens), if any

Voices are written into a temporary folder and renamed into place (``os.replace``), so a crash never leaves a
half-written voice. Ids are made here (``secrets.token_hex``) and checked against ``VOICE_ID_RE`` before any
path is built from one, so no client string ever becomes a path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from assistant.audio import read_audio, write_wav_bytes
from assistant.tts.base import ReferenceClip

log = logging.getLogger(__name__)

ID_BYTES = 8  # 16 hex characters: 64 random bits, no collisions in a store capped at a few hundred voices
VOICE_ID_RE = re.compile(r"^[0-9a-f]{16}$")
ENGINE_NAME_RE = re.compile(r"^[a-z0-9_]{1,32}$")
CLIP_FILE = "clip.wav"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp-"


class VoiceLimitError(RuntimeError):
    """The store already holds ``max_voices`` voices."""


@dataclass(frozen=True)
class Voice:
    """What the store knows about one voice (``meta.json``)."""

    voice_id: str
    name: str
    transcript: str
    duration_s: float
    sample_rate: int
    created: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def valid_voice_id(voice_id: object) -> bool:
    """True for ids this store could have made; anything else never reaches the filesystem."""
    return isinstance(voice_id, str) and VOICE_ID_RE.fullmatch(voice_id) is not None


class ReferenceClipStore:
    """Voices by id under ``root``; thread-safe (calls run in worker threads, off the event loop)."""

    def __init__(self, root: str | Path, max_voices: int) -> None:
        self.root = Path(root)
        self.max_voices = max_voices
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] = {}
        self._loaded = False

    # --- reading ---------------------------------------------------------------------------------------
    def _load(self) -> None:
        """Scan the folder once: read every voice's meta, remove leftovers of interrupted writes."""
        if self._loaded:
            return
        self._loaded = True
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name.startswith(TMP_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if not valid_voice_id(entry.name) or not entry.is_dir():
                continue
            try:
                meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
                voice = Voice(**{k: meta[k] for k in Voice.__dataclass_fields__})
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("voice_skipped id=%s reason=%s", entry.name, type(exc).__name__)
                continue
            if voice.voice_id == entry.name:
                self._voices[voice.voice_id] = voice
        log.info("voices_loaded count=%d dir=%s", len(self._voices), self.root)

    def list(self) -> list[Voice]:
        with self._lock:
            self._load()
            return sorted(self._voices.values(), key=lambda v: v.created)

    def get(self, voice_id: str) -> Voice | None:
        if not valid_voice_id(voice_id):
            return None
        with self._lock:
            self._load()
            return self._voices.get(voice_id)

    def _dir(self, voice_id: str) -> Path:
        if not valid_voice_id(voice_id):
            raise KeyError(voice_id)
        return self.root / voice_id

    def load_clip(self, voice_id: str) -> ReferenceClip:
        """The stored clip with its transcript, ready to hand to a cloning engine."""
        voice = self.get(voice_id)
        if voice is None:
            raise KeyError(voice_id)
        audio, sr = read_audio(self._dir(voice_id) / CLIP_FILE)
        return ReferenceClip(audio=audio, sample_rate=sr, text=voice.transcript)

    def cache_path(self, voice_id: str, engine: str, suffix: str = ".npz") -> Path:
        """Where ``engine`` keeps its prepared form of this voice (it may not exist yet)."""
        if not ENGINE_NAME_RE.fullmatch(engine) or not re.fullmatch(r"\.[a-z0-9]{1,8}", suffix):
            raise ValueError(f"bad engine cache name {engine!r}{suffix!r}")
        return self._dir(voice_id) / f"cache-{engine}{suffix}"

    # --- writing ---------------------------------------------------------------------------------------
    def create(
        self,
        audio: np.ndarray,
        sample_rate: int,
        transcript: str,
        name: str = "",
        write_cache: Callable[[str, Path], None] | None = None,
    ) -> Voice:
        """Store a new voice atomically; ``write_cache(voice_id, tmp_dir)`` may add engine files first."""
        with self._lock:
            self._load()
            if len(self._voices) >= self.max_voices:
                raise VoiceLimitError(f"the store holds its maximum of {self.max_voices} voices")
            voice_id = secrets.token_hex(ID_BYTES)
            while voice_id in self._voices:  # pragma: no cover - 64 random bits
                voice_id = secrets.token_hex(ID_BYTES)
            # Reserve the id so a concurrent create cannot pass the cap while this one writes.
            self._voices[voice_id] = voice = Voice(
                voice_id=voice_id,
                name=name or f"voice-{voice_id[:6]}",
                transcript=transcript,
                duration_s=round(len(audio) / sample_rate, 3),
                sample_rate=int(sample_rate),
                created=round(time.time(), 3),
            )
        tmp = self.root / f"{TMP_PREFIX}{voice_id}"
        try:
            tmp.mkdir(parents=True)
            (tmp / CLIP_FILE).write_bytes(write_wav_bytes(audio, sample_rate))
            (tmp / META_FILE).write_text(json.dumps(voice.to_json(), ensure_ascii=False), encoding="utf-8")
            if write_cache is not None:
                write_cache(voice_id, tmp)
            os.replace(tmp, self._dir(voice_id))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            with self._lock:
                self._voices.pop(voice_id, None)
            raise
        log.info("voice_created id=%s duration_s=%.2f", voice_id, voice.duration_s)
        return voice

    def write_cache_file(
        self, voice_id: str, engine: str, writer: Callable[[Path], None], suffix: str = ".npz"
    ) -> None:
        """Add or replace an engine cache file of an existing voice atomically (temp file + rename)."""
        final = self.cache_path(voice_id, engine, suffix)
        tmp = final.with_name(f"{TMP_PREFIX}{final.name}")
        try:
            writer(tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, voice_id: str) -> bool:
        """Remove a voice; False if there was none. The folder is renamed away first, then removed."""
        if not valid_voice_id(voice_id):
            return False
        with self._lock:
            self._load()
            if self._voices.pop(voice_id, None) is None:
                return False
        path = self._dir(voice_id)
        trash = self.root / f"{TMP_PREFIX}del-{voice_id}"
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return True
        shutil.rmtree(trash, ignore_errors=True)
        log.info("voice_deleted id=%s", voice_id)
        return True
