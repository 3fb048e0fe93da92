"""The breakdown that names the wait: the parts of a turn's voice-to-voice follow its critical path and add up
exactly to the server's v2v, whatever overlapped."""

from __future__ import annotations

import random

import pytest

from assistant.pipeline.trace import PARTS, WAIT_PARTS, Ending, Span, TurnTrace, split_wait

S = 1000.0  # the speech end (wall seconds)


def ms(parts: dict[str, float]) -> dict[str, float]:
    return {k: round(v * 1000, 3) for k, v in parts.items() if v}


def test_speculative_pass_finishing_after_the_decision_is_asr_after_the_pause() -> None:
    # Fixed silence ends the turn at 500 ms; the pass asked at the 200 ms pause ran 200 → 700 ms.
    ending = Ending(speech_end=S, decided=S + 0.5, silence_met=S + 0.5)
    parts = split_wait(ending, Span(S + 0.2, S + 0.2, S + 0.7), S + 0.7)
    assert ms(parts) == {"endpoint_ms": 200.0, "asr_ms": 500.0}


def test_decision_waiting_for_the_transcript_names_asr_and_the_worker_wait() -> None:
    # Asked at 200 ms, waited 100 ms for a worker, answered at 650 ms; committed 1 ms later.
    asr = Span(S + 0.2, S + 0.3, S + 0.65)
    model = Span(S + 0.2, S + 0.2, S + 0.25)
    ending = Ending(speech_end=S, decided=S + 0.651, silence_met=S + 0.2, text=True, model=model)
    assert ms(split_wait(ending, asr, S + 0.65)) == {
        "endpoint_ms": 200.0, "worker_wait_ms": 100.0, "asr_ms": 350.0, "decide_ms": 1.0,
    }


def test_decision_waiting_for_the_model() -> None:
    model = Span(S + 0.2, S + 0.25, S + 0.4)
    ending = Ending(speech_end=S, decided=S + 0.4, silence_met=S + 0.2, text=True, model=model)
    assert ms(split_wait(ending, Span(S + 0.2, S + 0.2, S + 0.3), S + 0.3)) == {
        "endpoint_ms": 200.0, "worker_wait_ms": 50.0, "end_of_turn_ms": 150.0,
    }


def test_evidence_in_before_the_silence_it_asked_for_leaves_the_silence() -> None:
    # A complete sentence needs 300 ms; text and model were in at 250 ms: the silence is what was waited for.
    model = Span(S + 0.2, S + 0.2, S + 0.22)
    ending = Ending(speech_end=S, decided=S + 0.3, silence_met=S + 0.3, text=True, model=model)
    assert ms(split_wait(ending, Span(S + 0.2, S + 0.2, S + 0.25), S + 0.25)) == {"endpoint_ms": 300.0}


def test_pass_asked_at_commit_follows_the_decision() -> None:
    # No speculation: 500 ms of silence, then the turn's pass queued 40 ms and ran 400 ms.
    ending = Ending(speech_end=S, decided=S + 0.5, silence_met=S + 0.5)
    assert ms(split_wait(ending, Span(S + 0.5, S + 0.54, S + 0.94), S + 0.94)) == {
        "endpoint_ms": 500.0, "worker_wait_ms": 40.0, "asr_ms": 400.0,
    }


def test_pass_begun_before_the_pause_counts_from_the_pause() -> None:
    ending = Ending(speech_end=S, decided=S + 0.31, silence_met=S + 0.1, text=True)
    assert ms(split_wait(ending, Span(S - 0.3, S - 0.2, S + 0.3), S + 0.3)) == {"asr_ms": 300.0, "decide_ms": 10.0}


@pytest.mark.parametrize("seed", range(200))
def test_parts_are_never_negative_and_add_up(seed: int) -> None:
    rng = random.Random(seed)

    def span() -> Span:
        a = S + rng.uniform(-0.5, 1.5)
        b = a + rng.uniform(0, 0.3)
        return Span(a, b, b + rng.uniform(0, 0.8))

    asr = span() if rng.random() < 0.9 else None
    decided = S + rng.uniform(0, 2)
    ending = Ending(speech_end=S, decided=decided, silence_met=S + rng.uniform(0, decided - S),
                    text=rng.random() < 0.5, model=span() if rng.random() < 0.5 else None)
    asr_done = asr.done if asr is not None else S + rng.uniform(-0.2, 2)
    parts = split_wait(ending, asr, asr_done)
    assert set(parts) == set(WAIT_PARTS)
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(max(decided, asr_done, S) - S, abs=1e-9)


def test_turn_durations_add_up_to_the_server_v2v_exactly() -> None:
    rng = random.Random(7)
    for _ in range(100):
        trace = TurnTrace(1)
        t = S
        trace.mark("speech_end", t)
        asr = Span(S + rng.uniform(0, 0.3), S + rng.uniform(0.3, 0.4), S + rng.uniform(0.4, 0.9))
        decided = S + rng.uniform(0.2, 1.0)
        trace.ending = Ending(speech_end=S, decided=decided, silence_met=S + 0.2, text=True)
        trace.asr = asr
        trace.mark("vad_end", decided)
        trace.mark("asr_done", asr.done)
        t = max(decided, asr.done)
        for stage in ("first_text", "first_tts_text", "first_audio", "first_frame_sent"):
            t += rng.uniform(0, 0.3) if rng.random() < 0.8 else -0.5  # sometimes done early (speculation)
            trace.mark(stage, t)
        d = trace.durations_ms()
        assert list(d)[: len(PARTS)] == list(PARTS)
        assert round(sum(d[p] for p in PARTS) * 10) == round(d["server_v2v_ms"] * 10), d
        marks = trace.effective_marks()
        assert d["server_v2v_ms"] == pytest.approx((marks["first_frame_sent"] - S) * 1000, abs=0.05)
        assert all(d[p] >= 0 for p in PARTS), d
