"""The engines as Ray Serve deployments, on a local Ray cluster (one per module): two Piper TTS replicas.

Real components throughout: Ray, Serve, Piper on each replica, the gateway's speech path and TTS API.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from assistant.audio import float_to_s16
from assistant.config import load_config
from assistant.pipeline.synthesis import SynthesisPath
from assistant.tts.base import TTSBusy, TTSRequest

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

LONG_TEXT = " ".join(f"This is sentence number {i} of a long reply that nobody hears to the end." for i in range(24))


def ray_config(**ray_keys: object) -> object:
    return load_config(environ={}, overrides={
        # one slot and no waiting room per replica: two requests fill the deployment, a third waits at the
        # caller (max_queued 1), a fourth is refused
        "tts": {"deterministic": True, "backend": "ray", "max_concurrent": 1, "max_waiting": 0},
        "respond": {"engine": "echo"},
        "ray": {"tts_replicas": 2, "tts_num_cpus": 0.5, "max_queued": 1, "app_name": "test", **ray_keys},
    })


@pytest.fixture(scope="module")
def cluster(ray_cluster: str) -> object:
    """The TTS application (two Piper replicas) on the run's Ray cluster."""
    from ray import serve

    from assistant.serve_ray.app import deploy

    cfg = ray_config()
    try:
        assert deploy(cfg, asr=False) == ["test-tts"]
        yield cfg
    finally:
        serve.delete("test-tts")


@pytest.fixture(scope="module")
def remote(cluster: object) -> object:
    from assistant.serve_ray.client import connect_tts

    hops: list[tuple[str, float]] = []
    engine = connect_tts(cluster, lambda kind, s: hops.append((kind, s)))
    engine.hops = hops  # type: ignore[attr-defined]
    return engine


@pytest.fixture(scope="module")
def local_piper(cluster: object) -> object:
    from assistant.tts.piper_engine import PiperEngine

    return PiperEngine(cluster.tts)  # type: ignore[attr-defined]


async def collect(chunks: object) -> np.ndarray:
    return np.concatenate([np.asarray(c, dtype=np.float32) async for c in chunks])  # type: ignore[attr-defined]


async def replica_stats(remote: object, want: int = 2) -> dict[str, dict]:
    """Each replica's stats (calls land at random: ask until every replica has answered)."""
    seen: dict[str, dict] = {}
    for _ in range(60):
        s = await remote.stats()  # type: ignore[attr-defined]
        seen[s["replica"]] = s
        if len(seen) >= want:
            break
    return seen


async def test_pcm_through_serve_is_byte_identical(remote: object, local_piper: object) -> None:
    request = TTSRequest(text="Hello there. The weather is fine today, and the train leaves at nine.")
    here = await collect(local_piper.synthesize(request))  # type: ignore[attr-defined]
    there = await collect(remote.synthesize(request))  # type: ignore[attr-defined]
    assert here.size > 10_000
    assert there.tobytes() == here.tobytes()
    # and through the speech path (chunking, resampling to the peer's 48 kHz, s16) as a call hears it
    out = []
    for engine in (local_piper, remote):
        path = SynthesisPath(engine, 48_000, timeout_s=30)  # type: ignore[arg-type]
        pcm = await collect(path.speak("One sentence here. And a second, longer one follows it.", request))
        out.append(float_to_s16(pcm).tobytes())
    assert out[0] == out[1]
    kinds = {kind for kind, _ in remote.hops}  # type: ignore[attr-defined]
    assert "call" in kinds and all(s >= 0 for _, s in remote.hops)  # type: ignore[attr-defined]


async def test_cancelling_mid_stream_frees_the_replica_slot(remote: object) -> None:
    before = {r: s["sentences_made"] for r, s in (await replica_stats(remote)).items()}
    stream = remote.synthesize(TTSRequest(text=LONG_TEXT))  # type: ignore[attr-defined]
    first = await anext(stream)
    assert first.size > 0
    served_by = remote.last_replica  # type: ignore[attr-defined]
    await stream.aclose()
    # The replica's stream ends and its engine stops: no synthesis left running, and far fewer sentences
    # made than the text has (Piper makes one per sentence; all 24 would be made had it run on).
    for _ in range(100):
        stats = (await replica_stats(remote))[served_by]
        if stats["active"] == 0 and stats["engine_active"] == 0:
            break
        await asyncio.sleep(0.05)
    assert stats["active"] == 0 and stats["engine_active"] == 0
    assert stats["sentences_made"] - before.get(served_by, 0) < 12
    # the freed slot serves the next request
    assert (await collect(remote.synthesize(TTSRequest(text="Next.")))).size > 0  # type: ignore[attr-defined]


async def test_voice_ids_stay_on_the_replicas_holding_them(remote: object, tmp_path_factory: object) -> None:
    from assistant.tts.piper_engine import default_voice_path

    src = default_voice_path()
    folder = tmp_path_factory.mktemp("voices")  # type: ignore[attr-defined]
    voices = []
    for name in ("voice_a", "voice_b"):
        shutil.copy(src, folder / f"{name}.onnx")
        shutil.copy(Path(f"{src}.json"), folder / f"{name}.onnx.json")
        voices.append(str(folder / f"{name}.onnx"))
    where: dict[str, set[str]] = {v: set() for v in voices}
    for _ in range(4):
        for voice in voices:
            pcm = await collect(remote.synthesize(TTSRequest(text="Hi.", voice=voice)))  # type: ignore[attr-defined]
            assert pcm.size > 0
            where[voice].add(remote.last_replica)  # type: ignore[attr-defined]
    assert all(len(replicas) == 1 for replicas in where.values()), where
    holders = {r: s["voices"] for r, s in (await replica_stats(remote)).items()}
    for voice, (replica,) in where.items():
        assert voice in holders[replica]


async def test_overload_is_busy(remote: object) -> None:
    """Two replicas × one slot; this gateway's queue holds a burst that size plus one (3): of eight long requests
    at once, 2 run, 3 wait, and the rest are refused busy."""

    async def one() -> str:
        try:
            stream = remote.synthesize(TTSRequest(text=LONG_TEXT[:400]))  # type: ignore[attr-defined]
            await collect(stream)
            return "ok"
        except TTSBusy:
            return "busy"

    results = await asyncio.gather(*(one() for _ in range(8)))
    assert results.count("busy") >= 1 and results.count("ok") >= 2, results


async def test_tts_api_answers_429_busy_through_ray(cluster: object, remote: object) -> None:
    """The TTS API with the Ray backend: audio when there is room, 429 busy when every replica is full."""

    from assistant.server.app import create_app
    from assistant.server.local import serve_on_loopback
    from assistant.server.services import Services

    cfg = ray_config()
    services = Services(cfg)  # type: ignore[arg-type]
    await services.load()  # tts.backend = ray: connects to the deployment (ASR and VAD load locally)
    assert services.tts is not None and services.tts.name == "piper"
    app = create_app(cfg, services)  # type: ignore[arg-type]
    try:
        async with serve_on_loopback(app) as base, aiohttp.ClientSession() as http:
            url = f"{base}/api/tts"
            async with http.post(url, json={"text": "Hello from the cluster.", "format": "wav"}) as resp:
                assert resp.status == 200, await resp.text()
                assert len(await resp.read()) > 10_000

            async def post() -> int:
                async with http.post(url, json={"text": LONG_TEXT[:600], "format": "pcm"}) as resp:
                    await resp.read()
                    if resp.status == 429:
                        assert (await resp.json())["error"] == "busy"
                    return resp.status

            statuses = await asyncio.gather(*(post() for _ in range(8)))
        assert 429 in statuses and statuses.count(200) >= 2, statuses
        assert services.metrics.ray_hop_seconds.labels(kind="call")._sum.get() > 0  # hop costs observed
    finally:
        await services.close()
