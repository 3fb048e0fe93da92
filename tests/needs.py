"""What a test needs from outside the code: the shared data, the packages the test extra declares, Chromium, coturn,
the right to make namespaces (a container's PID 1, a read-only mount), SIPp and baresip.

Under CI (``CI`` set and not ``false``/``0``; ``.ci/run`` sets it) a missing one fails the test that needs it, with
a message naming it: a green run means the tests ran. Elsewhere it skips with the same message, so a developer
without Chromium still runs the rest. Nothing else turns into a skip: an exception while importing or loading
our own code is a failure everywhere.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from assistant.bench.shared_data import ENV as SHARED_ENV
from assistant.bench.shared_data import shared_candidates, shared_dir

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str) -> NoReturn:
    """``what`` is not there: a failure under CI, a skip elsewhere."""
    if in_ci():
        pytest.fail(f"{what} (CI: a missing prerequisite fails the run)", pytrace=False)
    pytest.skip(what, allow_module_level=True)


def shared_missing_message(relative: str = "") -> str:
    looked = ", ".join(str(p) for p in shared_candidates())
    how = (f"${SHARED_ENV} names that place: fix it or unset it" if os.environ.get(SHARED_ENV)
           else f"put the shared data at ../shared beside the repository, or name its place in ${SHARED_ENV}")
    return f"the shared test data (../shared) is missing: no {relative or 'folder'} in {looked} ({how})"


def shared(relative: str = "") -> Path:
    """``relative`` inside the shared data folder (``bench/shared_data.py``: ``$ASSISTANT_SHARED``, else
    ``shared/`` in the tree, else ``../shared``)."""
    found = shared_dir(relative)
    if found is None:
        missing(shared_missing_message(relative))
    return found / relative


def module(name: str) -> ModuleType:
    """A package the ``test`` extra declares (pyproject.toml): imported, or missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise  # the package is there but something it imports is not: a real failure
        missing(f"{name} is not installed (the test extra declares it: pip install -e '.[test]')")


def chromium() -> str:
    """Debian's chromium for the browser tests (scripts/test.sh installs it)."""
    if not Path(CHROMIUM).exists():
        missing(f"Debian chromium not found at {CHROMIUM} (scripts/test.sh installs it: apt-get install chromium)")
    return CHROMIUM


def namespaces() -> None:
    """``unshare`` (util-linux) and the right to make PID and mount namespaces (root, as CI runs)."""
    if shutil.which("unshare") is None:
        missing("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "true"], capture_output=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        missing(f"cannot make PID and mount namespaces here (root needed): {probe.stderr.decode(errors='replace')}")


# Runs a command with its first argument, a folder, mounted read-only over itself (``bash -c READ_ONLY NAME DIR
# COMMAND...`` inside ``unshare --mount``): as a read-only image or volume has it, where root cannot write either.
READ_ONLY = 'mount --bind -o ro "$1" "$1" && exec "${@:2}"'


def read_only(folder: Path, *command: str) -> list[str]:
    """``command`` run with ``folder`` read-only, in a mount namespace of its own (see :data:`READ_ONLY`)."""
    return ["unshare", "--mount", "bash", "-c", READ_ONLY, "read-only", str(folder), *command]


def program(name: str, package: str) -> str:
    """A Debian program a test drives (SIPp's ``sipp`` from ``sip-tester``, ``baresip``): its path, or missing.
    scripts/test.sh installs them."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} not found (scripts/test.sh installs it: apt-get install {package})")
    return path
