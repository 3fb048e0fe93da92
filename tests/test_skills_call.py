"""Skills on a real call (a real aiortc peer on loopback, the real app and the default CPU stack): a timer set on
a call rings on that call, through the speech path, and the page sees it come and go on the events channel; it
waits for the user's turn and gives way when talked over; a call that ends cancels its timers; the page's time
zone is checked; a reply that loops stops at its last new sentence, and the responder's stream is closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession
from assistant.respond.base import Message
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


def kinds(client: BenchSession, kind: str) -> list[dict[str, Any]]:
    return [e.body for e in client.events if e.body.get("type") == kind]


def texts(client: BenchSession) -> list[str]:
    """The final text of each turn's reply, as the page was sent it."""
    last: dict[int, str] = {}
    for e in kinds(client, "reply_text"):
        last[e["turn"]] = e["text"]
    return [last[t] for t in sorted(last)]


async def test_a_timer_rings_on_its_call_and_ends_with_it(services: Services) -> None:
    cfg = test_config(respond={"intents": "always"}, server={"idle_timeout_s": 60.0})  # echo, with the intent step
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            session = app[SESSIONS][client.session_id]
            # The page sends the browser's time zone; a bad one is an error event, and the call goes on.
            client.channel.send(json.dumps({"type": "timezone", "timezone": "Mars/Olympus_Mons"}))
            client.channel.send(json.dumps({"type": "timezone", "timezone": "Asia/Tokyo"}))
            await until(lambda: str(session.call.timezone) == "Asia/Tokyo", "the page's time zone taken")
            await until(lambda: kinds(client, "error"), "the bad time zone refused")
            assert [e["stage"] for e in kinds(client, "error")] == ["timezone"]

            session.conversation.respond_to(text="Set a timer for two seconds.")
            await until(lambda: texts(client)[-1:] == ["Your 2 second timer is done."], "the timer's own words",
                        timeout_s=60)
            assert texts(client) == ["Timer set for 2 seconds.", "Your 2 second timer is done."]
            timer_events = kinds(client, "timer")
            assert [(e["action"], len(e["timers"])) for e in timer_events] == [("set", 1), ("done", 0)]
            assert timer_events[0]["timer"]["kind"] == "timer" and timer_events[0]["timer"]["seconds"] == 2
            # The page heard it: the reply's first audible frame went out for that turn too, and it ended.
            await until(lambda: [e["turn"] for e in kinds(client, "reply_done")] == [1, 2], "the timer's words said")
            assert sorted(e["turn"] for e in kinds(client, "reply_audio_start")) == [1, 2]
            # Not a turn the user waited on: no latency row for it.
            assert [e["turn"] for e in kinds(client, "turn_metrics")] == [1]

            session.conversation.respond_to(text="Set a timer for ten minutes.")
            await until(lambda: len(kinds(client, "timer")) == 3, "the second timer set")
            assert session.timers is not None and len(session.timers.timers) == 1
            handle = session.timers.timers[0].handle
        finally:
            await client.close()
        await until(lambda: session.closed, "the call closed")
        assert session.timers.timers == [] and handle is not None and handle.cancelled()


LONG = ("take the bags to the car, then come back for the keys, the wallet, the tickets and the passports, and check "
        "that the windows are shut")


async def test_a_timer_waits_for_the_users_turn_and_gives_way_when_talked_over(services: Services,
                                                                                 shared_audio: Path) -> None:
    """A reminder that rings while the user speaks waits for their turn and its reply; the user talking over the
    reminder cuts it (barge-in), and their words are the next turn."""
    cfg = test_config(respond={"intents": "always"}, server={"idle_timeout_s": 60.0})
    story, weather = (load_utterance(shared_audio / f"en_{name}.wav") for name in ("story", "weather"))
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            session = app[SESSIONS][client.session_id]
            assert session.timers is not None
            client.source.play(story)
            await until(lambda: kinds(client, "speech_start"), "the user speaking", timeout_s=30)
            session.timers.add("reminder", 1, label=LONG)  # rings while the user is still talking
            await until(lambda: [e for e in kinds(client, "timer") if e["action"] == "done"], "the reminder due")
            await until(lambda: [t for t in texts(client) if t.startswith("Here's your reminder")],
                        "the reminder said", timeout_s=90)
            user_turn = next(e["turn"] for e in kinds(client, "transcript") if e.get("final"))
            reminder_turn = next(e["turn"] for e in kinds(client, "reply_text") if e["text"].startswith("Here's"))
            assert reminder_turn == user_turn + 1  # after the user's turn and its reply, not over them
            done = [e["turn"] for e in kinds(client, "reply_done")]
            assert user_turn in done and not [e for e in kinds(client, "interrupted") if e["turn"] == user_turn]
            # The user talks over the reminder: it gives way, and their words are a turn of their own.
            await until(lambda: [e for e in kinds(client, "reply_audio_start") if e["turn"] == reminder_turn],
                        "the reminder heard", timeout_s=60)
            client.source.play(weather)
            await until(lambda: [e for e in kinds(client, "interrupted") if e["turn"] == reminder_turn],
                        "the reminder cut by the user", timeout_s=60)
            await until(lambda: [e for e in kinds(client, "transcript")
                                 if e.get("final") and "weather" in e["text"].lower()], "the user's next turn",
                        timeout_s=60)
        finally:
            await client.close()


class LoopingResponder:
    """A responder that loops for ever (a small model decoding greedily), a few letters at a time."""

    name = "looping"

    def __init__(self) -> None:
        self.closed = 0

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        line = "I'm sorry, I'm not a phonebot. I'm a voice assistant. "
        try:
            while True:
                for i in range(0, len(line), 4):
                    await asyncio.sleep(0)
                    yield line[i:i + 4]
        finally:
            self.closed += 1


async def test_a_reply_that_loops_stops_at_its_last_new_sentence(services: Services) -> None:
    cfg = test_config(respond={"engine": "tests.test_skills_call:LoopingResponder"})
    own = Services(cfg)  # the loaded engines, with this config's responder
    own.vad_model, own.asr, own.tts, own.end_of_turn = (services.vad_model, services.asr, services.tts,
                                                       services.end_of_turn)
    async with serve(cfg, own) as (url, app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            app[SESSIONS][client.session_id].conversation.respond_to(text="Who are you?")
            await until(lambda: kinds(client, "reply_done"), "the reply done", timeout_s=60)
        finally:
            await client.close()
    assert texts(client) == ["I'm sorry, I'm not a phonebot. I'm a voice assistant."]
    assert getattr(own.responder, "closed", None) == 1  # the responder's stream was closed: it stops generating
