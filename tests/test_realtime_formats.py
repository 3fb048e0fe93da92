"""The Realtime API's audio formats: what a client sends at 24 kHz (or as G.711) reaches the conversation as the same
signal our page's WebRTC path delivers, and each reply's G.711 audio ends with its own tail (the resampler is
flushed), never with the start of the next."""

from __future__ import annotations

import numpy as np
import pytest

from assistant.audio import S16_SCALE, SPEECH_RATE, float_to_s16, read_audio, resample
from assistant.g711 import ulaw_decode, ulaw_encode
from assistant.server.realtime.formats import PCM16, PCMU, InputDecoder, OutputEncoder


def fidelity(ref: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    """(lag in samples, gain in dB, SNR in dB) of ``y`` against ``ref`` at the best alignment (±10 ms)."""
    best = None
    for lag in range(-160, 161):
        a = ref[max(0, -lag):]
        b = y[max(0, lag):]
        n = min(len(a), len(b))
        a, b = a[:n], b[:n]
        corr = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))
        if best is None or corr > best[0]:
            best = (corr, lag, a, b)
    assert best is not None
    _, lag, a, b = best
    gain = float(np.dot(a, b) / np.dot(a, a))
    noise = b - gain * a
    return lag, 20 * np.log10(gain), 10 * np.log10(np.sum((gain * a) ** 2) / np.sum(noise**2))


@pytest.mark.parametrize("chunk_ms", [20, 100, 333])
def test_24khz_input_reaches_the_conversation_unchanged(shared_audio, chunk_ms: int) -> None:
    """A client's 24 kHz PCM16, in appends of any size, is the original signal at 16 kHz: no delay, no change of
    level, and the stream resampler's 16-bit precision (measured: 50–60 dB, as the page's 48 kHz path)."""
    x, sr = read_audio(shared_audio / "en_timer.wav")
    x16 = resample(x, sr, SPEECH_RATE)
    pcm = float_to_s16(resample(x16, SPEECH_RATE, 24_000)).tobytes()
    dec = InputDecoder(PCM16)
    step = 48 * chunk_ms + 1  # an odd number of bytes: a sample split between appends
    y = np.concatenate([dec.decode(pcm[at: at + step]) for at in range(0, len(pcm), step)])
    lag, gain_db, snr_db = fidelity(x16, y)
    assert lag == 0 and abs(gain_db) < 0.05 and snr_db > 45, (lag, gain_db, snr_db)


def test_g711_input_is_telephone_quality_at_the_same_level(shared_audio) -> None:
    x, sr = read_audio(shared_audio / "en_weather.wav")
    x16 = resample(x, sr, SPEECH_RATE)
    data = ulaw_encode(float_to_s16(resample(x16, SPEECH_RATE, 8_000)))
    dec = InputDecoder(PCMU)
    y = np.concatenate([dec.decode(data[at: at + 160]) for at in range(0, len(data), 160)])
    lag, gain_db, snr_db = fidelity(x16, y)
    assert abs(lag) <= 1 and abs(gain_db) < 0.5 and snr_db > 15, (lag, gain_db, snr_db)


def test_each_g711_reply_ends_with_its_own_tail() -> None:
    """Two replies through one encoder: each comes out whole (its length at 8 kHz, its last tone to the end) and
    the second starts with its own audio, not with what the resampler held of the first."""
    t = np.arange(24_000) / 24_000
    first = float_to_s16(0.5 * np.sin(2 * np.pi * 440 * t))  # 1 s of a tone
    second = float_to_s16(0.5 * np.sin(2 * np.pi * 1000 * t[:12_000]))  # 0.5 s of another
    enc = OutputEncoder(PCMU)
    out1 = b"".join(enc.encode(first[at: at + 2400]) for at in range(0, len(first), 2400)) + enc.flush()
    out2 = enc.encode(second) + enc.flush()
    assert len(out1) == 8_000 and len(out2) == 4_000
    head = ulaw_decode(out2[:80]).astype(np.float32) / S16_SCALE  # the first 10 ms of the second reply
    tone = np.sin(2 * np.pi * 1000 * np.arange(80) / 8_000)
    assert abs(np.corrcoef(head[20:], tone[20:])[0, 1]) > 0.9  # its own tone from the start
    tail = ulaw_decode(out1[-80:]).astype(np.float32) / S16_SCALE
    assert np.sqrt(np.mean(tail**2)) > 0.2  # the first reply's last 10 ms are there, at full level
    enc.encode(first[:2400])
    enc.reset()  # a reply cut short: what it held is dropped
    assert len(enc.encode(second) + enc.flush()) == 4_000
