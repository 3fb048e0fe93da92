"""Files the model caches write under ``~/.cache/assistant`` (the joined multilingual Whisper base, the embedded
model's rewritten weights): their SHA-256, and a temporary name beside a target, so a file is written whole and
then moved into place while another process may be writing the same one."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

CHUNK = 4 << 20


def sha256_of(paths: Sequence[Path], out: Path | None = None) -> str:
    """SHA-256 of the paths' bytes one after another (copied into ``out`` on the way when given)."""
    h = hashlib.sha256()
    sink = open(out, "wb") if out is not None else None  # noqa: SIM115 (closed below)
    try:
        for path in paths:
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    h.update(block)
                    if sink is not None:
                        sink.write(block)
    finally:
        if sink is not None:
            sink.close()
    return h.hexdigest()


def temp_beside(target: Path) -> Path:
    """A hidden name in ``target``'s folder for this process alone, to write to and then ``replace`` onto it."""
    return target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
