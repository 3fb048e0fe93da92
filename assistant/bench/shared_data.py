"""Where the shared data is (audio, texts, CosyVoice2 fixtures): ``$ASSISTANT_SHARED`` when it is set (then only
there: a wrong setting is an error, not a silent fall-back), else ``shared/`` in the working tree, else ``shared/``
beside it (``../shared`` from the tree: the development layout). A checkout copied alone to another machine finds
its data the first or the second way. The tests and the benches look here and nowhere else."""

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


__all__ = ["ENV", "shared_candidates", "shared_dir", "shared_path"]
