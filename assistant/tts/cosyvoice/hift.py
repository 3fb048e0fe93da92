"""HiFT vocoder of CosyVoice2: mel [1, 80, T] -> 24 kHz waveform (neural source filter + iSTFT head).

    mel ──F0Predictor──▶ f0 ──SineSource──▶ source s [1, 1, 480*T]
    mel ──conv_pre──▶ 3 x (LeakyReLU, transposed conv up x8 / x5 / x3,
                           + downsampled STFT of s through a resblock,
                           mean of 3 Snake resblocks)
        ──LeakyReLU, conv_post──▶ log-magnitude (9) and phase (9) of a 16-point STFT ──iSTFT hop 4──▶ audio

`HiFTVocoder.state_dict()` has exactly the keys of the official `hift.pt` (torch weight-norm
parametrizations; files written with the legacy `weight_g` / `weight_v` names load too).

Streaming glue: a chunk is vocoded together with the last mel frames of the previous one, and its
source is overwritten by the previous chunk's source there (`cache_source`) so the phase continues;
`fade_in_out` then cross-fades the overlapping audio with a Hamming window.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from assistant.tts.cosyvoice.hift_source import F0Predictor, SineSource, SourceNoise

log = logging.getLogger(__name__)


@dataclass
class HiFTConfig:
    """Sizes of the vocoder (defaults: CosyVoice2-0.5B)."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1  # sine amplitude
    nsf_sigma: float = 0.003  # noise std in voiced regions
    nsf_voiced_threshold: float = 10.0  # Hz
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 3])
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 11, 7])
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    source_resblock_kernel_sizes: list[int] = field(default_factory=lambda: [7, 7, 11])
    source_resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per mel frame (480 = 8*5*3 upsampling x hop 4)."""
        return math.prod(self.upsample_rates) * self.hop_len

    @classmethod
    def from_yaml(cls, section: dict[str, Any]) -> HiFTConfig:
        """Build from the `hift` entry of the official yaml as plain dicts (see the yaml reader)."""
        known = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in section.items() if k in known}
        istft = section.get("istft_params", {})
        if "n_fft" in istft:
            kwargs["n_fft"] = istft["n_fft"]
        if "hop_len" in istft:
            kwargs["hop_len"] = istft["hop_len"]
        f0 = section.get("f0_predictor", {})
        if "cond_channels" in f0:
            kwargs["f0_cond_channels"] = f0["cond_channels"]
        return cls(**kwargs)


class Snake(nn.Module):
    """x + sin²(αx)/α with a learned α per channel (periodic inductive bias for audio)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.view(1, -1, 1)
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Three residual units: Snake, dilated conv, Snake, conv (all weight-normed, 'same' padding)."""

    def __init__(self, channels: int, kernel_size: int, dilations: list[int]):
        super().__init__()

        def conv(dilation: int) -> nn.Module:
            pad = (kernel_size * dilation - dilation) // 2
            return weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=dilation, padding=pad))

        self.convs1 = nn.ModuleList([conv(d) for d in dilations])
        self.convs2 = nn.ModuleList([conv(1) for _ in dilations])
        self.activations1 = nn.ModuleList([Snake(channels) for _ in dilations])
        self.activations2 = nn.ModuleList([Snake(channels) for _ in dilations])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2, strict=True):
            x = x + c2(a2(c1(a1(x))))
        return x


class HiFTVocoder(nn.Module):
    """The official `HiFTGenerator` (inference only)."""

    def __init__(self, cfg: HiFTConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or HiFTConfig()
        base, rates = cfg.base_channels, cfg.upsample_rates
        self.f0_predictor = F0Predictor(cfg.in_channels, cfg.f0_cond_channels)
        self.m_source = SineSource(
            cfg.sampling_rate,
            cfg.samples_per_frame,
            cfg.nb_harmonics,
            cfg.nsf_alpha,
            cfg.nsf_sigma,
            cfg.nsf_voiced_threshold,
        )
        self.conv_pre = weight_norm(nn.Conv1d(cfg.in_channels, base, 7, padding=3))
        self.ups = nn.ModuleList(
            weight_norm(nn.ConvTranspose1d(base >> i, base >> (i + 1), k, u, padding=(k - u) // 2))
            for i, (u, k) in enumerate(zip(rates, cfg.upsample_kernel_sizes, strict=True))
        )
        # The source's STFT (hop 4) enters after each upsampling stage, strided down to that stage's rate.
        spec_channels = cfg.n_fft + 2
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        strides = np.cumprod([1, *rates[::-1][:-1]])[::-1]  # e.g. [15, 3, 1]
        for i, (u, k, d) in enumerate(
            zip(strides, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes, strict=True)
        ):
            ch, u = base >> (i + 1), int(u)
            down = nn.Conv1d(spec_channels, ch, 1) if u == 1 else nn.Conv1d(spec_channels, ch, 2 * u, u, u // 2)
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList(
            ResBlock(base >> (i + 1), k, d)
            for i in range(len(rates))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)
        )
        self.conv_post = weight_norm(nn.Conv1d(base >> len(rates), spec_channels, 7, padding=3))
        # scipy's periodic Hann (float64, stored float32); a buffer so it follows .to(device).
        n = torch.arange(cfg.n_fft, dtype=torch.float64)
        window = (0.5 - 0.5 * torch.cos(2 * math.pi * n / cfg.n_fft)).float()
        self.register_buffer("stft_window", window, persistent=False)

    def cast_decoder(self, dtype: torch.dtype) -> HiFTVocoder:
        """Cast the upsampling stack (nearly all the compute) to `dtype`; keep F0 and source in float32.

        In bfloat16 the F0 predictor is off by ~1 Hz, which over an utterance shifts the harmonic phase
        enough to change the waveform (tiny model: max 6e-2 vs 3e-3 with this split).
        """
        for name, child in self.named_children():
            if name not in ("f0_predictor", "m_source"):
                child.to(dtype)
        return self

    # --- pieces -------------------------------------------------------------------------------------

    def _window(self) -> torch.Tensor:
        return self.stft_window.float()

    def stft(self, x: torch.Tensor) -> torch.Tensor:
        """Source [1, N] -> real and imaginary parts stacked [1, n_fft + 2, N/hop + 1] (float32)."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_len
        spec = torch.stft(x.float(), n_fft, hop, n_fft, window=self._window(), return_complex=True)
        return torch.cat([spec.real, spec.imag], dim=1)

    def istft(self, log_magnitude: torch.Tensor, phase_in: torch.Tensor) -> torch.Tensor:
        """[1, n_fft/2+1, F] each -> waveform [1, N] (float32)."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_len
        magnitude = torch.exp(log_magnitude.float()).clip(max=1e2)
        phase = torch.sin(phase_in.float())  # the reference's head passes phase through sin
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, n_fft, hop, n_fft, window=self._window())

    def source(
        self, f0: torch.Tensor, noise: SourceNoise | None = None, phase_offset: torch.Tensor | None = None
    ) -> torch.Tensor:
        """f0 [1, T] -> source [1, 1, 480*T] (float32); draws `noise` from the global RNG if None."""
        per_sample = f0.float().repeat_interleave(self.cfg.samples_per_frame, dim=1).unsqueeze(-1)  # [1, N, 1]
        if noise is None:
            noise = SourceNoise.draw(per_sample.size(1), self.m_source.n_harmonics, per_sample.device)
        return self.m_source(per_sample, noise, phase_offset).transpose(1, 2)

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel [1, 80, T], source [1, 1, N] -> waveform [1, N] clamped to ±audio_limit (float32)."""
        cfg = self.cfg
        dtype = self.conv_pre.parametrizations.weight.original1.dtype
        s_spec = self.stft(source.squeeze(1)).to(dtype)  # [1, 18, N/4 + 1]
        x = self.conv_pre(mel.to(dtype))
        n_kernels = len(cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_spec))
            blocks = self.resblocks[i * n_kernels : (i + 1) * n_kernels]
            acc = blocks[0](x)
            for block in blocks[1:]:
                acc = acc + block(x)
            x = acc / n_kernels
        x = self.conv_post(F.leaky_relu(x))  # default slope 0.01 here, as the reference
        half = cfg.n_fft // 2 + 1
        audio = self.istft(x[:, :half], x[:, half:])
        return audio.clamp(-cfg.audio_limit, cfg.audio_limit)

    # --- entry point --------------------------------------------------------------------------------

    @torch.inference_mode()
    def inference(
        self,
        speech_feat: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        noise: SourceNoise | None = None,
        trace: dict[str, torch.Tensor] | None = None,
        phase_offset: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [1, 80, T] -> (speech [1, 480*T] float32, source [1, 1, 480*T] float32).

        cache_source [1, 1, M]: source of the overlap with the previous chunk; replaces the first M samples
        so the excitation's phase runs on across chunks. noise: the random draws (default: global RNG).
        phase_offset [1, H]: harmonic phase (cycles) reached before this mel (see `StreamingHiFT`).
        """
        f0_dtype = self.f0_predictor.classifier.weight.dtype
        f0 = self.f0_predictor(speech_feat.to(f0_dtype))  # [1, T]
        s = self.source(f0, noise, phase_offset)  # [1, 1, N]
        if cache_source is not None and cache_source.size(2) > 0:
            s[:, :, : cache_source.size(2)] = cache_source
        if trace is not None:
            trace["f0"] = f0
        return self.decode(speech_feat, s), s


def crossfade_window(overlap: int) -> torch.Tensor:
    """Hamming window of 2*overlap points (float64): rising half for the new chunk, falling for the old."""
    return torch.from_numpy(np.hamming(2 * overlap))


def fade_in_out(fade_in: torch.Tensor, fade_out: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Cross-fade the start of `fade_in` [..., N] with the tail of `fade_out` [..., >=len(window)/2].

    Returns a copy of `fade_in` whose first len(window)/2 samples are
    fade_in * window[:half] + fade_out[-half:] * window[half:] (computed in float64, like the reference).
    """
    half = window.size(0) // 2
    window = window.to(device=fade_in.device, dtype=torch.float64)
    out = fade_in.clone()
    mixed = fade_in[..., :half].double() * window[:half] + fade_out[..., -half:].double() * window[half:]
    out[..., :half] = mixed.to(out.dtype)
    return out


class StreamingHiFT:
    """Per-utterance streaming state of a `HiFTVocoder`: mel chunks in, audio chunks out.

    Each chunk is vocoded with the last `overlap_frames` mel frames of the previous one in front; the
    source there is the previous chunk's (so it is continuous), the harmonic phase after it continues
    from the frames already emitted (`phase_offset`, unlike the reference, which restarts it), and the
    overlapping audio is cross-faded with a Hamming window. The last overlap of every chunk is held back
    until the next chunk (or returned by `finalize`). Never share one between requests.
    """

    def __init__(self, vocoder: HiFTVocoder, overlap_frames: int = 8):
        self.vocoder = vocoder
        self.overlap = overlap_frames
        self.overlap_samples = overlap_frames * vocoder.cfg.samples_per_frame
        self.window = crossfade_window(self.overlap_samples)
        self.mel_tail: torch.Tensor | None = None  # [1, 80, overlap]
        self.source_tail: torch.Tensor | None = None  # [1, 1, overlap_samples]
        self.speech_tail: torch.Tensor | None = None  # [1, overlap_samples]
        self.cycles = torch.zeros(1, vocoder.m_source.n_harmonics, dtype=torch.float64)  # phase so far

    @torch.inference_mode()
    def push(self, mel: torch.Tensor, finalize: bool = False, noise: SourceNoise | None = None) -> torch.Tensor:
        """mel [1, 80, n] new frames -> audio [1, samples] ready to play (float32).

        noise: draws for the whole vocoded span (tail + new frames); default the global generator.
        """
        if self.mel_tail is not None:
            mel = torch.cat([self.mel_tail.to(mel), mel], dim=2)
        trace: dict[str, torch.Tensor] = {}
        speech, source = self.vocoder.inference(
            mel, cache_source=self.source_tail, noise=noise, trace=trace, phase_offset=self.cycles.float()
        )
        if self.speech_tail is not None:
            speech = fade_in_out(speech, self.speech_tail, self.window)
        if finalize:
            return speech
        done = mel.size(2) - self.overlap  # frames never vocoded again
        cycles = self.vocoder.m_source.frame_cycles(trace["f0"][:, :done]).double().sum(dim=1).cpu()
        self.cycles = (self.cycles + cycles) % 1
        self.mel_tail = mel[:, :, done:]
        self.source_tail = source[:, :, -self.overlap_samples :]
        self.speech_tail = speech[:, -self.overlap_samples :]
        return speech[:, : -self.overlap_samples]
