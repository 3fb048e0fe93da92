"""A throw-away coturn (Debian's ``turnserver``) on loopback with TURN REST auth, for the tests and the
connect-time benchmark: a real TURN server, nothing listening beyond 127.0.0.1."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TURNSERVER = shutil.which("turnserver") or "/usr/bin/turnserver"


@dataclass
class TurnServer:
    """A running coturn: its TURN URL and the TURN REST shared secret (``static-auth-secret``)."""

    url: str
    secret: str
    port: int


def free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (coturn listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no port free for both TCP and UDP on 127.0.0.1")


@contextlib.contextmanager
def run_turnserver(work_dir: Path | None = None, start_timeout_s: float = 10.0) -> Iterator[TurnServer]:
    """Start coturn on a free loopback port (``use-auth-secret``), yield it, stop it."""
    if not Path(TURNSERVER).exists():
        raise FileNotFoundError("coturn is not installed (apt-get install coturn)")
    with contextlib.ExitStack() as stack:
        work = work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="coturn-")))
        port, secret = free_port(), secrets.token_urlsafe(16)
        args = [
            TURNSERVER, "-n", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", f"--listening-port={port}",
            "--use-auth-secret", f"--static-auth-secret={secret}", "--realm=assistant.test", "--no-tls",
            "--no-dtls", "--allow-loopback-peers", "--no-cli", "--fingerprint", "--log-file=stdout", "--simple-log",
            f"--pidfile={work / 'turnserver.pid'}", f"--userdb={work / 'turndb'}",
        ]  # fmt: skip
        log_path = work / "turnserver.log"
        log = stack.enter_context(log_path.open("wb"))
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:  # ready once its TCP listener accepts
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"turnserver did not start: {log_path.read_text(errors='replace')[-2000:]}")
                time.sleep(0.05)
            yield TurnServer(f"turn:127.0.0.1:{port}?transport=udp", secret, port)
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
