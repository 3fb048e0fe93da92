"""Shared audio helpers: reading any audio file, resampling, float/int16 conversion, WAV bytes, level.

This is the one place for these conversions; every stage (inbound RTC audio, VAD, ASR, TTS, the HTTP API)
uses them so that scaling and clipping conventions are the same everywhere:

- float audio is float32 in −1…1; int16 ↔ float uses the scale 32768 (so int16 → float → int16 is exact),
  and float → int16 clips to −32768…32767.
- 0 dBFS is the RMS of a full-scale square wave (RMS 1.0); a full-scale sine is −3.01 dBFS.
"""

from __future__ import annotations

import io
import logging
import os
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

log = logging.getLogger(__name__)

# The rate of the user's speech inside the server: what the inbound reader makes and VAD, ASR and the
# end-of-turn model take. Named once here.
SPEECH_RATE = 16_000
# WebRTC audio on the wire: Opus carries 48 kHz, sent as 20 ms frames. The reply track sends (and the bench
# microphone plays) frames of this rate and length; the pipeline counts reply audio in these frames.
WEBRTC_RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = WEBRTC_RATE * FRAME_MS // 1000  # 960
# Reply audio whose peak (s16) is below this (≈ −60 dBFS) is silence: the reply track's "first audible frame"
# and where a reply's leading silence ends.
SILENCE_PEAK_S16 = 32
S16_SCALE = 32768.0  # int16 full scale; −32768 maps to exactly −1.0
# rms_dbfs of digital silence. A finite floor (not −inf) so levels stay valid JSON and metric values.
SILENCE_DBFS = -120.0
# Offline resampling quality: soxr "HQ" (20-bit precision); latency does not matter for whole files.
RESAMPLE_QUALITY = "HQ"

AudioSource = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO


class AudioFormatError(ValueError):
    """The input is not audio that soundfile or PyAV (FFmpeg) can decode."""


def to_mono(x: np.ndarray) -> np.ndarray:
    """Average channels of a (samples, channels) array into float32 mono; 1-D input passes through."""
    x = np.asarray(x)
    if x.ndim == 2:
        x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    elif x.ndim != 1:
        raise ValueError(f"expected 1-D or (samples, channels) audio, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


def read_audio(src: AudioSource) -> tuple[np.ndarray, int]:
    """Decode a file path, bytes or binary file object into (float32 mono, sample rate).

    soundfile (libsndfile: WAV, FLAC, OGG/Vorbis/Opus, MP3 in recent versions) is tried first because it is
    exact and fast; PyAV (FFmpeg) decodes the rest (webm, m4a, …). Non-audio input raises AudioFormatError,
    a missing path FileNotFoundError.
    """
    data: bytes | None = None
    path: Path | None = None
    if isinstance(src, bytes | bytearray | memoryview):
        data = bytes(src)
    elif isinstance(src, str | os.PathLike):
        path = Path(src)
        if not path.is_file():
            raise FileNotFoundError(f"audio file not found: {path}")
    else:
        data = src.read()
    if data is not None and not data:
        raise AudioFormatError("empty audio input")

    import soundfile as sf  # here, not at import: the GPU check runs where soundfile is absent

    try:
        x, sr = sf.read(path if path is not None else io.BytesIO(data or b""), dtype="float32", always_2d=True)
        return to_mono(x), int(sr)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        log.debug("audio.read soundfile_failed err=%s; trying PyAV", exc)
    return _read_with_av(path if path is not None else io.BytesIO(data or b""))


def _read_with_av(src: Path | BinaryIO) -> tuple[np.ndarray, int]:
    """Decode the first audio stream with PyAV into float32 mono at the stream's own rate."""
    import av  # lazy: only compressed formats that libsndfile lacks need FFmpeg

    try:
        with av.open(str(src) if isinstance(src, Path) else src, mode="r") as container:
            if not container.streams.audio:
                raise AudioFormatError("no audio stream in input")
            stream = container.streams.audio[0]
            rate = stream.rate or stream.codec_context.sample_rate
            # Same rate in and out: only the sample format and layout change, so no filter delay.
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            parts: list[np.ndarray] = []
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except AudioFormatError:
        raise
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise AudioFormatError(f"not a decodable audio file: {exc}") from exc
    if not parts:
        raise AudioFormatError("audio stream holds no samples")
    return np.concatenate(parts).astype(np.float32, copy=False), int(rate)


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample a whole float32 mono signal (soxr HQ). Use a stream resampler for live audio instead."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if sr_in == sr_out:
        return x
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"sample rates must be positive, got {sr_in} → {sr_out}")
    import soxr

    return soxr.resample(x, sr_in, sr_out, quality=RESAMPLE_QUALITY).astype(np.float32, copy=False)


def float_to_s16(x: np.ndarray) -> np.ndarray:
    """float −1…1 → int16 array, clipped (call ``.tobytes()`` for s16le PCM bytes)."""
    y = np.rint(np.asarray(x, dtype=np.float32) * S16_SCALE)
    return np.clip(y, -S16_SCALE, S16_SCALE - 1).astype(np.int16)


def s16_to_float(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """int16 samples (array or s16le bytes) → float32 −1…1."""
    a = np.frombuffer(data, dtype="<i2") if isinstance(data, bytes | bytearray | memoryview) else data
    if a.dtype != np.int16:
        raise ValueError(f"expected int16 samples, got {a.dtype}")
    return (a.astype(np.float32) / S16_SCALE).astype(np.float32, copy=False)


def write_wav_bytes(x: np.ndarray, sr: int) -> bytes:
    """float32 mono → a complete 16-bit PCM WAV file in memory."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sr))
        w.writeframes(float_to_s16(x).astype("<i2").tobytes())
    return buf.getvalue()


def rms_dbfs(x: np.ndarray) -> float:
    """RMS level in dBFS (0 dBFS = RMS 1.0); SILENCE_DBFS for silence or empty input."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return SILENCE_DBFS
    rms = float(np.sqrt(np.mean(x * x)))
    if rms <= 0.0:
        return SILENCE_DBFS
    return max(SILENCE_DBFS, 20.0 * float(np.log10(rms)))


@dataclass(frozen=True)
class AudioChunk:
    """16 kHz mono float32 samples starting at ``start`` on the stream's sample clock.

    Consecutive chunks are contiguous: ``a.end == b.start``.

    ``arrived`` (wall clock, ``time.time()``) is when the newest audio in it reached the server: the arrival
    of the packet that carried it, before any receive buffer held it (0: unknown, take the time it is
    read). That packet's audio runs ``lag`` samples past ``end`` (the resampler holds them back). So every
    sample up to ``end + lag`` had arrived by ``arrived``: the sample clock and the wall clock, tied on the
    chunk itself.
    """

    start: int
    samples: np.ndarray = field(repr=False)
    arrived: float = 0.0
    lag: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.samples)
