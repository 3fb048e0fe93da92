"""Where the shared data is (audio, texts, CosyVoice2 fixtures): ``$ASSISTANT_SHARED`` when it is set (then only
there: a wrong setting is an error, not a silent fall-back), else ``shared/`` in the working tree, else ``shared/``
beside it (``../shared`` from the tree: the development layout). A checkout copied alone to another machine finds
its data the first or the second way. The tests and the lab look here and nowhere else; the product's benches never
need it (``assistant bench v2v`` plays its own speech: ``bench/speech.py``)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ASSISTANT_SHARED"
TREE = Path(__file__).resolve().parents[2]          # the working tree (assistant/bench/ is two levels down)


def shared_candidates() -> list[Path]:
    """The places looked at, in order (``$ASSISTANT_SHARED`` alone when it is set)."""
    if os.environ.get(ENV):
        return [Path(os.environ[ENV]).expanduser()]
    return [TREE / "shared", TREE.parent / "shared"]


def shared_dir(must_hold: str = "") -> Path | None:
    """The first candidate that exists (and holds ``must_hold``, a relative path, when given), or None."""
    for path in shared_candidates():
        if path.is_dir() and (not must_hold or (path / must_hold).exists()):
            return path
    return None


def shared_path(relative: str) -> Path:
    """``relative`` inside the first shared folder that holds it (else inside the first candidate, so an error
    message names a real place)."""
    found = shared_dir(relative)
    return (found or shared_candidates()[0]) / relative


SHARED_AUDIO = shared_path("audio")  # the team's speech files with their manifest (../shared/audio)
# Files of SHARED_AUDIO that are not turns: the voice-cloning clip is a monologue, not a question.
EXCLUDED_SPEECH = frozenset({"en_reference_voice.wav"})


def shared_speech_files() -> list[Path]:
    """``SHARED_AUDIO/en_*.wav`` minus the voice-cloning clip, sorted by name: the speech the lab's studies and the
    tests play."""
    return sorted(p for p in SHARED_AUDIO.glob("en_*.wav") if p.name not in EXCLUDED_SPEECH)


__all__ = ["ENV", "SHARED_AUDIO", "shared_candidates", "shared_dir", "shared_path", "shared_speech_files"]
