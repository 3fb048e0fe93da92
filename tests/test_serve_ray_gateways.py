"""Two gateway processes sharing TTS and ASR through Ray Serve, on a local Ray cluster (one per module).

Real components throughout: the cluster (started here), the engine applications (two Piper TTS replicas, one
faster-whisper ASR replica), two ``assistant serve`` processes with ``tts.backend = asr.backend = "ray"``,
and browser-like aiortc peers. A TTS replica is killed in the middle of a turn: that turn gets one ``error``
event, the next turn works, and the other session notices nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import ray  # the .[ray] extra is part of the test extras: never skipped

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parents[1]
APP = "gw"
SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1500, settle_ms=300)
# A gateway process as `assistant serve`, with loopback ICE (aioice leaves 127.0.0.1 out; one machine here).
GATEWAY = ("import sys; from assistant.bench.v2v import allow_loopback_ice; allow_loopback_ice(); "
           "from assistant.cli import main; sys.exit(main(sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_config() -> object:
    return load_config(environ={}, overrides={
        "tts": {"backend": "ray"}, "asr": {"backend": "ray"},
        "ray": {"app_name": APP, "tts_replicas": 2, "tts_num_cpus": 0.5, "asr_num_cpus": 0.5},
    })


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout_s:g} s")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster with both engine applications; yields the address gateways join."""
    from ray import serve

    from assistant.serve_ray.app import deploy

    ray.init(num_cpus=6, include_dashboard=False, namespace="assistant", log_to_driver=False)
    try:
        assert sorted(deploy(cluster_config())) == [f"{APP}-asr", f"{APP}-tts"]
        yield ray.get_runtime_context().gcs_address
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def gateways(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two gateway processes using the cluster's engines (they only connect: ray.deploy off)."""
    procs, urls = [], []
    logs = tmp_path_factory.mktemp("gateways")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    try:
        for name in ("gA", "gB"):
            port = free_port()
            log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", GATEWAY, "serve", "--server.port", str(port),
                 "--server.data_dir", str(logs / name), "--server.idle_timeout_s", "60",
                 "--tts.backend", "ray", "--asr.backend", "ray", "--ray.address", cluster,
                 "--ray.app_name", APP, "--ray.deploy", "false",
                 "--respond.engine", "tests.long_responder:LongReply"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_ready(url, proc)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def tts_handle() -> object:
    from ray import serve

    return serve.get_deployment_handle("TTS", f"{APP}-tts")


async def kill_a_replica_mid_synthesis(timeout_s: float = 30.0) -> str:
    """Wait until a TTS replica is synthesising, then kill its actor; its replica id."""
    handle = tts_handle()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = await handle.stats.remote()
        if stats["active"] > 0:
            ray.kill(ray.get_actor(stats["actor"], namespace="serve"), no_restart=True)
            return stats["replica"]
        await asyncio.sleep(0.01)
    raise TimeoutError("no TTS replica was synthesising")


def errors(client: BenchSession, start: int = 0) -> list[dict]:
    return [e.body for e in client.events[start:] if e.body.get("type") == "error"]


async def test_sessions_on_two_gateways_and_a_replica_killed_mid_turn(gateways: list[str], shared_audio) -> None:
    weather = load_utterance(shared_audio / "en_weather.wav")
    timer = load_utterance(shared_audio / "en_timer.wav")
    async with aiohttp.ClientSession() as http:
        a = BenchSession(index=0, url=gateways[0], http=http)
        b = BenchSession(index=1, url=gateways[1], http=http)
        await a.connect()
        await b.connect()
        try:
            # Both sessions: transcript from the ASR replica, an audible reply from the TTS replicas.
            first = await asyncio.gather(a.run_turn(weather, 0, SETTINGS), b.run_turn(timer, 0, SETTINGS))
            for result in first:
                assert result.status == "ok", result.reason
                assert result.columns["v2v_ms"] > 0
            assert "weather" in first[0].transcript.lower() and "timer" in first[1].transcript.lower()

            # A's next turn: its TTS replica dies while the reply is being made.
            start = len(a.events)
            turn = asyncio.create_task(a.run_turn(timer, 1, SETTINGS))
            killed = await kill_a_replica_mid_synthesis()
            await turn
            failed = errors(a, start)
            assert len(failed) == 1 and failed[0]["stage"] == "tts", (killed, failed)

            # The next turn works (Serve sends it to the surviving replica), on both sessions.
            again = await asyncio.gather(a.run_turn(weather, 2, SETTINGS), b.run_turn(weather, 1, SETTINGS))
            for result in again:
                assert result.status == "ok", result.reason
                assert "weather" in result.transcript.lower() and result.columns["v2v_ms"] > 0
            assert len(errors(a)) == 1
            assert errors(b) == []  # the other session noticed nothing
            assert not a.failed and not b.failed
        finally:
            await a.close()
            await b.close()
