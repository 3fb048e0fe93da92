"""The Realtime API where a client can tell it from the reference (issue 31's "Why"): only standard events unless a
session asks for ours, ``usage`` always an object, truncation that clamps and stands, responses with no new input
and out of band, the turn-detection switches (create_response, interrupt_response, idle_timeout_ms), commit and
clear under server VAD, session.update field by field, tools with a responder that cannot call them, transcription
deltas while the user speaks, evicted items, and prefix padding. A raw WebSocket client over the real app and the
default CPU stack (echo responder); every server event is checked against the openai SDK's own model of it."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
import numpy as np
import pytest

from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_realtime_ws import RATE, pcm24, strict

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


class Client:
    """A raw /v1/realtime client: every server event kept (and checked), in order, by a reader task."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.all: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                break
            event = json.loads(msg.data)
            if not event["type"].startswith("assistant."):
                strict(event)
            self.all.append(event)
            self._new.set()

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_str(json.dumps(event))

    async def append(self, pcm: np.ndarray, speed: float = 4.0, chunk_s: float = 0.1) -> None:
        """``pcm`` in ``chunk_s`` events, ``speed`` × real time, each at its own time from the start: a busy loop
        delays an event, never the ones after it (a sleep after each send fell behind: at speed 1 on a loaded CI
        machine, 4.17 s of audio had gone in 5 s, and the idle timeout's audio span came out short)."""
        step = int(chunk_s * RATE)
        start = time.monotonic()
        for k, at in enumerate(range(0, len(pcm), step)):
            await self.send({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(pcm[at: at + step].tobytes()).decode()})
            await asyncio.sleep(max(0.0, start + (k + 1) * chunk_s / speed - time.monotonic()))

    def of(self, kind: str, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.all[since:] if e["type"] == kind]

    def types(self, since: int = 0) -> list[str]:
        return [e["type"] for e in self.all[since:]]

    async def wait(self, kind: str, since: int = 0, timeout: float = 60.0,
                   where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.all[since:]:
                if e["type"] == kind and (where is None or where(e)):
                    return e
            left = deadline - time.monotonic()
            if left <= 0 or self.task.done():
                raise AssertionError(f"no {kind} after {timeout} s; got {self.types(since)}")
            self._new.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), min(left, 1.0))

    async def response(self, since: int = 0, timeout: float = 60.0) -> dict[str, Any]:
        """The next response.done after ``since``."""
        return (await self.wait("response.done", since, timeout))["response"]

    async def text_turn(self, words: str, since: int | None = None, **response: Any) -> dict[str, Any]:
        since = len(self.all) if since is None else since
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": words}]}})
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        return await self.response(since)


@asynccontextmanager
async def client(url: str, query: str = "model=echo") -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as http, http.ws_connect(
            url.replace("http", "ws", 1) + f"/v1/realtime?{query}", max_msg_size=0) as ws:
        c = Client(ws)
        try:
            await c.wait("session.created", timeout=10)
            yield c
        finally:
            c.task.cancel()


def said(resp: dict[str, Any]) -> str:
    msg = next(o for o in resp["output"] if o["type"] == "message")
    part = msg["content"][0]
    return str(part.get("transcript") if "transcript" in part else part.get("text"))


async def test_standard_events_only_unless_asked_and_usage_always_an_object(services: Services) -> None:
    async with serve(test_config(), services) as (url, _app):
        async with client(url) as c:
            resp = await c.text_turn("What time is it")
            assert resp["status"] == "completed"
            assert not [t for t in c.types() if t.startswith("assistant.")]
            usage = resp["usage"]
            assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
            # Audio tokens from the reply's duration (about 20 a second), text tokens from the words.
            assert usage["output_token_details"]["audio_tokens"] > 10
            assert usage["output_token_details"]["text_tokens"] == -(-len("You said: What time is it") // 4)
            created = c.of("response.created")[0]["response"]
            assert created["usage"] is None  # in progress: nothing counted yet
            assert c.types().index("rate_limits.updated") == c.types().index("response.created") + 1
        async with client(url, "model=echo&extensions=1") as c:
            await c.text_turn("What time is it")
            metrics = await c.wait("assistant.turn_metrics")
            assert metrics["durations_ms"]["server_v2v_ms"] > 0


async def test_response_with_no_new_input_and_out_of_band(services: Services) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        # "Bot speaks first": nothing in the conversation, only the instructions.
        await c.send({"type": "session.update", "session": {"instructions": "Greet the caller."}})
        await c.send({"type": "response.create"})
        first = await c.response()
        assert first["status"] == "completed" and said(first) == "You said: Greet the caller."
        assert c.of("response.output_audio.delta")
        # Again with nothing new: answered from the conversation so far (the user's latest words).
        await c.text_turn("one two three")
        since = len(c.all)
        await c.send({"type": "response.create", "response": {"metadata": {"topic": "again"}}})
        again = await c.response(since)
        assert said(again) == "You said: one two three" and again["metadata"] == {"topic": "again"}
        # Out of band: the same events, but nothing enters the conversation.
        since = len(c.all)
        await c.send({"type": "response.create", "response": {
            "conversation": "none", "output_modalities": ["text"], "metadata": {"kind": "summary"},
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "sum up"}]}]}})
        oob = await c.response(since)
        assert oob["status"] == "completed" and oob["conversation_id"] is None
        assert said(oob) == "You said: sum up" and oob["metadata"] == {"kind": "summary"}
        assert not c.of("conversation.item.added", since) and c.of("response.output_text.done", since)
        await c.send({"type": "conversation.item.retrieve", "item_id": oob["output"][0]["id"]})
        err = await c.wait("error", since)
        assert err["error"]["code"] == "item_retrieve_invalid_item_id"
        # An out-of-band response referencing an item of the conversation.
        user_items = [e["item"] for e in c.of("conversation.item.added") if e["item"].get("role") == "user"]
        since = len(c.all)
        await c.send({"type": "response.create", "response": {
            "conversation": "none", "input": [{"type": "item_reference", "id": user_items[0]["id"]}]}})
        ref = await c.response(since)
        assert said(ref) == "You said: one two three"


async def test_session_update_applies_field_by_field_and_tools_are_accepted(services: Services) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    async with serve(test_config(), services) as (url, _app), client(url, "model=echo&extensions=1") as c:
        await c.send({"type": "session.update", "event_id": "evt_9", "session": {
            "instructions": "Be brief.", "colour": "blue", "tools": [tool],
            "audio": {"output": {"voice": "no-such-voice"}, "input": {"turn_detection": {
                "type": "server_vad", "silence_duration_ms": 700, "create_response": False}}}}})
        updated = (await c.wait("session.updated"))["session"]
        errors = {e["error"]["param"]: e["error"] for e in c.of("error")}
        assert set(errors) == {"session.colour", "session.audio.output.voice"}, errors
        assert errors["session.colour"]["code"] == "unknown_parameter"
        assert all(e["event_id"] == "evt_9" for e in errors.values())
        assert updated["instructions"] == "Be brief." and updated["tools"][0]["name"] == "get_weather"
        assert updated["audio"]["output"]["voice"] == "default"  # the wrong voice changed nothing
        td = updated["audio"]["input"]["turn_detection"]
        assert (td["silence_duration_ms"], td["create_response"]) == (700, False)
        # Echo cannot call tools: accepted, said once (our notice; a standard client never sees it).
        await c.send({"type": "session.update", "session": {"tools": [tool, {**tool, "name": "other"}]}})
        await c.wait("session.updated", where=lambda e: len(e["session"]["tools"]) == 2)
        notices = c.of("assistant.notice")
        assert len(notices) == 1 and notices[0]["code"] == "tools_unsupported"
        resp = await c.text_turn("hello there")
        assert resp["status"] == "completed" and said(resp) == "You said: hello there"
        assert len(c.of("error")) == 2


async def test_truncation_clamps_and_the_clients_cut_stands(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        resp = await c.text_turn("Tell me a short story about a cat who learns to play the piano")
        msg = resp["output"][0]
        sent_ms = sum(len(base64.b64decode(e["delta"])) for e in c.of("response.output_audio.delta")) / 48
        since = len(c.all)
        await c.send({"type": "conversation.item.truncate", "item_id": msg["id"], "content_index": 0,
                      "audio_end_ms": int(sent_ms) + 250})  # past the end: clamped, not an error
        cut = await c.wait("conversation.item.truncated", since)
        assert cut["audio_end_ms"] == int(sent_ms + 0.999)
        await c.send({"type": "conversation.item.truncate", "item_id": msg["id"], "content_index": 0,
                      "audio_end_ms": 1000})
        await c.wait("conversation.item.truncated", since, where=lambda e: e["audio_end_ms"] == 1000)
        await c.send({"type": "conversation.item.retrieve", "item_id": msg["id"]})
        kept = (await c.wait("conversation.item.retrieved", since))["item"]["content"][0]["transcript"]
        assert kept and len(kept) < len(said(resp)) and said(resp).startswith(kept)
        assert not c.of("error", since)

        # A barge-in where the client cuts first (as the Agents SDK and LiveKit do on speech_started): one
        # truncated event, at the client's cut.
        since = len(c.all)
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a short story about a cat who learns to play the piano"}]}})
        await c.send({"type": "response.create"})
        delta = await c.wait("response.output_audio.delta", since)
        await asyncio.sleep(0.6)
        speak = asyncio.create_task(c.append(pcm24(shared_audio / "en_timer.wav", 2.0), speed=1.0))
        await c.wait("input_audio_buffer.speech_started", since)
        await c.send({"type": "conversation.item.truncate", "item_id": delta["item_id"], "content_index": 0,
                      "audio_end_ms": 640})
        done = await c.wait("response.done", since)
        assert done["response"]["status"] == "cancelled"
        await c.wait("conversation.item.truncated", since)
        await speak
        await c.wait("response.done", since, where=lambda e: e["response"]["id"] != done["response"]["id"])
        truncated = c.of("conversation.item.truncated", since)  # seconds after the barge-in: ours never came
        assert [t["audio_end_ms"] for t in truncated] == [640], truncated
        assert not c.of("error", since)


async def test_create_response_off_and_commit_clear_under_server_vad(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        await c.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "create_response": False}}}}})
        await c.wait("session.updated")
        await c.append(pcm24(shared_audio / "en_weather.wav", 2.0))
        done = await c.wait("conversation.item.input_audio_transcription.completed")
        assert "weather" in done["transcript"].lower()
        await asyncio.sleep(1.0)
        assert not c.of("response.created")  # the client asks for responses itself
        since = len(c.all)
        await c.send({"type": "response.create"})
        resp = await c.response(since)
        assert "weather" in said(resp).lower()

        # commit while the user speaks ends the utterance now; the turn follows (no response: create_response off)
        since = len(c.all)
        x = pcm24(shared_audio / "en_story.wav")
        await c.append(x[: int(2.2 * RATE)])  # speaking, mid-sentence
        await c.wait("input_audio_buffer.speech_started", since)
        await c.send({"type": "input_audio_buffer.commit"})
        stopped = await c.wait("input_audio_buffer.speech_stopped", since)
        await c.wait("input_audio_buffer.committed", since, where=lambda e: e["item_id"] == stopped["item_id"])
        words = await c.wait("conversation.item.input_audio_transcription.completed", since)
        assert "story" in words["transcript"].lower()
        # clear while the user speaks drops the utterance: no speech_stopped, no item
        since = len(c.all)
        await c.append(x[: int(2.2 * RATE)])
        started = await c.wait("input_audio_buffer.speech_started", since)
        await c.send({"type": "input_audio_buffer.clear"})
        await c.wait("input_audio_buffer.cleared", since)
        await c.send({"type": "input_audio_buffer.commit"})  # nothing since the clear: the reference's error
        err = await c.wait("error", since)
        assert err["error"]["code"] == "input_audio_buffer_commit_empty"
        await c.append(np.zeros(RATE, dtype=np.int16))
        assert not [e for e in c.of("input_audio_buffer.speech_stopped", since) if e["item_id"] == started["item_id"]]
        await c.send({"type": "input_audio_buffer.commit"})  # audio with no speech in it: a user item all the same
        committed = await c.wait("input_audio_buffer.committed", since)
        added = await c.wait("conversation.item.added", since, where=lambda e: e["item"]["id"] == committed["item_id"])
        assert added["item"]["content"][0]["type"] == "input_audio"


async def test_interrupt_response_off_keeps_the_reply_and_the_words(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        await c.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "interrupt_response": False}}}}})
        await c.wait("session.updated")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a short story about a cat who learns to play the piano"}]}})
        await c.send({"type": "response.create"})
        await c.wait("response.output_audio.delta")
        await c.append(pcm24(shared_audio / "en_timer.wav", 1.5), speed=1.0)  # spoken over the reply
        first = await c.response()
        assert first["status"] == "completed"  # it played on
        words = await c.wait("conversation.item.input_audio_transcription.completed")
        assert "timer" in words["transcript"].lower()
        assert not c.of("conversation.item.deleted") and not c.of("conversation.item.truncated")
        since = len(c.all)
        await c.send({"type": "response.create"})  # the words said over the reply are the next one's input
        assert "timer" in said(await c.response(since)).lower()


async def test_idle_timeout_asks_for_a_response(services: Services) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        await c.send({"type": "session.update", "session": {"instructions": "Are you still there?", "audio": {
            "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}}})
        await c.wait("session.updated")
        silence = asyncio.create_task(c.append(np.zeros(7 * RATE, dtype=np.int16), speed=1.0))
        timeout = await c.wait("input_audio_buffer.timeout_triggered", timeout=20)
        assert 4500 <= timeout["audio_end_ms"] - timeout["audio_start_ms"] <= 5500
        types = c.types()
        at = types.index("input_audio_buffer.timeout_triggered")
        assert types[at + 1: at + 3] == ["input_audio_buffer.committed", "conversation.item.added"]
        resp = await c.response(timeout=20)
        assert resp["status"] == "completed" and said(resp) == "You said: Are you still there?"
        silence.cancel()


async def test_transcription_deltas_while_the_user_speaks(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, _app), client(url) as c:
        await c.append(pcm24(shared_audio / "en_pause_midsentence.wav", 2.5), speed=1.0)
        done = await c.wait("conversation.item.input_audio_transcription.completed")
        stopped = c.of("input_audio_buffer.speech_stopped")[-1]
        deltas = [e for e in c.of("conversation.item.input_audio_transcription.delta")
                  if e["item_id"] == done["item_id"]]
        first = c.all.index(deltas[0])
        assert first < c.all.index(stopped), "a delta from the speculative pass before the speech ended"
        assert "".join(d["delta"] for d in deltas) == done["transcript"]
        assert "pizza" in done["transcript"].lower()


async def test_evicted_items_are_deleted_and_prefix_padding_moves_audio_start(services: Services,
                                                                              shared_audio) -> None:
    cfg = test_config(realtime={"max_items": 3})
    async with serve(cfg, services) as (url, _app), client(url) as c:
        ids = []
        for k in range(5):
            await c.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "system", "content": [{"type": "input_text", "text": f"note {k}"}]}})
            ids.append((await c.wait("conversation.item.added", where=lambda e, k=k:
                                     e["item"]["content"][0]["text"] == f"note {k}"))["item"]["id"])
        deleted = [e["item_id"] for e in c.of("conversation.item.deleted")]
        assert deleted == ids[:2]
        starts = []
        for pad in (96, 400):
            since = len(c.all)
            await c.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
                "type": "server_vad", "prefix_padding_ms": pad}}}}})
            await c.wait("session.updated", since)
            await c.append(pcm24(shared_audio / "en_weather.wav", 2.0))
            started = await c.wait("input_audio_buffer.speech_started", since)
            await c.response(since)
            starts.append(started["audio_start_ms"])
        # The same audio twice: the second start is 304 ms earlier in its clip (its padding), on the session's clock.
        clip_ms = round(len(pcm24(shared_audio / "en_weather.wav", 2.0)) * 1000 / RATE)
        first, second = starts[0], starts[1] - clip_ms
        assert abs((first - second) - (400 - 96)) <= 40, (first, second)
