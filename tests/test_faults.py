"""Fault isolation through real aiortc peers: a stage that raises, hangs, returns NaN audio or closes
mid-stream ends that turn with an ``error`` event; the session goes on and other sessions never notice.

The faults come from ``tests/fault_engines.py``, switched per turn by keyword (the words the user says);
the ASR, VAD, Piper voice and aiortc peers are the real ones. Also here: an OpenAI-compatible responder
that cannot be reached, that never answers, or that closes mid-stream; an ASR that raises; a peer that
vanishes mid-reply; and a server shutdown with sessions in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.respond import openai as openai_mod
from assistant.respond.openai import OpenAIResponder
from assistant.server.app import SESSIONS, create_app, wait_ready
from assistant.server.local import serve_on_loopback
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.fault_engines import FaultyASR, FaultyResponder, FaultyTTS
from tests.test_limits import events, own_tasks, vanish, wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180), pytest.mark.slow]

# A turn ends on reply_done, an error, or this long without audio after some was heard: longer than the TTS time
# limit below, since a short first piece may play before the piece that hangs (and only the limit ends that one).
SETTINGS = TurnSettings(timeout_s=20.0, silence_ms=6000, settle_ms=300)
LIMITS = {
    # The engine's own time for a whole reply: a hang must end within the test, yet the bystander's real Piper
    # replies, on a machine busy with both sessions' ASR, must never come near it.
    "tts": {"timeout_s": 4.0},
    "asr": {"timeout_s": 3.0},
    "respond": {
        "engine": "tests.fault_engines:FaultyResponder",
        "total_timeout_s": 2.0,
        "first_token_timeout_s": 1.0,
        "connect_timeout_s": 0.5,
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services() -> Services:
    """The real stack with the fault stand-ins wrapped around it, loaded once for the module."""
    svc = Services(test_config(**LIMITS))  # type: ignore[arg-type]
    await svc.load()
    piper = svc.tts
    svc.tts = FaultyTTS(piper)
    svc.asr = FaultyASR(svc.asr)
    yield svc
    await svc.close()
    await piper.close()  # type: ignore[union-attr]


def cfg(tmp_path: Any, **server: Any) -> Any:
    return test_config(server={"data_dir": str(tmp_path / "data"), "idle_timeout_s": 30.0, **server}, **LIMITS)


@contextlib.asynccontextmanager
async def peers(url: str, http: aiohttp.ClientSession, n: int) -> AsyncIterator[list[BenchSession]]:
    clients = [BenchSession(i, url, http) for i in range(n)]
    try:
        for c in clients:
            await c.connect()
        yield clients
    finally:
        for c in clients:
            await c.close()


async def turn(client: BenchSession, utt: Any, k: int) -> tuple[str, list[dict]]:
    """Play one utterance; returns the turn's status and the error events it brought."""
    before = len(client.events)
    result = await client.run_turn(utt, k, SETTINGS)
    errors = [e.body for e in client.events[before:] if e.body.get("type") == "error"]
    return result.status, errors


# --- engines that fail -----------------------------------------------------------------------------------
async def test_a_failing_stage_ends_one_turn_and_spares_the_other_session(services, tmp_path, shared_audio):
    responder: FaultyResponder = services.responder
    tts: FaultyTTS = services.tts
    faulty_words = load_utterance(shared_audio / "en_weather.wav")  # "weather" switches the faults on
    clean_words = load_utterance(shared_audio / "en_timer.wav")
    plan = [  # (stage whose stand-in fails, mode, expected error stage); None: a normal turn
        ("responder", "raise", "responder"),
        ("tts", "nan", "tts"),
        ("responder", "hang", "responder"),
        ("tts", "hang", "tts"),
        ("tts", "close", "tts"),
        ("tts", "busy", "tts"),
    ]
    async with serve(cfg(tmp_path), services) as (url, app), aiohttp.ClientSession() as http, \
            peers(url, http, 2) as (a, b):
        done = asyncio.Event()

        async def bystander() -> list[tuple[str, list[dict]]]:
            out = []
            while not done.is_set():
                out.append(await turn(b, clean_words, len(out)))
            return out

        b_task = asyncio.create_task(bystander())
        outcomes = []
        try:
            for k, step in enumerate(plan):
                responder.faults, tts.faults = {}, {}
                if step is not None:
                    (responder.faults if step[0] == "responder" else tts.faults)["weather"] = step[1]
                status, errors = await turn(a, faulty_words if step else clean_words, k)
                outcomes.append((step, status, errors))
        finally:
            responder.faults, tts.faults = {}, {}
            done.set()
            b_results = await b_task
        for step, status, errors in outcomes:
            if step is None:
                assert status == "ok" and not errors, (step, status, errors)
            else:
                assert [e["stage"] for e in errors] == [step[2]], (step, errors)
                assert ("busy" in errors[0]["message"]) == (step[1] == "busy"), (step, errors)
                assert "Traceback" not in str(errors), (step, errors)
        assert len(b_results) >= 3, b_results
        assert all(status == "ok" and not errors for status, errors in b_results), b_results
        assert not events(b, "error")
        assert len(app[SESSIONS]) == 2  # both sessions lived through it all
        metrics = services.metrics.render()[0].decode()
        assert 'assistant_errors_total{stage="tts"}' in metrics and 'stage="responder"' in metrics


# --- an OpenAI-compatible server that misbehaves -----------------------------------------------------------
class FakeLLM:
    """An OpenAI-compatible server whose ``mode`` says how it misbehaves: ok, hang, cut."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.hanging = 0  # requests it holds unanswered right now
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.mode == "hang":
            self.hanging += 1
            try:
                await asyncio.sleep(3600)
            finally:
                self.hanging -= 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "Sure, here is "}}]}\n\n')
        if self.mode == "cut":
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()  # closes mid-stream: no [DONE], no finish_reason
            return resp
        await resp.write(b'data: {"choices": [{"delta": {"content": "the answer."}, "finish_reason": "stop"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def black_hole() -> Any:
    """A local port whose TCP handshake never completes: a listener that never accepts, its queue full.

    Linux then drops further SYNs, so a connect hangs as it would to a host that went away.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    try:
        yield listener.getsockname()[1]
    finally:
        for sock in [*fillers, listener]:
            sock.close()


async def test_openai_responder_failures_time_out_per_config(services, tmp_path, shared_audio):
    llm = FakeLLM()
    stack = contextlib.AsyncExitStack()
    # Its "hang" handler is cut off at cleanup.
    llm_url = await stack.enter_async_context(serve_on_loopback(llm.app, shutdown_timeout=0.5)) + "/v1"
    c = cfg(tmp_path)
    openai = OpenAIResponder(c.respond)
    saved = services.responder
    services.responder = openai
    words = load_utterance(shared_audio / "en_weather.wav")
    asr: FaultyASR = services.asr
    plan = [  # (base URL, server mode, expected message: which limit or fault ended the turn)
        (llm_url, "asr", None),  # the ASR engine raises first: an asr error, the session goes on
        (f"http://127.0.0.1:{free_port()}/v1", "refused", openai_mod.MSG_UNREACHABLE),
        (llm_url, "hang", openai_mod.MSG_TIMEOUT_FIRST),  # respond.first_token_timeout_s
        (llm_url, "cut", openai_mod.MSG_CUT),
        (llm_url, "ok", None),
    ]
    hole = stack.enter_context(black_hole())  # connects hang: only connect_timeout_s ends them
    plan.insert(2, (f"http://127.0.0.1:{hole}/v1", "connect", openai_mod.MSG_UNREACHABLE))  # connect_timeout_s
    try:
        async with serve(c, services) as (url, app), aiohttp.ClientSession() as http, \
                peers(url, http, 1) as (client,):
            for k, (base, mode, message) in enumerate(plan):
                openai.url = base.rstrip("/") + "/chat/completions"
                llm.mode = mode
                before = len(client.events)
                if mode == "asr":
                    # Every final transcription of this turn fails (a pause may split it into two, the first
                    # then being dropped unheard when the user goes on speaking).
                    asr.fail_next = ["raise"] * 3
                status, errors = await turn(client, words, k)
                asr.fail_next = []
                if mode == "asr":
                    assert [e["stage"] for e in errors] == ["asr"], errors
                    continue
                if message is None:
                    assert status == "ok" and not errors, (status, errors)
                    assert "the answer" in events(client, "reply_text")[-1]["text"]
                    continue
                assert [(e["stage"], e["message"]) for e in errors] == [("responder", message)], errors
                # The limit of the stage ended it (its message names which), after the request (the transcript
                # event), while the server had still not answered: the client gave up, not the server. How long
                # each limit takes is for a benchmark, not an assertion on a shared machine.
                kinds = [e.body.get("type") for e in client.events[before:]]
                assert kinds.index("transcript") < kinds.index("error"), kinds
                if mode == "hang":
                    # At least the committed turn's request is still unanswered: the client gave up. A speculative
                    # request for the same words may hang beside it (the server keeps a handler whose client left).
                    assert llm.hanging >= 1, "the responder's first-token limit, not the server, ended the turn"
            assert len(app[SESSIONS]) == 1
    finally:
        services.responder = saved
        await openai.aclose()
        await stack.aclose()


# --- peers that go away, a server that goes away ------------------------------------------------------------
async def test_a_peer_vanishing_mid_reply_is_cleaned_up_and_others_go_on(services, tmp_path, shared_audio):
    story = load_utterance(shared_audio / "en_story.wav")
    timer = load_utterance(shared_audio / "en_timer.wav")
    c = cfg(tmp_path, idle_timeout_s=2.0)
    async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
        baseline = len(own_tasks())
        async with peers(url, http, 2) as (gone, stays):
            ghost = app[SESSIONS][gone.session_id]
            gone.source.play(story)
            other = asyncio.create_task(stays.run_turn(timer, 0, SETTINGS))
            assert await wait_for(lambda: events(gone, "reply_audio_start"), 30), gone.events
            vanish(gone)
            gone.session_id = ""  # it never says goodbye
            assert await wait_for(lambda: ghost.closed and ghost.task_count == 0, c.server.idle_timeout_s + 3)
            assert ghost.close_reason == "idle_timeout" and ghost.task_count == 0
            result = await other
            assert result.status == "ok", result.reason
            assert not events(stays, "error")
            assert list(app[SESSIONS]) == [stays.session_id]
        assert await wait_for(lambda: not app[SESSIONS], 5)
        assert await wait_for(lambda: len(own_tasks()) <= baseline, 5), [t.get_name() for t in own_tasks()]


async def test_server_shutdown_closes_sessions_in_flight_with_a_close_event(services, tmp_path, shared_audio):
    app = create_app(cfg(tmp_path), services)
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    await wait_ready(app)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with aiohttp.ClientSession() as http:
        clients = [BenchSession(i, url, http) for i in range(2)]
        for c in clients:
            await c.connect()
        clients[0].source.play(load_utterance(shared_audio / "en_story.wav"))
        assert await wait_for(lambda: events(clients[0], "reply_audio_start"), 30)
        sessions = list(app[SESSIONS].values())
        await runner.cleanup()  # returns once every session is closed (the shutdown's own timeout bounds it)
        assert all(s.closed and s.close_reason == "server_shutdown" and s.task_count == 0 for s in sessions)
        assert not app[SESSIONS]
        for c in clients:
            assert await wait_for(lambda c=c: events(c, "close"), 3), c.events[-3:]
            assert events(c, "close")[-1]["reason"] == "server_shutdown"
            assert await wait_for(lambda c=c: c.pc.connectionState == "closed", 5), c.pc.connectionState
            c.session_id = ""
            await c.close()


# --- lifecycle ---------------------------------------------------------------------------------------------------
async def test_a_model_that_fails_to_load_stops_the_server_or_says_why(tmp_path) -> None:
    """``assistant serve`` exits non-zero when a model cannot load; told to stay up, ``/readyz`` says why."""
    import json
    import urllib.error
    import urllib.request

    from assistant.bench.processes import start_assistant, stop

    empty = tmp_path / "no-model"
    empty.mkdir()
    flags = ["--asr.model", str(empty), "--server.data_dir", str(tmp_path / "data"), "--respond.engine", "echo"]
    child = start_assistant("fails", "serve", flags, tmp_path)
    try:
        assert await asyncio.to_thread(child.proc.wait, 120) == 1, child.tail()
    finally:
        stop([child])
    assert "serve_exit reason=load_failed" in child.tail()
    stays = start_assistant("stays", "serve", [*flags, "--server.exit_on_load_failure", "false"], tmp_path)
    answer: tuple[int, dict] | None = None
    try:
        for _ in range(240):
            try:
                await asyncio.to_thread(urllib.request.urlopen, f"{stays.url}/readyz", timeout=2)
            except urllib.error.HTTPError as exc:
                answer = (exc.code, json.loads(exc.read()))
                if answer[1]["status"] == "failed":
                    break
            except OSError:
                pass
            assert stays.proc.poll() is None, stays.tail()
            await asyncio.sleep(0.5)
        assert answer is not None and answer[0] == 503, answer
        assert answer[1]["status"] == "failed" and str(empty) in answer[1]["reason"], answer
    finally:
        stop([stays])


async def test_no_audio_reaches_the_conversation_after_close(services, tmp_path, shared_audio):
    """Close stops input first: frames decoded after it (the inbound task is still being cancelled) are dropped,
    so no turn can start on a closed session."""
    from assistant.audio import AudioChunk, read_audio
    from assistant.server.voice.session import Session

    session = Session(services, cfg(tmp_path))
    fed: list[int] = []
    original = session.conversation.feed
    session.conversation.feed = lambda chunk: (fed.append(chunk.start), original(chunk))  # type: ignore
    speech, _ = read_audio(shared_audio / "en_weather.wav")
    session.feed(AudioChunk(0, speech[:320]))
    await session.close("test")
    for start in range(320, len(speech) - 320, 320):  # the whole utterance, after close
        session.feed(AudioChunk(start, speech[start:start + 320]))
    # feed() drops a frame on a closed session in the call itself: nothing is left to wait for.
    assert fed == [0] and session.conversation.turns == 0 and session.task_count == 0
