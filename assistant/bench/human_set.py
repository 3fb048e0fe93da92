"""The human set: ``../shared/audio/human`` (120 spoken coffee orders, 16 kHz FLAC, ``labels.json``; its README).

**A tuning set**: thresholds and settings are chosen on it, so its figures are not figures on unseen speech.

Its labels name the fields differently from the synthetic manifests (``speech_end_s`` for ``speech_ends_s``;
``pauses_s`` holds the *lengths* of the gaps, not where they lie), so :func:`load_human` gives each clip as a
manifest entry the end-of-turn bench reads (``speech_starts_s``, ``speech_ends_s``, no labelled pause
positions: the VAD finds the pauses) and keeps the rest (``pause_lengths_s``, ``slots``, ``intent``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from assistant.bench.shared_data import shared_path

FOLDER = "audio/human"  # inside the shared folder
LABELS = "labels.json"
TUNING_NOTE = "the human set is a tuning set: its figures are not figures on unseen speech"


def human_dir() -> Path:
    return shared_path(FOLDER)


def load_human(folder: Path | None = None) -> list[dict[str, Any]]:
    """One manifest entry per clip of the human set (module docstring), in the labels' order."""
    folder = folder or human_dir()
    out = []
    for row in json.loads((folder / LABELS).read_text(encoding="utf-8")):
        lengths = [float(p) for p in row.get("pauses_s", [])]
        out.append({
            "file": row["file"], "split": "human", "lang": "en", "engine": "human", "voice": "human",
            "kind": "pauses" if lengths else "fluent",
            "speech_starts_s": float(row["speech_start_s"]), "speech_ends_s": float(row["speech_end_s"]),
            "pause_lengths_s": lengths, "slots": {k: v.strip() for k, v in row.get("slots", {}).items()},
            "intent": row.get("intent", ""),
        })
    return out


__all__ = ["FOLDER", "LABELS", "TUNING_NOTE", "human_dir", "load_human"]
