"""Effects: pitch shift, time stretch and energy on a harmonic tone and on real Piper speech."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from assistant.config import TTSConfig
from assistant.tts.base import TTSRequest
from assistant.tts.effects import apply_energy, estimate_f0, pitch_shift, time_stretch
from assistant.tts.piper_engine import PiperEngine

SR = 22050


def harmonic_tone(f0: float = 200.0, seconds: float = 1.5, sr: int = SR) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return sum(0.3 / k * np.sin(2 * np.pi * f0 * k * t) for k in range(1, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """Two sentences from the real joe voice (Piper loaded once for this module).

    Piper's sampling noise is off: with it, breathiness varies per run and moves the F0 median by up to
    ±8 %, which would make the ±5 % checks flaky; without it the numbers are the same on every run.
    """
    engine = PiperEngine(TTSConfig(max_concurrent=1), noise_scale=0.0, noise_w_scale=0.0)

    async def make() -> np.ndarray:
        text = "Hello there. This is a test of the pitch shifting effect on real speech."
        return np.concatenate([c async for c in engine.synthesize(TTSRequest(text=text))])

    try:
        return asyncio.run(make())
    finally:
        asyncio.run(engine.close())


def test_estimate_f0_on_tones() -> None:
    for f0 in (100.0, 200.0, 330.0):
        assert estimate_f0(harmonic_tone(f0), SR) == pytest.approx(f0, rel=0.01)
    assert estimate_f0(np.zeros(SR, np.float32), SR) == 0.0
    assert estimate_f0(np.zeros(10, np.float32), SR) == 0.0


@pytest.mark.parametrize(("semitones", "expected"), [(12, 400.0), (-12, 100.0), (7, 200 * 2 ** (7 / 12))])
def test_pitch_shift_tone(semitones: float, expected: float) -> None:
    x = harmonic_tone()
    y = pitch_shift(x, SR, semitones)
    assert len(y) == len(x) and y.dtype == np.float32
    assert estimate_f0(y, SR) == pytest.approx(expected, rel=0.05)
    # Same loudness within a few dB: no level jumps from the overlap-add.
    rms = lambda a: float(np.sqrt(np.mean(a[SR // 10 : -SR // 10] ** 2)))  # noqa: E731
    assert 0.7 < rms(y) / rms(x) < 1.4


def test_pitch_shift_speech_doubles_f0(speech: np.ndarray) -> None:
    f0 = estimate_f0(speech, SR)
    assert 60 < f0 < 300
    up = estimate_f0(pitch_shift(speech, SR, 12), SR)
    assert up / f0 == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("speed", [1.5, 0.75])
def test_time_stretch_keeps_pitch(speed: float, speech: np.ndarray) -> None:
    x = harmonic_tone()
    y = time_stretch(x, SR, speed)
    assert len(y) / len(x) == pytest.approx(1 / speed, rel=0.03)
    assert estimate_f0(y, SR) == pytest.approx(200.0, rel=0.05)
    ys = time_stretch(speech, SR, speed)
    assert len(ys) / len(speech) == pytest.approx(1 / speed, rel=0.03)
    assert estimate_f0(ys, SR) == pytest.approx(estimate_f0(speech, SR), rel=0.05)


def test_energy_louder_without_clipping(speech: np.ndarray) -> None:
    rms = lambda a: float(np.sqrt(np.mean(a**2)))  # noqa: E731
    loud = apply_energy(speech, 2.0, SR)
    assert np.abs(loud).max() <= 0.99
    assert rms(loud) > 1.3 * rms(speech)
    quiet = apply_energy(speech, 0.5, SR)
    assert rms(quiet) == pytest.approx(0.5 * rms(speech), rel=0.02)
    tone = harmonic_tone() * 2.5  # already over full scale
    assert np.abs(apply_energy(tone, 2.0)).max() <= 0.99
    with pytest.raises(ValueError, match="energy"):
        apply_energy(speech, 3.0)


def test_edge_cases() -> None:
    empty = np.zeros(0, np.float32)
    assert time_stretch(empty, SR, 1.5).size == 0
    assert pitch_shift(empty, SR, 5).size == 0
    assert apply_energy(empty, 2.0).size == 0
    x = harmonic_tone(seconds=0.3)
    assert np.array_equal(time_stretch(x, SR, 1.0), x)
    assert np.array_equal(pitch_shift(x, SR, 0.0), x)
    assert np.array_equal(apply_energy(x, 1.0), x)
    short = x[:50]  # shorter than one WSOLA frame
    assert len(time_stretch(short, SR, 2.0)) == 25
    assert len(pitch_shift(short, SR, -12)) == 50
    with pytest.raises(ValueError, match="speed"):
        time_stretch(x, SR, 10.0)
    with pytest.raises(ValueError, match="pitch"):
        pitch_shift(x, SR, 13)
    with pytest.raises(ValueError, match="mono"):
        time_stretch(np.zeros((2, 100), np.float32), SR, 1.5)


def test_the_limiters_filters_equal_scipys() -> None:
    """running_min/running_mean are scipy.ndimage's minimum/uniform filters (mode "nearest"), without scipy."""
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    from assistant.tts.effects import running_mean, running_min

    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 1001, 22050):
        for size in (1, 3, 9, 441):
            x = rng.random(n).astype(np.float32)
            assert np.array_equal(running_min(x, size), minimum_filter1d(x, size=size, mode="nearest"))
            np.testing.assert_allclose(running_mean(x, size), uniform_filter1d(x, size=size, mode="nearest"),
                                       atol=1e-6)


def test_effects_need_no_scipy() -> None:
    """A plain install has no scipy: the TTS service's speed, pitch and energy run without it."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class NoScipy(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'scipy' or name.startswith('scipy.'):\n"
            "            raise ImportError('no scipy here')\n"
            "sys.meta_path.insert(0, NoScipy())\n"
            "import numpy as np\n"
            "from assistant.tts import effects as fx\n"
            "x = (0.9 * np.sin(np.arange(22050) * 2 * np.pi * 150 / 22050)).astype(np.float32)\n"
            "assert len(fx.time_stretch(x, 22050, 1.5)) == round(22050 / 1.5)\n"
            "assert len(fx.pitch_shift(x, 22050, 3.0)) == 22050\n"
            "assert float(abs(fx.apply_energy(x, 2.0)).max()) <= fx.PEAK_MAX\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
