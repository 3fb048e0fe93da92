"""Excitation of the HiFT vocoder: F0 from the mel, and the neural-source-filter (NSF) source signal.

    mel [1, 80, T] ──F0Predictor──▶ f0 [1, T] (Hz) ──repeat x480──▶ per-sample f0
        ──SineSource──▶ 9 harmonic sines (voiced) or noise (unvoiced) ──Linear 9->1, tanh──▶ source

The source is computed in float32 whatever the model's dtype: its phase is a long cumulative sum.
Its random parts (initial phase of the harmonics, additive noise) are a `SourceNoise`, drawn from the
global torch generator in the reference's order, or passed in so a test can replay recorded draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


class F0Predictor(nn.Module):
    """Five weight-normed conv(k=3) + ELU layers and a linear head; |output| is F0 in Hz."""

    def __init__(self, in_channels: int = 80, cond_channels: int = 512, num_layers: int = 5):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers += [
                weight_norm(nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1)),
                nn.ELU(),
            ]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T] -> f0 [B, T]."""
        h = self.condnet(mel).transpose(1, 2)  # [B, T, C]
        return self.classifier(h).squeeze(-1).abs()


@dataclass
class SourceNoise:
    """The random draws of one vocoder call.

    rand_ini [1, H]: initial phase of each harmonic in cycles (column 0, the fundamental, is forced to 0);
    sine_noise [1, N, H]: standard normal noise per sample and harmonic. H = harmonics + 1, N samples.
    """

    rand_ini: torch.Tensor
    sine_noise: torch.Tensor

    @classmethod
    def draw(cls, n_samples: int, n_harmonics: int, device: torch.device | str = "cpu") -> SourceNoise:
        """Draw from the global generator exactly as the reference does, so a fixed seed replays it."""
        rand_ini = torch.rand(1, n_harmonics, device=device)
        # The reference calls randn_like on a transposed [1, N, H] view: the normals fill [1, H, N] memory.
        sine_noise = torch.empty(1, n_harmonics, n_samples, device=device).transpose(1, 2).normal_()
        torch.randn(1, n_samples, 1, device=device)  # the reference's unused noise branch, kept for RNG order
        return cls(rand_ini, sine_noise)


class SineSource(nn.Module):
    """NSF source: harmonic sines where voiced, noise where not, merged to one channel.

    The phase is integrated at the frame rate (linear down-sampling of the instantaneous frequency,
    cumulative sum, linear up-sampling), which keeps it smooth across the x`upsample` repeat of F0.
    """

    def __init__(
        self,
        sampling_rate: int,
        upsample: int,
        harmonics: int = 8,
        sine_amp: float = 0.1,
        noise_std: float = 0.003,
        voiced_threshold: float = 10.0,
    ):
        super().__init__()
        self.sampling_rate = sampling_rate
        self.upsample = upsample
        self.n_harmonics = harmonics + 1
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        self.l_linear = nn.Linear(self.n_harmonics, 1)

    def frame_cycles(self, f0: torch.Tensor) -> torch.Tensor:
        """f0 [1, T] per frame -> phase advance per sample of each harmonic, in cycles [1, T, H]."""
        harmonics = torch.arange(1, self.n_harmonics + 1, device=f0.device, dtype=torch.float32)
        return (f0.float().unsqueeze(-1) * harmonics / self.sampling_rate) % 1

    def forward(self, f0: torch.Tensor, noise: SourceNoise, phase_offset: torch.Tensor | None = None) -> torch.Tensor:
        """f0 [1, N, 1] per sample (float32) -> source [1, N, 1].

        phase_offset [1, H] (cycles per sample, summed over the frames before this call; streaming):
        continues the harmonic phase of earlier calls instead of restarting it.
        """
        harmonics = torch.arange(1, self.n_harmonics + 1, device=f0.device, dtype=torch.float32)
        freq = f0 * harmonics.view(1, 1, -1)  # [1, N, H] Hz
        cycles = (freq / self.sampling_rate) % 1  # phase increment per sample, in cycles
        initial = noise.rand_ini.to(cycles).clone()
        initial[:, 0] = 0
        cycles[:, 0, :] = cycles[:, 0, :] + initial

        per_frame = F.interpolate(cycles.transpose(1, 2), scale_factor=1 / self.upsample, mode="linear")
        summed = torch.cumsum(per_frame, dim=2)
        if phase_offset is not None:
            summed = summed + phase_offset.to(summed).unsqueeze(-1)
        phase = summed * 2 * math.pi  # [1, H, frames] radians at frame rate
        phase = F.interpolate(phase * self.upsample, scale_factor=float(self.upsample), mode="linear")
        sines = torch.sin(phase).transpose(1, 2) * self.sine_amp  # [1, N, H]

        voiced = (f0 > self.voiced_threshold).to(torch.float32)  # [1, N, 1]
        noise_amp = voiced * self.noise_std + (1 - voiced) * self.sine_amp / 3
        excitation = sines * voiced + noise_amp * noise.sine_noise.to(sines)
        weight, bias = self.l_linear.weight.float(), self.l_linear.bias.float()
        return torch.tanh(F.linear(excitation, weight, bias))
