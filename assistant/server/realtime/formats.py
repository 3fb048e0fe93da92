"""Audio as the Realtime API carries it: PCM16 at 24 kHz, or G.711 μ-law and A-law at 8 kHz, base64 in JSON.

Inbound, a client's bytes become 16 kHz float32 for the conversation (:class:`InputDecoder`); outbound, the
reply's 24 kHz int16 becomes the session's output format (:class:`OutputEncoder`). Each keeps one streaming
resampler for the session, so chunk edges leave no clicks and no samples are lost. The G.711 companding is
``assistant/g711.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr

from assistant.audio import S16_SCALE, SPEECH_RATE
from assistant.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

PCM_RATE = 24_000  # the one rate the reference takes for audio/pcm
G711_RATE = 8_000  # μ-law and A-law are telephone audio
RESAMPLE_QUALITY = "MQ"  # 16-bit precision, as for our inbound WebRTC audio (HQ would add ~20 ms)


class FormatError(ValueError):
    """A format the Realtime API does not know, or audio that does not fit its format; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class AudioFormat:
    """One of the three formats: ``type`` is the GA name (``audio/pcm``, ``audio/pcmu``, ``audio/pcma``)."""

    type: str
    rate: int
    bytes_per_sample: int

    def to_json(self) -> dict[str, object]:
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}

    @property
    def beta_name(self) -> str:
        return BETA_NAMES[self.type]

    def duration_ms(self, n_bytes: int) -> float:
        return n_bytes / self.bytes_per_sample * 1000 / self.rate


PCM16 = AudioFormat("audio/pcm", PCM_RATE, 2)
PCMU = AudioFormat("audio/pcmu", G711_RATE, 1)
PCMA = AudioFormat("audio/pcma", G711_RATE, 1)
FORMATS = {f.type: f for f in (PCM16, PCMU, PCMA)}
BETA_NAMES = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
BY_BETA_NAME = {beta: FORMATS[ga] for ga, beta in BETA_NAMES.items()}


def parse_format(value: object, param: str) -> AudioFormat:
    """``{"type": "audio/pcm", "rate": 24000}`` (GA), or ``"pcm16"`` / ``"g711_ulaw"`` / ``"g711_alaw"`` (beta)."""
    if isinstance(value, str):
        if value in BY_BETA_NAME:
            return BY_BETA_NAME[value]
        raise FormatError(f"Invalid value: {value!r}. Supported values are: {', '.join(map(repr, BY_BETA_NAME))}.",
                          param)
    if not isinstance(value, dict):
        raise FormatError("an audio format is an object such as {\"type\": \"audio/pcm\", \"rate\": 24000}", param)
    kind = value.get("type")
    fmt = FORMATS.get(kind) if isinstance(kind, str) else None
    if fmt is None:
        raise FormatError(f"Invalid value: {kind!r}. Supported values are: {', '.join(map(repr, FORMATS))}.",
                          f"{param}.type")
    rate = value.get("rate")
    if rate is not None and rate != fmt.rate:
        raise FormatError(f"Invalid value: {rate!r}. {fmt.type} is only supported at {fmt.rate} Hz.", f"{param}.rate")
    extra = set(value) - {"type", "rate"}
    if extra:
        raise FormatError(f"Unknown parameter: '{param}.{sorted(extra)[0]}'.", f"{param}.{sorted(extra)[0]}")
    return fmt


# --- streams -----------------------------------------------------------------------------------------------
class InputDecoder:
    """A client's audio bytes in ``fmt`` → 16 kHz mono float32, across chunks (one resampler per session).

    PCM16 chunks may split a sample between two appends: the odd byte waits for the next one.
    """

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = soxr.ResampleStream(fmt.rate, SPEECH_RATE, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        self._odd = b""
        self.bytes_in = 0

    def decode(self, data: bytes) -> np.ndarray:
        self.bytes_in += len(data)
        pcm = self.to_s16(data)
        x = pcm.astype(np.float32) / S16_SCALE
        return self._resampler.resample_chunk(x)

    def to_s16(self, data: bytes) -> np.ndarray:
        """The chunk's samples at the format's own rate (int16)."""
        if self.format is PCMU:
            return ulaw_decode(data)
        if self.format is PCMA:
            return alaw_decode(data)
        data = self._odd + data
        cut = len(data) - len(data) % 2
        self._odd = data[cut:]
        return np.frombuffer(data[:cut], dtype="<i2")


def decode_clip(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """A whole clip (a user audio item) → 16 kHz float32."""
    dec = InputDecoder(fmt)
    out = dec.decode(data)
    tail = dec._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
    return np.concatenate([out, tail]) if tail.size else out


class OutputEncoder:
    """The reply's 24 kHz int16 → bytes in the session's output format (G.711: resampled to 8 kHz on the way)."""

    def __init__(self, fmt: AudioFormat, in_rate: int = PCM_RATE) -> None:
        self.format = fmt
        self._in_rate = in_rate
        self._resampler = (
            soxr.ResampleStream(in_rate, fmt.rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
            if fmt.rate != in_rate else None
        )

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._resampler is None:
            return pcm.astype("<i2").tobytes()
        return self._companded(self._resampler.resample_chunk(pcm.astype(np.float32) / S16_SCALE))

    def flush(self) -> bytes:
        """The end of a reply: what the resampler still holds, and a fresh resampler for the next reply (so
        the tail of one reply never starts the next)."""
        if self._resampler is None:
            return b""
        tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self.reset()
        return self._companded(tail) if tail.size else b""

    def reset(self) -> None:
        """Drop what the resampler holds (a reply cut short: its tail is not heard)."""
        if self._resampler is not None:
            self._resampler = soxr.ResampleStream(self._in_rate, self.format.rate, 1, dtype="float32",
                                                  quality=RESAMPLE_QUALITY)

    def _companded(self, y: np.ndarray) -> bytes:
        s16 = np.clip(np.rint(y * S16_SCALE), -S16_SCALE, S16_SCALE - 1).astype(np.int16)
        return ulaw_encode(s16) if self.format is PCMU else alaw_encode(s16)
