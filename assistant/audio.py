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
from typing import Any, BinaryIO

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


def read_audio(src: AudioSource, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode a file path, bytes or binary file object into (float32 mono, sample rate).

    soundfile (libsndfile: WAV, FLAC, OGG/Vorbis/Opus, MP3 in recent versions) is tried first because it is
    exact and fast; PyAV (FFmpeg) decodes the rest (webm, m4a, …). Non-audio input raises AudioFormatError,
    a missing path FileNotFoundError.

    With ``max_seconds`` the decode is bounded before it starts: a container that declares a longer duration
    is refused from its header, and any other is decoded a block at a time and stopped ``DECODE_MARGIN_S`` past
    the limit (a header may lie), so a small file of hours of silence never turns into gigabytes. Too long
    raises :class:`ClipTooLong`. Channels are mixed down block by block, so many channels cost no more.
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
        f = sf.SoundFile(path if path is not None else io.BytesIO(data or b""))
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        log.debug("audio.read soundfile_failed err=%s; trying PyAV", exc)
        return _read_with_av(path if path is not None else io.BytesIO(data or b""), max_seconds)
    with f:
        rate = int(f.samplerate)
        _check_layout(rate, f.channels)
        limit = _frame_limit(max_seconds, rate)
        declared = f.frames if 0 < f.frames < UNKNOWN_FRAMES else None
        if declared is not None and max_seconds is not None and declared / rate > max_seconds:
            raise ClipTooLong(declared / rate, max_seconds, declared=True)
        parts: list[np.ndarray] = []
        count = 0
        try:
            while len(block := f.read(DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)):
                parts.append(to_mono(block))
                count += len(block)
                if limit is not None and count > limit:
                    raise ClipTooLong(count / rate, max_seconds or 0.0, declared=False)
        except (sf.LibsndfileError, RuntimeError) as exc:
            raise AudioFormatError(f"not a decodable audio file: {exc}") from exc
    if not parts:
        raise AudioFormatError("audio stream holds no samples")
    return np.concatenate(parts), rate


class ClipTooLong(ValueError):
    """A clip over ``max_seconds``: ``declared`` when its container said so (nothing was decoded), else
    ``seconds`` is how far the bounded decode got before it stopped."""

    def __init__(self, seconds: float, max_seconds: float, *, declared: bool) -> None:
        what = f"is {seconds:.1f} s" if declared else f"runs over {seconds:.1f} s"
        super().__init__(f"audio {what}; the limit is {max_seconds:g} s")
        self.seconds = seconds
        self.max_seconds = max_seconds
        self.declared = declared


# What a clip may be before anything is decoded: more channels or a higher rate only multiply the memory a
# decode takes, and no voice needs them.
MAX_CHANNELS = 8
RATE_RANGE = (4_000, 192_000)
DECODE_BLOCK_FRAMES = 65_536
DECODE_MARGIN_S = 1.0      # a bounded decode stops this far past the limit (a header may have understated it)
UNKNOWN_FRAMES = 1 << 62   # libsndfile's frame count of a stream that does not say its length


def _check_layout(rate: int, channels: int) -> None:
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        raise AudioFormatError(f"sample rate {rate} Hz is outside {RATE_RANGE[0]}–{RATE_RANGE[1]} Hz")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioFormatError(f"{channels} channels; at most {MAX_CHANNELS}")


def _frame_limit(max_seconds: float | None, rate: int) -> int | None:
    return None if max_seconds is None else int((max_seconds + DECODE_MARGIN_S) * rate)


def _read_with_av(src: Path | BinaryIO, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode the first audio stream with PyAV into float32 mono at the stream's own rate (bounded as
    :func:`read_audio` says)."""
    import av  # lazy: only compressed formats that libsndfile lacks need FFmpeg

    try:
        with av.open(str(src) if isinstance(src, Path) else src, mode="r") as container:
            if not container.streams.audio:
                raise AudioFormatError("no audio stream in input")
            stream = container.streams.audio[0]
            rate = int(stream.rate or stream.codec_context.sample_rate or 0)
            _check_layout(rate, stream.codec_context.channels or 1)
            declared = _av_duration_s(container, stream)
            if declared is not None and max_seconds is not None and declared > max_seconds:
                raise ClipTooLong(declared, max_seconds, declared=True)
            limit = _frame_limit(max_seconds, rate)
            # Same rate in and out: only the sample format and layout change, so no filter delay.
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            parts: list[np.ndarray] = []
            count = 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
                    count += len(parts[-1])
                if limit is not None and count > limit:
                    raise ClipTooLong(count / rate, max_seconds or 0.0, declared=False)
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except (AudioFormatError, ClipTooLong):
        raise
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise AudioFormatError(f"not a decodable audio file: {exc}") from exc
    if not parts:
        raise AudioFormatError("audio stream holds no samples")
    return np.concatenate(parts).astype(np.float32, copy=False), rate


def _av_duration_s(container: Any, stream: Any) -> float | None:
    """The duration the container or stream header declares, if any."""
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


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
