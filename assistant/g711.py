"""G.711 companding (ITU-T G.711): μ-law and A-law, 8-bit codes ↔ int16 samples, with numpy over whole chunks.

Telephone audio: the Realtime API's ``audio/pcmu`` and ``audio/pcma`` and the carriers' media streams
(``server/telephony/``) carry these codes at 8 kHz. Pure functions with no state: what rate the samples are at,
and any resampling, is the caller's business.
"""

from __future__ import annotations

import numpy as np

ULAW_BIAS = 0x84
ULAW_CLIP_14 = 8159  # μ-law works on 14-bit samples: the top of the range it can code
ULAW_SILENCE = 0xFF  # the μ-law code of a zero sample


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
