"""Audio as the Realtime API carries it: PCM16 at 24 kHz, or G.711 μ-law and A-law at 8 kHz, base64 in JSON.

Inbound, a client's bytes become 16 kHz float32 for the conversation (:class:`InputDecoder`); outbound, the
reply's 24 kHz int16 becomes the session's output format (:class:`OutputEncoder`). Each keeps one streaming
resampler for the session, so chunk edges leave no clicks and no samples are lost. The G.711 companding is
the ITU-T G.711 rule, written with numpy over whole chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr

from assistant.audio import S16_SCALE, SPEECH_RATE

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


# --- G.711 -------------------------------------------------------------------------------------------------
ULAW_BIAS = 0x84
ULAW_CLIP_14 = 8159  # μ-law works on 14-bit samples: the top of the range it can code


def _segment(magnitude: np.ndarray, first_top: int) -> np.ndarray:
    """The companding segment 0…7: how many octaves a magnitude lies above ``2**first_top`` (0 below it)."""
    seg = np.zeros(magnitude.shape, dtype=np.int32)
    big = magnitude >= (1 << first_top)
    seg[big] = np.floor(np.log2(magnitude[big])).astype(np.int32) - first_top + 1
    return np.clip(seg, 0, 7)


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → μ-law bytes."""
    v = pcm.astype(np.int32) >> 2  # 14-bit, rounded down as G.711's reference code does
    negative = v < 0
    mag = np.minimum(np.minimum(np.where(negative, -v, v), ULAW_CLIP_14) + (ULAW_BIAS >> 2), 0x1FFF)
    seg = _segment(mag, 6)
    mantissa = (mag >> (seg + 1)) & 0x0F
    mask = np.where(negative, 0x7F, 0xFF)
    return (((seg << 4) | mantissa) ^ mask).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    u = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    seg = (u >> 4) & 0x07
    mag = (((u & 0x0F) << 3) + ULAW_BIAS) << seg
    mag -= ULAW_BIAS
    return np.where(u & 0x80, -mag, mag).astype(np.int16)


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → A-law bytes."""
    x = pcm.astype(np.int32)
    positive = x >= 0
    mag = np.where(positive, x, -x - 1)  # −32768 → 32767: the magnitude scale is one's complement
    seg = _segment(mag, 8)
    mantissa = np.where(seg == 0, mag >> 4, mag >> (seg + 3)) & 0x0F
    sign = np.where(positive, 0x80, 0)
    return ((sign | (seg << 4) | mantissa) ^ 0x55).astype(np.uint8).tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    a = np.frombuffer(data, dtype=np.uint8).astype(np.int32) ^ 0x55
    seg = (a >> 4) & 0x07
    t = (a & 0x0F) << 4
    mag = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, mag, -mag).astype(np.int16)


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
