"""The server as a container runs it: ``assistant serve`` as PID 1 of its own PID namespace (``unshare --pid --fork
--mount-proc``, as ``docker run IMAGE assistant serve`` starts it), answered by the embedded model in its supervised
child process, not by the fallback; stopped by SIGTERM (``docker stop``), which PID 1 only receives when it
handles it.

Real namespaces and real processes: the test needs root (``unshare``), as CI runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest

from assistant.bench.processes import free_port
from assistant.respond.rules import RulesResponder
from tests import needs
from tests.test_realtime_ws import connected

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

QUESTION = "What is the capital of France?"
AUTH = "test-auth-token-0123456789abcdef"


@dataclass
class Contained:
    """A command run as PID 1 of its own PID namespace: ``unshare``'s process, the command's pid out here, its log."""

    unshare: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        """The command's pid in our namespace (``unshare --fork`` made it; it is PID 1 in its own)."""
        children = Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children").read_text().split()
        return int(children[0])

    def namespace_pids(self) -> list[int]:
        """Its pid as each namespace it is in sees it, outermost first (``NSpid`` of /proc/PID/status)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
        return []

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@pytest.fixture
def pid1_server(tmp_path: Path) -> Iterator[tuple[str, Contained]]:
    needs.namespaces()
    port = free_port()
    log = tmp_path / "serve.log"
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "assistant", "serve",
               "--server.port", str(port), "--respond.threads", "1", "--respond.slots", "1",
               "--server.data_dir", str(tmp_path / "data")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Contained(proc, log)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        if proc.poll() is None:
            with suppress(OSError, IndexError, ValueError):
                os.kill(server.pid, signal.SIGKILL)  # PID 1 of the namespace: everything in it goes with it
            proc.kill()
            proc.wait(30)


def readyz(url: str) -> tuple[int, dict[str, object]] | None:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return None


async def settled(url: str, server: Contained) -> dict[str, object]:
    """/readyz once loading is over (ready, degraded or failed); fails with the log if the server exits first."""
    loop = asyncio.get_running_loop()
    for _ in range(1200):
        answer = await loop.run_in_executor(None, readyz, url)
        if answer is not None and answer[1].get("status") not in (None, "loading"):
            return answer[1]
        assert server.unshare.poll() is None, f"the server exited:\n{server.tail()}"
        await asyncio.sleep(0.25)
    raise AssertionError(f"/readyz never settled:\n{server.tail()}")


async def test_the_server_as_pid_1_is_answered_by_its_embedded_model(pid1_server: tuple[str, Contained]) -> None:
    url, server = pid1_server
    ready = await settled(url, server)
    assert server.namespace_pids()[-1] == 1  # the server is its namespace's init, as a container's command is
    engines = ready.get("engines", {})
    assert ready["status"] == "ready", (ready, server.tail())
    assert isinstance(engines, dict) and engines["llm"]["state"] == "ready" and engines["llm"]["restarts"] == 0

    async with connected(url, model="llama") as (conn, events):
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]})
        await conn.response.create()
        done = await events.wait("response.done", timeout=180)
        assert done["response"]["status"] == "completed", done
        said = events.of("response.output_audio_transcript.done")[0]["transcript"]
    fallback = "".join([d async for d in RulesResponder().respond(QUESTION, [])])
    assert said.strip() and said != fallback  # the model's words, not the rules table's

    os.kill(server.pid, signal.SIGTERM)  # docker stop: PID 1 gets it only because the server handles it
    assert server.unshare.wait(60) == 0, server.tail()
    assert "engine.died" not in server.tail(200_000)


def test_an_engine_child_ends_when_its_parent_is_not_the_one_that_started_it() -> None:
    """The child compares its parent with the pid the server gave it, not with 1: reparented (its server gone, to
    init or to a subreaper) it ends at once; under its own server, PID 1 or not, it waits for the hello."""
    import socket

    for parent, expected in ((os.getpid() + 1_000_000, 1), (os.getpid(), 2)):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            child = subprocess.Popen([sys.executable, "-m", "assistant.engine_host.child", str(theirs.fileno()),
                                      str(parent)], pass_fds=(theirs.fileno(),))
            theirs.close()
            if expected == 2:
                ours.close()  # no hello: the parent went away before saying what to host
            assert child.wait(60) == expected


@pytest.fixture
def read_only_data_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``assistant serve`` (the echo responder, Twilio calls on) whose ``server.data_dir`` is a read-only mount (as a
    container with a read-only root or volume has it: root cannot write there either), in its own mount namespace;
    its base URL and log."""
    needs.namespaces()
    data = tmp_path / "data"
    data.mkdir()
    port = free_port()
    log = tmp_path / "serve.log"
    serve = [sys.executable, "-m", "assistant", "serve", "--server.port", str(port), "--server.data_dir", str(data),
             "--respond.engine", "echo", "--telephony.twilio_auth_token", AUTH]
    with log.open("wb") as out:
        proc = subprocess.Popen(needs.read_only(data, *serve), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_read_only_data_dir_fails_no_call_and_says_why_voices_cannot_be_kept(
        read_only_data_server: tuple[str, Path]) -> None:
    """The answered-calls file cannot be written: the call is answered all the same (its replay still refused, from
    the gateway's own memory), and the log says once why the shared record is not used; no 500, no failed call. A
    voice cannot be stored there either: the answer says so and names the setting (507), not a 500."""
    import aiohttp

    from assistant.bench.telephony_client import TWILIO, dial, read_answer, signed_headers, webhook_form
    from tests.test_tts_api import tone_wav

    url, log = read_only_data_server
    loop = asyncio.get_running_loop()
    for _ in range(1200):
        answer = await loop.run_in_executor(None, readyz, url)
        if answer is not None and answer[1].get("status") == "ready":
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(log.read_text(errors="replace")[-3000:])
    _, call_id = TWILIO.new_ids()
    async with aiohttp.ClientSession() as http:
        first = await dial(http, url, TWILIO, call_id=call_id, auth_token=AUTH)
        # The same call again, signed anew (another signature: not the replay guard's, the call id's refusal).
        hook = f"{url}/telephony/twilio/voice"
        form = [*webhook_form(TWILIO, call_id), ("CallStatus", "in-progress")]
        body = urlencode(form).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   **signed_headers(TWILIO, hook, form, body, auth_token=AUTH)}
        async with http.post(hook, data=body, headers=headers) as resp:
            again = read_answer(resp.status, await resp.text())
        other = await dial(http, url, TWILIO, call_id=TWILIO.new_ids()[1], auth_token=AUTH)
        form = aiohttp.FormData()
        form.add_field("clip", tone_wav(3.0), filename="me.wav", content_type="audio/wav")
        form.add_field("transcript", "a tone")
        async with http.post(f"{url}/api/voices", data=form) as resp:
            voice = (resp.status, await resp.json())
    text = log.read_text(errors="replace")
    assert first.status == 200 and first.stream_url, (first, text[-3000:])
    assert again.status == 403 and "replayed" in again.body
    assert other.status == 200 and other.stream_url
    assert text.count("telephony.answered_store_down") == 1 and "Read-only file system" in text
    assert voice[0] == 507 and voice[1]["error"] == "voice_storage" and "server.data_dir" in voice[1]["detail"]
