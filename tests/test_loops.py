"""No loops (pipeline/loops.py): a reply that repeats itself is stopped at the end of its last new sentence, however
the text arrives (a letter at a time, a few, whole), and a reply that does not repeat itself goes through whole."""

from __future__ import annotations

import pytest

from assistant.pipeline.loops import LoopGuard, loops, stutter_at, without_loops, words


def streamed(text: str, step: int) -> str:
    guard = LoopGuard()
    out = [guard.feed(text[i:i + step]) for i in range(0, len(text), step)]
    return "".join(out) + guard.finish()


@pytest.mark.parametrize(("reply", "said"), [
    # The replies (SmolLM2-135M, greedy).
    ("I'm sorry, I'm not a phonebot. I'm a voice assistant. I'm not a phonebot. I'm a voice assistant. I'm not",
     "I'm sorry, I'm not a phonebot. I'm a voice assistant."),
    ("I'm so glad you asked for a dinner tonight. I'm so glad you asked for a dinner tonight. I'm so glad",
     "I'm so glad you asked for a dinner tonight."),
    ("L'Alma, la France, la France, la France.", "L'Alma, la France"),
    ("1 1 1 I'm sorry for any confusion", "1"),
    # A run of five words said again is a loop, whatever the sentence around it.
    ("Try a warm bath before bed. A warm bath before bed helps you sleep.", "Try a warm bath before bed."),
    ("很好很好很好。", "很好"),
])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_loop_ends_with_the_last_new_sentence(reply: str, said: str, step: int) -> None:
    assert loops(reply)
    assert streamed(reply, step).strip(" ,") == said  # a clause already said keeps its comma


@pytest.mark.parametrize("reply", [
    "The capital of France is Paris. It is known for the Eiffel Tower.",
    "Cut it into small cubes and leave it out for about fifteen minutes.",
    "I'm a chatbot designed to help. I'm not a chatbot designed to judge.",  # four words again: a turn of phrase
    "Very, very good. Yes.",
    "Sorry, I can't set timers. I can only talk with you.",
    "谢谢你。这是北京。",
    "1公斤等于1000克。",  # a number is one word, not three zeros
    "",
])
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_reply_that_does_not_repeat_itself_goes_through_whole(reply: str, step: int) -> None:
    assert not loops(reply)
    assert streamed(reply, step) == reply


def test_the_first_sentence_goes_on_clause_by_clause_and_later_ones_whole() -> None:
    guard = LoopGuard()
    assert guard.feed("Boil it, then") == "Boil it, "  # up to the latest clause mark: the speech path waits for one
    assert guard.feed(" drain it. Add") == "then drain it."
    assert guard.feed(" salt") == ""  # a later sentence is held until it is complete
    assert guard.feed(". Serve.") == " Add salt."
    assert guard.finish() == " Serve."
    assert not guard.stopped


def test_a_first_clause_goes_on_with_its_comma_not_the_token_after() -> None:
    """The speech path breaks at a comma after a letter as it comes (tts/text.is_clause_break), so the guard lets
    it through as it comes too: "I'm sorry," is not held for the " I" the model writes next. A comma after a digit
    waits ("3," may be "3,000")."""
    guard = LoopGuard()
    assert guard.feed("I'm sorry") == ""
    assert guard.feed(",") == "I'm sorry,"
    assert guard.feed(" I paid 3") == ""
    assert guard.feed(",") == ""
    assert guard.feed("000 for it") == ""  # no mark yet
    assert guard.feed(",") == " I paid 3,000 for it,"
    assert not guard.stopped


def test_words_and_stutters() -> None:
    assert words("I'm here, OK?") == ["i'm", "here", "ok"]
    assert words("北京很好") == ["北", "京", "很", "好"]
    assert stutter_at(["a", "b", "a", "b"]) == 2 and stutter_at(["no", "no", "no"]) == 1
    assert stutter_at(["very", "very", "good"]) is None
    assert without_loops("One two three four five. One two three four five six.") == "One two three four five."
