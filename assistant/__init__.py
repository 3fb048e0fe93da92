"""assistant: a real-time spoken assistant over WebRTC with measured voice-to-voice latency.

Importing it puts numpy's BLAS (OpenBLAS) on one thread, in this process and the engine children it starts,
unless ``OPENBLAS_NUM_THREADS`` says otherwise. The voice chat's numpy matrix products are small (Smart Turn's and
Whisper's mel filters: a few ms), but after each one OpenBLAS leaves a thread per core spinning for a while, and on
a small CPU that spinning takes the core the language model, CTranslate2's or Piper's threads were running on:
measured on 2 EPYC cores, a Smart Turn call used 219 ms of CPU for 110 ms of work, and an ASR pass took 266 ms
against 200-222 on one BLAS thread (docs/latency.md). tests/test_one_blas_thread.py guards it.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def _one_blas_thread() -> None:
    """Read by OpenBLAS when numpy loads it; a numpy loaded before this package is limited at run time (the same
    library's own call, through threadpoolctl)."""
    if BLAS_THREADS_ENV in _os.environ:
        return  # the user's choice
    _os.environ[BLAS_THREADS_ENV] = "1"
    if "numpy" in _sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")


_one_blas_thread()
