"""The end-of-turn corpus and its evaluation: the same corpus from the same seed, halves that share no sentence
and no voice, labels that say where the turn ends, the bench's replay equal to the pipeline's ``decide()``, and
the falling policy on real clips (real VAD, real Smart Turn, real tiny.en): no false cut-off on the pause files."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from assistant.bench.eot import FallingTable, Pause, Turns, flatten, replay, score_replay
from assistant.bench.eot_corpus import (
    ESPEAK_VOICES,
    HALVES,
    PIPER_VOICES,
    Voice,
    available_voices,
    generate,
    plan_corpus,
)
from assistant.bench.eot_evidence import ClipEvidence, collect_clip
from assistant.config import TurnConfig
from assistant.pipeline.end_of_turn import Cue, TurnEnd, cue

PAUSES = Path(__file__).parent / "data" / "pauses"


def _small_voices() -> list[Voice]:
    """A few voices of each installed family (espeak-ng comes with scripts/test.sh; Piper with the package)."""
    voices = available_voices()
    out = [v for v in voices if v.family == "piper"]
    out += [v for v in voices if v.family == "espeak"][:4]
    return out


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "corpus.json"}


@pytest.mark.slow
def test_the_same_seed_makes_the_same_corpus(tmp_path: Path) -> None:
    voices = _small_voices()
    a = generate(tmp_path / "a", seed=7, sentences=12, voices=voices)
    b = generate(tmp_path / "b", seed=7, sentences=12, voices=voices)
    generate(tmp_path / "c", seed=8, sentences=12, voices=voices)
    assert a["clips"] == b["clips"] and sum(a["clips"].values()) == 12 and not a["skipped"]
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")  # every WAV and manifest, byte for byte
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")
    for half in HALVES:
        manifest = json.loads((tmp_path / "a" / half / "manifest.json").read_text())
        for e in manifest:
            x, sr = sf.read(tmp_path / "a" / half / e["file"], dtype="float32")
            assert sr == 16_000 and abs(len(x) / sr - e["seconds"]) < 0.01
            assert 0.3 < e["speech_starts_s"] < e["speech_ends_s"] <= e["seconds"] - 2.0
            assert e["split"] == half and e["text"] == " ".join(e["segments"])
            assert len(e["pauses_s"]) == len(e["pause_kinds"]) == len(e["segments"]) - 1
            for a_s, b_s in e["pauses_s"]:  # a written-in pause lies inside the turn and lasts
                assert e["speech_starts_s"] < a_s < b_s < e["speech_ends_s"] and b_s - a_s >= 0.2


def test_the_halves_share_no_sentence_and_no_voice() -> None:
    kokoro = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
    voices = ([Voice("piper", v) for v in PIPER_VOICES] + [Voice("espeak", v) for v in ESPEAK_VOICES]
              + [Voice("kokoro", v, "ja") for v in kokoro])
    plan = plan_corpus(34, 360, voices)  # the plan only: nothing is spoken, so no voice needs to be installed
    texts = {h: {s.text.lower() for half, _, s, _ in plan.clips if half == h} for h in HALVES}
    voices = {h: {v.key for half, _, _, v in plan.clips if half == h} for h in HALVES}
    assert len(texts["tune"]) == len(texts["heldout"]) == 180 + 30  # English and Japanese
    assert not texts["tune"] & texts["heldout"]
    assert not voices["tune"] & voices["heldout"]
    assert {v.key for v in plan.voices["tune"]}.isdisjoint({v.key for v in plan.voices["heldout"]})
    kinds = {s.kind for _, _, s, _ in plan.clips}
    assert {"question", "command", "list", "number", "address", "pause_and", "pause_to", "pause_the",
            "pause_number", "pause_name", "pause_um"} <= kinds


def test_transcript_cues() -> None:
    assert cue("What is the weather like today?") is Cue.COMPLETE
    assert cue("I would like to order, um,") is Cue.CONTINUES
    assert cue("Send a message to") is Cue.CONTINUES
    assert cue("My number is 555") is Cue.NUMBER
    assert cue("Set an alarm for six.") is Cue.NUMBER
    assert cue("Hello?") is Cue.SHORT
    assert cue("play some jazz music") is Cue.OPEN
    assert cue("") is Cue.OPEN


def _random_pause(r: random.Random, clip: int, is_end: bool) -> Pause:
    c = r.choice(list(Cue))
    marks = [96, 192, 320, 480, 704, 1024, 1504]
    limit = 2000 if is_end else r.choice([128, 224, 400, 700, 1100])
    return Pause(
        clip=clip, is_end=is_end, silence_ms=None if is_end else limit, offset_ms=r.uniform(0, 120), text="",
        cue=c, text_end=TurnEnd.COMPLETE if c is Cue.COMPLETE else TurnEnd.UNKNOWN, words=5,
        asr_ms=r.uniform(50, 400), labelled=None,
        probs=[[m, r.random(), r.uniform(20, 150)] for m in marks if m <= limit],
    )


def test_the_tuner_s_fast_replay_is_the_pipeline_s_decide() -> None:
    """The vectorised table the tuner uses gives, pause for pause, what the pipeline's decide() gives."""
    r = random.Random(3)
    pauses = [_random_pause(r, i // 3, i % 3 == 2) for i in range(240)]
    clips = [ClipEvidence(file=str(i), split="tune", engine="e", voice="v", lang="en", kind="k", speech_ends_s=1.0,
                          status="ok", pauses=[]) for i in range(80)]
    turns = Turns(clips, pauses)
    base = replace(TurnConfig(), policy="falling")
    for k in range(12):
        cfg = replace(base, falling_from=r.uniform(0.6, 1.6), falling_to=r.uniform(0.0, 0.8),
                      falling_over_ms=r.choice([300, 600, 1200]),
                      end_of_turn_recheck_ms=r.choice([[96], [96, 320], [96, 192, 320, 480, 704, 1024]]),
                      cue_complete=r.uniform(-0.2, 0.5), cue_continues=r.uniform(-1, 0), cue_open=r.uniform(-.3, .2),
                      cue_number=r.uniform(-.5, .2), cue_short=r.uniform(-.5, .1))
        exact = score_replay(cfg, turns, 500)
        fast = FallingTable(turns, cfg).score(cfg)
        assert (exact.cut, exact.waits) == (fast.cut, fast.waits), k


def test_the_threshold_falls_with_the_silence() -> None:
    """The same evidence that does not end the turn after a short silence ends it after a longer one; a
    transcript that goes on holds it to the longest silence."""
    cfg = TurnConfig()
    r = random.Random(1)
    p = _random_pause(r, 0, True)
    p.cue, p.asr_ms, p.probs = Cue.COMPLETE, 100.0, [[96, 0.6, 30.0]]
    t_complete = replay(cfg, p, 500, marks=(96,))
    p.cue = Cue.CONTINUES
    t_continues = replay(cfg, p, 500, marks=(96,))
    assert cfg.speculative_pause_ms + 100 <= t_complete < t_continues
    assert t_continues >= cfg.max_silence_ms


@pytest.fixture(scope="module")
def asr() -> object:
    from assistant.asr.whisper import FasterWhisperEngine
    from assistant.config import ASRConfig

    return FasterWhisperEngine(ASRConfig())


@pytest.fixture(scope="module")
def turn_model() -> object:
    from assistant.vad.end_of_turn import SmartTurnModel

    return SmartTurnModel()


@pytest.mark.slow
def test_no_false_cutoff_on_the_pause_clips(asr: object, turn_model: object, shared_audio: Path) -> None:
    """Every mid-turn pause of tests/data/pauses and ../shared/audio/en_pause_midsentence.wav, heard by the real
    VAD, Smart Turn and tiny.en, survives today's defaults; and every turn still ends."""
    entries = [(PAUSES / e["file"], e) for e in json.loads((PAUSES / "manifest.json").read_text())]
    shared = {e["file"]: e for e in json.loads((shared_audio / "manifest.json").read_text())}
    entries.append((shared_audio / "en_pause_midsentence.wav", shared["en_pause_midsentence.wav"]))
    cfg = TurnConfig()
    for path, entry in entries:
        ev = collect_clip(path, entry, asr, turn_model)  # type: ignore[arg-type]
        assert ev.status == "ok", (path.name, ev.status)
        turns = flatten([ev])
        mids = [p for p in turns.pauses if not p.is_end]
        assert mids, path.name  # the VAD heard the written-in pause
        for p in mids:
            t = replay(cfg, p, 500)
            assert p.silence_ms is not None and t >= p.silence_ms + 32, (path.name, p.text, p.probs, t)
        end = [p for p in turns.pauses if p.is_end]
        assert len(end) == 1 and replay(cfg, end[0], 500) <= cfg.max_silence_ms + 32


def test_corpus_noise_and_phone_change_the_sound() -> None:
    """The variations really vary: a phone clip has nothing above 4 kHz, an echo clip rings on after the speech."""
    from assistant.bench.eot_corpus import _phone, _room

    rng = np.random.default_rng(0)
    x = rng.standard_normal(16_000).astype(np.float32) * 0.1
    spec = np.abs(np.fft.rfft(_phone(x)))
    freqs = np.fft.rfftfreq(16_000, 1 / 16_000)
    assert spec[freqs > 4200].mean() < 0.05 * spec[(freqs > 500) & (freqs < 3000)].mean()
    click = np.zeros(16_000, np.float32)
    click[100] = 1.0
    wet = _room(click, 0.5, 0.7, rng)
    assert np.abs(wet[2000:4000]).max() > 1e-3  # 120-240 ms after the click: the room still rings


def test_japanese_transcripts_have_cues_too() -> None:
    """Japanese has no spaces: a whole sentence is not a fragment, a phrase that stops on a particle goes on."""
    assert cue("明日の東京の天気を教えてください。") is Cue.COMPLETE
    assert cue("明日の、") is Cue.CONTINUES
    assert cue("東京で") is Cue.CONTINUES
    assert cue("えーと") is Cue.CONTINUES
    assert cue("電話番号は123") is Cue.NUMBER
    assert cue("はい") is Cue.SHORT
