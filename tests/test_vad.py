"""assistant.vad: Silero on onnxruntime, and the Endpointer on the shared speech files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assistant.audio import read_audio, rms_dbfs
from assistant.bench.shared_data import shared_path
from assistant.config import VADConfig
from assistant.vad.endpoint import Endpointer, SpeechEnd, SpeechStart, VADEvent
from assistant.vad.silero import WINDOW_SAMPLES, ZERO_RUN_WINDOWS, SileroModel, SileroStream

AUDIO = shared_path("audio")  # ../shared/audio (assistant/bench/shared_data.py)
MANIFEST = {m["file"]: m for m in json.loads((AUDIO / "manifest.json").read_text())}
SR = 16_000
TOLERANCE_S = 0.1


@pytest.fixture(scope="module")
def model() -> SileroModel:
    return SileroModel.shared()


def _events(
    x: np.ndarray, cfg: VADConfig, model: SileroModel, chunks: list[int] | None = None
) -> list[VADEvent]:
    ep = Endpointer(cfg, model)
    out: list[VADEvent] = []
    if chunks is None:
        out += ep.feed(x)
    else:
        pos = 0
        for n in chunks:
            out += ep.feed(x[pos : pos + n])
            pos += n
        out += ep.feed(x[pos:])
    return out + ep.finish()


def _summary(events: list[VADEvent]) -> list[tuple]:
    return [(type(e).__name__, e.sample_index, e.detected_at_s) for e in events]


def test_silero_model_inputs_and_shared_instance(model: SileroModel) -> None:
    assert SileroModel.shared() is model
    names = {i.name: i.shape for i in model.session.get_inputs()}
    assert set(names) == {"input", "h", "c"}  # the v6 export faster-whisper ships
    stream = SileroStream(model)
    assert stream.prob(np.zeros(WINDOW_SAMPLES, np.float32)) < 0.1
    with pytest.raises(ValueError):
        stream.prob(np.zeros(480, np.float32))


def test_silero_import_does_not_load_torch() -> None:
    code = (
        "import sys; from assistant.vad.endpoint import Endpointer; Endpointer();"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.strip() == "False"


def test_speech_probability_high_in_speech(model: SileroModel) -> None:
    x, _ = read_audio(AUDIO / "en_weather.wav")
    stream = SileroStream(model)
    probs = [
        stream.prob(x[i : i + WINDOW_SAMPLES]) for i in range(0, len(x) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES)
    ]
    t = np.arange(len(probs)) * WINDOW_SAMPLES / SR
    assert np.median(np.array(probs)[(t > 0.8) & (t < 2.2)]) > 0.9
    assert max(np.array(probs)[t < 0.4]) < 0.1


@pytest.mark.parametrize("name", ["en_weather.wav", "en_timer.wav"])
def test_one_utterance_matches_manifest(name: str, model: SileroModel) -> None:
    cfg = VADConfig()
    x, _ = read_audio(AUDIO / name)
    events = _events(x, cfg, model)
    assert [type(e) for e in events] == [SpeechStart, SpeechEnd]
    start, end = events
    assert isinstance(start, SpeechStart) and isinstance(end, SpeechEnd)
    m = MANIFEST[name]
    assert abs(start.time_s - m["speech_starts_s"]) <= TOLERANCE_S
    assert abs(end.time_s - m["speech_ends_s"]) <= TOLERANCE_S
    assert end.reason == "silence"
    # Start is stamped when speech began, confirmed min_speech_ms later.
    assert start.detected_at_s - start.time_s >= cfg.min_speech_ms / 1000 - 1e-9
    # End = detection minus the hangover, to one 32 ms window.
    hangover = end.detected_at_s - end.time_s
    assert cfg.end_silence_ms / 1000 - 1e-9 <= hangover < cfg.end_silence_ms / 1000 + WINDOW_SAMPLES / SR
    # The utterance audio runs from start − pad to end + pad and is the file's own samples.
    pad = cfg.speech_pad_ms * SR // 1000
    a = start.sample_index - pad
    assert end.audio_start_s == pytest.approx(a / SR)
    assert len(end.audio) == end.sample_index + pad - a
    np.testing.assert_array_equal(end.audio, x[a : end.sample_index + pad])


def test_pause_midsentence_hangover_setting(model: SileroModel) -> None:
    x, _ = read_audio(AUDIO / "en_pause_midsentence.wav")
    m = MANIFEST["en_pause_midsentence.wav"]
    long_ = _events(x, VADConfig(end_silence_ms=500), model)
    assert [type(e) for e in long_] == [SpeechStart, SpeechEnd]
    assert abs(long_[0].time_s - m["speech_starts_s"]) <= TOLERANCE_S
    assert abs(long_[1].time_s - m["speech_ends_s"]) <= TOLERANCE_S
    short = _events(x, VADConfig(end_silence_ms=200), model)
    assert [type(e) for e in short] == [SpeechStart, SpeechEnd, SpeechStart, SpeechEnd]
    pause_at, _pause_len = m["pause_s"]
    assert abs(short[1].time_s - pause_at) <= 0.2  # the first part ends at the pause


def test_random_chunk_sizes_give_identical_events(model: SileroModel) -> None:
    x, _ = read_audio(AUDIO / "en_pause_midsentence.wav")
    cfg = VADConfig(end_silence_ms=200)
    ref = _events(x, cfg, model, chunks=[WINDOW_SAMPLES] * (len(x) // WINDOW_SAMPLES))
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 3000, size=200).tolist()
    got = _events(x, cfg, model, chunks=sizes)
    assert _summary(got) == _summary(ref) and len(ref) == 4
    for a, b in zip(got, ref, strict=True):
        if isinstance(a, SpeechEnd):
            np.testing.assert_array_equal(a.audio, b.audio)


def test_silence_and_white_noise_give_no_speech(model: SileroModel) -> None:
    cfg = VADConfig()
    assert _events(np.zeros(5 * SR, np.float32), cfg, model) == []
    noise = np.random.default_rng(1).standard_normal(5 * SR).astype(np.float32)
    noise *= 10 ** (-30 / 20) / np.sqrt(np.mean(noise**2))
    assert rms_dbfs(noise) == pytest.approx(-30, abs=0.01)
    assert _events(noise, cfg, model) == []


def test_utterance_buffer_max_length_cut_and_reset(model: SileroModel) -> None:
    x, _ = read_audio(AUDIO / "en_story.wav")
    ep = Endpointer(VADConfig(max_utterance_s=1.5), model)
    events: list[VADEvent] = []
    for i in range(0, len(x), 320):
        events += ep.feed(x[i : i + 320])
        if ep.speaking:
            u = ep.utterance()
            assert u is not None and len(u) > 0
    kinds = [(type(e).__name__, getattr(e, "reason", "")) for e in events]
    assert kinds[:3] == [("SpeechStart", ""), ("SpeechEnd", "max_utterance"), ("SpeechStart", "")]
    assert kinds[-1] == ("SpeechEnd", "silence")
    first_end = events[1]
    assert isinstance(first_end, SpeechEnd) and first_end.duration_s == pytest.approx(1.5, abs=0.04)
    assert events[2].sample_index == first_end.sample_index  # the next utterance starts at the cut
    assert ep.utterance() is None

    ep.feed(x[: int(1.5 * SR)])
    assert ep.speaking
    ep.reset()
    assert not ep.speaking and ep.utterance() is None and ep.samples_fed == len(x) + int(1.5 * SR)


def test_dropped_audio_keeps_the_clock(model: SileroModel) -> None:
    """A chunk whose start jumps ahead (upstream drop) is placed on the stream clock, the gap as silence."""
    x, _ = read_audio(AUDIO / "en_weather.wav")
    ep = Endpointer(VADConfig(), model)
    ep.feed(np.zeros(SR, np.float32))
    events = ep.feed(x, start=2 * SR) + ep.finish()  # one second never arrived
    assert isinstance(events[0], SpeechStart)
    assert abs(events[0].time_s - (2 + MANIFEST["en_weather.wav"]["speech_starts_s"])) <= TOLERANCE_S
    with pytest.raises(ValueError):
        ep.feed(x[:100], start=0)


def test_48k_stereo_frames_through_inbound_keep_event_times(model: SileroModel) -> None:
    """The file as aiortc would deliver it (48 kHz stereo s16, 20 ms frames) gives the same event times."""
    from fractions import Fraction

    import av

    from assistant.audio import float_to_s16, resample
    from assistant.rtc.inbound import InboundAudio

    x, _ = read_audio(AUDIO / "en_weather.wav")
    direct = _events(x, VADConfig(), model)
    x48 = float_to_s16(resample(x, SR, 48_000))
    inbound, ep, via = InboundAudio(), Endpointer(VADConfig(), model), []
    for i in range(0, len(x48) - 959, 960):
        frame = av.AudioFrame.from_ndarray(
            np.repeat(x48[i : i + 960], 2)[None, :], format="s16", layout="stereo"
        )
        frame.sample_rate, frame.pts, frame.time_base = 48_000, i, Fraction(1, 48_000)
        via += ep.feed(inbound.push(frame))
    via += ep.feed(inbound.flush()) + ep.finish()
    assert [type(e) for e in via] == [type(e) for e in direct] == [SpeechStart, SpeechEnd]
    for a, b in zip(via, direct, strict=True):
        assert abs(a.time_s - b.time_s) <= WINDOW_SAMPLES / SR


def test_digital_silence_stops_running_the_model_and_speech_after_it_is_heard(model: SileroModel) -> None:
    """Seconds of filled silence (all-zero windows) cost ZERO_RUN_WINDOWS model runs, not one per window; the
    utterance that follows is found as it is without the silence in front."""
    runs = []

    class Counting:
        def run(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            runs.append(len(x))
            return model.run(x, state)

    speech, _ = read_audio(AUDIO / "en_weather.wav")
    silence = np.zeros(5 * SR, np.float32)
    ep = Endpointer(VADConfig(), Counting())  # type: ignore[arg-type]
    assert ep.feed(silence) == [] and len(runs) == ZERO_RUN_WINDOWS
    events = ep.feed(speech) + ep.finish()
    alone = _events(speech, VADConfig(), model)
    assert [type(e) for e in events] == [type(e) for e in alone]
    assert abs(events[0].sample_index - len(silence) - alone[0].sample_index) <= WINDOW_SAMPLES
