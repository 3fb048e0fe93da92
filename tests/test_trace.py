"""The breakdown that names the wait: the parts of a turn's voice-to-voice follow its critical path and add up
exactly to the server's v2v, whatever overlapped."""

from __future__ import annotations

import random

import pytest

from assistant.pipeline.trace import GAPS, PARTS, WAIT_PARTS, Ending, Span, TurnTrace, split_wait

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


def test_a_model_call_held_for_the_transcript_names_the_pass_before_it() -> None:
    # The pass ran 96 → 400 ms; the model, not asked beside it, was asked 2 ms after it landed and answered
    # at 480 ms: the wait is the pause, the pass, the hop, the model (the model's mark passed long before).
    asr = Span(S + 0.096, S + 0.096, S + 0.4)
    model = Span(S + 0.402, S + 0.402, S + 0.48)
    ending = Ending(speech_end=S, decided=S + 0.48, silence_met=S + 0.096, text=True, model=model,
                    model_after_text=True)
    assert ms(split_wait(ending, asr, S + 0.4)) == {
        "endpoint_ms": 96.0, "asr_ms": 304.0, "decide_ms": 2.0, "end_of_turn_ms": 78.0,
    }
    # The same call asked at a later mark (not held): the silence up to the mark was the wait.
    ending = Ending(speech_end=S, decided=S + 0.48, silence_met=S + 0.096, text=True, model=model)
    assert ms(split_wait(ending, asr, S + 0.4)) == {"endpoint_ms": 402.0, "end_of_turn_ms": 78.0}


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
                    text=rng.random() < 0.5, model=span() if rng.random() < 0.5 else None,
                    model_after_text=rng.random() < 0.5)
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
        if rng.random() < 0.5:  # confirmed at commit, or held for more silence (turn.confirm_ms)
            trace.mark("confirmed", decided if rng.random() < 0.5 else S + rng.uniform(0.6, 1.2))
        for stage in ("first_text", "first_tts_text", "first_audio", "first_frame_sent"):
            t += rng.uniform(0, 0.3) if rng.random() < 0.8 else -0.5  # sometimes done early (speculation)
            trace.mark(stage, t)
        d = trace.durations_ms()
        assert list(d)[: len(PARTS)] == list(PARTS)
        assert round(sum(d[p] for p in PARTS) * 10) == round(d["server_v2v_ms"] * 10), d
        marks = trace.effective_marks()
        assert d["server_v2v_ms"] == pytest.approx((marks["first_frame_sent"] - S) * 1000, abs=0.05)
        assert all(d[p] >= 0 for p in PARTS), d


def test_gaps_are_never_negative_and_name_a_speculative_lead() -> None:
    """A speculative turn's first text for TTS made before its commit is a lead, not a negative gap."""
    trace = TurnTrace(1)
    trace.mark("speech_end", S)
    trace.asr = Span(S + 0.1, S + 0.1, S + 0.35)
    trace.ending = Ending(speech_end=S, decided=S + 0.6, silence_met=S + 0.6, text=True)
    trace.mark("asr_done", S + 0.35)
    trace.mark("first_text", S + 0.36)
    trace.mark("first_tts_text", S + 0.37)  # handed to TTS 230 ms before the commit below
    trace.mark("vad_end", S + 0.6)
    gaps = trace.gaps_ms()
    assert set(gaps) == set(GAPS)
    assert gaps == {"evidence_to_commit_ms": 0.0, "commit_to_tts_text_ms": 0.0, "tts_text_before_commit_ms": 230.0}

    later = TurnTrace(2)  # the usual order: commit, then text
    later.mark("speech_end", S)
    later.ending = Ending(speech_end=S, decided=S + 0.5, silence_met=S + 0.5)
    for stage, at in (("vad_end", 0.5), ("asr_done", 0.8), ("first_text", 0.801), ("first_tts_text", 0.803)):
        later.mark(stage, S + at)
    gaps = later.gaps_ms()
    assert gaps["commit_to_tts_text_ms"] == pytest.approx(3.0) and gaps["tts_text_before_commit_ms"] == 0.0
    assert all(v >= 0 for v in gaps.values())


def test_metrics_and_the_page_legend_name_the_same_gaps() -> None:
    """/metrics keeps a histogram per gap under the turn_metrics names; /api/stages lists them for the page."""
    from assistant.pipeline.trace import gap_legend
    from assistant.server.metrics import Metrics

    metrics = Metrics()
    metrics.observe_turn({"endpoint_ms": 100.0}, {"evidence_to_commit_ms": 0.0, "commit_to_tts_text_ms": 0.0,
                                                  "tts_text_before_commit_ms": 230.0})
    text = metrics.render()[0].decode()
    for name in GAPS:
        assert f'assistant_turn_gap_seconds_count{{gap="{name.removesuffix("_ms")}"}} 1.0' in text, name
    assert 'assistant_turn_gap_seconds_bucket{gap="tts_text_before_commit",le="0.2"} 0.0' in text
    assert [g["name"] for g in gap_legend()] == list(GAPS)
