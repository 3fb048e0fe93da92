"""``assistant`` commands as child processes on this machine: for benchmarks and tests that need real gateways,
a dispatcher or a one-process server beside their own client.

Children get ``ASSISTANT_LOOPBACK_ICE=1``: aioice leaves 127.0.0.1 out of its candidates, and a client in
another process on one machine reaches the peers there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from assistant.rtc.loopback_ice import LOOPBACK_ICE_ENV

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AssistantProcess:
    """One ``python -m assistant ...`` child, its base URL and its log file."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def start_assistant(name: str, command: str, flags: Sequence[str], folder: Path, *,
                    cwd: Path | None = None, env: dict[str, str] | None = None) -> AssistantProcess:
    """``python -m assistant <command> --server.port <free> <flags>``, its output in ``folder/<name>.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / f"{name}.log"
    child_env = {**os.environ, LOOPBACK_ICE_ENV: "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                 **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "assistant", command, "--server.port", str(port), *flags],
                                cwd=cwd, env=child_env, stdout=out, stderr=subprocess.STDOUT)
    return AssistantProcess(name, f"http://127.0.0.1:{port}", proc, log)


def is_ready(url: str) -> bool:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
        return resp.status == 200
    return False


def wait_ready(children: Sequence[AssistantProcess], timeout_s: float = 240.0) -> None:
    """Block until every child's ``/readyz`` answers 200; raise with its log's tail if one exits or is late."""
    deadline = time.monotonic() + timeout_s
    for child in children:
        while not is_ready(child.url):
            if child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{child.name} not ready after {timeout_s:g} s:\n{child.tail()}")
            time.sleep(0.5)


def stop(children: Sequence[AssistantProcess], timeout_s: float = 10.0) -> None:
    """SIGINT (a clean shutdown: sessions closed, engines freed), then kill what is still there."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGINT)
    for child in children:
        try:
            child.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """User + system CPU time these processes have used so far (Linux ``/proc``; None elsewhere)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return total / tick
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class CpuSnapshot:
    """Where the CPU counters stood at one moment: this process's own time and each CPU's idle time."""

    at: float  # time.monotonic()
    own_s: float  # this process's user + system CPU seconds, every thread
    host_idle_s: dict[str, float] | None  # each online CPU's idle + iowait seconds (/proc/stat); None elsewhere
    host_cores: int


def cpu_snapshot() -> CpuSnapshot:
    """The CPU counters now (:func:`cpu_use` turns two into cores)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    idle = _host_idle_s()
    return CpuSnapshot(time.monotonic(), usage.ru_utime + usage.ru_stime, idle,
                       len(idle) if idle else (os.cpu_count() or 1))


# How far below this process's own time the host's reading may fall before it is called wrong, per CPU: /proc/stat
# counts each CPU's idle time in clock ticks (10 ms), read at two moments.
_HOST_SLACK_S_PER_CPU = 0.05


def cpu_use(since: CpuSnapshot, now: CpuSnapshot | None = None) -> tuple[float | None, float | None]:
    """Cores in use on average from ``since`` to ``now`` (default: this moment): this process's (a bench client's own
    share of the machine) and the whole host's busy cores (None where /proc/stat cannot be read, or no time has
    passed). A bench whose server runs on the same machine reads what the client took from the cores the server had.

    The host's busy time is each CPU's wall time less its idle and iowait time, the CPUs online at both moments: the
    kernel keeps idle time exactly (a tickless kernel times each idle stretch), where its busy fields are sampled at
    each clock tick and miss work that wakes and sleeps between ticks (a client pacing 20 ms audio frames does).
    A host reading below this process's own time cannot be true; it is logged and left out, not reported."""
    now = now or cpu_snapshot()
    wall = now.at - since.at
    if wall <= 0:
        return None, None
    own = max(0.0, now.own_s - since.own_s) / wall
    if now.host_idle_s is None or since.host_idle_s is None:
        return own, None
    cpus = now.host_idle_s.keys() & since.host_idle_s.keys()
    busy_s = sum(max(0.0, wall - (now.host_idle_s[c] - since.host_idle_s[c])) for c in cpus)
    if busy_s < own * wall - _HOST_SLACK_S_PER_CPU * len(cpus):
        log.warning("cpu: the host's /proc/stat reads %.2f s busy where this process alone took %.2f s; "
                    "the host's figure is left out", busy_s, own * wall)
        return own, None
    return own, min(float(len(cpus)), busy_s / wall)


def _host_idle_s() -> dict[str, float] | None:
    """Each online CPU's idle + iowait seconds since boot, from /proc/stat's ``cpuN`` lines (None where it cannot be
    read)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        idle: dict[str, float] = {}
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0].startswith("cpu") and fields[0] != "cpu":
                    idle[fields[0]] = (int(fields[4]) + int(fields[5])) / tick  # user nice system IDLE IOWAIT …
        return idle or None
    except (OSError, ValueError, IndexError):
        return None
