"""``python -m lab speech-ends``: the server's end of a clip against its label, per half and floor, and the floor
chosen on the tuning half alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from assistant.audio import SPEECH_RATE
from assistant.config import VADConfig
from assistant.vad.silero import SileroModel
from lab.__main__ import main
from lab.speech_ends import Row, choose, server_end


def _speech(shared_audio: Path) -> np.ndarray:
    x, rate = sf.read(shared_audio / "en_weather.wav", dtype="float32")
    assert rate == SPEECH_RATE
    return x


def test_a_quiet_speakers_fading_end_is_where_the_label_puts_it(shared_audio: Path) -> None:
    """The same words 25 dB quieter, their last sound fading under −45 dBFS: the floor under the speaker's own peak
    finds the end where the loud take has it; −45 dBFS alone ends the quiet take early (by 110 ms here)."""
    x = _speech(shared_audio)
    model, vad = SileroModel.shared(), VADConfig()
    loud = server_end(x, 40.0, model, vad)
    quiet = server_end(x * 10 ** (-25 / 20), 40.0, model, vad)
    quiet_abs = server_end(x * 10 ** (-25 / 20), None, model, vad)
    assert loud is not None and quiet is not None and quiet_abs is not None
    assert abs(quiet - loud) <= 0.01
    assert quiet_abs < quiet - 0.06


def test_the_floor_is_chosen_on_the_tuning_half() -> None:
    def row(half: str, floor: str, abs_p50: float, early: int) -> Row:
        return Row(half, floor, 10, 0, 0, 0, 0, 0, early, 0, abs_p50)

    rows = [row("tuning", "abs", 20, 9), row("tuning", "40", 4, 2), row("tuning", "35", 4, 1),
            row("held-out", "50", 1, 0)]
    assert choose(rows) == "35"  # equal distance: fewer early ends; the held-out half never chooses


def test_the_study_runs_on_a_labelled_folder(tmp_path: Path, shared_audio: Path) -> None:
    x = _speech(shared_audio)
    folder = tmp_path / "clips"
    folder.mkdir()
    for name, gain in (("a.flac", 1.0), ("b.flac", 0.05)):
        sf.write(folder / name, x * gain, SPEECH_RATE)
    (folder / "labels.json").write_text(json.dumps([{"file": name, "speech_start_s": 0.54, "speech_end_s": 2.54}
                                                    for name in ("a.flac", "b.flac")]))
    held = tmp_path / "held.txt"
    held.write_text("b.flac\n")
    out = tmp_path / "out"
    assert main(["speech-ends", "--audio", str(folder), "--held-out", str(held), "--below-peak-db", "abs,40",
                 "--out", str(out), "--markdown", str(out / "t.md")]) == 0
    report = json.loads((out / "speech_ends.json").read_text())
    assert [(r["half"], r["floor"], r["n"]) for r in report["rows"]] == [
        ("tuning", "abs", 1), ("tuning", "40", 1), ("held-out", "abs", 1), ("held-out", "40", 1)]
    assert report["chosen"] in ("abs", "40")
    assert "peak − 40 dB" in (out / "t.md").read_text()
