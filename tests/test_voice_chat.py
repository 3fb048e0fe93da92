"""Voice chat end to end: real aiortc peers on loopback against the real app and the default CPU stack."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.pipeline.trace import STAGES
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.waiting import own_tasks, until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)


def cfg_with(**server: object) -> object:
    return test_config(server={"idle_timeout_s": 30.0, **server})


async def _session(url: str, http: aiohttp.ClientSession, index: int = 0) -> BenchSession:
    client = BenchSession(index=index, url=url, http=http)
    await client.connect()
    return client


async def test_one_turn_transcript_reply_and_metrics(services: Services, shared_audio) -> None:
    async with serve(cfg_with(), services) as (url, _app), aiohttp.ClientSession() as http:
        client = await _session(url, http)
        try:
            result = await client.run_turn(load_utterance(shared_audio / "en_weather.wav"), 0, SETTINGS)
        finally:
            await client.close()
    assert result.status == "ok", result.reason
    assert "weather" in result.transcript.lower()
    assert "weather" in result.reply_text.lower()  # the echo responder repeats it
    assert result.columns["v2v_ms"] > 0  # a non-silent reply sample was heard
    marks = result.server_marks_ms
    ordered = [marks[s] for s in STAGES if s in marks and s != "reply_done"]
    assert len(ordered) == len(STAGES) - 1, f"missing stage marks: {set(STAGES) - set(marks)}"
    assert ordered == sorted(ordered), marks
    for name in ("endpoint_ms", "server_v2v_ms"):
        assert result.columns[name] is not None and result.columns[name] > 0, name
    # TTS after the decision may be 0: the falling end-of-turn policy decides after the speculative reply's
    # first audio was made (it waits ~900 ms of silence after a finished sentence).
    assert result.columns["tts_first_audio_ms"] is not None and result.columns["tts_first_audio_ms"] >= 0
    # ASR after the endpoint may be 0: the end of turn waits for the speculative transcript (its evidence).
    assert result.columns["asr_ms"] is not None and result.columns["asr_ms"] >= 0
    # The client hears the reply after the server sent it.
    assert result.columns["v2v_ms"] >= result.columns["server_v2v_ms"]


async def test_barge_in_stops_the_reply_at_once(services: Services, shared_audio) -> None:
    """Talking over the reply stops it on the spot: once the server has decided to interrupt (the ``interrupted``
    event), not one more audible reply frame leaves it while the user speaks. The sink drops (or holds) its queue
    in the same step that emits the event, so this is an order of events, true on any machine: a reply that went
    on for even one 20 ms frame after the decision fails it."""
    story = load_utterance(shared_audio / "en_story.wav")  # a long echo reply (~4 s of speech)
    timer = load_utterance(shared_audio / "en_timer.wav")
    async with serve(cfg_with(), services) as (url, app), aiohttp.ClientSession() as http:
        client = await _session(url, http)
        try:
            session = next(iter(app[SESSIONS].values()))
            track = session.track
            # What the track had sent when the interruption was decided (a listener runs inside emit()).
            at_interrupt: list[tuple[int, float]] = []
            kinds: list[str] = []

            def note(event: dict) -> None:
                kinds.append(event["type"])
                if event["type"] == "interrupted":
                    at_interrupt.append((track.audible_frames_sent, track.last_audible_sent_at))

            session.events.subscribe(note)
            client.source.play(story, on_speech_end=client.listener.arm)
            await until(lambda: track.audible_frames_sent > 0, "the reply to start playing", 60)
            playing = track.audible_frames_sent
            await until(lambda: track.audible_frames_sent >= playing + 25, "half a second of the reply to play", 60)
            over = client.source.play(timer)
            await until(lambda: at_interrupt, "the reply to be interrupted", 60)
            await asyncio.wait_for(over.speech_end_at, 60)  # the user is done talking over it
            frames_after, last_sent = track.audible_frames_sent, track.last_audible_sent_at
            async with http.get(f"{url}/metrics") as r:
                metrics_text = await r.text()
        finally:
            await client.close()
    (frames_at, sent_at), *_ = at_interrupt
    # The reply was still playing (an interruption needs an active turn; its reply was not done yet)...
    assert "reply_done" not in kinds[: kinds.index("interrupted")], kinds
    # ...and from the decision on, nothing more of it was heard.
    assert (frames_after, last_sent) == (frames_at, sent_at), (
        f"{frames_after - frames_at} audible reply frames went out after the interruption")
    counted = [
        float(line.split()[1])
        for line in metrics_text.splitlines()
        if line.startswith("assistant_interruptions_total ")
    ]
    assert counted and counted[0] >= 1  # the barge-in is counted on /metrics


async def test_three_sessions_stay_independent(services: Services, shared_audio) -> None:
    files = {"en_weather.wav": "weather", "en_timer.wav": "timer", "en_story.wav": "piano"}
    async with serve(cfg_with(), services) as (url, app), aiohttp.ClientSession() as http:
        clients = [await _session(url, http, i) for i in range(3)]
        assert len(app[SESSIONS]) == 3
        try:
            results = await asyncio.gather(
                *(
                    c.run_turn(load_utterance(shared_audio / name), 0, SETTINGS)
                    for c, name in zip(clients, files, strict=True)
                )
            )
        finally:
            for c in clients:
                await c.close()
    for result, word in zip(results, files.values(), strict=True):
        assert result.status == "ok", result.reason
        assert word in result.transcript.lower(), (word, result.transcript)
        # Each session heard its own reply, not another session's.
        assert word in result.reply_text.lower()


async def test_hangup_frees_session_and_tasks(services: Services, shared_audio) -> None:
    async with serve(cfg_with(), services) as (url, app), aiohttp.ClientSession() as http:
        baseline = len(own_tasks())
        client = await _session(url, http)
        session = next(iter(app[SESSIONS].values()))
        assert session.task_count >= 1
        async with http.delete(f"{url}/api/sessions/{client.session_id}") as resp:
            assert resp.status == 200
        client.session_id = ""  # already hung up
        await client.close()
        assert session.closed and session.task_count == 0
        assert client.session_id not in app[SESSIONS]
        await until(lambda: len(own_tasks()) <= baseline, "the session's tasks to end", 10)
        async with http.delete(f"{url}/api/sessions/{session.id}") as resp:
            assert resp.status == 404


async def test_bad_offers_are_refused_and_others_unaffected(services: Services) -> None:
    async with (
        serve(cfg_with(max_sessions=1, max_body_bytes=4096), services) as (url, app),
        aiohttp.ClientSession() as http,
    ):

        async def post(body: bytes | str, ctype: str = "application/json") -> tuple[int, dict]:
            async with http.post(f"{url}/api/offer", data=body, headers={"Content-Type": ctype}) as r:
                return r.status, await r.json(content_type=None)

        assert (await post("{not json"))[0] == 400
        assert (await post("[1, 2]"))[0] == 400
        assert (await post('{"type": "offer"}'))[0] == 400
        assert (await post('{"sdp": "v=0", "type": "answer"}'))[0] == 400
        status, body = await post('{"sdp": "hello", "type": "offer"}')
        assert status == 400 and body["error"] == "bad_offer"
        status, body = await post('{"sdp": "v=0\\r\\no=- 0 0 IN IP4 0.0.0.0\\r\\n", "type": "offer"}')
        assert status == 400 and "Traceback" not in str(body)
        status, body = await post(b'{"sdp": "' + b"x" * 10_000 + b'", "type": "offer"}')
        assert status == 413, body
        async with http.delete(f"{url}/api/sessions/nope") as r:
            assert r.status == 404
        assert not app[SESSIONS], "refused offers left sessions behind"
        # A good session still works, and the one-session cap answers 503 to the next.
        client = await _session(url, http)
        try:
            with pytest.raises(RuntimeError, match="503"):
                await _session(url, http, 1)
        finally:
            await client.close()


async def test_silent_peer_is_reaped_and_metrics_exported(services: Services) -> None:
    async with serve(cfg_with(max_silence_s=2.0), services) as (url, app), aiohttp.ClientSession() as http:
        client = await _session(url, http)  # sends only digital silence: no turn, no error, then reaped
        session = next(iter(app[SESSIONS].values()))
        await until(lambda: session.closed and not app[SESSIONS], "the silent session to be reaped", 30)
        assert session.close_reason == "silence_timeout"
        assert session.conversation.turns == 0
        assert not [e for e in client.events if e.body.get("type") in ("speech_start", "error")]
        assert any(e.body.get("type") == "close" for e in client.events)
        assert not app[SESSIONS]
        client.session_id = ""
        await client.close()
        async with http.get(f"{url}/metrics") as r:
            text = await r.text()
        assert "assistant_sessions_total" in text and "assistant_sessions_active 0.0" in text


async def test_the_default_stack_does_not_load_a_voice_no_turn_can_reach(services: Services) -> None:
    """It hears English alone (tiny.en): the Japanese voice of tts.voices waits for a request in Japanese (the TTS
    API may still ask for it, so it is still listed)."""
    from assistant.tts.routing import LanguageRouter

    assert isinstance(services.tts, LanguageRouter)
    (kokoro,) = services.tts.voices_routed
    assert kokoro.languages == ["ja"] and kokoro.engine is None
    assert "ja" in services.tts.capabilities.languages
