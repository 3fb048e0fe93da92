"""The bench's own speech (``assistant/bench/speech.py``): the shipped English clips decode to where their labels
say the speech ends, ship with their licence, and stay small; the Japanese requests are made once with Kokoro,
their speech ends and pauses where the manifest says, and reused from the cache."""

from __future__ import annotations

import argparse
import fnmatch
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from assistant.audio import read_audio
from assistant.bench.audio_source import load_utterance, read_manifest
from assistant.bench.speech import DATA, audible_span, bench_speech, japanese_files, shipped_files, speech_languages
from assistant.vad.endpoint import Endpointer, SpeechEnd
from assistant.vad.silero import WINDOW_SAMPLES, SileroStream

ROOT = Path(__file__).resolve().parents[1]
MAX_SHIPPED_BYTES = 300 * 1024  # the package stays small: the clips are about 240 KiB
SILERO_AGREES_S = 0.05
ENDPOINTER_AGREES_S = 0.02


def test_the_shipped_clips_are_listed_licensed_and_small() -> None:
    files = shipped_files()
    assert len(files) == 5 and all(f.suffix == ".opus" and f.is_file() for f in files)
    assert {p.name for p in DATA.glob("*.opus")} == {f.name for f in files}  # nothing shipped unlisted
    assert sum(f.stat().st_size for f in files) < MAX_SHIPPED_BYTES
    notice = (DATA / "README.md").read_text(encoding="utf-8")
    assert "Picovoice" in notice and "Apache License 2.0" in notice and "Changes made" in notice
    assert "Apache License" in (DATA / "picovoice-LICENSE").read_text(encoding="utf-8")
    entries = json.loads((DATA / "manifest.json").read_text(encoding="utf-8"))
    assert sum(1 for e in entries if e["kind"] == "pauses") == 2


def test_the_package_data_takes_every_shipped_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["package-data"]["assistant.bench"]
    for path in DATA.iterdir():
        rel = path.relative_to(DATA.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} would not be in the wheel"


def _silero_end(x: np.ndarray, rate: int) -> float:
    stream = SileroStream()
    probs = [stream.prob(x[i : i + WINDOW_SAMPLES]) for i in range(0, len(x) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES)]
    speech = [i for i, p in enumerate(probs) if p >= 0.5]
    return (speech[-1] + 1) * WINDOW_SAMPLES / rate if speech else 0.0


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: p.name)
def test_a_shipped_clip_ends_where_its_label_says(path: Path) -> None:
    """Decoded (libsndfile reads the Opus), the VAD and our endpointer end the speech at the labelled end: the codec
    kept the quiet end of the last word."""
    x, rate = read_audio(path)
    assert rate == 16_000
    end = read_manifest(path.parent)[path.name]["speech_ends_s"]
    assert abs(_silero_end(x, rate) - end) <= SILERO_AGREES_S
    endpointer = Endpointer()
    ends = [e for e in endpointer.feed(x) + endpointer.finish() if isinstance(e, SpeechEnd)]
    assert len(ends) == 1 and abs(ends[0].speech_end / rate - end) <= ENDPOINTER_AGREES_S
    utt = load_utterance(path)
    assert utt.speech_end_s == pytest.approx(end, abs=1 / 48_000)


def test_languages_flag() -> None:
    assert speech_languages("en") == ["en"] and speech_languages("en,ja") == ["en", "ja"]
    for bad in ("", "fr", "en,xx"):
        with pytest.raises(argparse.ArgumentTypeError):
            speech_languages(bad)


@pytest.mark.slow
async def test_the_japanese_speech_is_made_once_with_exact_ends(tmp_path: Path) -> None:
    files = await bench_speech(["ja"], tmp_path)
    assert [f.name for f in files] == ["ja_weather.wav", "ja_timer.wav", "ja_train.wav"]
    manifest = read_manifest(files[0].parent)
    for f in files:
        entry = manifest[f.name]
        x, rate = read_audio(f)
        start, end = audible_span(x, rate)
        assert entry["speech_ends_s"] == pytest.approx(end / rate, abs=1e-3)
        assert entry["speech_starts_s"] == pytest.approx(start / rate, abs=1e-3)
        assert len(x) / rate - entry["speech_ends_s"] >= 2.4  # a tail for the server's VAD to hear the end in
        for a, b in entry["pauses_s"]:  # a pause inside the sentence: no audible frame in it
            gap = x[round(a * rate) : round(b * rate)]
            assert audible_span(gap, rate) == (0, 0) and b - a >= 0.3
    assert sum(1 for f in files if manifest[f.name]["pauses_s"]) == 2
    made = {f: f.stat().st_mtime_ns for f in files}
    again = await japanese_files(tmp_path)  # the cache, untouched
    assert again == files and {f: f.stat().st_mtime_ns for f in again} == made
    assert [p.name for p in tmp_path.iterdir()] == [files[0].parent.name]  # no half-made folder left behind
