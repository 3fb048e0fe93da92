"""``respond.model_path = auto`` (respond/auto.py, respond/upgrade.py, respond/swap.py): the table chooses by cores,
memory and GPU; a server starts on the bundled model, pulls the machine's model in the background from the local hub
the pull tests use (tests/test_pull.py), loads it in its own child process and swaps it in between turns, and the
page and ``/readyz`` say which model answers and why; offline, the bundled model goes on answering and says why."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from assistant.bench.v2v import BenchSession
from assistant.config import RespondConfig
from assistant.respond import auto, hub
from assistant.respond.base import Message
from assistant.respond.swap import SwappableResponder
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_pull import FILE, REPO, Hub, gguf, local_hub  # noqa: F401  (fixtures: the local hub)
from tests.waiting import until, until_async

CPU_8 = auto.Machine(cores=8, memory_gb=16)


def test_the_table_chooses_by_cores_memory_and_gpu() -> None:
    assert auto.choose(auto.Machine(cores=2, memory_gb=16)).model == ""  # this machine: the bundled model
    assert auto.choose(auto.Machine(cores=4, memory_gb=8)).model == "qwen2.5-1.5b"
    assert auto.choose(auto.Machine(cores=4, memory_gb=2)).model == ""  # not enough memory free
    assert auto.choose(CPU_8).model == "qwen2.5-3b"
    gpu = auto.choose(auto.Machine(cores=4, memory_gb=16, gpu_gb=24, gpu="NVIDIA H200"))
    assert (gpu.model, gpu.gpu_layers) == ("llama3.1-8b", -1)
    assert auto.choose(auto.Machine(cores=2, memory_gb=8, gpu_gb=6)).model == "qwen2.5-3b"
    assert "8 cores, 16.0 GiB free, no GPU" in auto.choose(CPU_8).why
    for row in auto.TABLE:
        hub.parse_ref(row.model)  # every row names a model a pull can fetch
    here = auto.detect()
    assert here.cores >= 1 and here.memory_gb > 0


def test_auto_reads_the_machine_within_a_containers_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container on a big host: its CPU quota and memory limit, not the host's cores and MemAvailable, choose."""
    monkeypatch.setattr(auto, "usable_cpus", lambda: 2)
    monkeypatch.setattr(auto, "cgroup_memory_free", lambda: 1.5 * auto.GIB)
    monkeypatch.setattr(auto, "_host_memory", lambda: 200.0 * auto.GIB)
    monkeypatch.setattr(auto, "_gpu", lambda: (0.0, ""))
    here = auto.detect()
    assert (here.cores, here.memory_gb) == (2, 1.5)
    assert auto.choose(here).model == ""  # the bundled model, not the 3B the host's 64 cores would pick
    monkeypatch.setattr(auto, "cgroup_memory_free", lambda: None)
    assert auto.detect().memory_gb == 200.0


def test_without_network_auto_is_the_pulled_copy_or_the_bundled_model(local_hub: Hub) -> None:  # noqa: F811
    row = (auto.Row(f"{REPO}/{FILE}", cores=1, why="a test row"),)
    cfg = RespondConfig(engine="llama")
    assert cfg.model_path == "auto"
    choice = auto.choose(CPU_8, row)
    assert auto.pulled(choice) == ""
    dest = hub.pull(choice.model, progress=False)
    assert auto.pulled(choice) == str(dest)


def _auto_services(services: Services, **respond: object) -> tuple[object, Services]:
    cfg = test_config(respond={"engine": "llama", "model_path": "auto", "slots": 1, **respond})
    own = Services(cfg)  # the loaded speech engines; this config's responder
    own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                       services.end_of_turn)
    return cfg, own


async def _readyz(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(f"{url}/readyz") as resp:
        return await resp.json()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_the_machines_model_is_pulled_checked_and_swapped_in_between_turns(
        services: Services, local_hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(auto, "TABLE", (auto.Row(f"{REPO}/{FILE}", cores=1, memory_gb=0.1, why="a test row"),))
    local_hub.cut_after = 0
    cfg, own = _auto_services(services)
    async with serve(cfg, own) as (url, app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()  # a call that is open while the model is swapped
        try:
            assert client.answer["responder"]["engine"] == "llama"
            await until_async(lambda: _ready_model(http, url), "the pulled model swapped in", timeout_s=240)
            ready = await _readyz(http, url)
            model = ready["model"]
            assert (model["state"], model["answers"], model["target"]) == ("ready", f"{REPO}/{FILE}", f"{REPO}/{FILE}")
            assert "a test row; pulled in the background and swapped in" in model["why"]
            assert ready["status"] == "ready" and ready["engines"]["llm"]["state"] == "ready"
            assert local_hub.gets == [""]  # one download, whole
            # The open call heard who answers now, and why; its next turn is answered by the new child.
            await until(lambda: [e for e in client.events if e.body.get("type") == "responder"], "the page told")
            told = [e.body for e in client.events if e.body.get("type") == "responder"][-1]
            assert told["why"] == model["why"] and told["model"] == FILE
            swappable = own.responder
            assert isinstance(swappable, SwappableResponder) and swappable.swaps == 1
            new_pid = swappable.current.host.pid  # type: ignore[attr-defined]
            app[SESSIONS][client.session_id].conversation.respond_to(text="What is the capital of France?")
            await until(lambda: [e for e in client.events if e.body.get("type") == "reply_done"], "a reply",
                        timeout_s=120)
            assert own.engines["llm"].pid == new_pid
        finally:
            await client.close()


async def _ready_model(http: aiohttp.ClientSession, url: str) -> bool:
    model = (await _readyz(http, url)).get("model", {})
    if model.get("state") in ("offline", "failed"):
        raise AssertionError(f"the upgrade did not happen: {model}")
    return model.get("state") == "ready"


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_offline_the_bundled_model_answers_and_says_why(services: Services, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from assistant.bench.processes import free_port

    monkeypatch.setattr(auto, "TABLE", (auto.Row(f"{REPO}/{FILE}", cores=1, memory_gb=0.1, why="a test row"),))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv(hub.DIR_ENV, str(tmp_path / "models"))
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)
    cfg, own = _auto_services(services)
    async with serve(cfg, own) as (url, _app), aiohttp.ClientSession() as http:
        await until_async(lambda: _state(http, url, "offline"), "the pull given up", timeout_s=60)
        model = (await _readyz(http, url))["model"]
        assert model["answers"] == auto.BUNDLED and "cannot reach the model hub at 127.0.0.1" in model["why"]
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        await client.close()
        assert client.answer["responder"]["why"] == model["why"]  # the page says it too
    assert not list((tmp_path / "models").rglob("*.gguf"))


async def _state(http: aiohttp.ClientSession, url: str, state: str) -> bool:
    return (await _readyz(http, url)).get("model", {}).get("state") == state


class Slow:
    """A responder whose reply waits until told to go on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.go = asyncio.Event()
        self.closed = False

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        yield f"{self.name} begins"
        await self.go.wait()
        yield f" and {self.name} ends."

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_a_swap_waits_for_replies_in_flight_and_closes_the_old_model_after() -> None:
    old, new = Slow("old"), Slow("new")
    shared = SwappableResponder(old, "bundled")
    first = shared.respond("hi", [])
    assert await anext(first) == "old begins"
    shared.swap(new, "better")
    assert shared.describe()["why"] == "better" and shared.name == "new"
    second = shared.respond("hi", [])
    assert await anext(second) == "new begins"  # the next reply: the new model
    assert not old.closed  # a reply is still running on it
    old.go.set()
    assert [d async for d in first] == [" and old ends."]  # the reply in flight ends on the model it began on
    await until(lambda: old.closed, "the old model closed after its last reply")
    new.go.set()
    assert [d async for d in second] == [" and new ends."]
    await shared.aclose()
    assert new.closed


def test_readyz_documents_the_model() -> None:
    from assistant.server.app import READYZ_SCHEMA

    assert "model" in READYZ_SCHEMA["properties"]
    json.dumps(dataclasses.asdict(auto.choose(CPU_8)))  # what the log and /readyz carry is plain data
