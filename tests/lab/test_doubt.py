"""``python -m lab doubt``: its requests are tuning requests only (no held-out question, nor any fact the held-out
half asks), the thresholds follow one rule (a tenth below the lowest right answer), and a short run on the bundled
model scores first sentences as the gate does."""

from __future__ import annotations

import asyncio

import pytest

from assistant.config import RespondConfig
from assistant.respond.llama.doubt import THRESHOLDS, is_factual_question, least_likely_word
from lab import doubt as D
from lab import replies as R


def test_the_doubt_requests_are_tuning_requests_only() -> None:
    tuning = D.tuning_requests()
    heldout = R.load_requests("heldout")
    assert len(tuning) >= 100 and not {r.text for r in tuning} & {r.text for r in heldout}
    asked = " ".join(r.text.lower() for r in tuning)
    for fact in ("spain", "england", "russia", "dog have", "snow", "tomato", "strawberr", "of big", "of day",
                 "of left", "中国的首都", "一週間"):
        assert fact not in asked, fact  # no fact the held-out half asks
    assert all(is_factual_question(r.text, r.language) for r in tuning)


def test_the_thresholds_lose_no_right_answer() -> None:
    def row(language: str, score: float, right: bool) -> D.Scored:
        return D.Scored(R.Request("x", "factual", language, "q"), "", score, right)

    chosen = D.choose([row("en", -2.76, True), row("en", -0.1, True), row("en", -3.7, False), row("en", -0.3, False),
                       row("zh", -1.8, False), row("ja", -0.34, False)])
    assert chosen["en"] == {"threshold": -2.8, "right": 2, "wrong": 2, "lowest_right": -2.76, "caught": 1, "lost": 0}
    assert chosen["*"]["threshold"] == -0.2 and chosen["*"]["caught"] == 2
    assert THRESHOLDS == {"en": -2.8, "*": -0.2}  # what the study chose on the tuning requests (lab/doubt.py)
    # A word's tokens count together; the first word (the phrasing's choice) does not count.
    assert least_likely_word([("The", -3.0), (" capital", -0.1), (" is", -0.1), (" Ber", -0.5), ("lin", -0.4)]) == \
        pytest.approx(-0.9)


@pytest.mark.slow
def test_a_short_run_scores_as_the_gate_does() -> None:
    requests = D.tuning_requests()[:2]  # the capitals of France and Japan: the small model knows them
    rows = asyncio.run(D.score_all(requests, RespondConfig(slots=1, context_tokens=1024, threads=1, model_path="")))
    assert [r.right for r in rows] == [True, True]
    assert all(THRESHOLDS["en"] < r.score <= 0 for r in rows)
