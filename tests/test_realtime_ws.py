"""The Realtime API over WebSocket, driven by the official ``openai`` SDK against the real app and the default CPU
stack (echo responder): a spoken turn, a text turn, a barge-in, a session.update that changes voice and VAD."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Any

import numpy as np
import pytest

from assistant.audio import SPEECH_RATE, float_to_s16, read_audio, resample, s16_to_float
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests import needs
from tests.conftest import serve, test_config

openai = needs.module("openai")
from openai.types.realtime.realtime_server_event import RealtimeServerEvent  # noqa: E402
from pydantic import Field, TypeAdapter  # noqa: E402

# Every server event as a strict client checks it (the Agents SDK validates each one against the SDK's union and
# reports any that fails as an error): our own events (assistant.*) are only sent to a session that asked.
STRICT = TypeAdapter(Annotated[RealtimeServerEvent, Field(discriminator="type")])
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

RATE = 24_000
CHUNK_S = 0.1


def pcm24(path: Any, silence_s: float = 0.0) -> np.ndarray:
    """A speech file as 24 kHz int16, with ``silence_s`` of silence after it."""
    x, sr = read_audio(path)
    y = resample(x, sr, RATE)
    return float_to_s16(np.concatenate([y, np.zeros(int(silence_s * RATE), dtype=np.float32)]))


async def append(conn: Any, pcm: np.ndarray, speed: float = 4.0) -> float:
    """Append ``pcm`` in 100 ms events, ``speed`` × faster than real time; returns when the last one went."""
    step = int(CHUNK_S * RATE)
    for at in range(0, len(pcm), step):
        chunk = pcm[at : at + step]
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk.tobytes()).decode())
        await asyncio.sleep(CHUNK_S / speed)
    return time.monotonic()


class Events:
    """Every server event of a connection, as dicts, read by a background task."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.all: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            raw = await self.conn.recv_bytes()
            event = self.conn.parse_event(raw)  # the SDK's own parsing, as recv() does it
            body = json.loads(raw)
            assert event.type == body["type"] and body["event_id"].startswith("event_")
            if not body["type"].startswith("assistant."):
                strict(body)
            self.all.append(body)
            self._new.set()

    def types(self, since: int = 0) -> list[str]:
        return [e["type"] for e in self.all[since:]]

    async def wait(self, kind: str, since: int = 0, timeout: float = 60.0, where: Any = None,
                   **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.all[since:]:
                if e["type"] == kind and all(e.get(k) == v for k, v in match.items()) and (where is None or where(e)):
                    return e
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} {match or ''} after {timeout} s; got {self.types(since)}")
            self._new.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), min(left, 1.0))

    def of(self, kind: str, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.all[since:] if e["type"] == kind]


@asynccontextmanager
async def connected(url: str, model: str = "echo", **query: str) -> AsyncIterator[tuple[Any, Events]]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
    async with client.realtime.connect(model=model, extra_query=query) as conn:
        events = Events(conn)
        try:
            await events.wait("session.created", timeout=10)
            yield conn, events
        finally:
            events.task.cancel()


def strict(event: dict[str, Any]) -> None:
    """The event passes the openai SDK's own model of server events, as the Agents SDK checks it (which first
    reads a null previous_item_id as "")."""
    if event.get("previous_item_id", "") is None:
        event = {**event, "previous_item_id": ""}
    STRICT.validate_python(event)


def reply_audio(events: Events, response_id: str) -> np.ndarray:
    deltas = [e["delta"] for e in events.all
              if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id]
    return np.frombuffer(b"".join(base64.b64decode(d) for d in deltas), dtype="<i2")


async def heard(services: Services, pcm24k: np.ndarray) -> str:
    """What our ASR hears in 24 kHz reply audio."""
    audio = resample(s16_to_float(pcm24k), RATE, SPEECH_RATE)
    return (await services.asr.transcribe(audio)).text.lower()


def in_order(types: list[str], *wanted: str) -> bool:
    """``wanted`` appear in ``types`` in this order (first occurrence of each, after the previous one)."""
    at = 0
    for kind in wanted:
        try:
            at = types.index(kind, at) + 1
        except ValueError:
            return False
    return True


async def test_spoken_turn_gets_transcription_and_audio_our_asr_understands(services: Services,
                                                                               shared_audio) -> None:
    async with serve(test_config(), services) as (url, app), connected(url, extensions="1") as (conn, ev):
        created = ev.of("session.created")[0]["session"]
        assert created["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert created["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        assert len(app[SESSIONS]) == 1  # a WebSocket session takes a session slot like a peer
        await append(conn, pcm24(shared_audio / "en_weather.wav", silence_s=2.5))
        done = await ev.wait("response.done")
        assert done["response"]["status"] == "completed", done
        types = ev.types()
        assert in_order(types, "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                        "input_audio_buffer.committed", "conversation.item.added",
                        "conversation.item.input_audio_transcription.completed", "conversation.item.done",
                        "response.created", "response.output_item.added", "response.content_part.added",
                        "response.output_audio_transcript.delta", "response.output_audio.delta",
                        "response.output_audio.done", "response.output_audio_transcript.done",
                        "response.content_part.done", "response.output_item.done", "response.done"), types
        transcript = ev.of("conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert "weather" in transcript.lower()
        said = ev.of("response.output_audio_transcript.done")[0]["transcript"]
        assert said.lower().startswith("you said") and "weather" in said.lower()
        audio = reply_audio(ev, done["response"]["id"])
        assert len(audio) > RATE  # more than a second of speech
        assert "weather" in await heard(services, audio)
        metrics = ev.of("assistant.turn_metrics")
        assert metrics and metrics[0]["response_id"] == done["response"]["id"]
        assert metrics[0]["durations_ms"]["server_v2v_ms"] > 0
        # The user item and the reply are in the conversation, in order, completed.
        output = done["response"]["output"][0]
        assert output["role"] == "assistant" and output["status"] == "completed"
        assert output["content"][0]["transcript"] == said


async def test_text_turn(services: Services) -> None:
    async with serve(test_config(), services) as (url, _app), connected(url) as (conn, ev):
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it"}]})
        added = await ev.wait("conversation.item.added")
        await conn.response.create()
        done = await ev.wait("response.done")
        assert done["response"]["status"] == "completed"
        said = ev.of("response.output_audio_transcript.done")[0]["transcript"]
        assert said == "You said: What time is it"
        assert "time" in await heard(services, reply_audio(ev, done["response"]["id"]))
        assert not ev.of("conversation.item.input_audio_transcription.completed")  # typed, not spoken
        assert not ev.of("assistant.turn_metrics")  # ours: only for a session that asks (?extensions=1)
        assert added["item"]["content"][0] == {"type": "input_text", "text": "What time is it"}
        # A second response.create while one is running is refused, as the reference does.
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two three four"}]})
        since = len(ev.all)
        await conn.response.create()
        await conn.response.create()
        err = await ev.wait("error", since)
        assert err["error"]["code"] == "conversation_already_has_active_response"
        await ev.wait("response.done", since)


async def test_barge_in_cancels_and_truncates_at_what_was_played(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, _app), connected(url) as (conn, ev):
        await append(conn, pcm24(shared_audio / "en_story.wav", silence_s=2.0))
        created = await ev.wait("response.created")
        rid = created["response"]["id"]
        await ev.wait("response.output_audio.delta", response_id=rid)
        await asyncio.sleep(1.0)  # the reply plays for a while (by the server's playout clock)
        since = len(ev.all)
        await append(conn, pcm24(shared_audio / "en_timer.wav", silence_s=2.0), speed=1.0)
        await ev.wait("input_audio_buffer.speech_started", since)
        done = await ev.wait("response.done")
        assert done["response"]["id"] == rid
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        # Over WebSocket the server's cut is announced a moment later, unless the client truncated first.
        truncated = [await ev.wait("conversation.item.truncated", since, timeout=5)]
        item = done["response"]["output"][0]
        assert truncated[0]["item_id"] == item["id"] and item["status"] == "incomplete"
        sent_ms = len(reply_audio(ev, rid)) * 1000 / RATE
        assert 500 < truncated[0]["audio_end_ms"] < sent_ms, (truncated[0], sent_ms)
        # The transcript keeps what was heard: a start of the full reply, not all of it.
        kept = item["content"][0]["transcript"]
        full = "".join(e["delta"] for e in ev.of("response.output_audio_transcript.delta")
                       if e["response_id"] == rid)
        assert kept and full.startswith(kept) and len(kept) < len(full)
        # The user's new words are the next turn.
        second = await ev.wait("response.done", since, where=lambda e: e["response"]["id"] != rid)
        assert second["response"]["status"] == "completed", second
        assert "timer" in second["response"]["output"][0]["content"][0]["transcript"].lower()


async def test_session_update_changes_voice_and_vad_silence(services: Services, shared_audio) -> None:
    pause = shared_audio / "en_pause_midsentence.wav"  # one sentence with a 400 ms pause in the middle
    async with serve(test_config(), services) as (url, app), connected(url) as (conn, ev):
        engine_voice = services.tts.voice_name
        await conn.session.update(session={"type": "realtime", "audio": {
            "output": {"voice": engine_voice},
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 1200}}}})
        updated = (await ev.wait("session.updated"))["session"]
        assert updated["audio"]["output"]["voice"] == engine_voice
        assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 1200
        session = next(iter(app[SESSIONS].values()))
        assert session.conversation.voice == engine_voice
        await append(conn, pcm24(pause, silence_s=2.5))
        await ev.wait("response.done")
        assert len(ev.of("input_audio_buffer.speech_stopped")) == 1  # the pause did not end the turn

        since = len(ev.all)
        await conn.session.update(session={"audio": {
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}}})
        await ev.wait("session.updated", since)
        await append(conn, pcm24(pause, silence_s=2.5))
        await ev.wait("response.done", since)
        await asyncio.sleep(1.0)
        assert len(ev.of("input_audio_buffer.speech_stopped", since)) == 2  # now it did

        since = len(ev.all)
        await conn.session.update(session={"audio": {"output": {"voice": "no-such-voice"}}})
        err = await ev.wait("error", since)
        assert err["error"]["code"] == "unknown_voice" and err["error"]["param"] == "session.audio.output.voice"
        assert session.conversation.voice == engine_voice  # nothing changed


async def test_a_turn_taken_back_leaves_no_reply_and_no_item(services: Services, shared_audio) -> None:
    """A turn committed on an unsure end (the 200 ms silence the client asked for, at the sentence's 400 ms pause) is
    taken back when the speaker goes on: a client reading text gets nothing of its reply, its response is
    cancelled, and its user item is deleted, so that the conversation holds the sentence once, as the model has
    it."""
    pause = shared_audio / "en_pause_midsentence.wav"  # "I would like to order [400 ms] a large pizza."
    cfg = test_config(turn={"speculative": False, "policy": "flat", "confirm_ms": 1000})
    async with serve(cfg, services) as (url, _app), connected(url) as (conn, ev):
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "audio": {
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}}})
        await ev.wait("session.updated")
        await append(conn, pcm24(pause, silence_s=2.5), speed=1.0)
        done = await ev.wait("response.done", where=lambda e: e["response"]["status"] == "completed")
        stopped = ev.of("input_audio_buffer.speech_stopped")
        assert len(stopped) == 2, ev.types()  # the pause ended a turn
        first, second = (e["item_id"] for e in stopped)
        assert [e["item_id"] for e in ev.of("conversation.item.deleted")] == [first]
        taken_back = [e["response"] for e in ev.of("response.done") if e["response"]["id"] != done["response"]["id"]]
        assert [r["status"] for r in taken_back] == ["cancelled"] and not taken_back[0]["output"]
        texts = ev.of("response.output_text.delta")
        assert texts and {e["response_id"] for e in texts} == {done["response"]["id"]}
        said = "".join(e["delta"] for e in texts).lower()
        assert said.startswith("you said") and "pizza" in said and said.count("order") == 1, said
        words = ev.of("conversation.item.input_audio_transcription.completed")
        assert words[-1]["item_id"] == second and "order" in words[-1]["transcript"].lower()


async def test_bench_ws_turn_measures_the_first_delta(services: Services, shared_audio) -> None:
    """The bench's WebSocket client (assistant bench v2v --protocol realtime-ws): both ways of ending a turn."""
    import aiohttp

    from assistant.bench.audio_source import load_utterance
    from assistant.bench.realtime_client import ws_turn

    utt = load_utterance(shared_audio / "en_weather.wav")
    async with serve(test_config(), services) as (url, _app), aiohttp.ClientSession() as http:
        for mode in ("server_vad", "commit"):
            turn = await ws_turn(http, url, utt, mode=mode)
            assert not turn.error, turn
            assert turn.first_delta_ms is not None and turn.first_delta_ms > 0, turn
            assert "weather" in turn.transcript.lower() and "weather" in turn.reply.lower()
            assert turn.server.get("server_v2v_ms", 0) > 0
