"""The embedded LLM as a Ray Serve deployment (``respond.backend = "ray"``), on the run's local Ray cluster: the real
packaged model on a replica, the gateway's responder calling it through a streaming handle."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from assistant.config import load_config
from assistant.respond.base import ReplyOptions
from assistant.respond.llama import AHEAD_TOKENS
from assistant.telemetry import carry, names
from tests.otlp_receiver import Receiver, threaded_otlp_receiver
from tests.waiting import until, until_async

if TYPE_CHECKING:
    from assistant.serve_ray.replicas import LLMReplicaStats

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

APP = "testllm"
CALL_TRACE, CALL_SPAN = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
TRACEPARENT = f"00-{CALL_TRACE}-{CALL_SPAN}-01"
LONG_ASK = "Write a long essay about the history of Rome."  # greedy SmolLM2 runs to 300 tokens on it


def llm_config(receiver: Receiver) -> object:
    return load_config(environ={}, overrides={
        "respond": {"engine": "llama", "backend": "ray", "slots": 1, "max_waiting": 0, "threads": 1,
                    "temperature": 0.0, "context_tokens": 1024},
        "ray": {"app_name": APP, "llm_num_cpus": 0.5},
        "telemetry": {"otlp_endpoint": receiver.url, "schedule_delay_ms": 100},
    })


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with threaded_otlp_receiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def deployed(ray_cluster: str, receiver: Receiver) -> object:
    from ray import serve

    from assistant.serve_ray.app import deploy, llm_app_name

    cfg = llm_config(receiver)
    try:
        assert deploy(cfg, tts=False, asr=False, llm=True) == [llm_app_name(cfg)]  # type: ignore[arg-type]
        yield cfg
    finally:
        serve.delete(llm_app_name(cfg))  # type: ignore[arg-type]


async def test_the_model_on_a_replica_answers_and_a_cancel_frees_its_slot(deployed: object,
                                                                        receiver: Receiver) -> None:
    from ray import serve

    from assistant.serve_ray.app import LLM_DEPLOYMENT, llm_app_name
    from assistant.serve_ray.client import RemoteResponder, connect_llm

    remote = await asyncio.to_thread(connect_llm, deployed)
    assert isinstance(remote, RemoteResponder)
    assert remote.describe()["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    # A call's reply (its trace context registered, as a gateway's session does with telemetry on).
    carry.register("gT.call", lambda: {"traceparent": TRACEPARENT})
    try:
        options = ReplyOptions(max_tokens=24, session="gT.call")
        text = "".join([d async for d in remote.respond("What is the capital of France?", [], options)])
    finally:
        carry.forget("gT.call")
    assert text.strip()
    assert options.usage is not None and options.usage.exact and 0 < options.usage.output_tokens <= 24
    # The replica's span of that reply, in the call's trace, with what it cost.
    await until(lambda: receiver.named(names.REPLICA_LLM), "the replica's span", 30)
    span = receiver.named(names.REPLICA_LLM)[0]
    assert (span.trace_id, span.parent_id) == (CALL_TRACE, CALL_SPAN)
    assert span.resource["service.name"] == "assistant-llm" and span.attributes[names.RAY_DEPLOYMENT] == "LLM"
    assert span.attributes[names.LLM_OUTPUT_TOKENS] == options.usage.output_tokens
    assert span.attributes[names.RESPONSE_CHARS] == len(text) and span.attributes[names.TTFT_MS] > 0

    stats = serve.get_deployment_handle(LLM_DEPLOYMENT, llm_app_name(deployed)).stats  # type: ignore[arg-type]
    before = (await stats.remote())["tokens_after_cancel"]
    long = remote.respond(LONG_ASK, [], ReplyOptions(max_tokens=300))
    assert (await anext(long)).strip()
    await long.aclose()  # barge-in: the call is cancelled, and with it the reply on the replica
    seen: list[LLMReplicaStats] = []

    async def idle() -> bool:
        seen.append(await stats.remote())
        return seen[-1]["active"] == 0

    await until_async(idle, "the replica's slot to be free", 30)
    now = seen[-1]
    assert now["cancelled"] >= 1 and now["tokens_after_cancel"] - before <= 2
    # The long reply made at most what runs ahead of an unread stream, and stopped: nowhere near its 300 tokens.
    assert now["generated_tokens"] - options.usage.output_tokens <= AHEAD_TOKENS + 2
    again = "".join([d async for d in remote.respond("Say hello.", [], ReplyOptions(max_tokens=8))])
    assert again.strip()  # the one slot is free again
