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
# The 40 clips issue 58's v2v runs report on, one name a line: the studies that tune on the set keep them out.
HELD_OUT = Path(__file__).with_name("data") / "human_heldout.txt"
TUNING_NOTE = "the human set is a tuning set: its figures are not figures on unseen speech"


def human_dir() -> Path:
    return shared_path(FOLDER)


def held_out(path: Path = HELD_OUT) -> set[str]:
    """The held-out clips' file names (:data:`HELD_OUT`, or another such list)."""
    return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}


def load_human(folder: Path | None = None) -> list[dict[str, Any]]:
    """One manifest entry per clip of the human set (``read_labels``), in the labels' order."""
    return read_labels(folder or human_dir())


__all__ = ["FOLDER", "HELD_OUT", "LABELS", "TUNING_NOTE", "held_out", "human_dir", "load_human"]
