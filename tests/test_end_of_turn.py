"""End of turn: the evidence table (transcript rule × audio model), and the policy on real audio with the
real Smart Turn model: a mid-sentence pause stays one turn, a finished sentence ends before the fixed silence."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from assistant.asr.base import Transcript
from assistant.audio import read_audio
from assistant.config import TURN_CUES, ConfigError, TurnConfig, load_config
from assistant.pipeline.conversation import Conversation, TurnDeps
from assistant.pipeline.end_of_turn import (
    Cue,
    Evidence,
    TurnEnd,
    confirm_hold_ms,
    cue,
    cue_at,
    decide,
    falling_threshold,
    judge,
    weigh,
)
from assistant.pipeline.events import EventChannel
from assistant.respond.echo import EchoResponder
from assistant.rtc.outbound import ReplyTrack
from assistant.vad.end_of_turn import SmartTurnModel
from assistant.vad.endpoint import Endpointer
from assistant.vad.silero import SileroModel
from tests.conftest import test_config
from tests.test_turn_taking import ToneTTS
from tests.waiting import until

PAUSES = Path(__file__).parent / "data" / "pauses"
MANIFEST = {e["file"]: e for e in json.loads((PAUSES / "manifest.json").read_text())}
CHUNK = 320


def _cfg(text: bool, audio: bool) -> TurnConfig:
    return TurnConfig(smart_endpoint=text, end_of_turn_model=audio)


def test_weigh_the_evidence() -> None:
    both = _cfg(True, True)
    # The transcript's veto: a sentence ending on "to", "the", "order"… is never complete.
    v = weigh(both, TurnEnd.INCOMPLETE, 0.97)
    assert not v.commit and v.end_silence_ms == both.incomplete_endpoint_ms
    assert weigh(both, TurnEnd.INCOMPLETE, None).end_silence_ms == both.incomplete_endpoint_ms
    # Both say done, or the text cannot tell and the audio says done: end now.
    assert weigh(both, TurnEnd.COMPLETE, 0.9).commit
    assert weigh(both, TurnEnd.UNKNOWN, 0.9).commit
    # They disagree, or the model is not sure of a finished text: the unsure wait, shorter than for a text that
    # trails off. Neither says done: up to the max silence.
    assert weigh(both, TurnEnd.COMPLETE, 0.1).end_silence_ms == both.unsure_endpoint_ms
    assert weigh(both, TurnEnd.COMPLETE, 0.7).end_silence_ms == both.unsure_endpoint_ms
    assert both.complete_endpoint_ms < both.unsure_endpoint_ms < both.incomplete_endpoint_ms
    assert weigh(both, TurnEnd.UNKNOWN, 0.1).end_silence_ms == both.max_silence_ms
    # Evidence still coming: keep the current setting.
    assert weigh(both, None, 0.9).pending and weigh(both, TurnEnd.COMPLETE, None).pending
    # One switch at a time.
    text = _cfg(True, False)
    assert weigh(text, TurnEnd.COMPLETE, None).end_silence_ms == text.complete_endpoint_ms
    assert not weigh(text, TurnEnd.COMPLETE, None).commit
    audio = _cfg(False, True)
    assert weigh(audio, TurnEnd.INCOMPLETE, 0.9).commit  # the text is not asked
    assert weigh(audio, None, 0.2).end_silence_ms == audio.max_silence_ms
    off = _cfg(False, False)
    v = weigh(off, None, None)
    assert not v.commit and not v.pending and v.end_silence_ms is None


def test_the_model_alone_decides_and_the_transcript_vetoes() -> None:
    """turn.model_alone: a very sure model ends the turn whatever the falling threshold, once the transcript has
    landed and its cue does not veto; before it lands the turn waits (nothing could be heard before it anyway)."""
    cfg = TurnConfig(policy="falling", model_alone=0.97, model_alone_veto=["continues", "number"])
    sure = [(96, 0.98)]
    pending = decide(cfg, Evidence(use_text=True, use_audio=True, probs=sure), 160, 500)
    assert not pending.end_now and pending.reason == "pending"
    done = decide(cfg, Evidence(use_text=True, use_audio=True, text=TurnEnd.COMPLETE, cue=Cue.COMPLETE, words=6,
                                probs=sure), 288, 500)
    assert done.end_now and done.reason == "model_alone" and done.needed_ms == 96
    for veto in (Cue.CONTINUES, Cue.NUMBER):
        d = decide(cfg, Evidence(use_text=True, use_audio=True, cue=veto, words=6, probs=sure), 288, 500)
        assert not d.end_now, veto
    # Not sure enough: the falling threshold decides (at 288 ms it is far above 0.96 + cue_complete).
    d = decide(cfg, Evidence(use_text=True, use_audio=True, cue=Cue.COMPLETE, words=6, probs=[(96, 0.96)]), 288, 500)
    assert not d.end_now
    # Off by default (chosen on the tuning half and the human set: 0.99 ends no held-out turn sooner), and
    # only cue names may veto.
    assert TurnConfig().model_alone >= 0.99 and "short" in TurnConfig().model_alone_veto
    assert set(TurnConfig().model_alone_veto) <= set(TURN_CUES) == {c.value for c in Cue}
    with pytest.raises(ConfigError, match="model_alone_veto"):
        load_config(overrides={"turn": {"model_alone_veto": ["maybe"]}})
    # The late stage's veto takes cue names too; the late stage is on by default since the doubtful cue (it cuts no
    # more held-out turns), and what goes on, a digit string or a fragment gets none of it.
    assert {"continues", "number", "short", "doubtful"} <= set(TurnConfig().falling_late_veto)
    assert TurnConfig().falling_late_to < TurnConfig().falling_to
    with pytest.raises(ConfigError, match="falling_late_veto"):
        load_config(overrides={"turn": {"falling_late_veto": ["and"]}})


def test_a_number_is_held_only_so_long() -> None:
    """turn.number_hold_ms: a transcript that ends on a number that may be half said ("My number is 1390.")
    is held (cue_number) while the silence is no longer than a pause between a number's groups, then judged by its
    punctuation: a finished one ends at the hold however unsure the model, an open one when the model is sure,
    and the trace's split says the decision needed the hold's silence. 0 holds it to max_silence_ms, as before the
    setting."""
    cfg = TurnConfig(policy="falling")
    hold = cfg.number_hold_ms
    assert 0 < hold < cfg.max_silence_ms
    sure = [(96, 0.98), (704, 0.98), (1024, 0.98)]
    finished = Evidence(use_text=True, use_audio=True, text=TurnEnd.COMPLETE, cue=Cue.NUMBER, words=5, probs=sure)
    before = decide(cfg, finished, hold - 32, 500)
    assert not before.end_now and before.reason == "waiting"
    after = decide(cfg, finished, hold, 500)
    assert after.end_now and after.reason == "score_complete_after_number" and after.needed_ms == hold
    # No final punctuation ("navigate to 26"): judged as open text, which the late stage's lower threshold lets a
    # sure model end.
    open_text = Evidence(use_text=True, use_audio=True, text=TurnEnd.UNKNOWN, cue=Cue.NUMBER, words=3, probs=sure)
    assert 0.98 + cfg.cue_open >= falling_threshold(cfg, hold) and "open" not in cfg.falling_late_veto
    d = decide(cfg, open_text, hold, 500)
    assert d.end_now and d.reason == "score_open_after_number", d
    unsure = Evidence(use_text=True, use_audio=True, text=TurnEnd.UNKNOWN, cue=Cue.NUMBER, words=3,
                      probs=[(96, 0.2), (1024, 0.3)])
    assert not decide(cfg, unsure, hold + 300, 500).end_now  # an unsure model still waits for an open one
    # Written finished ("The code is 3 1564."), the hold is enough: the model, unsure after digits, is not waited
    # for (it kept such turns to the cap).
    written = replace(unsure, text=TurnEnd.COMPLETE)
    assert not decide(cfg, written, hold - 32, 500).end_now
    d = decide(cfg, written, hold, 500)
    assert d.end_now and d.reason == "complete_after_number" and d.needed_ms == hold and not d.sure
    # Other cues are not touched by the hold, and 0 is no hold.
    short = Evidence(use_text=True, use_audio=True, text=TurnEnd.COMPLETE, cue=Cue.SHORT, words=1, probs=sure)
    assert cue_at(cfg, short, hold + 500) is Cue.SHORT
    never = TurnConfig(policy="falling", number_hold_ms=0)
    assert not decide(never, finished, never.max_silence_ms - 32, 500).end_now
    assert decide(never, finished, never.max_silence_ms, 500).reason == "max_silence"


def test_a_decision_is_sure_only_on_a_score_that_reaches_confirm_sure() -> None:
    """turn.confirm_sure: an end decided on a score at or above it is sure (its reply heard at once); a lower one, and
    a held cue's release however sure the model, is not (its reply waits for turn.confirm_ms of silence)."""
    cfg = TurnConfig(policy="falling", confirm_sure=1.3)
    sure = [(96, 0.98), (480, 0.98)]
    finished = Evidence(use_text=True, use_audio=True, text=TurnEnd.COMPLETE, cue=Cue.COMPLETE, words=6, probs=sure)
    d = decide(cfg, finished, 480, 500)
    assert d.end_now and d.sure  # 0.98 + cue_complete 0.4 = 1.38
    d = decide(TurnConfig(policy="falling", confirm_sure=1.5), finished, 480, 500)
    assert d.end_now and not d.sure
    released = Evidence(use_text=True, use_audio=True, text=TurnEnd.COMPLETE, cue=Cue.NUMBER, words=5,
                        probs=[(96, 0.98), (1024, 0.98)])
    d = decide(TurnConfig(policy="falling", confirm_sure=0.0), released, cfg.number_hold_ms, 500)
    assert d.end_now and d.reason == "score_complete_after_number" and not d.sure
    assert not decide(cfg, finished, 96, 500).sure  # no decision, nothing sure


def test_a_trailing_word_is_held_only_so_long() -> None:
    """turn.trailing_hold_ms: "What is that?" (Cue.TRAILING) is vetoed as a trailing "that" would be
    while the silence could be a pause before the object, then judged finished: a sure model ends it from the
    hold on (the decision names the hold), an unsure one still waits, and 0 holds it to max_silence_ms."""
    cfg = TurnConfig(policy="falling")
    hold = cfg.trailing_hold_ms
    assert 0 < hold < cfg.max_silence_ms and {"trailing"} <= set(cfg.falling_late_veto) & set(cfg.model_alone_veto)
    sure = [(96, 0.98), (704, 0.98), (1024, 0.98)]
    text = "What is that?"
    ev = Evidence(use_text=True, use_audio=True, text=judge(text), cue=cue(text), words=5, probs=sure)
    assert ev.cue is Cue.TRAILING and ev.text is TurnEnd.INCOMPLETE
    assert not decide(cfg, ev, hold - 32, 500).end_now
    after = decide(cfg, ev, hold, 500)
    assert after.end_now and after.reason == "score_complete_after_trailing" and after.needed_ms == hold
    unsure = replace(ev, probs=[(96, 0.2), (1024, 0.3)])
    assert not decide(cfg, unsure, hold + 300, 500).end_now
    never = replace(cfg, trailing_hold_ms=0)
    assert not decide(never, ev, never.max_silence_ms - 32, 500).end_now
    # The number's hold does not free a trailing word, nor the trailing hold a number.
    assert cue_at(replace(cfg, number_hold_ms=100, trailing_hold_ms=0), ev, hold) is Cue.TRAILING
    number = replace(ev, cue=Cue.NUMBER, text=TurnEnd.COMPLETE)
    assert cue_at(replace(cfg, number_hold_ms=0, trailing_hold_ms=100), number, hold) is Cue.NUMBER


class PhraseASR:
    """Says the file's first phrase for audio that stops in its first pause, the whole text after."""

    def __init__(self, entry: dict[str, Any], first: str) -> None:
        pad = test_config().vad.speech_pad_ms / 1000  # type: ignore[attr-defined]
        self.first_s = entry["pauses_s"][0][1] - entry["speech_starts_s"] + pad if entry.get("pauses_s") else 1e9
        self.first, self.text = first, entry["text"]

    async def transcribe(self, audio: np.ndarray, **_: Any) -> Transcript:
        return Transcript(text=self.first if len(audio) / 16_000 < self.first_s else self.text)

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript:
        return await self.transcribe(audio, **kw)


@pytest.fixture(scope="module")
def batcher_model() -> SmartTurnModel:
    return SmartTurnModel()


class InlineEndOfTurn:
    """The real model, answering within the chunk that asked (on a busy CI machine a worker thread may
    answer after the pause is over; the decision, not the machine's speed, is under test here)."""

    def __init__(self, model: SmartTurnModel) -> None:
        self.model = model

    async def probability(self, audio: np.ndarray) -> float:
        return self.model.probability(audio)


async def _converse(cfg: Any, audio: np.ndarray, asr: Any, model: Any,
                    hold: tuple[int, Callable[[], object]] | None = None) -> list[dict]:
    """Feed ``audio`` at the pace it was spoken. ``model``: a model answering at once (``probability`` a plain
    function, wrapped in :class:`InlineEndOfTurn`), or an end-of-turn object of the pipeline's own (a coroutine).
    ``hold``: at that sample, wait until the condition is true before feeding on (the stream's clock stands
    still meanwhile, so the pipeline hears the same audio however slow the machine)."""
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    end_of_turn = model if asyncio.iscoroutinefunction(model.probability) else InlineEndOfTurn(model)
    deps = TurnDeps(asr=asr, tts=ToneTTS(), responder=EchoResponder(), end_of_turn=end_of_turn)
    conv = Conversation(cfg, Endpointer(cfg.vad, SileroModel.shared()), deps, ReplyTrack(queue_ms=1000), events, "e")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(0, len(audio), CHUNK):
        if hold is not None and i <= hold[0] < i + CHUNK:
            held = loop.time()
            await until(hold[1], "the held condition")
            t0 += loop.time() - held
        conv.feed(audio[i : i + CHUNK])
        await asyncio.sleep(max(0.0, t0 + (i + CHUNK) / 16_000 - loop.time()))
    await asyncio.sleep(0.3)
    await conv.close()
    return seen


@pytest.mark.slow
async def test_model_says_done_mid_sentence_but_the_transcript_keeps_one_turn(batcher_model: SmartTurnModel) -> None:
    """order_pizza.wav: the audio model hears "I'd like to order" as complete (0.9+, synthetic voice);
    the transcript ends on "order", so the turn waits, and the sentence stays one turn."""
    entry = MANIFEST["order_pizza.wav"]
    x, _ = read_audio(PAUSES / entry["file"])
    x = x[: int((entry["speech_ends_s"] + 1.2) * 16_000)]
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})
    seen = await _converse(cfg, x, PhraseASR(entry, "I'd like to order."), batcher_model)
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 1, ends
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert finals == [entry["text"]]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["flat", "falling"])
async def test_finished_sentence_ends_on_the_evidence(
    shared_audio: Path, batcher_model: SmartTurnModel, policy: str
) -> None:
    """en_story.wav: model (0.9+ on the clean file) and transcript agree. The flat policy ends the turn at the
    96 ms pause, well before the 500 ms of silence the endpointer alone would wait. The falling policy (the
    default since the held-out half of the end-of-turn corpus showed the flat one cutting 26.2 % of turns off)
    ends it where its falling threshold meets the evidence's score, on the evidence, well before
    max_silence_ms."""
    x, _ = read_audio(shared_audio / "en_story.wav")
    entry = {"text": "Tell me a short story about a cat who learns to play the piano.", "speech_starts_s": 0.51}
    asr = PhraseASR(entry, entry["text"])  # no pause inside: the whole text at the end
    # Smart Turn says 0.84-0.9+ at this pause depending on the onnxruntime build (0.84 with 1.32): the flat policy's
    # sure line is put under that, since what is tested is the policy acting on a sure model, not the 0.85 line.
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True, "policy": policy,
                            "end_of_turn_sure": 0.8})
    seen = await _converse(cfg, x, asr, batcher_model)
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 1 and ends[0]["reason"] == "end_of_turn", ends
    if policy == "flat":
        assert ends[0]["ago_ms"] < cfg.vad.end_silence_ms  # type: ignore[attr-defined]
    else:
        turn = cfg.turn  # type: ignore[attr-defined]
        # p ≥ 0.9 with a complete-looking text: the threshold is down to 0.9 by this much silence.
        crossing = turn.speculative_pause_ms + (turn.falling_over_ms - turn.speculative_pause_ms) * (
            turn.falling_from - 0.9) / (turn.falling_from - turn.falling_to)
        assert ends[0]["ago_ms"] < min(crossing + 300, turn.max_silence_ms), (ends, crossing)


class SureModel:
    """A model that is sure of every pause (0.99): only the transcript can keep the turn open."""

    def probability(self, audio: np.ndarray) -> float:
        return 0.99


@pytest.mark.slow
async def test_a_fragment_at_a_pause_waits_for_the_silence_however_sure_the_model(shared_audio: Path) -> None:
    """en_weather.wav: Whisper may close the first phrase as "Hello?" (a finished sentence by the transcript
    rule); with a sure model the pause after it would end the turn at once, cutting off "what is the weather
    like today?". A transcript of fewer than SHORT_TURN_WORDS words waits the fixed silence instead."""
    x, _ = read_audio(shared_audio / "en_weather.wav")
    entry = {"text": "Hello, what is the weather like today?", "pauses_s": [[0.89, 1.25]], "speech_starts_s": 0.54}
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})
    seen = await _converse(cfg, x, PhraseASR(entry, "Hello?"), SureModel())  # type: ignore[arg-type]
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 1 and ends[0]["reason"] == "end_of_turn", ends
    assert [e["text"] for e in seen if e["type"] == "transcript" and e["final"]] == [entry["text"]]


@pytest.mark.slow
@pytest.mark.parametrize(("text", "held"), [("Set a timer for 10.", "number"), ("What is that?", "trailing")])
async def test_a_held_cue_waits_its_hold_not_the_cap(text: str, held: str, shared_audio: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """turn.number_hold_ms and turn.trailing_hold_ms through turn-taking: a finished turn heard as ending on a
    number ("Set a timer for 10.") or on a word that usually goes on ("What is that?": "that" vetoed it to
    max_silence_ms before) is held while the silence could be a pause inside the turn, then ends on a sure model
    before the cap: the decision names the hold and comes at a silence between it and max_silence_ms (on the
    stream's own clock)."""
    x, _ = read_audio(shared_audio / "en_timer.wav")
    x = np.concatenate([x, np.zeros(2 * 16_000, np.float32)])  # silence past the cap after the speech
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})
    with caplog.at_level(logging.INFO, logger="assistant.pipeline.turn_taking"):
        seen = await _converse(cfg, x, PhraseASR({"text": text, "speech_starts_s": 0.54}, text), SureModel())
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 1 and ends[0]["reason"] == "end_of_turn", ends
    decided = [r.getMessage() for r in caplog.records if r.getMessage().startswith("turn_end_decided")]
    assert len(decided) == 1 and f"verdict=score_complete_after_{held}" in decided[0], decided
    pause_ms = int(re.search(r"pause_ms=(\d+)", decided[0]).group(1))  # type: ignore[union-attr]
    hold = getattr(cfg.turn, f"{held}_hold_ms")  # type: ignore[attr-defined]
    assert hold <= pause_ms < cfg.turn.max_silence_ms, decided  # type: ignore[attr-defined]


class CountingModel:
    """The real model, recording how much audio each call heard."""

    def __init__(self, model: SmartTurnModel) -> None:
        self.model, self.heard = model, []  # type: ignore[var-annotated]

    def probability(self, audio: np.ndarray) -> float:
        self.heard.append(len(audio))
        return self.model.probability(audio)


@pytest.mark.slow
async def test_falling_policy_asks_the_model_again_as_the_silence_grows(
    shared_audio: Path, batcher_model: SmartTurnModel
) -> None:
    """en_weather.wav's end: the model hears the pause at the speculative pause and again at each of
    turn.end_of_turn_recheck_ms the silence reaches before the turn ends, each time with more of the silence."""
    x, _ = read_audio(shared_audio / "en_weather.wav")
    entry = {"text": "Hello, what is the weather like today?", "pauses_s": [[0.89, 1.25]], "speech_starts_s": 0.54}
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})
    model = CountingModel(batcher_model)
    seen = await _converse(cfg, x, PhraseASR(entry, "Hello?"), model)  # type: ignore[arg-type]
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 1 and ends[0]["reason"] == "end_of_turn", ends
    # The first pause (after "Hello") asks once or more; the end's pause asks again as it lengthens.
    assert len(model.heard) >= 3, model.heard
    grows = [b - a for a, b in zip(model.heard, model.heard[1:], strict=False) if 0 < b - a < 16_000]
    assert grows, model.heard  # a re-ask of the same pause heard more (silent) audio than the ask before it


class SlowASR:
    """A transcript that takes ``delay_s`` to come, as a CPU's ASR pass does; records when each one landed."""

    def __init__(self, text: str, delay_s: float) -> None:
        self.text, self.delay_s, self.landed = text, delay_s, []  # type: ignore[var-annotated]

    async def transcribe(self, audio: np.ndarray, **_: Any) -> Transcript:
        await asyncio.sleep(self.delay_s)
        self.landed.append(asyncio.get_running_loop().time())
        return Transcript(text=self.text)

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript:
        return await self.transcribe(audio, **kw)


class UnsureModel:
    """Never sure the user is done (0.1); records when it was asked and how much audio it heard."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int]] = []

    async def probability(self, audio: np.ndarray) -> float:
        self.calls.append((asyncio.get_running_loop().time(), len(audio)))
        return 0.1


@pytest.mark.slow
async def test_the_model_waits_for_the_transcript_then_hears_the_pause_at_its_mark(shared_audio: Path) -> None:
    """A model run beside the ASR pass slows the pass (two CTranslate2 threads stall while a core is taken; on one
    thread it slowed four sessions' turns), and the decision waits for the transcript anyway: so the model is first
    asked when the transcript lands, once, on the audio as it was at the latest recheck mark passed (the marks before
    it are not asked one by one), then at each later mark, each time on the audio up to that mark: the evidence
    ``bench eot`` collects and replays."""
    x, _ = read_audio(shared_audio / "en_story.wav")
    x = np.concatenate([x, np.zeros(16_000 * 2, np.float32)])
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})
    marks = cfg.turn.end_of_turn_recheck_ms  # type: ignore[attr-defined]
    asr, model = SlowASR("Tell me a short story about a cat who learns to play the piano.", 0.35), UnsureModel()
    await _converse(cfg, x, asr, model)
    assert asr.landed and model.calls
    # Not asked before the transcript of its pause landed (the end's pause: the clip has no other).
    assert model.calls[0][0] >= asr.landed[0], (model.calls, asr.landed)
    # The first ask was at the latest mark passed (96 + 350 ms of silence or more: 320 ms, or a later one on a slow
    # machine), not at each mark before it; then one per later mark, each on the audio up to its mark.
    heard = [n for _, n in model.calls]
    assert len(heard) >= 2, heard
    steps = [b - a for a, b in itertools.pairwise(heard)]
    firsts = [k for k, m in enumerate(marks) if m >= 320 and k + len(heard) <= len(marks)]
    assert any(steps == [(b - a) * 16 for a, b in itertools.pairwise(marks[k : k + len(heard)])] for k in firsts), (
        heard, marks)


@pytest.mark.slow
async def test_the_model_hears_the_speech_since_the_latest_pause() -> None:
    """turn.end_of_turn_since_pause: at order_pizza.wav's end ("I'd like to order [pause] a large pizza with
    mushrooms.") the end-of-turn model hears the words after the pause, not the whole utterance (a long silence
    inside its audio makes Smart Turn unsure of a finished turn); off, the whole utterance. As bench eot's
    evidence (tests/lab/test_eot_bench.py)."""
    entry = MANIFEST["order_pizza.wav"]
    x, _ = read_audio(PAUSES / entry["file"])
    x = x[: int((entry["speech_ends_s"] + 1.5) * 16_000)]
    last: dict[bool, float] = {}
    for since in (True, False):
        cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True,
                                "end_of_turn_since_pause": since})
        model = UnsureModel()
        await _converse(cfg, x, PhraseASR(entry, "I'd like to order."), model)
        last[since] = max(n for _, n in model.calls) / 16_000  # the end's latest mark
    after_pause = entry["speech_ends_s"] - entry["pauses_s"][-1][1]
    assert last[True] > after_pause, last  # every word after the pause
    assert last[False] - last[True] > 0.8, last  # not the words before it


def _distance() -> tuple[dict[str, Any], np.ndarray, Any]:
    """distance.wav's manifest entry, its audio with 2.5 s of silence after the end, and a config with every
    end-of-turn signal on."""
    entry = MANIFEST["distance.wav"]
    x, _ = read_audio(PAUSES / entry["file"])
    x = x[: int((entry["speech_ends_s"] + 2.5) * 16_000)]
    return entry, x, test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": True})


class LosesTheTail:
    """distance.wav as Whisper without timestamps hears it: audio up to the pause and the whole turn are both
    "What is the distance between?"; a pass over the tail alone (told the words before it) hears the rest.
    Records each pass: (seconds of audio, prompt)."""

    def __init__(self, entry: dict[str, Any], tail: str = "Paris and Berlin?") -> None:
        self.pause_end_s = entry["pauses_s"][0][1] - entry["speech_starts_s"]
        self.tail, self.passes = tail, []  # type: ignore[var-annotated]

    async def transcribe(self, audio: np.ndarray, *, prompt: str | None = None, **_: Any) -> Transcript:
        self.passes.append((len(audio) / 16_000, prompt))
        if prompt:
            return Transcript(text=self.tail, language="en")
        return Transcript(text="What is the distance between?", language="en")

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript:
        return await self.transcribe(audio, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("tail", ["Paris and Berlin?", ""])
async def test_the_words_after_a_pause_are_heard_when_the_turns_pass_loses_them(
    batcher_model: SmartTurnModel, tail: str
) -> None:
    """distance.wav: the pause's pass heard "What is the distance between?", and so did the pass over the whole
    turn (the decoder ended its text at the pause): the tail after the pause gets a pass of its own, told the words
    before it, and the turn is heard whole; its reply answers the question that was asked. A tail pass that hears
    nothing leaves the turn's own transcript."""
    entry, x, cfg = _distance()
    asr = LosesTheTail(entry, tail)
    seen = await _converse(cfg, x, asr, batcher_model)
    assert len([e for e in seen if e["type"] == "speech_end"]) == 1
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert finals == (["What is the distance between? Paris and Berlin?"] if tail else
                      ["What is the distance between?"])
    prompted = [(s, p) for s, p in asr.passes if p]
    assert prompted and all(p == "What is the distance between?" for _, p in prompted)
    # The tail's pass heard the audio after the pause's pass: shorter than the turn by at least the pause's start.
    whole = max(s for s, p in asr.passes if not p)
    assert all(s < whole - 1.0 for s, _ in prompted), asr.passes


class TailFails(LosesTheTail):
    """The pass over the tail raises (a worker's fault, a time-out)."""

    async def transcribe(self, audio: np.ndarray, *, prompt: str | None = None, **kw: Any) -> Transcript:
        if prompt:
            self.passes.append((len(audio) / 16_000, prompt))
            raise RuntimeError("the tail's pass failed")
        return await super().transcribe(audio, **kw)


@pytest.mark.slow
async def test_a_failed_pass_over_the_tail_keeps_the_turns_own_transcript(batcher_model: SmartTurnModel) -> None:
    """The turn's own pass answered; the second one failing costs the tail, not the turn: no error, no apology."""
    entry, x, cfg = _distance()
    asr = TailFails(entry)
    seen = await _converse(cfg, x, asr, batcher_model)
    assert any(p for _, p in asr.passes), asr.passes  # the tail's pass was asked, and failed
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert finals == ["What is the distance between?"]
    assert not [e for e in seen if e["type"] == "error"]
    assert any(e["type"] == "reply_text" for e in seen)


class HearsOn(LosesTheTail):
    """The whole turn's pass hears the words after the pause: no pass over the tail."""

    async def transcribe(self, audio: np.ndarray, *, prompt: str | None = None, **_: Any) -> Transcript:
        self.passes.append((len(audio) / 16_000, prompt))
        if len(audio) / 16_000 < self.pause_end_s:
            return Transcript(text="What is the distance between?", language="en")
        return Transcript(text="What is the distance between Paris and Berlin?", language="en")


@pytest.mark.slow
async def test_no_pass_over_the_tail_when_the_turns_pass_heard_it(batcher_model: SmartTurnModel) -> None:
    entry, x, cfg = _distance()
    asr = HearsOn(entry)
    seen = await _converse(cfg, x, asr, batcher_model)
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert finals == ["What is the distance between Paris and Berlin?"]
    assert len(asr.passes) >= 2 and not any(p for _, p in asr.passes), asr.passes


class Answered:
    """A transcriber that counts the passes it has answered."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.answered = inner, 0

    async def transcribe(self, audio: np.ndarray, **kw: Any) -> Transcript:
        heard: Transcript = await self.inner.transcribe(audio, **kw)
        self.answered += 1
        return heard

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript | None:
        heard: Transcript | None = await self.inner.transcribe_partial(audio, **kw)
        return heard


@pytest.mark.slow
async def test_a_real_pass_over_the_tail_hears_what_the_turns_pass_lost(batcher_model: SmartTurnModel) -> None:
    """The same with tiny.en itself: over the whole of distance.wav it ends its text at the pause ("What is the
    distance between?"); the pass over the tail hears the last words ("Harrison Berlin": a synthetic voice's
    "Paris and"), so the turn's transcript and the reply have them."""
    from assistant.asr import create_asr
    from assistant.asr.runner import ASRRunner
    from assistant.config import ASRConfig

    entry, x, cfg = _distance()
    runner = ASRRunner(create_asr(ASRConfig()), ASRConfig())
    asr = Answered(runner)
    # Mid-pause, the pause's pass must have answered before the speech comes back (on a loaded machine it may
    # not in 400 ms; then no tail is known and the turn keeps its own transcript): the stream waits for it there.
    mid_pause = int((entry["pauses_s"][0][0] + 0.3) * 16_000)
    try:
        seen = await _converse(cfg, x, asr, batcher_model, hold=(mid_pause, lambda: asr.answered >= 1))
    finally:
        runner.close()
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert len(finals) == 1 and finals[0].startswith("What is the distance between") and "Berlin" in finals[0], finals


@pytest.mark.parametrize(("asked", "text", "expected"), [
    # What the assistant asked says how long a whole answer is: so many digits, or any count.
    ("What is your four-digit PIN?", "1234.", Cue.COMPLETE),
    ("What is your four-digit PIN?", "12.", Cue.SHORT),
    ("Please read me the 6 digit code.", "It's 123 456.", Cue.COMPLETE),
    ("Please read me the 6 digit code.", "The code is 123.", Cue.NUMBER),
    ("How many tickets do you need?", "Three.", Cue.COMPLETE),
    ("How many tickets do you need?", "I need 3.", Cue.COMPLETE),
    ("How long should the timer be?", "10.", Cue.SHORT),  # "... minutes" may follow
    ("", "I need 3.", Cue.NUMBER),
    # What the speaker called the number says how long a whole one is.
    ("", "My flight number is 1390.", Cue.COMPLETE),
    ("", "My flight number is 13.", Cue.NUMBER),
    ("", "The code is 123.", Cue.NUMBER),  # a one-time code is read in two groups of three
    ("", "The code is 123 456.", Cue.COMPLETE),
    ("", "The zip code is 94110.", Cue.COMPLETE),
    ("", "My number is 555.", Cue.NUMBER),  # a phone number: turn.number_whole_digits
    ("What's your phone number?", "My number is 555-213.", Cue.NUMBER),
    # Whole by its digits, it needs no full stop (Whisper often writes none after a digit string); a number whole
    # by other signs, or only a count, still goes by its punctuation.
    ("", "My number is 555-213-449", Cue.COMPLETE),
    ("", "My flight number is 1390", Cue.COMPLETE),
    ("What is your four-digit PIN?", "It is 1234", Cue.COMPLETE),
    ("How many tickets do you need?", "I need 3", Cue.OPEN),  # "… for tonight" may follow
    ("", "The meeting is at 1030", Cue.OPEN),
    ("", "My flight number is 13", Cue.NUMBER),
    # A time of day said as an hour and its minutes, in a sentence about a time, is finished; a lone hour is not.
    ("", "Set an alarm for 8 15", Cue.OPEN),
    ("", "Set in alarm for 10, 15.", Cue.COMPLETE),
    ("", "Wake me up tomorrow until 6 45.", Cue.COMPLETE),
    ("", "Set an alarm for 10.", Cue.NUMBER),
    ("", "Set an alarm for 7:00.", Cue.NUMBER),
    ("", "Book a table for 4, 15.", Cue.NUMBER),  # no time: "… minutes from now" may follow
])
def test_a_number_is_whole_by_what_was_asked_and_what_was_said(asked: str, text: str, expected: Cue) -> None:
    """Issue 58: a turn that ends on a number is answered without the number hold when the question or the speaker's
    own words say the number is whole; a phone number or a code still being read keeps its hold."""
    assert cue(text, whole_digits=TurnConfig().number_whole_digits, asked=asked) is expected


@pytest.mark.parametrize(("asked", "text", "plan", "expected"), [
    # turn.phone_plan "nanp": a phone number by the speaker's words or the question, whole at seven digits.
    ("", "My number is 555-2134.", "nanp", Cue.COMPLETE),
    ("", "My number is 555-2134", "nanp", Cue.COMPLETE),
    ("", "my cell's 555 2134", "nanp", Cue.COMPLETE),
    ("", "Call me back at 555 2134", "nanp", Cue.COMPLETE),
    ("", "My number is five five five two one three four.", "nanp", Cue.COMPLETE),
    ("What's your phone number?", "555-2134.", "nanp", Cue.COMPLETE),
    ("What's the best number to reach you?", "It's 555 2134.", "nanp", Cue.COMPLETE),
    # Not whole: six digits, a local number cannot begin with 0 or 1 ("1-800-555" goes on), no phone named.
    ("", "My number is 555-213.", "nanp", Cue.NUMBER),
    ("", "My number is 155-1838.", "nanp", Cue.NUMBER),
    ("", "Call 1-800-555", "nanp", Cue.NUMBER),
    ("", "I need 555 2134", "nanp", Cue.NUMBER),
    ("Which day suits you?", "555-2134.", "nanp", Cue.SHORT),
    # The shipped plan is none: a seven-digit number is held as maybe half said.
    ("", "My number is 555-2134.", "", Cue.NUMBER),
    ("What's your phone number?", "555-2134.", "", Cue.SHORT),
])
def test_a_phone_number_is_whole_by_the_phone_plan(asked: str, text: str, plan: str, expected: Cue) -> None:
    """Issue 58: where callers give North American numbers, a seven-digit one after "my number is" or to "What is
    your phone number?" is whole (it had waited number_hold_ms, ~1.2-1.4 s heard); a shorter one, or one no local
    number can be, is still held."""
    assert TurnConfig().phone_plan == ""
    assert cue(text, whole_digits=TurnConfig().number_whole_digits, asked=asked, phone_plan=plan) is expected


def test_the_phone_plans_digits() -> None:
    from assistant.config.turn import PHONE_PLANS
    from assistant.pipeline.end_of_turn import PHONE_PLAN_RULES, nanp_whole, trailing_digits

    assert set(PHONE_PLAN_RULES) | {""} == set(PHONE_PLANS)
    assert [nanp_whole(d) for d in ("5552134", "1552134", "0552134", "555213", "55521345")] == [
        True, False, False, False, False]
    assert [nanp_whole(d) for d in ("4155552134", "4151552134", "0155552134", "14155552134", "24155552134")] == [
        True, False, False, True, False]
    assert trailing_digits("My number is five five five 2134.") == "5552134"
    assert trailing_digits("My number is 555-213-4490") == "5552134490"
    assert trailing_digits("It is twenty one") is None and trailing_digits("Hello.") is None
    with pytest.raises(ConfigError, match=r"turn\.phone_plan"):
        load_config(environ={}, overrides={"turn": {"phone_plan": "uk"}})
    assert load_config(environ={}, overrides={"turn": {"phone_plan": "nanp"}}).turn.phone_plan == "nanp"


def test_the_number_rules_read_the_end_of_a_long_transcript() -> None:
    """The number rules read the transcript's last NUMBER_TAIL_CHARS: a long turn's number is judged as a short
    one's, and a long run of digits, spaces and dashes that fails at its end no longer costs seconds of the event
    loop (their end-anchored patterns cost its square: 1.7 s for 6,000 characters before the bound)."""
    from assistant.pipeline.end_of_turn import NUMBER_TAIL_CHARS, named_digits

    said = "I told you about the trip and the hotel and the car. " * 40
    assert len(said) > 10 * NUMBER_TAIL_CHARS
    assert cue(said + "My flight number is 1390.", whole_digits=8) is Cue.COMPLETE
    assert cue(said + "My number is 555-2134.", whole_digits=8, phone_plan="nanp") is Cue.COMPLETE
    assert cue(said + "Set an alarm for 8 15.", whole_digits=8) is Cue.COMPLETE
    assert cue(said + "My number is 555-213.", whole_digits=8) is Cue.NUMBER
    # Only the end is read: a name further back than the bound names no number ("flight number is" + 300 chars).
    assert named_digits("My flight number is " + "1 " * 150) is None
    assert named_digits("My flight number is " + "1 " * 50) == 3
    for junk in ("The code is " + " -" * 3000 + "a 1", "my number " + " ,-" * 2000 + "a 5552134",
                 "alarm " * 2000 + "for 10 15 x 1"):
        assert named_digits(junk) is None
        assert cue(junk, whole_digits=8, phone_plan="nanp") is Cue.NUMBER


def test_what_was_asked_is_what_the_assistant_last_said() -> None:
    from assistant.pipeline.end_of_turn import expected_digits
    from assistant.respond.history import ConversationHistory

    history = ConversationHistory(max_turns=0)  # kept even when no history goes to the responder
    history.add_turn("Book me a table.", "Sure. How many people?")
    assert history.last_reply == "Sure. How many people?" and expected_digits(history.last_reply) == 1
    assert expected_digits("Your ZIP code, please.") == 5 and expected_digits("Hello!") is None
    history.clear()
    assert history.last_reply == ""


def test_the_reply_waits_the_hold_its_end_earned() -> None:
    """One rule for the conversation and the lab's replay: a sure end waits ``confirm_sure_ms``, an unsure one
    ``confirm_ms``, and with ``confirm_ms`` 0 no reply waits at all."""
    cfg = TurnConfig(confirm_ms=650, confirm_sure_ms=200)
    assert confirm_hold_ms(cfg, sure=False) == 650 and confirm_hold_ms(cfg, sure=True) == 200
    assert confirm_hold_ms(TurnConfig(confirm_ms=650, confirm_sure_ms=0), sure=True) == 0
    assert confirm_hold_ms(TurnConfig(confirm_ms=0, confirm_sure_ms=0), sure=False) == 0
    assert confirm_hold_ms(TurnConfig(), sure=False) == TurnConfig().confirm_ms
    # A sure end never waits longer than an unsure one: a shorter confirm_ms alone shortens both.
    assert confirm_hold_ms(TurnConfig(confirm_ms=400, confirm_sure_ms=500), sure=True) == 400
