"""``python -m lab hearing``'s word matching, and ``bench eot``'s rows for the human set, on made-up evidence
(no model runs)."""

from __future__ import annotations

import json

from assistant.bench.audio_source import load_utterance, read_manifest
from lab.eot import flatten, human_report
from lab.eot_evidence import ClipEvidence, PauseEvidence
from lab.hearing import Clip, Pass, heard, normalise, slot_table, words_table
from lab.human_set import TUNING_NOTE, human_dir, load_human
from tests.needs import shared


def test_words_are_matched_whatever_the_case_punctuation_or_digits() -> None:
    assert normalise("A 12-ounce Iced-Mocha, 8oz; 2 shots.") == [
        "a", "twelve", "ounce", "iced", "mocha", "eight", "ounce", "two", "shot"]
    assert heard("sixteen ounce", "Can I get a 16 oz latte?")
    assert heard("triple shot", "a triple-shot espresso")
    assert heard("twenty ounce", "20 ounces of coffee")
    assert not heard("iced mocha", "a mocha, iced")  # the words in order, next to each other
    assert not heard("mocha", "")


def test_the_slot_table_counts_each_engine_at_the_turns_end() -> None:
    end = Pass(2.0, True, 2.1, {"tiny.en+en": "An iced mocha, light roast.", "base+auto": "A nice mocha light roast"})
    mid = Pass(1.0, False, 1.0, {"tiny.en+en": "", "base+auto": "An iced mocha"})
    table = slot_table([Clip("human", "a.flac", {"coffeeDrink": "iced mocha", "roast": "light roast"}, [mid, end])],
                       ["tiny.en+en", "base+auto"])
    assert "| coffeeDrink | 1 | 1 (100.0 %) | 0 (0.0 %) |" in table
    assert "| all slots | 2 | 2 (100.0 %) | 1 (50.0 %) |" in table


def test_the_words_table_counts_each_word_as_often_as_it_is_said() -> None:
    end = Pass(3.0, True, 3.1, {"stamps": "What is the distance between? Paris and Berlin?",
                                "none": "What is the distance between?"})
    clip = Clip("synthetic en", "distance.wav", {}, [end], "What is the distance between Paris and Berlin?")
    table = words_table([clip], ["stamps", "none"])
    assert "| stamps | 1 | 8 of 8 (100.0 %) | 1 (100 %) |" in table
    assert "| none | 1 | 5 of 8 (62.5 %) | 0 (0 %) |" in table


def _clip(name: str, kind: str, pauses: list[PauseEvidence]) -> ClipEvidence:
    return ClipEvidence(file=name, split="human", engine="human", voice="human", lang="en", kind=kind,
                        speech_ends_s=2.0, status="ok", pauses=pauses)


def test_the_human_set_has_rows_of_its_own_that_say_it_is_a_tuning_set() -> None:
    sure_end = [[m, 0.95, 50.0] for m in (96, 192, 320, 480, 704, 1024, 1504)]
    fluent = _clip("a.flac", "fluent", [PauseEvidence(2.0, True, None, None, "A latte.", 150.0, sure_end)])
    paused = _clip("b.flac", "pauses", [
        PauseEvidence(1.0, False, 300, None, "A latte and", 150.0, [[96, 0.2, 50.0], [192, 0.3, 50.0]]),
        PauseEvidence(2.0, True, None, None, "A latte and a muffin.", 150.0, sure_end)])
    from assistant.config import TurnConfig
    from lab.eot import _settings

    eager = {**_settings(TurnConfig(), "falling"), "falling_from": 0.1, "falling_to": 0.0, "cue_continues": 0.0}
    report = human_report(flatten([fluent, paused]), _settings(TurnConfig(), "falling"), 1200, eager)
    assert TUNING_NOTE in report["text"] and "**a tuning set**" in report["markdown"]
    parts = {(r["policy"], r["turns"]) for r in report["rows"]}
    assert {("falling", "all (2)"), ("falling", "fluent (1)"), ("falling", "pauses (1)")} <= parts
    # The point tuned without the human set, on rows of its own: this one ends at "and" (its veto is off).
    other = next(r for r in report["rows"] if r["policy"] == "falling, tuned without it" and r["turns"] == "all (2)")
    assert other["false cut-offs"] == "50.0 %"
    falling = next(r for r in report["rows"] if r["policy"] == "falling" and r["turns"] == "all (2)")
    assert falling["false cut-offs"] == "0.0 %"  # "and" at the pause is a veto


def test_the_human_set_loads_as_manifest_entries() -> None:
    folder = shared("audio/human")
    assert folder == human_dir()
    clips = load_human()
    assert len(clips) == 120 and sum(c["kind"] == "pauses" for c in clips) == 37  # its README: 37 with a pause
    assert all(c["speech_ends_s"] > c["speech_starts_s"] and "pauses_s" not in c for c in clips)


def test_bench_v2v_plays_the_human_set_with_its_labelled_ends() -> None:
    """``assistant bench v2v --audio ../shared/audio/human/*.flac``: no manifest there, the labels give the ends."""
    folder = shared("audio/human")
    manifest = read_manifest(folder)
    assert len(manifest) == 120
    labels = {row["file"]: row for row in json.loads((folder / "labels.json").read_text())}
    for name in sorted(manifest)[:3]:
        utt = load_utterance(folder / name, manifest)
        assert utt.speech_end_sample == round(labels[name]["speech_end_s"] * 48000)
        assert len(utt.pcm) > utt.speech_end_sample
