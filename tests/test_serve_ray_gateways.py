"""Two gateway processes sharing TTS and ASR through Ray Serve, on a local Ray cluster (one per module).

Real components throughout: the cluster (started here), the engine applications (two Piper TTS replicas, one
faster-whisper ASR replica), two ``assistant serve`` processes with ``tts.backend = asr.backend = "ray"``, the
dispatcher in front of them, and browser-like aiortc peers that talk only to the dispatcher. A TTS replica is
killed in the middle of a reply: that turn gets one ``error`` event, the next turn works, and the other
session notices nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import ray  # the .[ray] extra is part of the test extras: never skipped

from assistant.bench.audio_source import load_utterance
from assistant.bench.processes import AssistantProcess, start_assistant, stop, wait_ready
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.config import load_config
from assistant.telemetry import names
from tests.otlp_receiver import ReceivedSpan, Receiver, threaded_otlp_receiver
from tests.waiting import until, until_async

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parents[1]
APP = "gw"
SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1500, settle_ms=300)


def telemetry(receiver: Receiver) -> dict[str, object]:
    """Every process of the stack sends its spans to the test's receiver (quickly, so the test waits little)."""
    return {"otlp_endpoint": receiver.url, "schedule_delay_ms": 100, "metrics": False}


def cluster_config(receiver: Receiver) -> object:
    return load_config(environ={}, overrides={
        "tts": {"backend": "ray"}, "asr": {"backend": "ray"},
        "ray": {"app_name": APP, "tts_replicas": 2, "tts_num_cpus": 0.5, "asr_num_cpus": 0.5},
        "telemetry": telemetry(receiver),
    })


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with threaded_otlp_receiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def cluster(ray_cluster: str, receiver: Receiver) -> Iterator[str]:
    """Both engine applications on the run's Ray cluster; yields the address gateways join."""
    from ray import serve

    from assistant.serve_ray.app import deploy

    try:
        assert sorted(deploy(cluster_config(receiver))) == [f"{APP}-asr", f"{APP}-tts"]
        yield ray_cluster
    finally:
        for app in (f"{APP}-asr", f"{APP}-tts"):
            serve.delete(app)


@pytest.fixture(scope="module")
def stack(cluster: str, receiver: Receiver,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[AssistantProcess]]]:
    """Two gateway processes using the cluster's engines (they only connect: ray.deploy off), and the dispatcher
    in front of them, all with telemetry on; (the dispatcher's URL, the gateways)."""
    folder = tmp_path_factory.mktemp("gateways")
    children: list[AssistantProcess] = []
    traced = [f"--telemetry.{key}={str(value).lower()}" for key, value in telemetry(receiver).items()]
    try:
        for gid in ("gA", "gB"):
            children.append(start_assistant(gid, "serve", [
                "--server.gateway_id", gid, "--server.data_dir", str(folder / gid), "--server.idle_timeout_s", "60",
                "--tts.backend", "ray", "--asr.backend", "ray", "--ray.address", cluster, "--ray.app_name", APP,
                "--ray.deploy", "false", "--respond.engine", "tests.long_responder:LongReply", *traced],
                folder, cwd=REPO))
        wait_ready(children)
        front = start_assistant("dispatch", "dispatch", [
            "--dispatch.gateways", ",".join(c.url for c in children), "--dispatch.poll_interval_s", "0.5", *traced],
            folder, cwd=REPO)
        wait_ready([front])
        gateways = list(children)
        children.append(front)
        yield front.url, gateways
    finally:
        stop(children)


def tts_handle() -> object:
    from ray import serve

    return serve.get_deployment_handle("TTS", f"{APP}-tts")


async def kill_a_replica_mid_reply(client: BenchSession, start: int, timeout_s: float = 30.0) -> str:
    """Once the client's reply has started (not a speculative one that may yet be dropped), kill the TTS
    replica that is synthesising it; its replica id.

    Serve's router sends a call to the less loaded of two replicas, so a lone ``stats`` call lands on the idle
    replica whenever the router knows the other is busy (a run of single calls can miss a whole reply). Each
    round asks four at once: the router's count of its own calls in flight sends some to the busy replica (one
    traced run: round 1 all on the idle replica, round 2 one of three on the busy one)."""
    handle = tts_handle()
    await until(lambda: [e for e in client.events[start:] if e.body.get("type") == "reply_audio_start"],
                "the reply to start", timeout_s)
    deadline = time.monotonic() + timeout_s
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        for stats in await asyncio.gather(*(handle.stats.remote() for _ in range(4))):
            seen[stats["replica"]] = seen.get(stats["replica"], 0) + 1
            if stats["active"] > 0:
                ray.kill(ray.get_actor(stats["actor"], namespace="serve"), no_restart=True)
                return stats["replica"]
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no TTS replica was synthesising (answers per replica: {seen})")


def errors(client: BenchSession, start: int = 0) -> list[dict]:
    return [e.body for e in client.events[start:] if e.body.get("type") == "error"]


async def gateway_sessions(http: aiohttp.ClientSession, gateway: AssistantProcess) -> set[str]:
    async with http.get(f"{gateway.url}/api/sessions") as resp:
        return {s["session_id"] for s in (await resp.json())["sessions"]}


async def test_sessions_on_two_gateways_and_a_replica_killed_mid_turn(stack, shared_audio) -> None:
    front, (ga, gb) = stack
    weather = load_utterance(shared_audio / "en_weather.wav")
    timer = load_utterance(shared_audio / "en_timer.wav")
    async with aiohttp.ClientSession() as http:
        # Two browser-like peers through the dispatcher land on different gateways (the least-loaded first).
        a = BenchSession(index=0, url=front, http=http)
        await a.connect()
        opened = time.time()

        async def dispatcher_saw_a() -> bool:  # a heartbeat asked after a's session opened, so the table holds it
            async with http.get(f"{front}/readyz") as r:
                rows = (await r.json())["gateways"]
            return any(g["gateway"] == a.session_id.split(".")[0] and g["sessions"] >= 1
                       and (g["polled_at"] or 0) > opened for g in rows)

        await until_async(dispatcher_saw_a, "the dispatcher's heartbeat to see a's session")
        b = BenchSession(index=1, url=front, http=http)
        await b.connect()
        try:
            assert {a.session_id.split(".")[0], b.session_id.split(".")[0]} == {"gA", "gB"}
            if a.session_id.startswith("gB."):
                ga, gb = gb, ga  # a's gateway is "ga" below
            # Both sessions: transcript from the ASR replica, an audible reply from the TTS replicas.
            first = await asyncio.gather(a.run_turn(weather, 0, SETTINGS), b.run_turn(timer, 0, SETTINGS))
            for result in first:
                assert result.status == "ok", result.reason
                assert result.columns["v2v_ms"] > 0
            assert "weather" in first[0].transcript.lower() and "timer" in first[1].transcript.lower()

            # A's next turn: its TTS replica dies while the reply is being made.
            start = len(a.events)
            turn = asyncio.create_task(a.run_turn(timer, 1, SETTINGS))
            killed = await kill_a_replica_mid_reply(a, start)
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

            # DELETE through the dispatcher reaches the gateway that owns the session, and only that one.
            async with http.delete(f"{front}/api/sessions/{a.session_id}") as resp:
                assert resp.status == 200, await resp.text()
            assert a.session_id not in await gateway_sessions(http, ga)
            assert b.session_id in await gateway_sessions(http, gb)
        finally:
            await a.close()
            await b.close()


CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class TracedSession(BenchSession):
    """A page client that sends a W3C traceparent with its offer (as an instrumented app would)."""

    def _headers(self) -> dict[str, str]:
        return {**super()._headers(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}


async def test_one_trace_crosses_the_dispatcher_the_gateway_and_the_replicas(stack, receiver, shared_audio) -> None:
    """A client's traceparent, through the dispatcher, a gateway and the ASR and TTS replicas: every process adds
    its spans to the client's trace, each under the span of the process that sent it the work."""
    front, _ = stack
    weather = load_utterance(shared_audio / "en_weather.wav")
    async with aiohttp.ClientSession() as http:
        client = TracedSession(index=0, url=front, http=http)
        await client.connect()
        try:
            result = await client.run_turn(weather, 0, SETTINGS)
            assert result.status == "ok", result.reason
        finally:
            await client.close()
    session = client.session_id

    def mine() -> list[ReceivedSpan]:
        return [s for s in receiver.spans if s.trace_id == CLIENT_TRACE]

    def complete() -> bool:
        got = {s.name for s in mine()}
        return {names.DISPATCH, names.CALL, names.TURN, names.REPLICA_ASR, names.REPLICA_TTS} <= got

    await until(complete, "the spans of the dispatcher, the gateway and both replicas", 30)
    spans = mine()
    dispatch = next(s for s in spans if s.name == names.DISPATCH)
    call = next(s for s in spans if s.name == names.CALL and s.attributes.get(names.SESSION_ID) == session)
    assert dispatch.parent_id == CLIENT_SPAN and call.parent_id == dispatch.span_id
    assert dispatch.attributes[names.DISPATCH_GATEWAY] == session.split(".")[0]
    replicas = [s for s in spans if s.name in (names.REPLICA_ASR, names.REPLICA_TTS)]
    assert {s.parent_id for s in replicas} == {call.span_id}  # hung under the call: its context at request time
    services = {s.resource["service.name"] for s in spans}
    assert {"assistant-dispatch", "assistant", "assistant-asr", "assistant-tts"} <= services
    asr = [s for s in replicas if s.name == names.REPLICA_ASR]
    assert all(s.attributes[names.RAY_DEPLOYMENT] == "ASR" and s.attributes[names.AUDIO_S] > 0 for s in asr)
    tts = [s for s in replicas if s.name == names.REPLICA_TTS]
    assert all(s.attributes[names.TTS_CHARS] > 0 for s in tts) and any(s.attributes[names.TTS_CHUNKS] for s in tts)
    # The replicas' work sits inside the call's time, on this machine's one clock.
    assert all(call.start_ns <= s.start_ns <= s.end_ns <= call.end_ns for s in replicas)
