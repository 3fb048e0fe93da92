"""How many CPUs this process may really use (the embedded model's and the ASR's default thread counts), and how many
of them are free right now (a prompt's wider step, ``respond.prompt_threads``).

A container's CPU limit (``docker run --cpus 2``, a Kubernetes ``limits.cpu``) is a cgroup quota, not an affinity
mask: ``sched_getaffinity`` still lists every core of the host. llama.cpp's threads wait for each other at every
layer, so eight threads under a two-CPU quota are throttled every period and a token costs many times what it
should. The quota is read where the kernel shows it: cgroup v2 ``cpu.max`` (``QUOTA PERIOD`` or ``max PERIOD``),
cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none), for this process's cgroup and those above it
(the tightest wins). A memory limit is read the same way (:func:`cgroup_memory_free`): the host's MemAvailable knows
nothing of it, and a model chosen by that is killed by the container's OOM killer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPUINFO = Path("/proc/cpuinfo")
LOADAVG = Path("/proc/loadavg")
SELF_CGROUP = Path("/proc/self/cgroup")
V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
V1_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _up_from(base: Path, relative: str) -> list[Path]:
    """``base/relative`` and each folder above it up to ``base`` (a limit may be set on an ancestor)."""
    here = base / relative.strip("/")
    out = [here]
    while here != base and base in here.parents:
        here = here.parent
        out.append(here)
    return out


def _cgroups(root: Path, self_cgroup: Path, controller: str,
             v1_mounts: tuple[str, ...]) -> Iterator[tuple[bool, Path]]:
    """(v2?, folder) for each cgroup folder whose ``controller`` limit binds this process: its own and those above
    it, cgroup v2's unified tree or v1's ``v1_mounts`` (where the mount may show our cgroup at its root)."""
    for line in _read(self_cgroup).splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, relative = parts
        if controllers == "":
            for folder in _up_from(root, relative):
                yield True, folder
        elif controller in controllers.split(","):
            for mount in v1_mounts:
                for folder in (*_up_from(root / mount, relative), root / mount):
                    yield False, folder


def cgroup_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """CPUs this process's cgroup quota allows (1.5 for ``150000 100000``), or None when there is none."""
    limits: list[float] = []
    for v2, folder in _cgroups(root, self_cgroup, "cpu", V1_CPU_MOUNTS):
        if v2:
            fields = _read(folder / "cpu.max").split()
            if len(fields) == 2 and fields[0] != "max" and fields[0].isdigit() and fields[1].isdigit():
                limits.append(int(fields[0]) / max(1, int(fields[1])))
        else:
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota.isdigit() and period.isdigit() and int(quota) > 0:
                limits.append(int(quota) / max(1, int(period)))
    return min(limits) if limits else None


def cgroup_memory_free(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """Bytes this process's cgroup may still use (its limit less what it uses; the tightest of it and those above
    it), or None when none is limited: v2 ``memory.max`` and ``memory.current`` ("max": none), v1
    ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``."""
    free: list[float] = []
    for v2, folder in _cgroups(root, self_cgroup, "memory", ("memory",)):
        limit, used = (_read(folder / "memory.max"), _read(folder / "memory.current")) if v2 else \
            (_read(folder / "memory.limit_in_bytes"), _read(folder / "memory.usage_in_bytes"))
        if limit.isdigit() and int(limit) < V1_NO_LIMIT:
            free.append(max(0.0, float(int(limit) - (int(used) if used.isdigit() else 0))))
    return min(free) if free else None


def usable_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """The cores this process may run on, and no more than its cgroup's quota allows (rounded up, at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpus(root, self_cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def default_threads() -> int:
    """Half the CPUs this process may use (:func:`usable_cpus`; at most 8): ASR, TTS and the VAD share the machine,
    and llama.cpp's threads wait for each other at every layer, so one descheduled thread stalls the step (on 2
    shared cores, 2 threads made a token 10× slower than 1)."""
    return max(1, min(8, usable_cpus() // 2))


def asr_threads(workers: int) -> int:
    """The ASR's threads per pass (``asr.cpu_threads`` 0): :func:`default_threads` shared by the ``workers`` passes that
    may run at once, at least 1. On 2 cores, 1: there a second CTranslate2 thread made no pass faster (tiny.en 134 ms
    p50 on one thread against 159 on two, the multilingual base 272 against 271, alone on a 2-core Xeon: ``python -m
    lab asr-threads``) and took 1.3-1.4x the CPU from the model and the voice beside it (docs/latency.md, One ASR
    thread a pass)."""
    return max(1, default_threads() // max(1, workers))


def runnable_threads(loadavg: str) -> int | None:
    """The threads runnable on the machine at this instant, the caller included: the numerator of ``/proc/loadavg``'s
    fourth field (``0.23 0.53 0.64 2/107 332`` → 2); None when the text does not say."""
    fields = loadavg.split()
    if len(fields) < 4 or "/" not in fields[3]:
        return None
    running = fields[3].split("/", 1)[0]
    return int(running) if running.isdigit() else None


def free_cpus(usable: int, loadavg: Path = LOADAVG) -> int:
    """Of ``usable`` CPUs, how many no other thread wants at this instant (the caller's own counts as free): ``usable``
    less the other runnable threads, at least 1. A snapshot, machine-wide (in a container that shares its host it sees
    the host's threads, and so says busy: the safe answer); 1 when the kernel does not say."""
    running = runnable_threads(_read(loadavg))
    if running is None:
        return 1
    return max(1, usable - max(0, running - 1))


def cpuinfo_field(name: str, cpuinfo: Path = CPUINFO) -> str:
    """The first value of ``name`` in ``/proc/cpuinfo`` (``model name``, ``vendor_id``; "" where it has none)."""
    for line in _read(cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def cpu_vendor(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's vendor as the kernel names it (``GenuineIntel``, ``AuthenticAMD``; "" where it does not say)."""
    return cpuinfo_field("vendor_id", cpuinfo)
