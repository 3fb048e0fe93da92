"""The weights the CPU runs fast: ``respond.requantize`` rewrites a model file once into a cache, then reuses it.

llama.cpp has no fast CPU kernel for SmolLM2's Q4_1 blocks (the packaged model): a 20-token prompt took 201 ms
on one EPYC core as Q4_1 and 107 ms as Q8_0 (a token 17.1 → 16.2 ms; one-off timings with llama-cpp-python's
``Llama.eval``). Q4_1 → Q8_0 changes the model about as little as llama.cpp's kernels do: the two files' next-token
distributions differ by a mean KL of 0.004 nats and disagree only at near ties, and each is as far from the F16
expansion of the same weights (``tests/test_llama_weights.py`` checks it). Q4_0 was faster still but moved
tokens the model was sure of, so it is not offered. The cost is memory: a 138 MiB file instead of 94 MiB.

- ``auto`` (default): the packaged SmolLM2 on a CPU (``respond.gpu_layers = 0``) is rewritten as Q8_0; a model
  file of yours, or any model on a GPU, loads as it is (a big Q4 model on a CPU is bound by memory bandwidth,
  where twice the bytes may cost more than the kernel saves).
- ``q8_0``: any model file is rewritten as Q8_0. ``off``: every file loads as it is.

The rewritten file is named by the source's SHA-256, written beside a temporary name and moved into place (two
processes may convert at once), so a file in the cache is always whole and always of the source it names. A
conversion that fails (no room, a read-only cache) logs a warning and the source file loads instead.
"""

from __future__ import annotations

import ctypes
import logging
import time
from pathlib import Path

from assistant.cache_files import sha256_of, temp_beside
from assistant.config import REQUANTIZE, RespondConfig
from assistant.respond.llama.model_file import check_gguf, default_model_path

log = logging.getLogger(__name__)

SUBFOLDER = "llm"


def weights_path(source: Path, cfg: RespondConfig) -> Path:
    """The file to load for ``source`` under ``cfg.requantize``: ``source`` itself, or its Q8_0 rewrite in
    ``respond.cache_dir`` (made the first time)."""
    if cfg.requantize not in REQUANTIZE:
        raise ValueError(f"respond.requantize must be one of {', '.join(REQUANTIZE)}, got {cfg.requantize!r}")
    if not _wants_q8(source, cfg):
        return source
    try:
        return rewritten_q8_0(source, Path(cfg.cache_dir).expanduser() / SUBFOLDER)
    except Exception as exc:  # the model still loads: as it is, slower on a CPU
        log.warning("llm.requantize_failed source=%s error=%s: %s (loading the file as it is)", source,
                    type(exc).__name__, exc)
        return source


def _wants_q8(source: Path, cfg: RespondConfig) -> bool:
    if cfg.requantize == "q8_0":
        return True
    if cfg.requantize == "off" or cfg.gpu_layers != 0:
        return False
    try:
        return source.resolve() == default_model_path().resolve()
    except Exception:  # the package is not installed: this is a file of the user's
        return False


def rewritten_q8_0(source: Path, folder: Path) -> Path:
    """``source`` as Q8_0 in ``folder``: reused when there, else written (0.8 s for the packaged file, one core)
    and moved into place. Raises on failure (the caller decides what loads instead). The source is hashed at
    every start (0.08-0.19 s for the packaged 94 MiB); a rewrite of an older source stays until removed."""
    digest = sha256_of([source])
    target = folder / f"{source.stem}.{digest[:16]}.Q8_0.gguf"
    if target.is_file():
        check_gguf(target)
        return target
    from assistant.respond.llama.engine import install_llama_log
    from assistant.respond.llama.native import llama_cpp

    install_llama_log(llama_cpp)  # its per-tensor lines stay out of the server's log (warnings still come)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(target)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    params.nthread = 1
    t0 = time.perf_counter()
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.is_file():
            raise OSError(f"llama.cpp could not rewrite the weights (code {rc})")
        check_gguf(tmp)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("llm.requantized source=%s target=%s type=Q8_0 bytes=%d s=%.1f", source, target,
             target.stat().st_size, time.perf_counter() - t0)
    return target
