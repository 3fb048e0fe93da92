"""numpy's BLAS runs on one thread wherever the package is imported (assistant/__init__.py): OpenBLAS's idle
threads spin after each small product and take the core the model's threads need. Each check runs in a fresh
interpreter, since this one imported numpy long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json
{first}
import numpy
from threadpoolctl import threadpool_info
a = numpy.ones((300, 300))
a @ a  # the library is loaded and has run
print(json.dumps([p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]))
"""


def _blas_threads(first: str = "import assistant", **env: str) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return list(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.skipif((os.cpu_count() or 1) == 1, reason="one core: every BLAS runs on one thread anyway")
def test_numpy_s_blas_is_on_one_thread_after_importing_the_package() -> None:
    without = _blas_threads(first="")
    assert without and all(n > 1 for n in without)  # what the package changes: a thread per core
    assert _blas_threads() == [1]
    # numpy loaded and used first (an application that imports it before us): limited at import all the same.
    assert _blas_threads("import numpy\nnumpy.ones((300, 300)) @ numpy.ones((300, 300))\nimport assistant") == [1]


def test_a_user_s_own_blas_setting_is_kept() -> None:
    assert _blas_threads(OPENBLAS_NUM_THREADS="2") == [2]


def test_the_engine_children_inherit_it() -> None:
    """The supervised children (engine_host) keep the parent's BLAS setting among their variables."""
    from assistant.engine_host.supervisor import CHILD_ENV_PREFIXES

    assert any("OPENBLAS_NUM_THREADS".startswith(p) for p in CHILD_ENV_PREFIXES)
    assert "OPENBLAS_NUM_THREADS" in os.environ  # set when this process imported the package
