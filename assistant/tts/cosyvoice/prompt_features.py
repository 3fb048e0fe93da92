"""Audio features of a reference clip, written in torch (no torchaudio, no librosa, no whisper package).

Three different front ends feed three different networks:

| feature                 | rate   | used by                     | definition                                          |
|-------------------------|--------|-----------------------------|-----------------------------------------------------|
| ``prompt_mel``  80 bins | 24 kHz | flow (prompt frames)        | Matcha/HiFi-GAN mel: n_fft 1920, hop 480, slaney   |
| ``whisper_log_mel`` 128 | 16 kHz | speech_tokenizer_v2.onnx    | Whisper: n_fft 400, hop 160, log10, 8 dB floor      |
| ``kaldi_fbank`` 80      | 16 kHz | campplus.onnx (x-vector)    | Kaldi fbank: 25/10 ms, povey, preemph 0.97, log    |
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from assistant.tts.cosyvoice import SAMPLE_RATE

PROMPT_SAMPLE_RATE = SAMPLE_RATE  # the prompt mel is made at the model's own rate
TOKENIZER_SAMPLE_RATE = 16000

# prompt mel (the yaml's feat_extractor)
MEL_N_FFT = 1920
MEL_HOP = 480  # 20 ms at 24 kHz: 2 mel frames per 25 Hz speech token
MEL_WIN = 1920
MEL_BINS = 80
MEL_FMIN = 0.0
MEL_FMAX = 8000.0
MEL_LOG_FLOOR = 1e-5

# whisper
WHISPER_N_FFT = 400
WHISPER_HOP = 160
WHISPER_BINS = 128

# kaldi fbank
FBANK_FRAME = 400  # 25 ms at 16 kHz
FBANK_SHIFT = 160  # 10 ms
FBANK_BINS = 80
FBANK_PREEMPH = 0.97
FBANK_LOW_HZ = 20.0


def _as_tensor(audio: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Mono float32 [N] (a [1,N] or [N,1] input is squeezed)."""
    x = torch.as_tensor(np.asarray(audio) if not isinstance(audio, torch.Tensor) else audio)
    x = x.to(torch.float32)
    if x.dim() == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.dim() != 1:
        raise ValueError(f"expected mono audio [N], got shape {tuple(x.shape)}")
    return x


# --- slaney mel filterbank (librosa.filters.mel with htk=False, norm="slaney") --------------------------------


def _hz_to_mel_slaney(f: np.ndarray | float) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mel = f / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mel)


def _mel_to_hz_slaney(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """[n_mels, n_fft//2+1] float32 triangular filters, area-normalised (librosa's default)."""
    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_pts = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = mel_pts[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_pts[2 : n_mels + 2] - mel_pts[:n_mels]))[:, None]
    return weights.astype(np.float32)


# --- the flow's prompt mel ------------------------------------------------------------------------------------


def prompt_mel(audio_24k: np.ndarray | torch.Tensor) -> torch.Tensor:
    """24 kHz mono audio → log mel [T, 80] with T = N // 480, as CosyVoice's ``feat_extractor`` computes it.

    Reflect-pad (n_fft - hop) / 2 = 720 samples each side, STFT without centring, magnitude with a 1e-9
    floor inside the sqrt, slaney mel 0-8 kHz, natural log of max(x, 1e-5).
    """
    y = _as_tensor(audio_24k)
    pad = (MEL_N_FFT - MEL_HOP) // 2
    if y.numel() <= pad:
        raise ValueError(f"audio too short for a prompt mel: {y.numel()} samples")
    y = F.pad(y[None, None], (pad, pad), mode="reflect")[0, 0]
    spec = torch.stft(
        y, MEL_N_FFT, hop_length=MEL_HOP, win_length=MEL_WIN, window=torch.hann_window(MEL_WIN),
        center=False, normalized=False, onesided=True, return_complex=True,
    )                                                                        # [1 + n_fft/2, T]
    mag = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)
    fb = torch.from_numpy(slaney_mel_filterbank(PROMPT_SAMPLE_RATE, MEL_N_FFT, MEL_BINS, MEL_FMIN, MEL_FMAX))
    mel = fb @ mag                                                           # [80, T]
    return torch.log(torch.clamp(mel, min=MEL_LOG_FLOOR)).T.contiguous()    # [T, 80]


# --- whisper log-mel for the speech tokenizer ----------------------------------------------------------------


def whisper_log_mel(audio_16k: np.ndarray | torch.Tensor, n_mels: int = WHISPER_BINS) -> torch.Tensor:
    """16 kHz mono audio → Whisper log-mel [n_mels, N // 160] (what ``whisper.log_mel_spectrogram`` returns).

    Centred STFT (reflect padding), periodic hann 400, power spectrum without its last frame, slaney mel,
    log10 of max(x, 1e-10), floored at max - 8, then (x + 4) / 4.
    """
    y = _as_tensor(audio_16k)
    spec = torch.stft(
        y, WHISPER_N_FFT, hop_length=WHISPER_HOP, window=torch.hann_window(WHISPER_N_FFT),
        center=True, pad_mode="reflect", return_complex=True,
    )                                                                        # [201, 1 + N/160]
    power = spec[..., :-1].abs() ** 2
    fb = torch.from_numpy(slaney_mel_filterbank(TOKENIZER_SAMPLE_RATE, WHISPER_N_FFT, n_mels, 0.0, 8000.0))
    log_spec = torch.clamp(fb @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


# --- kaldi fbank for the speaker model -----------------------------------------------------------------------


def _kaldi_mel(f: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(f / 700.0)


@lru_cache(maxsize=4)
def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate: int, low_hz: float) -> torch.Tensor:
    """[num_bins, padded_window//2 + 1] Kaldi triangular filters (mel = 1127 ln(1 + f/700)); last column 0."""
    n_fft_bins = padded_window // 2
    nyquist = sample_rate / 2
    bin_width = sample_rate / padded_window
    mel_low, mel_high = _kaldi_mel(torch.tensor(low_hz)), _kaldi_mel(torch.tensor(nyquist))
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins, dtype=torch.float32)[:, None]
    left, center, right = mel_low + b * delta, mel_low + (b + 1) * delta, mel_low + (b + 2) * delta
    mel = _kaldi_mel(bin_width * torch.arange(n_fft_bins, dtype=torch.float32))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return F.pad(banks, (0, 1))  # the Nyquist bin gets no weight


def kaldi_fbank(
    audio_16k: np.ndarray | torch.Tensor,
    num_bins: int = FBANK_BINS,
    sample_rate: int = TOKENIZER_SAMPLE_RATE,
) -> torch.Tensor:
    """Kaldi ``compute-fbank-feats`` defaults with dither 0 → log mel energies [T, num_bins].

    Frames of 25 ms every 10 ms, only whole frames (snip_edges): T = 1 + (N - 400) // 160. Per frame: remove
    the DC offset, pre-emphasis 0.97 (the first sample against itself), povey window, zero-pad to 512, power
    spectrum, mel banks from 20 Hz to Nyquist, natural log floored at float32 epsilon. Not mean-normalised:
    see ``speaker_fbank``.
    """
    y = _as_tensor(audio_16k)
    if y.numel() < FBANK_FRAME:
        raise ValueError(f"audio too short for fbank: {y.numel()} samples < {FBANK_FRAME}")
    n_frames = 1 + (y.numel() - FBANK_FRAME) // FBANK_SHIFT
    frames = y.as_strided((n_frames, FBANK_FRAME), (FBANK_SHIFT, 1)).clone()   # [T, 400]
    frames = frames - frames.mean(dim=1, keepdim=True)
    prev = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - FBANK_PREEMPH * prev
    n = torch.arange(FBANK_FRAME, dtype=torch.float64)
    povey = (0.5 - 0.5 * torch.cos(2 * math.pi * n / (FBANK_FRAME - 1))).pow(0.85).to(torch.float32)
    frames = frames * povey
    padded = 1 << (FBANK_FRAME - 1).bit_length()                                # 512
    power = torch.fft.rfft(frames, n=padded).abs().pow(2)                       # [T, 257]
    mel = power @ kaldi_mel_banks(num_bins, padded, sample_rate, FBANK_LOW_HZ).T  # [T, bins]
    return torch.log(torch.clamp(mel, min=torch.finfo(torch.float32).eps))


def speaker_fbank(audio_16k: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The speaker model's input: Kaldi fbank with the per-utterance mean removed [T, 80]."""
    feat = kaldi_fbank(audio_16k)
    return feat - feat.mean(dim=0, keepdim=True)


def resample(audio: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Mono float32 resampling with soxr (high quality); a no-op when the rates agree.

    Without soxr (the offline GPU machine) scipy's polyphase filter does it: a voice prompt is resampled once,
    so its cost does not matter, and its pass band matches soxr's to well under the features' resolution.
    """
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 2:  # [N, C] or [C, N] → mono
        audio = audio.mean(axis=1 if audio.shape[1] < audio.shape[0] else 0)
    if sr_in == sr_out:
        return audio
    try:
        import soxr
    except ImportError:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(sr_in, sr_out)
        return resample_poly(audio, sr_out // g, sr_in // g).astype(np.float32)
    return soxr.resample(audio, sr_in, sr_out, quality="HQ").astype(np.float32)


__all__ = [
    "MEL_HOP",
    "PROMPT_SAMPLE_RATE",
    "TOKENIZER_SAMPLE_RATE",
    "kaldi_fbank",
    "kaldi_mel_banks",
    "prompt_mel",
    "resample",
    "slaney_mel_filterbank",
    "speaker_fbank",
    "whisper_log_mel",
]
