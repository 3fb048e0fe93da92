"""Smart Turn v3.2 end-of-turn model: features, the shipped ONNX, batching, and the pause files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from assistant.vad.end_of_turn import (
    MODEL_FILE,
    N_FRAMES,
    N_MELS,
    WINDOW_SAMPLES,
    SmartTurnBatcher,
    SmartTurnModel,
    last_window,
    log_mel,
    mel_filter_bank,
)

PAUSES = Path(__file__).parent / "data" / "pauses"


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    return SmartTurnModel()


def _tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * 16_000)) / 16_000
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_model_ships_inside_the_package_with_its_licence() -> None:
    assert MODEL_FILE.is_file() and MODEL_FILE.stat().st_size > 1_000_000
    licence = (MODEL_FILE.parent / "smart-turn-LICENSE").read_text()
    assert "BSD 2-Clause" in licence


def test_last_window_pads_at_the_front_and_keeps_the_end() -> None:
    short = _tone(1.0)
    w = last_window(short)
    assert w.shape == (WINDOW_SAMPLES,)
    assert not w[: WINDOW_SAMPLES - short.size].any()
    np.testing.assert_array_equal(w[-short.size :], short)
    long = np.arange(WINDOW_SAMPLES + 500, dtype=np.float32)
    np.testing.assert_array_equal(last_window(long), long[-WINDOW_SAMPLES:])


def test_log_mel_shape_range_and_where_the_sound_is() -> None:
    feats = log_mel(_tone(2.0, 440.0))
    assert feats.shape == (N_MELS, N_FRAMES) and feats.dtype == np.float32
    assert np.isfinite(feats).all()
    # Whisper's dynamic range clamp: at most 8 log10 units = 2.0 after the (x + 4) / 4 scaling.
    assert feats.max() - feats.min() <= 2.0 + 1e-5
    # The tone is in the last 2 s (frames 600…800): its band is louder there than in the padding.
    band = int(np.argmax(mel_filter_bank()[int(440 / 8000 * 200)]))
    assert feats[band, 650:790].mean() > feats[band, 50:550].mean() + 0.5


def test_mel_filter_bank_covers_the_spectrum() -> None:
    fb = mel_filter_bank()
    assert fb.shape == (201, 80)
    assert (fb >= 0).all()
    assert (fb.sum(axis=0) > 0).all()  # no empty filter


def test_probability_is_a_probability_and_batching_matches_single_runs(model: SmartTurnModel) -> None:
    x, _ = sf.read(PAUSES / "order_pizza.wav", dtype="float32")
    audios = [x[:24_000], x[:40_000], x]
    batch = model.predict(audios)
    singles = np.array([model.probability(a) for a in audios])
    assert batch.shape == (3,)
    assert ((batch >= 0) & (batch <= 1)).all()
    np.testing.assert_allclose(batch, singles, atol=1e-4)


async def test_batcher_runs_concurrent_calls_together(model: SmartTurnModel) -> None:
    x, _ = sf.read(PAUSES / "alarm.wav", dtype="float32")
    batcher = SmartTurnBatcher(model, max_batch=4, window_s=0.05)
    probs = await asyncio.gather(*(batcher.probability(x[: n * 16_000]) for n in (2, 3, 4)))
    assert batcher.batches == 1 and batcher.calls == 3
    np.testing.assert_allclose(probs, model.predict([x[: n * 16_000] for n in (2, 3, 4)]), atol=1e-4)
    single = SmartTurnBatcher(model)  # the CPU default: no batching, each call runs at once
    await asyncio.gather(single.probability(x), single.probability(x))
    assert single.batches == 2


def test_pause_files_and_manifest_agree() -> None:
    manifest = json.loads((PAUSES / "manifest.json").read_text())
    assert len(manifest) >= 5
    for entry in manifest:
        x, sr = sf.read(PAUSES / entry["file"], dtype="float32")
        assert sr == 16_000 and abs(len(x) / sr - entry["seconds"]) < 0.01
        assert entry["pauses_s"], entry["file"]
        for a, b in entry["pauses_s"]:
            assert 0.3 - 1e-6 <= b - a <= 0.7 + 1e-6
            assert entry["speech_starts_s"] < a < b < entry["speech_ends_s"]
            gap = x[int(a * sr) + 80 : int(b * sr) - 80]
            assert np.abs(gap).max() < 10 ** (-45 / 20)  # the pause really is silent
        after = x[int(entry["speech_ends_s"] * sr) + 160 :]
        assert np.sqrt(np.mean(after[:160] ** 2)) < 10 ** (-45 / 20)  # speech ends where the manifest says
