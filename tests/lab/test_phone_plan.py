"""``python -m lab phone-plan``: each plan replayed on the same evidence; the number ends it answers sooner, and the
mid-number pause it cuts counted as a false start a caller hears."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from assistant.config.turn import PHONE_PLANS
from assistant.pipeline.end_of_turn import ends_on_number
from lab.eot import flatten
from lab.eot_evidence import ClipEvidence, PauseEvidence
from lab.phone_plan import changes, measure, run_phone_plan

FIXED_MS = 500
MARKS = (96, 192, 320, 480, 704, 1024, 1504)


def _clip(i: int, pauses: list[PauseEvidence], split: str = "tune") -> ClipEvidence:
    return ClipEvidence(file=f"clip_{i}.wav", split=split, engine="e", voice="v", lang="en", kind="number",
                        speech_ends_s=3.0, status="ok", pauses=pauses)


def _end(text: str) -> PauseEvidence:
    return PauseEvidence(start_s=3.0, is_end=True, silence_ms=None, labelled=None, text=text, asr_ms=100.0,
                         probs=[[m, 0.98, 40.0] for m in MARKS], last_p=0.7)


def _mid(text: str, silence_ms: int) -> PauseEvidence:
    return PauseEvidence(start_s=2.0, is_end=False, silence_ms=silence_ms, labelled="in_number", text=text,
                         asr_ms=100.0, probs=[[m, 0.98, 40.0] for m in MARKS if m <= silence_ms], last_p=0.5)


def _clips() -> list[ClipEvidence]:
    return [
        _clip(0, [_end("My number is 555-2134.")]),  # whole by the plan: answered sooner
        _clip(1, [_mid("My number is 5552134.", 576), _end("My number is 555-213-4490.")]),  # a made-up 7th digit
        _clip(2, [_end("My number is 155-1838.")]),  # no local number begins with 1: held either way
        _clip(3, [_end("Play some music.")]),
    ]


def test_a_plan_answers_a_whole_number_sooner_and_counts_the_pause_it_cuts() -> None:
    clips = _clips()
    none, nanp = (measure(flatten(clips, phone_plan=plan), plan, FIXED_MS) for plan in ("", "nanp"))
    assert none.number_ends == nanp.number_ends == 3
    assert nanp.number_heard_mean_ms is not None and none.number_heard_mean_ms is not None
    assert nanp.number_heard_mean_ms < none.number_heard_mean_ms
    assert (none.false_starts, nanp.false_starts) == (0, 1)
    assert nanp.cutoffs > none.cutoffs == 0.0
    changed = changes(clips, "nanp", FIXED_MS)
    assert [(c["file"], c["end"], c["heard_at_pause"]) for c in changed] == [
        ("clip_0.wav", True, False), ("clip_1.wav", False, True)]
    assert all(c["cue"] == "number → complete" for c in changed)
    assert ends_on_number("My number is five five five.") and not ends_on_number("Play some music.")


def test_the_study_reads_lab_eots_cache_and_writes_its_figure(tmp_path: Path, capsys) -> None:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    for half in ("tune", "heldout"):
        with (evidence / f"{half}.jsonl").open("w", encoding="utf-8") as f:
            for c in _clips():
                f.write(json.dumps(asdict(replace(c, split=half))) + "\n")
    figure = tmp_path / "phone_plan.md"
    assert run_phone_plan(argparse.Namespace(out=tmp_path, markdown=figure)) == 0
    text = figure.read_text(encoding="utf-8")
    assert "_Measured with" in text and "| held-out half | nanp | 4 |" in text and "heard |" in text
    assert len([line for line in text.splitlines() if line.startswith("| tuning half |")]) == len(PHONE_PLANS)
    assert "My number is 5552134." in capsys.readouterr().out
