"""The human set: ``../shared/audio/human`` (120 spoken coffee orders, 16 kHz FLAC, ``labels.json``; its README).

**A tuning set**: thresholds and settings are chosen on it, so its figures are not figures on unseen speech.

Its labels are read as manifest entries by the bench's own reader (``assistant.bench.audio_source.read_labels``:
``bench v2v`` plays such a folder too); here is where the set lives and the note its reports carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from assistant.bench.audio_source import LABELS, read_labels
from assistant.bench.shared_data import shared_path

FOLDER = "audio/human"  # inside the shared folder
TUNING_NOTE = "the human set is a tuning set: its figures are not figures on unseen speech"


def human_dir() -> Path:
    return shared_path(FOLDER)


def load_human(folder: Path | None = None) -> list[dict[str, Any]]:
    """One manifest entry per clip of the human set (``read_labels``), in the labels' order."""
    return read_labels(folder or human_dir())


__all__ = ["FOLDER", "LABELS", "TUNING_NOTE", "human_dir", "load_human"]
