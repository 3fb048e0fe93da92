"""Skills (respond/skills/): each built-in answers exactly, the intent step finds what is clearly a skill in the
languages we hear and leaves the rest to the model, a run is bounded in time and size, a call's timers are its own
and bounded, and a model that calls tools gets the skills beside a client's own tools (a local chat-completions
server plays the model)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import pytest
from aiohttp import web

from assistant.config import ConfigError, load_config
from assistant.respond.base import Message, ReplyOptions, ToolCall, reply_stream
from assistant.respond.echo import EchoResponder
from assistant.respond.openai import OpenAIResponder
from assistant.respond.skills import Asked, CallContext, SkillError, Skills, load_skills, tool_schema, with_skills
from assistant.respond.skills.calculator import evaluate
from assistant.respond.skills.numbers import parse_cjk, parse_english, say_number
from assistant.respond.skills.responder import SkillfulMessagesResponder, SkillfulResponder
from assistant.respond.skills.timers import CallTimers, english_duration
from assistant.respond.skills.units import convert
from tests.test_respond import FakeLLM, chunk, sse, stream
from tests.waiting import until

NOON = dt.datetime(2025, 6, 14, 12, 0, tzinfo=dt.UTC)  # a Saturday


def skills() -> Skills:
    return load_skills(["clock", "calculator", "units", "timers"])


def call_at(now: dt.datetime = NOON, zone: str = "UTC", timers: CallTimers | None = None) -> CallContext:
    return CallContext(timezone=ZoneInfo(zone), timers=timers, clock=lambda: now)


def new_timers(rung: list[str] | None = None, changes: list[tuple[str, int]] | None = None, *, max_timers: int = 3,
               max_seconds: float = 3600.0) -> CallTimers:
    return CallTimers(max_timers=max_timers, max_seconds=max_seconds,
                      on_due=lambda timer, text: rung.append(text) if rung is not None else None,
                      on_change=lambda action, timer, _: changes.append((action, timer.id))
                      if changes is not None else None)


async def answer(text: str, language: str = "en", call: CallContext | None = None) -> tuple[str, str]:
    """(the skill that answered, what it said); ("", "") when the intent step leaves it to the model."""
    sk, c = skills(), call or call_at()
    routed = sk.route(text, language, c)
    if routed is None:
        return "", ""
    return routed.skill, await sk.run(routed.skill, routed.arguments, language, c)


# --- numbers ------------------------------------------------------------------------------------------------------
def test_numbers_as_people_say_them() -> None:
    assert parse_english("two hundred and five") == 205
    assert parse_english("a dozen") == 12 and parse_english("three point five") == 3.5
    assert parse_english("1,500") == 1500 and parse_english("twenty-one") == 21
    assert parse_english("two and a half") == 2.5 and parse_english("banana") is None
    assert parse_cjk("三千五百") == 3500 and parse_cjk("二十五") == 25 and parse_cjk("十") == 10
    assert parse_cjk("一万二千") == 12000 and parse_cjk("３") == 3 and parse_cjk("北京") is None
    assert say_number(5.0) == "5" and say_number(1 / 3) == "0.3333" and say_number(1234.56) == "1235"
    assert say_number(-2.5) == "-2.5"


# --- the skills, through the intent step ----------------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize(("text", "language", "skill", "said"), [
    ("What is two plus three?", "en", "calculate", "2 plus 3 is 5."),
    ("What's 15 percent of 80?", "en", "calculate", "15 percent of 80 is 12."),
    ("How much is seven divided by two?", "en", "calculate", "7 divided by 2 is 3.5."),
    ("What is the square root of 81?", "en", "calculate", "The square root of 81 is 9."),
    ("What's 10 divided by 0?", "en", "calculate", "You can't divide by zero."),
    ("What is 12-3?", "en", "calculate", "12 minus 3 is 9."),
    ("三加五等于几？", "zh", "calculate", "3加5等于8。"),
    ("十割る四は何ですか", "ja", "calculate", "10割る4は2.5です。"),
    ("3 더하기 5는?", "ko", "calculate", "3 더하기 5의 답은 8입니다."),
    ("How many minutes are in an hour?", "en", "convert_units", "There are 60 minutes in an hour."),
    ("How many days are in a year?", "en", "convert_units", "There are 365 days in a year (366 in a leap year)."),
    ("Convert 5 miles to kilometres.", "en", "convert_units", "5 miles is about 8.047 kilometres."),
    ("What is 100 fahrenheit in celsius?", "en", "convert_units",
     "100 degrees Fahrenheit is about 37.78 degrees Celsius."),
    ("一小时有多少分钟？", "zh", "convert_units", "1小时等于60分钟。"),
    ("1時間は何分ですか", "ja", "convert_units", "1時間は60分です。"),
    ("하루는 몇 시간이에요?", "ko", "convert_units", "1일은 24시간입니다."),
    ("What time is it?", "en", "get_time", "It's 2:00 PM."),
    ("What's the date today?", "en", "get_time", "Today is Saturday, June 14, 2025."),
    ("What time is it in Tokyo?", "en", "get_time", "In Tokyo, it's 9:00 PM."),
    ("现在几点了？", "zh", "get_time", "现在是下午2点。"),
    ("今日は何曜日ですか", "ja", "get_time", "今日は2025年6月14日、土曜日です。"),
    ("지금 몇 시예요?", "ko", "get_time", "지금은 오후 2시입니다."),
])
async def test_a_skill_request_is_answered_exactly(text: str, language: str, skill: str, said: str) -> None:
    # The user is in Paris (UTC+2 in June): the clock answers in their zone, a city's in its own.
    assert await answer(text, language, call_at(zone="Europe/Paris")) == (skill, said)


@pytest.mark.asyncio
@pytest.mark.parametrize(("text", "language"), [
    ("What is the capital of France?", "en"), ("What is the opposite of big?", "en"),
    ("How many legs does a dog have?", "en"), ("How do I boil an egg?", "en"), ("What time should I leave?", "en"),
    ("Give me a dinner idea.", "en"), ("What colour is the sky?", "en"), ("中国的首都是哪里？", "zh"),
    ("日本の首都はどこですか？", "ja"), ("Bonjour, comment ça va ?", "fr"), ("What is one and one?", "en"),
    # a phone number, a date or a code is not a sum, nor a sentence with words left around the digits
    ("My number is 555-213-4490.", "en"), ("Send it to 1-800-555-0199.", "en"), ("What is 2021-11-05?", "en"),
    ("My code is 12-34-56.", "en"), ("My number is 555-2134.", "en"),
])
async def test_the_rest_is_left_to_the_model(text: str, language: str) -> None:
    assert await answer(text, language, call_at(timers=new_timers())) == ("", "")


def test_arithmetic_is_parsed_never_evaluated_as_python() -> None:
    assert evaluate("2 + 3 * 4") == (14, 2) and evaluate("(2 + 3) * 4") == (20, 2)
    assert evaluate("2 ^ 3 ^ 2")[0] == 512  # right-associative, as written
    for bad in ("__import__('os')", "2 +", "1e400", "9 ^ 9999", "2 ** 3", "x + 1"):
        with pytest.raises((ValueError, OverflowError)):
            evaluate(bad)
    assert convert(0, "c", "f") == 32 and round(convert(1, "mi", "km"), 6) == 1.609344
    with pytest.raises(ValueError):
        convert(1, "kg", "m")


# --- timers ---------------------------------------------------------------------------------------------------------
def test_durations_as_people_say_them() -> None:
    assert english_duration("ten minutes") == 600 and english_duration("an hour and a half") == 5400
    assert english_duration("1 hour and 30 minutes") == 5400 and english_duration("90 seconds") == 90
    assert english_duration("half an hour") == 1800 and english_duration("soon") is None


@pytest.mark.asyncio
async def test_timers_are_bounded_ring_once_and_end_with_the_call() -> None:
    rung: list[str] = []
    changes: list[tuple[str, int]] = []
    timers = new_timers(rung, changes, max_timers=3, max_seconds=3600)
    call = call_at(timers=timers)
    assert await answer("Set a timer for one second.", call=call) == ("set_timer", "Timer set for 1 second.")
    await until(lambda: rung, "the timer rang")
    assert rung == ["Your 1 second timer is done."] and changes == [("set", 1), ("done", 1)]
    # A reminder said back to the one who asked, and the bounds said plainly.
    assert await answer("Remind me to call my sister in 20 minutes.", call=call) == (
        "set_timer", "OK, I'll remind you to call your sister in 20 minutes.")
    assert (await answer("Set a timer for two hours.", call=call))[1].startswith("Sorry, I can't set it that far")
    assert (await answer("Remind me to call my mother tomorrow morning.", call=call))[1].startswith(
        "Sorry, I can't set it that far ahead")
    assert await answer("Start a timer for the eggs.", call=call) == (
        "set_timer", "For how long? Say, for example, set a timer for five minutes.")
    for _ in range(2):
        await answer("Set a timer for ten minutes.", call=call)
    assert (await answer("Set a timer for five minutes.", call=call))[1] == \
        "Sorry, I can't keep more than 3 timers on one call."
    skill, said = await answer("How much time is left on my timer?", call=call)
    assert (skill, said) == ("list_timers", "Time left on your 10 minute timer: 10 minutes; 10 minute timer: "
                                            "10 minutes; reminder to call your sister: 20 minutes.")
    assert await answer("Cancel the reminder.", call=call) == ("cancel_timer",
                                                               "Cancelled your reminder to call your sister.")
    # The call ends: the rest are cancelled and none rings (the loop would have run them: 10 minutes is not waited
    # for, but a cancelled handle is gone from the loop's schedule at once).
    handles = [t.handle for t in timers.timers]
    timers.close()
    assert timers.timers == [] and all(h is not None and h.cancelled() for h in handles)
    with pytest.raises(SkillError):
        timers.add("timer", 5)
    assert len(rung) == 1


@pytest.mark.asyncio
async def test_an_alarm_is_the_next_such_time_in_the_users_zone() -> None:
    call = call_at(dt.datetime(2025, 6, 14, 4, 30, tzinfo=dt.UTC), "America/New_York",
                   new_timers(max_seconds=12 * 3600))  # 00:30 in New York
    assert await answer("Set an alarm for seven a.m.", call=call) == (
        "set_timer", "Alarm set for 7:00 AM, in 6 hours and 30 minutes.")
    assert await answer("Remind me to call Tom at half past six.", call=call) == (
        "set_timer", "OK, I'll remind you to call Tom at 6:30 AM.")
    late = call_at(dt.datetime(2025, 6, 14, 20, 0, tzinfo=dt.UTC), "America/New_York", new_timers())
    assert (await answer("Set an alarm for seven a.m.", call=late))[1].startswith("Sorry, I can't set it that far")
    for c in (call, late):
        assert c.timers is not None
        c.timers.close()  # type: ignore[attr-defined]


class SendSkill:
    """A plug-in that acts (it says nothing of ``acts``, so it is taken to), with its own undo."""

    name = "send"
    description = "Sends a message."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def run(self, asked: Asked) -> str:
        self.sent.append("hi")
        asked.on_undo(lambda: self.sent.append("unsent"))
        return "Sent."


@pytest.mark.asyncio
async def test_a_skill_that_acts_runs_once_the_turn_is_sure_and_is_undone_if_it_never_counts() -> None:
    """On a turn not yet sure (a speculation, an unsure end) a skill that answers runs at once, one that acts waits;
    a turn dropped while it waits never acts, and one that never counts (kept cancelled) takes its act back."""
    loop = asyncio.get_running_loop()
    changes: list[tuple[str, int]] = []
    timers = new_timers(changes=changes, max_timers=5)
    call = call_at(timers=timers)
    sk = skills()
    sure, kept = asyncio.Event(), loop.create_future()
    assert await sk.run("list_timers", {}, "en", call, sure=sure, kept=kept) == "You have no timers."  # at once
    asked = asyncio.create_task(sk.run("set_timer", {"seconds": 600}, "en", call, sure=sure, kept=kept))
    await asyncio.sleep(0.05)
    assert not asked.done() and timers.timers == []  # waits for the turn to be sure
    sure.set()
    assert await asked == "Timer set for 10 minutes." and len(timers.timers) == 1
    kept.set_result("Timer set for 10 minutes.")  # the turn counted: the timer stays
    assert len(timers.timers) == 1 and changes == [("set", 1)]

    dropped = asyncio.create_task(sk.run("set_timer", {"seconds": 60}, "en", call, sure=asyncio.Event()))
    await asyncio.sleep(0.05)
    dropped.cancel()  # the speaker went on: the turn is cancelled before its end was sure
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert len(timers.timers) == 1 and changes == [("set", 1)]

    # Sure, acted, then never counted (dropped just after its reply began, or failed): taken back.
    kept = loop.create_future()
    assert await sk.run("set_timer", {"seconds": 60}, "en", call, sure=sure, kept=kept) == "Timer set for 1 minute."
    assert len(timers.timers) == 2
    kept.cancel()
    await until(lambda: len(timers.timers) == 1, "the timer taken back")
    assert changes[-2:] == [("set", 2), ("cancelled", 2)]
    # A cancel taken back: the timers run again, to their old end.
    due = timers.timers[0].due
    kept = loop.create_future()
    assert await sk.run("cancel_timer", {"which": "all"}, "en", call, sure=sure, kept=kept) == \
        "Cancelled your 10 minute timer."
    assert timers.timers == []
    kept.cancel()
    await until(lambda: len(timers.timers) == 1, "the timer restored")
    assert timers.timers[0].due == due and timers.timers[0].handle is not None
    timers.close()

    send = SendSkill()  # a plug-in's skill waits too, and its own undo runs
    own = Skills([send])
    kept, unsure = loop.create_future(), asyncio.Event()
    task = asyncio.create_task(own.run("send", {}, "en", call_at(), sure=unsure, kept=kept))
    await asyncio.sleep(0.05)
    assert send.sent == []
    unsure.set()
    assert await task == "Sent." and send.sent == ["hi"]
    kept.cancel()
    await until(lambda: send.sent == ["hi", "unsent"], "the plug-in's undo")


@pytest.mark.asyncio
async def test_a_call_without_timers_has_no_timer_skills() -> None:
    call = call_at()  # a Realtime client keeps its own timers
    assert [t["name"] for t in skills().tools(call)] == ["get_time", "calculate", "convert_units"]
    assert await answer("Set a timer for ten minutes.", call=call) == ("", "")


# --- bounded runs, and skills of one's own --------------------------------------------------------------------------
class SlowSkill:
    name = "slow"
    description = "Takes its time (a plug-in that blocks)."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def run(self, asked: Asked) -> str:  # a plain function: it runs in a worker thread, the loop goes on
        time.sleep(0.5)
        return "done"


class ChattySkill:
    name = "chatty"
    description = "Says far too much, and is found by its own intent."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        return {} if "chatty" in text else None

    async def run(self, asked: Asked) -> str:
        return "Word. " * 1000


class BrokenSkill:
    name = "broken"
    description = "Fails."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    async def run(self, asked: Asked) -> str:
        raise RuntimeError("boom")


@pytest.mark.asyncio
async def test_a_run_is_bounded_in_time_and_size_and_a_failure_is_said() -> None:
    own = Skills([SlowSkill(), ChattySkill(), BrokenSkill()], timeout_s=0.1)
    call = call_at()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        assert await own.run("slow", {}, "en", call) == "Sorry, that took too long."
    finally:
        ticker.cancel()
    assert ticks >= 3  # the loop kept running while the plug-in blocked its thread
    said = await own.run("chatty", {}, "en", call)
    assert len(said) <= 600 and said.endswith("Word.")
    assert await own.run("broken", {}, "ja", call) == "すみません、できませんでした。"
    assert await own.run("nope", {}, "en", call) == "Sorry, I couldn't do that."
    assert await own.run("chatty", "not json", "en", call) == "Sorry, I couldn't do that."
    assert own.route("be chatty", "en", call) is not None


class LateSendSkill:
    """A plug-in that acts and blocks past its time limit (a slow service): it sends, then registers its undo."""

    name = "late_send"
    description = "Sends a message, slowly."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __init__(self, coroutine: bool = False) -> None:
        self.sent: list[str] = []
        self.returned = threading.Event()
        if coroutine:
            self.run = self._run_async  # type: ignore[method-assign]

    def run(self, asked: Asked) -> str:
        time.sleep(0.3)
        self.sent.append("hi")
        asked.on_undo(lambda: self.sent.append("unsent"))
        self.returned.set()
        return "Sent."

    async def _run_async(self, asked: Asked) -> str:
        self.sent.append("hi")
        asked.on_undo(lambda: self.sent.append("unsent"))
        await asyncio.sleep(0.3)
        return "Sent."


@pytest.mark.asyncio
@pytest.mark.parametrize("coroutine", [False, True], ids=["thread", "coroutine"])
async def test_a_skill_cut_off_by_its_time_limit_is_undone(coroutine: bool) -> None:
    """The caller is told it took too long, so what the skill did does not stand: a coroutine's act is undone as it
    is cut off, a blocking function's once its thread returns (it acts late, then is undone), even on a turn that
    counts."""
    skill = LateSendSkill(coroutine)
    own = Skills([skill], timeout_s=0.05)
    kept = asyncio.get_running_loop().create_future()
    assert await own.run("late_send", {}, "en", call_at(), kept=kept) == "Sorry, that took too long."
    kept.set_result("Sorry, that took too long.")
    await until(lambda: skill.sent == ["hi", "unsent"], "the late act undone")
    assert coroutine or skill.returned.is_set()


def test_skills_load_by_name_and_plugins_as_module_class() -> None:
    loaded = load_skills(["units", "tests.test_skills:ChattySkill"])
    assert list(loaded.skills) == ["convert_units", "chatty"]
    with pytest.raises(ValueError, match="unknown skill"):
        load_skills(["weather"])
    with pytest.raises(ValueError, match="two skills"):
        load_skills(["units", "units"])
    for tool in skills().tools(call_at(timers=new_timers())):
        json.dumps(tool)  # plain JSON, in the Realtime API's flat function shape
        assert tool["type"] == "function" and tool["parameters"]["type"] == "object"
        assert set(tool["parameters"].get("required", [])) <= set(tool["parameters"]["properties"])
    assert tool_schema(ChattySkill())["name"] == "chatty"


def test_settings_are_checked() -> None:
    cfg = load_config(environ={})
    assert cfg.respond.skills == ["clock", "calculator", "units", "timers"] and cfg.respond.intents == "auto"
    with pytest.raises(ConfigError, match=r"respond\.intents"):
        load_config(overrides={"respond": {"intents": "sometimes"}}, environ={})
    with pytest.raises(ConfigError, match="IANA"):
        load_config(overrides={"respond": {"timezone": "Mars/Olympus"}}, environ={})


# --- in front of a model, or beside one -----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_the_intent_step_answers_before_the_model_and_says_which_skill() -> None:
    echo = EchoResponder()
    assert with_skills(echo, skills(), call_at()) is echo  # echo says back what it heard: no step unless "always"
    wrapped = with_skills(echo, skills(), call_at(), intents="always")
    assert isinstance(wrapped, SkillfulResponder)
    opts = ReplyOptions(language="en")
    said = "".join([d async for d in reply_stream(wrapped, "What is two plus three?", [], opts)])
    assert (said, opts.skill) == ("2 plus 3 is 5.", "calculate")
    opts = ReplyOptions(language="en")
    said = "".join([d async for d in reply_stream(wrapped, "What is the capital of Spain?", [], opts)])
    assert (said, opts.skill) == ("You said: What is the capital of Spain?", "")


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def call_piece(index: int, **fields: object) -> bytes:
    return sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]},
                             "finish_reason": None}]})


async def model(request: web.Request) -> web.StreamResponse:
    """Asked a sum with the skills offered, it calls ``calculate``; given the result, it says it. Asked the weather,
    it calls the client's ``get_weather``."""
    body = await request.json()
    last = body["messages"][-1]
    names = [t["function"]["name"] for t in body.get("tools", [])]
    if last["role"] == "tool":
        parts = [sse(chunk(f"The answer: {last['content']}")), sse(chunk(None, "stop"))]
    elif "calculate" in names and "plus" in last["content"]:
        parts = [call_piece(0, id="call_1", type="function",
                            function={"name": "calculate", "arguments": '{"expression": "2 + 3"}'}),
                 sse(chunk(None, "tool_calls"))]
    elif "get_weather" in names and "weather" in last["content"]:
        parts = [call_piece(0, id="call_2", type="function",
                            function={"name": "get_weather", "arguments": '{"city": "Paris"}'}),
                 sse(chunk(None, "tool_calls"))]
    else:
        parts = [sse(chunk("Hello.")), sse(chunk(None, "stop"))]
    return await stream(request, [*parts, b"data: [DONE]\n\n"])


@pytest.mark.asyncio
async def test_a_model_that_calls_tools_gets_the_skills_beside_the_clients_own() -> None:
    async with FakeLLM(model) as fake:
        inner = OpenAIResponder(fake.cfg())
        try:
            wrapped = with_skills(inner, skills(), call_at(timers=new_timers()))
            assert isinstance(wrapped, SkillfulMessagesResponder)
            # The page: the model is offered the skills, calls one, and answers with its result.
            opts = ReplyOptions(language="en")
            said = "".join([d async for d in reply_stream(wrapped, "What is two plus three?", [], opts)])
            assert (said, opts.skill) == ("The answer: 2 plus 3 is 5.", "calculate")
            offered = [t["function"]["name"] for t in fake.requests[0][0]["tools"]]
            assert offered == ["get_time", "calculate", "convert_units", "set_timer", "cancel_timer", "list_timers"]
            tool_turn = fake.requests[1][0]["messages"]
            assert tool_turn[-2]["tool_calls"][0]["function"]["name"] == "calculate"
            assert tool_turn[-1] == {"role": "tool", "content": "2 plus 3 is 5.", "tool_call_id": "call_1"}
            # A Realtime client's own tool: offered first, its call goes out to the client, untouched; a skill it
            # names itself is its own (ours steps aside).
            fake.requests.clear()
            mine = {**WEATHER, "name": "calculate"}
            out = [o async for o in wrapped.respond_messages(  # type: ignore[attr-defined]
                [Message("user", "What is the weather in Paris?")], [WEATHER, mine])]
            calls = [o for o in out if isinstance(o, ToolCall)]
            assert [(c.name, c.call_id) for c in calls] == [("get_weather", "call_2")]
            names = [t["function"]["name"] for t in fake.requests[0][0]["tools"]]
            assert names[:2] == ["get_weather", "calculate"] and names.count("calculate") == 1
            assert len(fake.requests) == 1  # the client runs its own tool: nothing more is asked of the model
        finally:
            await inner.aclose()
