"""``assistant`` commands as child processes on this machine: for benchmarks and tests that need real gateways,
a dispatcher or a one-process server beside their own client.

Children get ``ASSISTANT_LOOPBACK_ICE=1``: aioice leaves 127.0.0.1 out of its candidates, and a client in
another process on one machine reaches the peers there.
"""

from __future__ import annotations

import contextlib
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
    """Where the CPU counters stood at one moment: this process's own time and the whole host's busy time."""

    at: float  # time.monotonic()
    own_s: float  # this process's user + system CPU seconds, every thread
    host_busy_s: float | None  # every CPU's non-idle seconds since boot (Linux /proc/stat); None elsewhere
    host_cores: int


def cpu_snapshot() -> CpuSnapshot:
    """The CPU counters now (:func:`cpu_use` turns two into cores)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CpuSnapshot(time.monotonic(), usage.ru_utime + usage.ru_stime, _host_busy_s(), os.cpu_count() or 1)


def cpu_use(since: CpuSnapshot) -> tuple[float | None, float | None]:
    """Cores in use on average since ``since``: this process's (a bench client's own share of the machine) and the
    whole host's busy cores (None where /proc/stat cannot be read, or no time has passed). A bench whose server runs
    on the same machine reads what the client took from the cores the server had."""
    now = cpu_snapshot()
    wall = now.at - since.at
    if wall <= 0:
        return None, None
    own = max(0.0, now.own_s - since.own_s) / wall
    if now.host_busy_s is None or since.host_busy_s is None:
        return own, None
    return own, min(float(now.host_cores), max(0.0, now.host_busy_s - since.host_busy_s) / wall)


def _host_busy_s() -> float | None:
    """Seconds every CPU has spent busy since boot: /proc/stat's first line less idle and iowait (guest time is
    already in user)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
