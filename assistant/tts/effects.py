"""Speed, pitch and loudness changes for engines that cannot do them natively (used by the TTS service),
and an F0 estimate for tests and the benchmark. numpy and soxr only (no scipy: a plain install serves them).

* :func:`time_stretch` — WSOLA (waveform-similarity overlap-add): each output frame is the input frame,
  near its nominal position, that best continues the previous one, so pitch periods stay intact. For
  speech it sounds cleaner than a phase vocoder (no "phasiness").
* :func:`pitch_shift` — time-stretch by the pitch ratio, then resample back to the original duration with
  soxr (high quality), so the pitch moves and the duration stays. Formants move with the pitch.
* :func:`apply_energy` — gain with a look-ahead limiter, so a louder voice never clips.
* :func:`estimate_f0` — YIN per frame, median over voiced frames.
"""

from __future__ import annotations

import numpy as np
import soxr
from numpy.lib.stride_tricks import sliding_window_view

from assistant.tts.base import STRETCH_RANGE

WSOLA_FRAME_S = 0.040     # analysis/synthesis frame: two periods of a 50 Hz voice
WSOLA_TOLERANCE_S = 0.012 # search ±12 ms around the nominal position: covers one period down to ~83 Hz
PITCH_RANGE = (-12.0, 12.0)
GAIN_RANGE = (0.5, 2.0)
LIMIT_CEILING = 0.98      # limiter target; the hard bound after it is PEAK_MAX
PEAK_MAX = 0.99
LIMIT_HOLD_S = 0.005      # the limiter's look-ahead/hold; its gain then ramps over the same time again
YIN_THRESHOLD = 0.15


def _mono_f32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {x.shape}")
    return x


def time_stretch(x: np.ndarray, sr: int, speed: float) -> np.ndarray:
    """Play ``x`` ``speed`` times faster (duration × 1/speed) at the same pitch; float32 out.

    ``speed`` 1.0 returns a copy. Output length is ``round(len(x) / speed)``.
    """
    x = _mono_f32(x)
    if not STRETCH_RANGE[0] <= speed <= STRETCH_RANGE[1]:
        raise ValueError(f"speed must be within {STRETCH_RANGE[0]}–{STRETCH_RANGE[1]}, got {speed}")
    out_len = round(len(x) / speed)
    if x.size == 0 or abs(speed - 1.0) < 1e-6:
        return x.copy()
    n = max(16, int(sr * WSOLA_FRAME_S) // 2 * 2)   # frame length (even)
    hs = n // 2                                     # synthesis hop: 50 % overlap of Hann windows
    tol = max(1, int(sr * WSOLA_TOLERANCE_S))
    ha = hs * speed                                 # analysis hop
    win = np.hanning(n + 1)[:n].astype(np.float32)  # periodic Hann: overlaps at n/2 sum to 1
    n_frames = out_len // hs + 2
    pad = n + tol
    xp = np.concatenate([np.zeros(pad, np.float32), x, np.zeros(pad + int(ha * n_frames) + n, np.float32)])
    out = np.zeros(n_frames * hs + n, np.float32)
    norm = np.zeros_like(out)
    # Frame k is centred on output time k·hs and, nominally, on input time k·ha (padded: + pad).
    prev = pad - hs  # start of the frame chosen for k = 0 (no search for the first frame)
    for k in range(n_frames):
        nominal = pad + round(k * ha) - hs
        if k == 0:
            start = nominal
        else:
            target = xp[prev + hs : prev + hs + n]  # the natural continuation of the previous frame
            lo = nominal - tol
            region = xp[lo : lo + n + 2 * tol]
            if not target.any() or not region.any():
                start = nominal
            else:
                corr = sliding_window_view(region, n) @ target  # cross-correlation, 2·tol+1 lags
                start = lo + int(np.argmax(corr))
        out[k * hs : k * hs + n] += xp[start : start + n] * win
        norm[k * hs : k * hs + n] += win
        prev = start
    # Output time t sits at out[t + hs] (frame 0 is centred on index hs).
    y = out[hs : hs + out_len] / np.maximum(norm[hs : hs + out_len], 1e-3)
    return y.astype(np.float32)


def pitch_shift(x: np.ndarray, sr: int, semitones: float) -> np.ndarray:
    """Raise (or lower) the pitch by ``semitones`` (−12…12) keeping the duration; float32 out."""
    x = _mono_f32(x)
    if not PITCH_RANGE[0] <= semitones <= PITCH_RANGE[1]:
        raise ValueError(f"pitch must be within {PITCH_RANGE[0]:g}…{PITCH_RANGE[1]:g} semitones, got {semitones}")
    if x.size == 0 or abs(semitones) < 1e-6:
        return x.copy()
    ratio = 2.0 ** (semitones / 12.0)
    longer = time_stretch(x, sr, 1.0 / ratio)                   # duration × ratio, same pitch
    y = soxr.resample(longer, sr * ratio, sr, quality="HQ")      # squeeze back: pitch × ratio
    y = np.asarray(y, dtype=np.float32)
    if len(y) >= len(x):
        return y[: len(x)]
    return np.concatenate([y, np.zeros(len(x) - len(y), np.float32)])


def apply_energy(x: np.ndarray, gain: float, sr: int = 22050) -> np.ndarray:
    """Scale loudness by ``gain`` (0.5–2.0); a look-ahead limiter keeps every peak ≤ 0.99.

    The limiter's gain at each sample is the mean, over ±hold, of the minimum needed gain over ±2·hold,
    which is never above what that sample needs: no sample passes the ceiling, and the gain moves
    smoothly (no waveshaping distortion). ``gain`` 1.0 returns a copy unchanged; ``sr`` only sets the
    limiter's time constants.
    """
    x = _mono_f32(x)
    if not GAIN_RANGE[0] <= gain <= GAIN_RANGE[1]:
        raise ValueError(f"energy must be within {GAIN_RANGE[0]}–{GAIN_RANGE[1]}, got {gain}")
    if x.size == 0 or gain == 1.0:
        return x.copy()
    y = x * np.float32(gain)
    peak = float(np.max(np.abs(y)))
    if peak > LIMIT_CEILING:
        hold = max(1, round(LIMIT_HOLD_S * sr))  # in samples
        need = np.minimum(1.0, LIMIT_CEILING / np.maximum(np.abs(y), 1e-9)).astype(np.float32)
        g = running_min(need, 4 * hold + 1)
        g = running_mean(g, 2 * hold + 1)
        y = y * np.minimum(g, need)
    return np.clip(y, -PEAK_MAX, PEAK_MAX).astype(np.float32)


def running_min(x: np.ndarray, size: int) -> np.ndarray:
    """The minimum over a centred window of odd ``size`` at every sample, the edges repeated past the ends
    (``scipy.ndimage.minimum_filter1d(mode="nearest")``), in O(n): van Herk/Gil-Werman's block prefix and suffix
    minima."""
    if size % 2 != 1:
        raise ValueError(f"size must be odd, got {size}")
    half = size // 2
    padded = np.concatenate([np.full(half, x[0], x.dtype), x, np.full(half, x[-1], x.dtype)])
    blocks = -(-len(padded) // size)
    tail = blocks * size - len(padded)
    full = np.concatenate([padded, np.full(tail, padded[-1], x.dtype)]).reshape(blocks, size)
    prefix = np.minimum.accumulate(full, axis=1).ravel()
    suffix = np.minimum.accumulate(full[:, ::-1], axis=1)[:, ::-1].ravel()
    n = len(x)
    return np.minimum(suffix[:n], prefix[size - 1 : size - 1 + n]).astype(x.dtype)


def running_mean(x: np.ndarray, size: int) -> np.ndarray:
    """The mean over a centred window of odd ``size`` at every sample, the edges repeated past the ends
    (``scipy.ndimage.uniform_filter1d(mode="nearest")``)."""
    if size % 2 != 1:
        raise ValueError(f"size must be odd, got {size}")
    half = size // 2
    padded = np.concatenate([np.full(half, x[0]), x, np.full(half, x[-1])]).astype(np.float64)
    sums = np.concatenate([[0.0], np.cumsum(padded)])
    return ((sums[size:] - sums[:-size]) / size).astype(x.dtype)


def estimate_f0(x: np.ndarray, sr: int, fmin: float = 50.0, fmax: float = 600.0) -> float:
    """Median fundamental frequency (Hz) over voiced frames (YIN); 0.0 if nothing is voiced."""
    x = _mono_f32(x).astype(np.float64)
    max_lag = int(np.ceil(sr / fmin))
    min_lag = max(2, int(np.floor(sr / fmax)))
    w = max_lag  # integration window
    hop = max(1, int(sr * 0.010))
    if len(x) < w + max_lag + 1:
        return 0.0
    starts = np.arange(0, len(x) - (w + max_lag), hop)
    frames = np.stack([x[s : s + w + max_lag] for s in starts])  # (F, w + max_lag)
    energy = np.sqrt(np.mean(frames[:, :w] ** 2, axis=1))
    keep = energy > max(1e-4, 0.1 * float(np.max(energy)))  # skip silence and faint noise
    frames = frames[keep]
    if not len(frames):
        return 0.0
    # Difference function d(τ) = E(0..w) + E(τ..τ+w) − 2·r(τ), r via FFT.
    nfft = 1 << int(np.ceil(np.log2(2 * (w + max_lag))))
    spec_a = np.fft.rfft(frames[:, :w], nfft)
    spec_b = np.fft.rfft(frames, nfft)
    r = np.fft.irfft(np.conj(spec_a) * spec_b, nfft)[:, : max_lag + 1]
    sq = np.concatenate([np.zeros((len(frames), 1)), np.cumsum(frames**2, axis=1)], axis=1)
    lags = np.arange(max_lag + 1)
    e_tau = sq[:, lags + w] - sq[:, lags]
    d = np.maximum(e_tau[:, :1] + e_tau - 2 * r, 0.0)
    cum = np.cumsum(d[:, 1:], axis=1)
    cmnd = np.ones_like(d)
    cmnd[:, 1:] = d[:, 1:] * lags[1:] / np.maximum(cum, 1e-12)
    f0s: list[float] = []
    for row in cmnd:
        below = np.nonzero(row[min_lag:max_lag] < YIN_THRESHOLD)[0]
        if not len(below):
            continue
        t = min_lag + int(below[0])
        while t + 1 < max_lag and row[t + 1] < row[t]:  # walk down to the local minimum
            t += 1
        a, b, c = row[t - 1], row[t], row[t + 1] if t + 1 <= max_lag else row[t]
        denom = a - 2 * b + c
        shift = 0.5 * (a - c) / denom if abs(denom) > 1e-12 else 0.0
        f0s.append(sr / (t + float(np.clip(shift, -1, 1))))
    return float(np.median(f0s)) if f0s else 0.0
