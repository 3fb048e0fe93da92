"""``respond.model_path = "auto"``: the best model this machine can run, from a small table.

The machine (:class:`Machine`): the cores this process may use and the memory available, both within a
container's limits (``cpus.py``; the host's counts would choose a 3B model for a ``--cpus 2 --memory 2g``
container on a big host), and a GPU that llama.cpp can offload to (``nvidia-smi`` says its memory; a
llama-cpp-python built without GPU support cannot use one). The
table (:data:`TABLE`), the first row the machine meets, is the README's "for" column: a GPU with 8 GB runs
Llama 3.1 8B, a GPU with 4 GB or 8 cores with 6 GB free run Qwen2.5 3B, 4 cores with 3 GB free run Qwen2.5 1.5B;
anything smaller keeps the bundled SmolLM2-135M. Every choice says why (:attr:`Choice.why`), for the log, the
page and ``/readyz``.

What happens with the choice is the server's business (``server/services.py``): a copy an earlier pull left is
used at once; else the bundled model answers while the chosen one is pulled in the background (``hub.pull``:
size, sha256 and GGUF header checked), loaded and warmed, and swapped in between turns (``swap.py``). Offline, the
bundled model answers, and the page says why. :func:`resolve_auto` is the same choice without any network: the
pulled copy if there is one, else the bundled model (a responder made outside the server: the lab, a child
process).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from assistant.config import RespondConfig
from assistant.cpus import cgroup_memory_free, usable_cpus
from assistant.respond.hub import cached_path, parse_ref

log = logging.getLogger(__name__)

AUTO = "auto"
BUNDLED = "SmolLM2-135M-Instruct (bundled)"
GIB = 2**30
NVIDIA_SMI_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Machine:
    """What the model would run on: cores this process may use, memory available now (GiB), the GPU's memory
    (GiB, 0 for none llama.cpp can use) and what the GPU is."""

    cores: int
    memory_gb: float
    gpu_gb: float = 0.0
    gpu: str = ""

    def __str__(self) -> str:
        gpu = f"a GPU with {self.gpu_gb:.0f} GiB ({self.gpu})" if self.gpu_gb else (self.gpu or "no GPU")
        return f"{self.cores} cores, {self.memory_gb:.1f} GiB free, {gpu}"


@dataclass(frozen=True)
class Row:
    """A row of the table: the least a machine needs for ``model`` (a short name in ``hub.KNOWN``)."""

    model: str
    gpu_gb: float = 0.0
    cores: int = 0
    memory_gb: float = 0.0
    gpu_layers: int = 0
    why: str = ""

    def fits(self, machine: Machine) -> bool:
        return machine.gpu_gb >= self.gpu_gb and machine.cores >= self.cores and machine.memory_gb >= self.memory_gb


TABLE: tuple[Row, ...] = (
    Row("llama3.1-8b", gpu_gb=8, memory_gb=6, gpu_layers=-1, why="a GPU with 8 GiB runs an 8B model on the GPU"),
    Row("qwen2.5-3b", gpu_gb=4, memory_gb=4, gpu_layers=-1, why="a GPU with 4 GiB runs a 3B model on the GPU"),
    Row("qwen2.5-3b", cores=8, memory_gb=6, why="8 cores and 6 GiB free run a 3B model on the CPU"),
    Row("qwen2.5-1.5b", cores=4, memory_gb=3, why="4 cores and 3 GiB free run a 1.5B model on the CPU"),
)


@dataclass(frozen=True)
class Choice:
    """The model for this machine (a short name, or "" for the bundled one), its GPU layers, and why."""

    model: str
    gpu_layers: int
    why: str
    machine: Machine | None = None


def choose(machine: Machine, table: tuple[Row, ...] | None = None) -> Choice:
    """The first row of ``table`` (default: :data:`TABLE`) that ``machine`` meets, or the bundled model."""
    for row in TABLE if table is None else table:
        if row.fits(machine):
            return Choice(row.model, row.gpu_layers, f"{machine}: {row.why}", machine)
    return Choice("", 0, f"{machine}: too small for a bigger model than the bundled one", machine)


def detect() -> Machine:
    """This machine, as :func:`choose` reads it."""
    gpu_gb, gpu = _gpu()
    return Machine(usable_cpus(), _available_memory() / GIB, gpu_gb, gpu)


def _available_memory() -> float:
    """Bytes of memory available now: Linux's MemAvailable (else the total), and no more than a container's limit
    leaves (``cpus.cgroup_memory_free``)."""
    limited = cgroup_memory_free()
    host = _host_memory()
    return host if limited is None else min(host, limited)


def _host_memory() -> float:
    """Bytes of memory available now (Linux's MemAvailable), else the total."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def _gpu() -> tuple[float, str]:
    """(GiB of the largest NVIDIA GPU's memory, its name) when llama.cpp can offload to it; else (0, why not)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0.0, ""
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
        gpus = [(float(mem) / 1024, name.strip()) for name, mem in (line.rsplit(",", 1) for line in out.splitlines()
                                                                      if "," in line)]
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.info("respond.auto gpu_unknown reason=%s", exc)
        return 0.0, ""
    if not gpus:
        return 0.0, ""
    gb, name = max(gpus)
    if not _llama_offloads():
        return 0.0, f"a GPU ({name}) this llama-cpp-python cannot use (built without GPU support)"
    return gb, name


def _llama_offloads() -> bool:
    try:
        from assistant.respond.llama.native import llama_cpp  # the one way in (its safe defaults come with it)
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def pulled(choice: Choice) -> str:
    """The file an earlier pull left for ``choice``, or ""."""
    if not choice.model:
        return ""
    path = cached_path(parse_ref(choice.model))
    return str(path) if path is not None else ""


def resolve_auto(cfg: RespondConfig, machine: Machine | None = None) -> tuple[RespondConfig, Choice]:
    """``cfg`` with ``model_path = "auto"`` made concrete without any network: the chosen model's pulled copy (with
    its GPU layers), else the bundled model (``model_path`` empty); and the choice."""
    choice = choose(machine or detect())
    path = pulled(choice)
    if not path:
        return dataclasses.replace(cfg, model_path=""), choice
    return dataclasses.replace(cfg, model_path=path, gpu_layers=choice.gpu_layers or cfg.gpu_layers), choice


__all__ = ["AUTO", "BUNDLED", "TABLE", "Choice", "Machine", "Row", "choose", "detect", "pulled", "resolve_auto"]
