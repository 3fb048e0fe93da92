"""``python -m lab replies``: the rubric on fixed strings, the request sets, the persona's example turns in the
embedded model's prompt, and a short run of the bench on the real default model."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from assistant.config import RespondConfig
from assistant.respond import persona
from assistant.respond.base import Message, ReplyOptions
from lab import replies as R
from tests.needs import module


def req(text: str, category: str = "howto", answer: tuple[str, ...] = (), language: str = "en") -> R.Request:
    return R.Request("x", category, language, text, answer)


def test_request_sets_are_two_disjoint_halves_of_every_category() -> None:
    tuning, heldout = R.load_requests("tuning"), R.load_requests("heldout")
    assert len(tuning) >= 40 and len(heldout) >= 40
    assert not {r.text for r in tuning} & {r.text for r in heldout}
    for half in (tuning, heldout):
        assert {r.category for r in half} == set(R.CATEGORIES)
        assert all(r.answer for r in half if r.category == "factual")
        assert len({r.id for r in half}) == len(half)
    # The persona's examples are none of the requests it is measured on.
    asked = {m.content for m in persona.EXAMPLES if m.role == "user"}
    assert not asked & {r.text for r in tuning + heldout}


def test_role_reversal() -> None:
    ask = "Remind me to call my mother tomorrow morning"
    assert R.role_reversal(ask, "I'm sorry for any misunderstanding. Could you please call your mother tomorrow "
                                "morning?")
    assert R.role_reversal("Play some relaxing music", "Could you please play some relaxing music for me tomorrow?")
    assert R.role_reversal("Set a timer", "Please set a timer on your phone.")
    assert not R.role_reversal(ask, "Sorry, I can't set reminders. I can only talk with you.")
    assert not R.role_reversal("How long do I boil an egg", "Boil it for about nine minutes.")
    assert not R.role_reversal("Give me a dinner idea", "How about pasta? Would you like a recipe?")


def test_answered() -> None:
    cannot = req("Set a timer for ten minutes.", "cannot")
    assert R.answered(cannot, "Sorry, I can't set timers.")
    assert not R.answered(cannot, "Sure, the timer is set.")  # pretending
    assert not R.answered(cannot, "Set a timer for ten minutes.")  # handed back
    assert not R.answered(req("Play some relaxing music", "cannot"),
                          "I'm sorry for any confusion. Could you please play some relaxing music for me tomorrow?")
    howto = req("How long do I boil an egg?")
    assert R.answered(howto, "About nine minutes for a hard egg.")
    assert not R.answered(howto, "I can't send messages or make calls.")  # a refusal is no answer here
    assert not R.answered(howto, "Could you clarify what you mean?")
    assert not R.answered(howto, "")
    assert R.answered(req("Good morning!", "chitchat"), "Good morning!")
    assert R.answered(req("How many days are in a week?", "factual", ("seven", "7")), "There are 7 days in a week.")


def test_speakable_short_right_language() -> None:
    markdown = "* **Marinated Squab:** a rich dish.\n* **Pasta:** quick."
    assert not R.speakable(markdown) and not R.speakable("See https://x.y") and not R.speakable("Yes! 🎉")
    assert R.speakable("Marinated squab is a rich dish. Pasta is quick.")
    assert R.speakable(R.heard(markdown))  # the speech path shapes it
    long = "This is a reply that goes on and on about nothing in particular for a very long time indeed. " * 4
    s = R.score(req("Tell me something."), long)
    assert s.first_words == 19 and s.first_s > R.SHORT_FIRST_S and not s.short
    assert s.reply_words == 76 and s.reply_s == pytest.approx(len(long.strip()) / R.LETTERS_PER_S, rel=0.01)
    ok = R.score(req("What is the capital of Spain?", "factual", ("Madrid",)), "The capital of Spain is Madrid.")
    assert ok.short and ok.right and ok.in_language and ok.answered and ok.no_reversal and ok.speakable_raw
    assert R.right(req("q", "factual", ("red",)), "It is reddish.") is False  # a whole word
    assert R.right(req("q", "factual", ("北京",), "zh"), "中国的首都是北京。") is True
    assert R.right(req("q"), "anything") is None
    assert R.in_language("中国的首都是北京。", "zh") and not R.in_language("The capital is Beijing.", "zh")
    assert R.in_language("一週間は七日です。", "ja") and R.in_language("Hola, ¿qué tal estás? Muy bien.", "es")
    assert not R.in_language("Hello, how are you?", "es") and R.in_language("Hola, ¿cómo está?", "es")
    assert R.speech_seconds("北京") == pytest.approx(4 / R.LETTERS_PER_S)


def test_examples_go_between_the_system_prompt_and_the_history() -> None:
    module("assistant.respond.llama.native")
    from assistant.respond.llama.prompt import PromptBuilder

    def builder(cfg: RespondConfig) -> PromptBuilder:  # the prompt's assembly only: no model, no template
        system = persona.embedded(cfg).system_prompt or ""
        return PromptBuilder(None, lambda text: [], 1024, system, cfg.language,  # type: ignore[arg-type]
                             persona.example_messages(cfg))

    history = [Message("user", "Hi"), Message("assistant", "Hello!")]
    msgs = builder(RespondConfig()).messages("What now?", history, ReplyOptions())
    n = len(persona.EXAMPLES)
    assert msgs[0] == {"role": "system", "content": persona.SYSTEM_PROMPT}
    assert [m["content"] for m in msgs[1 : 1 + n]] == [m.content for m in persona.EXAMPLES]
    assert [m["content"] for m in msgs[1 + n :]] == ["Hi", "Hello!", "What now?"]
    assert len(builder(RespondConfig(examples=False)).messages("What now?", history, ReplyOptions())) == 4
    # No examples in other languages.
    assert len(builder(RespondConfig(language="fr")).messages("What now?", [], ReplyOptions())) == 2
    # A history with its own system prompt (a Realtime session's instructions): none.
    own = [Message("system", "Be a pirate."), *history]
    assert len(builder(RespondConfig()).messages("What now?", own, ReplyOptions())) == 4


@pytest.mark.slow
def test_the_bench_runs_on_the_default_model(tmp_path: Path) -> None:
    module("assistant.respond.llama.native")
    parser = argparse.ArgumentParser()
    R.add_replies_arguments(parser)
    args = parser.parse_args(["--half", "heldout", "--presets", "before,config", "--limit", "3",
                              "--out", str(tmp_path)])
    cfg = RespondConfig(slots=2, context_tokens=1024, threads=1)
    results = asyncio.run(R.run_replies(args, cfg))
    assert [(r.preset, r.request.id) for r in results.rows] == [
        ("before", "h01"), ("before", "h02"), ("before", "h03"), ("config", "h01"), ("config", "h02"),
        ("config", "h03")]
    assert all(r.reply.strip() for r in results.rows)
    after = [r for r in results.rows if r.preset == "config"]
    assert all(r.score.short and r.score.speakable_heard for r in after)
    assert sum(bool(r.score.right) for r in after) >= 2  # capitals: the small model knows Madrid and London
    table = R.format_tables(results)
    assert "heldout, preset config" in table and "factual" in table and "right, factual: English" in table


def test_loops_skills_and_doubt_are_scored_apart() -> None:
    loop = "I'm so glad you asked. I'm so glad you asked. I'm so glad you asked."
    s = R.score(req("Give me an idea."), R.without_loops(loop), loop)
    assert s.loops_raw and not s.loops_said and s.reply_words == 5
    skill = R.Request("s", "skill", "en", "What is two plus three?", skill="calculate", expect=("5",))
    assert R.score(skill, "2 plus 3 is 5.", skill="calculate").skill_right
    assert not R.score(skill, "2 plus 3 is 6.", skill="calculate").skill_right  # not what it must say
    assert not R.score(skill, "Five.").skill_right  # the model answered, not the skill
    # A "cannot" request a skill now takes (a timer) is answered by it.
    assert R.score(req("Start a timer for the eggs.", "cannot"), "For how long?", skill="set_timer").answered
    unsure = R.score(req("中国的首都是哪里？", "factual", ("北京",), "zh"), "抱歉，我不确定。")
    assert unsure.not_sure and not unsure.right

    def row(request: R.Request, reply: str, skill: str = "") -> R.Row:
        return R.Row("config", "heldout", request, reply, 0.1, R.score(request, reply, skill=skill), reply, 0.05, 80.0)

    rows = [row(req("Capital of Spain?", "factual", ("Madrid",)), "Madrid."),
            row(req("Hours in a day?", "factual", ("24",)), "There are 24 hours in a day.", "convert_units"),
            row(req("中国的首都是哪里？", "factual", ("北京",), "zh"), "抱歉，我不确定。"),
            row(req("Capital of Turkey?", "factual", ("Ankara",)), "Istanbul."),
            row(skill, "2 plus 3 is 5.", "calculate")]
    assert R._facts(rows) == ("facts: 2 right (1 by the model, 1 by a skill), 1 not sure, 1 wrong of 4; English 2 of 3 "
                              "right or not sure, 1 wrong")
    assert R._skills(rows) == "skills: 1 of 1 skill requests right; 1 other requests answered by a skill"
    table = R.format_tables(R.Results(rows=rows))
    assert "all (model)" in table and "skills" in table
    assert "intent step (before the model is asked): p50 0.050 ms" in table


def test_skill_requests_name_skills_that_exist_and_the_halves_stay_apart() -> None:
    from assistant.respond.skills import DEFAULT, load_skills

    names = set(load_skills(DEFAULT).skills)
    for half in R.HALVES:
        asked = [r for r in R.load_requests(half) if r.category == "skill"]
        assert len(asked) >= 24 and {r.skill for r in asked} <= names and all(r.expect for r in asked)
        assert {r.language for r in asked} == {"en", "zh", "ja", "ko"}


@pytest.mark.slow
def test_a_skill_answers_on_a_call_of_its_own_and_the_small_model_doubts_in_chinese() -> None:
    from assistant.respond import create_responder

    cfg = RespondConfig(slots=2, context_tokens=1024, threads=1, model_path="")
    requests = [R.Request("a", "skill", "en", "What time is it?", skill="get_time", expect=("5:00 PM",)),
                R.Request("b", "factual", "zh", "日本的首都是哪里？", answer=("东京", "東京"))]

    async def run() -> list[R.Row]:
        responder = create_responder(cfg)
        try:
            return await R.run_preset(responder, cfg, requests, preset_name="config", half="tuning", concurrency=1)
        finally:
            await responder.aclose()

    clock, chinese = asyncio.run(run())
    assert (clock.reply, clock.score.skill, clock.score.skill_right) == ("It's 5:00 PM.", "get_time", True)
    assert clock.intent_ms is not None
    assert chinese.reply == "抱歉，我不确定。" and chinese.score.not_sure and not chinese.score.skill
