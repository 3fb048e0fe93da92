"""The engine supervisor judges slow engines rightly: real child processes (``engine_host``), real crashes, the real
embedded model.

- a crash loop is counted from when a child got ready, not from when it started: a model that loads slowly and
  dies at its first turn ends ``failed`` after ``max_failures``, instead of being restarted at once for ever;
- a prompt step that takes longer than ``hang_timeout_s`` (a big model's chunk on a CPU) is not a hang;
- closing while a child still loads kills it at once instead of waiting for it to read a frame it never reads;
- the child is crash isolation, not a sandbox, so it gets none of the server's secrets, and what it sends is read
  as data: a frame that names anything but the host's types is refused before any of it runs, and the connection
  ends saying so (it used to be unpickled, or, failing that, seen as a hang).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from assistant.config import RespondConfig
from assistant.engine_host.supervisor import EngineDied, EngineProcess, EngineUnavailable
from assistant.respond.hosted import HostedResponder
from tests.waiting import until, until_async

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FACTORY = "tests.fault_engines:slow_load_then_crash"


async def test_a_slow_loading_engine_that_dies_at_its_first_turn_is_a_crash_loop() -> None:
    """Each child loads for longer than ``stable_s`` and dies at its first call: three failures in a row, then
    ``failed`` (the fallback answers), where the time spent loading used to count as time served."""
    host = EngineProcess("slow", FACTORY, {"load_s": 1.0}, stable_s=0.5, max_failures=3, backoff_s=0.0,
                         retry_failed_s=3600.0)
    try:
        await host.start()
        for _ in range(host.max_failures + 2):
            if not await host.wait_ready(120):
                break
            with pytest.raises(EngineDied):
                await host.call("crash", timeout=60)
        assert host.health.state == "failed", host.health
        assert "3 failures in a row" in host.health.reason and "SIGSEGV" in host.health.reason
        assert len(host.deaths) == 3
    finally:
        await host.close()


async def test_closing_while_a_child_loads_kills_it_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """A child loading (here for an hour) reads no frame: it is killed at once, its pid is gone, and whoever waited
    for it to be ready hears that it was closed."""
    host = EngineProcess("never", FACTORY, {"load_s": 3600.0})
    starting = asyncio.create_task(host.start())
    await until(lambda: host.pid is not None, "the child to start loading", 60)
    pid = host.pid
    with caplog.at_level(logging.WARNING, logger="assistant.engine_host.supervisor"):
        await asyncio.wait_for(host.close(), 120)
    assert "engine.close_timeout" not in caplog.text  # not 30 s of waiting for a frame it would never read
    assert not Path(f"/proc/{pid}").exists() and host.pid is None
    with pytest.raises(EngineUnavailable, match="closed before it was ready"):
        await asyncio.wait_for(starting, 30)
    assert host.health.state == "closed"


async def test_a_prompt_step_longer_than_the_hang_timeout_is_not_a_hang() -> None:
    """The real model in its child, with a hang limit shorter than one 256-token prompt step on this CPU (as a 3B
    model's step is longer than the default 10 s): the step is given the time its tokens take, and the reply comes,
    by the child that started."""
    cfg = RespondConfig(engine="llama", backend="process", threads=1, slots=1, context_tokens=1024, max_tokens=4,
                        hang_timeout_s=0.5, restart_backoff_s=0.0)
    responder = HostedResponder(cfg)
    long_turn = "The quick brown fox jumps over the lazy dog near the river bank. " * 18  # about 250 tokens
    try:
        await responder.start()
        pid = responder.host.pid
        reply = "".join([d async for d in responder.respond(long_turn, [])])
        assert reply.strip() and responder.host.deaths == [] and responder.host.pid == pid
    finally:
        await responder.aclose()


async def test_the_model_in_its_child_gets_ready_from_what_the_conversation_kept() -> None:
    """``ReplyOptions.kept`` crosses to the child: the next prompt is got ready only once the server says what it kept,
    and a reply the server dropped (a speculation the user talked over) leaves the slot holding the history the next
    real turn brings, so that turn evaluates only its own words though the history is full."""
    from assistant.respond.base import ReplyOptions
    from assistant.respond.history import ConversationHistory

    cfg = RespondConfig(engine="llama", backend="process", threads=1, slots=1, context_tokens=1024, max_tokens=10,
                        history_turns=2, temperature=0.0, examples=False, system_prompt="Answer briefly.",
                        doubt="off")  # the model's own short answers (test_llama has the doubted ones)
    responder = HostedResponder(cfg)
    history = ConversationHistory(2)
    loop = asyncio.get_running_loop()

    async def reply(text: str, kept: asyncio.Future[str] | None) -> str:
        return "".join([d async for d in responder.respond(text, history.messages, ReplyOptions(kept=kept))])

    async def stats() -> dict[str, int]:
        return await responder.stats()

    try:
        await responder.start()
        base = (await stats())["prepared"]  # warm-up got each slot ready for a first turn
        for n, ask in enumerate(["Name a fruit.", "Name a colour."], start=1):
            kept: asyncio.Future[str] = loop.create_future()
            said = await reply(ask, kept)
            assert (await stats())["prepared"] == base + n - 1  # not before the server says what it kept
            history.add_turn(ask, said)
            kept.set_result(said)

            async def prepared(n: int = n) -> bool:
                return (await stats())["prepared"] == base + n

            await until_async(prepared, "the child to get the next prompt ready", 60)
        spoken: asyncio.Future[str] = loop.create_future()
        await reply("Name a city", spoken)  # the history is full; the user went on: dropped
        spoken.cancel()
        before = await stats()
        assert before["prepared"] == base + 2  # nothing from the dropped reply
        await reply("Name a city in Spain.", None)
        after = await stats()
        evaluated = ((after["prompt_tokens"] - before["prompt_tokens"])
                     - (after["reused_tokens"] - before["reused_tokens"]))
        # Its own words and the template around them (12 tokens); not the history's turns again.
        assert evaluated <= 16, (evaluated, before, after)
    finally:
        await responder.aclose()


async def test_a_frame_that_would_run_code_in_the_server_is_refused_and_named(tmp_path: Path) -> None:
    marker = tmp_path / "ran-in-the-server"
    host = EngineProcess("smuggler", "tests.fault_engines:smuggler", {}, backoff_s=0.0)
    try:
        await host.start()
        pid = host.pid
        with pytest.raises(EngineDied, match=r"posix\.system, which is not a type this engine sends"):
            await host.call("smuggle", str(marker), timeout=60)
        assert not marker.exists()  # nothing of the frame ran
        assert host.deaths and "broken connection" in host.deaths[0] and "hung" not in host.deaths[0]
        assert await host.wait_ready(60) and host.pid != pid  # restarted: a fresh child
    finally:
        await host.close()


SECRETS = {"OPENAI_API_KEY": "sk-server", "HF_TOKEN": "hf_server", "ASSISTANT_SERVER__AUTH_TOKEN": "admin",
           "ASSISTANT_TELEPHONY__TWILIO_AUTH_TOKEN": "carrier", "AWS_SECRET_ACCESS_KEY": "cloud"}


async def test_a_child_gets_an_allow_listed_environment_and_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's secrets stay in the server; the child gets where things are, the locale, thread settings, and
    what its host names (a plug-in's key, ``respond.child_env``); the embedded model's config carries no OpenAI key."""
    from assistant.respond.hosted import child_config, child_env

    for name, value in {**SECRETS, "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8", "PLUGIN_KEY": "mine"}.items():
        monkeypatch.setenv(name, value)
    host = EngineProcess("smuggler", "tests.fault_engines:smuggler", {}, env=("PLUGIN_KEY",))
    try:
        await host.start()
        seen = await host.call("environment", timeout=60)
    finally:
        await host.close()
    assert not set(SECRETS) & set(seen), sorted(set(SECRETS) & set(seen))
    assert seen["PLUGIN_KEY"] == "mine" and seen["OMP_NUM_THREADS"] == "1" and seen["LC_ALL"] == "C.UTF-8"
    assert seen["PATH"] and "PYTHONPATH" in seen

    llama = RespondConfig(engine="llama", api_key="sk-config", child_env=["PLUGIN_KEY"])
    assert child_config(llama)["api_key"] == "" and child_env(llama) == ("PLUGIN_KEY",)
    openai = RespondConfig(engine="openai", api_key="sk-config")
    assert child_config(openai)["api_key"] == "sk-config" and child_env(openai) == ("OPENAI_API_KEY",)


async def test_a_native_library_built_for_another_cpu_is_named_as_such() -> None:
    """A child killed by SIGILL (an instruction this CPU lacks, executed for real) in a crash loop: the reason
    /readyz shows says what it likely is and how to rebuild, not only the signal's name."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ud2 is an x86 instruction")
    host = EngineProcess("illegal", "tests.fault_engines:illegal_instruction", {}, max_failures=2, backoff_s=0.0,
                         retry_failed_s=3600.0)
    try:
        await host.start()
        assert host.health.state == "failed"
        assert "killed by SIGILL" in host.health.reason and "GGML_NATIVE=OFF" in host.health.reason
    finally:
        await host.close()
