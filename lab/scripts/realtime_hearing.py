#!/usr/bin/env python3
"""What the server hears of one recording through each input path, and how much the ASR's words depend on it.

    heavy .venv/bin/python lab/scripts/realtime_hearing.py ../shared/audio/en_weather.wav \\
        --say "What is the weather like in Lisbon?" --say "Book me a flight to Osaka, please."

For each utterance (a WAV, or ``--say TEXT`` spoken by the configured TTS engine, as a user's recording would be):

1. the 16 kHz signal each path gives the conversation, against the original (lag, gain, SNR at the best
   alignment): the page's and WebRTC's 48 kHz frames through ``rtc/inbound`` (without the Opus codec, which
   the client's stack adds), the Realtime WebSocket's 24 kHz PCM16 through ``realtime/formats`` (20 ms and
   100 ms appends), G.711 μ-law at 8 kHz;
2. the words our ASR (``[asr]``, tiny.en by default) gives for the speech segment when its start moves by a few
   milliseconds and its level by a few dB: the differences two transports make (aiortc's sender upmixes mono to
   stereo at -3 dB and Opus delays the audio by ~6.5 ms, which moves where the VAD's 32 ms windows fall).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from assistant.asr import create_asr
from assistant.audio import SPEECH_RATE, float_to_s16, read_audio, resample
from assistant.config import load_config
from assistant.g711 import ulaw_encode
from assistant.rtc.inbound import InboundAudio
from assistant.server.realtime.formats import PCM16, PCMU, InputDecoder

SHIFTS_MS = (0, 2, 4, 6, 8, 16)
GAINS_DB = (-3.0, 0.0, 3.0)
PAD_MS = 96  # the VAD's prefix padding: the segment starts this long before the speech


class Frame:
    """A mono s16 frame as aiortc hands one to ``rtc/inbound``."""

    def __init__(self, pcm: np.ndarray, rate: int) -> None:
        self.pcm, self.sample_rate, self.pts, self.time_base = pcm, rate, None, None
        self.layout = type("Layout", (), {"channels": [0]})()
        self.format = type("Format", (), {"name": "s16", "is_planar": False})()

    def to_ndarray(self) -> np.ndarray:
        return self.pcm.reshape(1, -1)


def page_path(x16: np.ndarray) -> np.ndarray:
    pcm = float_to_s16(resample(x16, SPEECH_RATE, 48_000))
    inbound = InboundAudio()
    out = [inbound.push(Frame(pcm[at: at + 960], 48_000)) for at in range(0, len(pcm), 960)]  # type: ignore[arg-type]
    return np.concatenate([*out, inbound.flush()])


def ws_pcm16_path(x16: np.ndarray, chunk_ms: int) -> np.ndarray:
    pcm = float_to_s16(resample(x16, SPEECH_RATE, 24_000)).tobytes()
    dec = InputDecoder(PCM16)
    step = 48 * chunk_ms
    return np.concatenate([dec.decode(pcm[at: at + step]) for at in range(0, len(pcm), step)])


def ws_g711_path(x16: np.ndarray) -> np.ndarray:
    data = ulaw_encode(float_to_s16(resample(x16, SPEECH_RATE, 8_000)))
    dec = InputDecoder(PCMU)
    return np.concatenate([dec.decode(data[at: at + 160]) for at in range(0, len(data), 160)])


def fidelity(ref: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    best: tuple[float, int, np.ndarray, np.ndarray] | None = None
    for lag in range(-160, 161):
        a, b = ref[max(0, -lag):], y[max(0, lag):]
        n = min(len(a), len(b))
        a, b = a[:n], b[:n]
        corr = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))
        if best is None or corr > best[0]:
            best = (corr, lag, a, b)
    assert best is not None
    _, lag, a, b = best
    gain = float(np.dot(a, b) / np.dot(a, a))
    noise = b - gain * a
    return lag, 20 * np.log10(gain), 10 * np.log10(np.sum((gain * a) ** 2) / max(np.sum(noise**2), 1e-20))


def speech_segment(x16: np.ndarray) -> np.ndarray:
    """From ``PAD_MS`` before the first audible 10 ms frame to ``PAD_MS`` after the last (-45 dBFS)."""
    frames = x16[: len(x16) // 160 * 160].reshape(-1, 160)
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 10 ** (-45 / 20))
    start = max(0, loud[0] * 160 - PAD_MS * 16)
    end = min(len(x16), (loud[-1] + 1) * 160 + PAD_MS * 16)
    return x16[start:end]


async def spoken(texts: list[str]) -> list[tuple[str, np.ndarray]]:
    from assistant.server.services import Services
    from assistant.tts.base import TTSRequest

    services = Services(load_config(environ={}))
    await services.load()
    out = []
    try:
        assert services.tts is not None
        for text in texts:
            audio = np.concatenate([c async for c in services.tts.synthesize(TTSRequest(text=text))])
            x16 = resample(audio, services.tts.sample_rate, SPEECH_RATE)
            pad = np.zeros(SPEECH_RATE // 2, dtype=np.float32)
            out.append((f"say:{text}", np.concatenate([pad, x16, pad, pad])))
    finally:
        await services.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--say", action="append", default=[], help="an utterance spoken by the TTS engine")
    args = parser.parse_args()
    utterances: list[tuple[str, np.ndarray]] = []
    for path in args.files:
        x, sr = read_audio(path)
        utterances.append((path.name, resample(x, sr, SPEECH_RATE)))
    if args.say:
        utterances += asyncio.run(spoken(args.say))
    asr: Any = create_asr(load_config(environ={}).asr)
    for name, x16 in utterances:
        print(f"== {name}")
        paths = {"page/WebRTC 48 kHz frames": page_path(x16),
                 "Realtime WS PCM16 24 kHz, 20 ms": ws_pcm16_path(x16, 20),
                 "Realtime WS PCM16 24 kHz, 100 ms": ws_pcm16_path(x16, 100),
                 "Realtime WS G.711 μ-law": ws_g711_path(x16)}
        for label, y in paths.items():
            lag, gain_db, snr_db = fidelity(x16, y)
            print(f"  {label:34s} lag {lag:+d} samples  gain {gain_db:+.2f} dB  SNR {snr_db:5.1f} dB")
        segment = speech_segment(x16)
        for shift in SHIFTS_MS:
            print(f"  start +{shift:2d} ms: {asr.transcribe(segment[shift * 16:]).text.strip()!r}")
        for gain in GAINS_DB:
            print(f"  level {gain:+.0f} dB:  {asr.transcribe(segment * 10 ** (gain / 20)).text.strip()!r}")


if __name__ == "__main__":
    main()
