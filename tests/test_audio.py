"""assistant.audio: reading, resampling, int16 conversion, WAV bytes, level."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from assistant.audio import (
    DECODE_BLOCK_FRAMES,
    DECODE_MARGIN_S,
    MAX_CHANNELS,
    SILENCE_DBFS,
    AudioFormatError,
    ClipTooLong,
    float_to_s16,
    read_audio,
    resample,
    rms_dbfs,
    s16_to_float,
    write_wav_bytes,
)
from assistant.bench.shared_data import shared_path

AUDIO = shared_path("audio")  # ../shared/audio (assistant/bench/shared_data.py)


def _sine(freq: float, sr: int, seconds: float, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return (level * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _peak_hz(x: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * sr / len(x))


def test_read_shared_wav_path_and_bytes() -> None:
    x, sr = read_audio(AUDIO / "en_weather.wav")
    assert sr == 16_000 and x.dtype == np.float32 and x.ndim == 1
    assert abs(len(x) / sr - 4.276) < 0.01
    y, sr2 = read_audio((AUDIO / "en_weather.wav").read_bytes())
    assert sr2 == sr and np.array_equal(x, y)


def test_read_stereo_downmixes_to_mono() -> None:
    left, right = _sine(440, 22_050, 0.2), np.zeros(4410, np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([left, right], axis=1), 22_050, format="WAV", subtype="FLOAT")
    x, sr = read_audio(buf.getvalue())
    assert sr == 22_050 and x.shape == (4410,)
    np.testing.assert_allclose(x, left / 2, atol=1e-6)


def test_read_compressed_with_pyav_fallback(tmp_path: Path) -> None:
    """An m4a/AAC file (which libsndfile cannot read) decodes through PyAV."""
    path = tmp_path / "tone.m4a"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=24_000, layout="mono")
        x = _sine(1000, 24_000, 1.0)
        frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
        frame.sample_rate = 24_000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    y, sr = read_audio(path)
    assert sr == 24_000 and abs(len(y) / sr - 1.0) < 0.1
    assert abs(_peak_hz(y, sr) - 1000) < 5


def test_non_audio_bytes_raise_audio_format_error() -> None:
    with pytest.raises(AudioFormatError):
        read_audio(b"this is not audio at all, just some text " * 20)
    with pytest.raises(AudioFormatError):
        read_audio(b"")


def test_resample_length_and_frequency() -> None:
    x = _sine(440, 48_000, 1.0)
    y = resample(x, 48_000, 16_000)
    assert y.dtype == np.float32 and len(y) == 16_000
    assert abs(_peak_hz(y, 16_000) - 440) < 2
    assert resample(y, 16_000, 16_000) is not None and len(resample(y, 16_000, 16_000)) == 16_000


def test_s16_round_trip_is_exact_and_clips() -> None:
    ints = np.array([-32768, -1, 0, 1, 32767], dtype=np.int16)
    assert np.array_equal(float_to_s16(s16_to_float(ints)), ints)
    assert np.array_equal(float_to_s16(s16_to_float(ints.tobytes())), ints)
    assert s16_to_float(ints)[0] == -1.0
    clipped = float_to_s16(np.array([-2.0, 1.0, 2.0], np.float32))
    assert clipped.tolist() == [-32768, 32767, 32767]
    assert float_to_s16(np.array([0.5], np.float32)).tobytes() == np.int16(16384).tobytes()


def test_write_wav_bytes_round_trip() -> None:
    x = _sine(300, 16_000, 0.5)
    data = write_wav_bytes(x, 16_000)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16_000, 8000)
    y, sr = read_audio(data)
    assert sr == 16_000
    np.testing.assert_allclose(y, x, atol=1 / 32768)


def test_rms_dbfs() -> None:
    assert rms_dbfs(np.ones(100, np.float32)) == pytest.approx(0.0)
    assert rms_dbfs(_sine(1000, 16_000, 1.0, level=1.0)) == pytest.approx(-3.0103, abs=0.01)
    assert rms_dbfs(np.full(10, 0.1, np.float32)) == pytest.approx(-20.0)
    assert rms_dbfs(np.zeros(10, np.float32)) == SILENCE_DBFS
    assert rms_dbfs(np.zeros(0, np.float32)) == SILENCE_DBFS


# --- bounded decoding: a clip is refused before it can become gigabytes ----------------------------------------
def _flac(seconds: float, sr: int = 8000) -> bytes:
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=sr, channels=1, format="FLAC", subtype="PCM_16") as f:
        f.write(np.zeros(int(sr * seconds), np.int16))
    return buf.getvalue()


def _without_flac_length(data: bytes) -> bytes:
    """The same FLAC with STREAMINFO's total-samples field zeroed: a stream that does not say its length."""
    d = bytearray(data)
    field = int.from_bytes(d[18:26], "big") & ~((1 << 36) - 1)  # STREAMINFO at 8; total samples: its low 36 bits
    d[18:26] = field.to_bytes(8, "big")
    return bytes(d)


def test_a_declared_duration_over_the_limit_is_refused_before_decoding() -> None:
    with pytest.raises(ClipTooLong) as ei:
        read_audio(_flac(60.0), max_seconds=2.0)
    assert ei.value.declared and ei.value.seconds == pytest.approx(60.0)


def test_an_undeclared_length_is_decoded_only_up_to_the_limit_and_a_margin() -> None:
    data = _without_flac_length(_flac(60.0))
    assert sf.info(io.BytesIO(data)).frames > 1 << 62  # libsndfile: length unknown
    with pytest.raises(ClipTooLong) as ei:
        read_audio(data, max_seconds=2.0)
    assert not ei.value.declared
    assert 2.0 < ei.value.seconds <= 2.0 + DECODE_MARGIN_S + DECODE_BLOCK_FRAMES / 8000


def test_a_wav_whose_header_says_more_data_than_it_holds_reads_what_is_there() -> None:
    wav = bytearray(write_wav_bytes(np.zeros(16000, np.float32), 16000))
    k = wav.find(b"data")
    wav[k + 4:k + 8] = (0xFFFFFFF0).to_bytes(4, "little")  # the header lies: 4 GB of data
    x, sr = read_audio(bytes(wav), max_seconds=2.0)
    assert sr == 16000 and len(x) == 16000


def test_within_the_limit_decodes_whole_and_layouts_past_the_bounds_are_refused() -> None:
    x, sr = read_audio(_flac(1.5), max_seconds=2.0)
    assert sr == 8000 and len(x) == 12000
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=8000, channels=MAX_CHANNELS + 1, format="WAV", subtype="PCM_16") as f:
        f.write(np.zeros((800, MAX_CHANNELS + 1), np.int16))
    with pytest.raises(AudioFormatError, match="channels"):
        read_audio(buf.getvalue(), max_seconds=2.0)


def test_compressed_input_through_pyav_is_bounded_too(tmp_path: Path) -> None:
    path = tmp_path / "long.m4a"
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000, layout="mono")
        for i in range(20):  # 20 s
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 16000
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    with pytest.raises(ClipTooLong):
        read_audio(path.read_bytes(), max_seconds=5.0)
    x, sr = read_audio(path.read_bytes(), max_seconds=30.0)
    assert sr == 16000 and len(x) >= 20 * 16000 - 2048
