"""The embedded model's default threads follow the CPUs this process may really use: its affinity (real, through
``taskset``) and a container's CPU quota, read from the cgroup files as the kernel writes them (v2 ``cpu.max``, v1
``cpu.cfs_quota_us``), set on the process's own cgroup or one above it. On a 64-core host under ``--cpus 2``, the
affinity alone gave 8 threads for 2 CPUs of quota."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assistant import cpus
from assistant.cpus import (
    LOADAVG,
    asr_threads,
    cgroup_cpus,
    cgroup_memory_free,
    cpu_vendor,
    free_cpus,
    runnable_threads,
    usable_cpus,
)
from tests import needs


def tree(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "sys-fs-cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    (tmp_path / "cgroup").write_text(self_cgroup)
    return root, tmp_path / "cgroup"


@pytest.mark.parametrize(("self_cgroup", "files", "cpus"), [
    # cgroup v2 in a container (its own namespace: the cgroup is "/")
    ("0::/\n", {"cpu.max": "200000 100000"}, 2.0),
    ("0::/\n", {"cpu.max": "max 100000"}, None),
    # v2, the limit on the pod, the process in a container's cgroup below it (Kubernetes)
    ("0::/kubepods/pod7/c1\n", {"kubepods/pod7/cpu.max": "150000 100000", "kubepods/pod7/c1/cpu.max": "max 100000"},
     1.5),
    # v1 (Docker without a cgroup namespace: the host's path, the mount showing the container's own cgroup)
    ("12:pids:/docker/ab\n4:cpu,cpuacct:/docker/ab\n1:name=systemd:/docker/ab\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.5),
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
    ("", {}, None),  # no cgroup file at all (another OS, a sandbox)
])
def test_the_quota_is_read_as_the_kernel_writes_it(tmp_path: Path, self_cgroup: str, files: dict[str, str],
                                                   cpus: float | None) -> None:
    root, me = tree(tmp_path, self_cgroup, files)
    assert cgroup_cpus(root, me) == cpus


GIB = 1 << 30


@pytest.mark.parametrize(("self_cgroup", "files", "free"), [
    ("0::/\n", {"memory.max": str(4 * GIB), "memory.current": str(GIB)}, 3 * GIB),
    ("0::/\n", {"memory.max": "max", "memory.current": str(GIB)}, None),
    # v2, the pod's limit tighter than the container's
    ("0::/kubepods/pod7/c1\n", {"kubepods/pod7/memory.max": str(2 * GIB), "kubepods/pod7/memory.current": str(GIB),
                                 "kubepods/pod7/c1/memory.max": str(8 * GIB),
                                 "kubepods/pod7/c1/memory.current": str(GIB)}, GIB),
    # v1 (Docker's --memory 2g), and v1 with no limit (2^63 - 1 rounded to a page)
    ("9:memory:/docker/ab\n", {"memory/memory.limit_in_bytes": str(2 * GIB),
                                "memory/memory.usage_in_bytes": str(GIB // 2)}, 1.5 * GIB),
    ("9:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712",
                       "memory/memory.usage_in_bytes": "1000"}, None),
    ("0::/\n", {"memory.max": str(GIB), "memory.current": str(2 * GIB)}, 0.0),  # over it: nothing left, not less
    ("", {}, None),
])
def test_a_containers_memory_limit_is_read_as_the_kernel_writes_it(tmp_path: Path, self_cgroup: str,
                                                                     files: dict[str, str], free: float | None) -> None:
    root, me = tree(tmp_path, self_cgroup, files)
    assert cgroup_memory_free(root, me) == free


def test_a_quota_bounds_the_cores_and_rounds_up(tmp_path: Path) -> None:
    root, me = tree(tmp_path, "0::/\n", {"cpu.max": "50000 100000"})
    assert usable_cpus(root, me) == 1  # half a CPU: one thread, not none
    root, me = tree(tmp_path / "wide", "0::/\n", {"cpu.max": "10000000 100000"})
    assert usable_cpus(root, me) == usable_cpus(tmp_path / "none", tmp_path / "none")  # 100 CPUs: the cores bound it


def test_the_default_follows_a_real_affinity_mask() -> None:
    if shutil.which("taskset") is None:
        needs.missing("taskset (util-linux) is not installed")
    code = ("from assistant.cpus import asr_threads, default_threads, usable_cpus\n"
            "print(usable_cpus(), default_threads(), asr_threads(2))")
    run = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert run.stdout.split() == ["1", "1", "1"]


@pytest.mark.parametrize(("usable", "workers", "threads"), [
    (2, 2, 1),  # the small machine: one thread a pass, two passes at once
    (2, 1, 1),
    (8, 2, 2),  # half the cores (4), shared by the two passes
    (16, 2, 4),
    (64, 2, 4),  # half the cores at most 8, as the model's
    (16, 0, 8),  # asr.workers 0 runs one pass at a time
])
def test_the_asr_threads_are_a_share_of_the_cpus(monkeypatch: pytest.MonkeyPatch, usable: int, workers: int,
                                                 threads: int) -> None:
    monkeypatch.setattr(cpus, "usable_cpus", lambda: usable)
    assert asr_threads(workers) == threads


@pytest.mark.parametrize(("text", "running"), [
    ("0.23 0.53 0.64 2/107 332\n", 2),
    ("0.00 0.01 0.05 1/80 9", 1),
    ("0.23 0.53 0.64 x/107 332", None),
    ("0.23 0.53", None),
    ("", None),
])
def test_the_runnable_threads_are_loadavgs_fourth_field(text: str, running: int | None) -> None:
    assert runnable_threads(text) == running


def test_the_free_cpus_are_the_usable_ones_the_other_runnable_threads_leave(tmp_path: Path) -> None:
    """What respond.prompt_threads asks before a prompt's step: the caller's own thread counts as free, each other
    runnable thread takes a CPU, at least one is left; a kernel that does not say gives 1 (no wider step)."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.23 0.53 0.64 1/106 3\n")  # the caller alone
    assert free_cpus(2, loadavg) == 2
    loadavg.write_text("0.23 0.53 0.64 2/106 3\n")  # one more thread wants a core
    assert (free_cpus(2, loadavg), free_cpus(4, loadavg)) == (1, 3)
    loadavg.write_text("9.0 9.0 9.0 12/300 3\n")
    assert free_cpus(2, loadavg) == 1
    assert free_cpus(2, tmp_path / "missing") == 1
    if LOADAVG.exists():  # the machine's own: a count between 1 and the CPUs
        assert 1 <= free_cpus(usable_cpus()) <= usable_cpus()


def test_the_cpu_vendor_is_read_as_the_kernel_writes_it(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\nprocessor\t: 1\n"
                    "vendor_id\t: AuthenticAMD\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")  # an ARM kernel names no vendor_id
    assert cpu_vendor(info) == ""
    assert cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.parametrize(("vendor", "value", "warned"), [
    ("AuthenticAMD", "1", True), ("AuthenticAMD", "true", True), ("AuthenticAMD", "0", False),
    ("AuthenticAMD", "on", False), ("AuthenticAMD", "True", False),  # CTranslate2 reads these as no
    ("AuthenticAMD", "", False), ("GenuineIntel", "1", False), ("", "1", False),
])
def test_intel_mkl_forced_on_another_vendors_cpu_is_told(vendor: str, value: str, warned: bool) -> None:
    """CTranslate2 on an AMD EPYC with CT2_USE_MKL=1 took ~10x its default's time a pass (asr/whisper.py)."""
    from assistant.asr.whisper import forced_mkl

    environ = {"CT2_USE_MKL": value} if value else {}
    assert forced_mkl(vendor, environ) is warned
