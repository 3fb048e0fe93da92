"""llama.cpp for this process: the one module that imports llama-cpp-python and the one place a model is loaded.

**Extra buffer types are off for the whole process.** llama.cpp can repack the weights at load into CPU-specific
layouts ("extra buffer types": the AMX tiles of Intel Xeons from Sapphire Rapids on, the AArch64/x86 repacked
Q4_0/IQ4_NL kernels) so the CPU's matrix units read them directly. On an Intel Xeon with AMX the build this
package compiles (native, llama-cpp-python 0.3.36) takes the AMX path for SmolLM2's Q4_1 and Q8_0 weights and
segfaults in the first ``llama_decode`` (``ggml_backend_amx_mul_mat``; upstream ggml-org/llama.cpp#20824, the same
crash llama-server shows under Ollama on such machines). Off, the weights stay in plain CPU buffers and run the
ordinary AVX2/AVX-512 kernels on every CPU.

Importing this module makes ``llama_model_default_params()`` return that safe default, in ``llama_cpp`` and in
``llama_cpp.llama_cpp``, which is where the high-level ``llama_cpp.Llama`` class and its ``LlamaModel`` take their
parameters from: whatever loads a model in this process after the import starts from plain CPU buffers.
``respond.extra_buffers = true`` turns them back on for the engine's model, deliberately (:func:`model_params`).

Nothing else in the package, the lab, the tests or the scripts imports ``llama_cpp`` or names a call that loads a
model: they use :data:`llama_cpp` from here, :func:`load_model` (the low-level API) and :func:`open_llama` (the
``Llama`` class); llama-cpp-python's OpenAI-compatible server runs as ``python -m assistant.respond.llama.native
ARGS`` (``bench llm``: its ARGS, with the safe default installed first). ``tests/test_llama_native.py`` reads every
module and script and fails on any other way in, so the safe default cannot be skipped by a new call site, on a
machine where nobody sees the crash.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as _low

__all__ = ["llama_cpp", "load_model", "model_params", "open_llama"]

_SAFE = "_assistant_plain_cpu_buffers"  # marks our default, so a second import (a reload) does not wrap it again


def _install() -> None:
    """``llama_model_default_params()`` with extra buffer types off, for every caller in this process."""
    current = _low.llama_model_default_params
    if getattr(current, _SAFE, False):
        return
    library_default = current

    def plain_cpu_buffers() -> Any:
        params = library_default()
        params.use_extra_bufts = False
        return params

    setattr(plain_cpu_buffers, _SAFE, True)
    _low.llama_model_default_params = plain_cpu_buffers  # what Llama and LlamaModel call (llama_cpp.llama_cpp)
    llama_cpp.llama_model_default_params = plain_cpu_buffers  # the package's re-export of the same name


_install()


def model_params(*, gpu_layers: int = 0, extra_buffers: bool = False) -> Any:
    """Model parameters: ``gpu_layers`` offloaded (-1: all); extra buffer types only when ``extra_buffers`` asks
    (``respond.extra_buffers``: proven on this CPU)."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = gpu_layers if gpu_layers >= 0 else 999
    params.use_extra_bufts = bool(extra_buffers)
    return params


def load_model(path: Path, params: Any | None = None) -> Any:
    """llama.cpp's model from the GGUF at ``path`` (a null pointer when it cannot load it); ``params`` from
    :func:`model_params` (default: CPU only, plain buffers)."""
    return llama_cpp.llama_model_load_from_file(str(path).encode(), params if params is not None else model_params())


def open_llama(path: Path, **options: Any) -> Any:
    """llama-cpp-python's high-level ``Llama`` over the GGUF at ``path`` (``options`` as ``Llama`` takes them), its
    weights in plain CPU buffers: for studies and checks that want its conveniences (``eval``, ``scores``)."""
    llm = llama_cpp.Llama(model_path=str(path), **options)
    if llm.model_params.use_extra_bufts:  # cannot happen after _install(); a refusal beats a segfault in decode
        llm.close()
        raise RuntimeError("llama.cpp's extra buffer types are on for this model: the process default was bypassed")
    return llm


if __name__ == "__main__":  # llama-cpp-python's server, its models loaded with the default above
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
