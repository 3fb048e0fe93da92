"""HiFT vocoder of CosyVoice2: mel [1, 80, T] -> 24 kHz waveform (neural source filter + iSTFT head).

    mel ──F0Predictor──▶ f0 ──SineSource──▶ source s [1, 1, 480*T]
    mel ──conv_pre──▶ 3 x (LeakyReLU, transposed conv up x8 / x5 / x3,
                           + downsampled STFT of s through a resblock,
                           mean of 3 Snake resblocks)
        ──LeakyReLU, conv_post──▶ log-magnitude (9) and phase (9) of a 16-point STFT ──iSTFT hop 4──▶ audio

`HiFTVocoder.state_dict()` has exactly the keys of the official `hift.pt` (torch weight-norm
parametrizations; files written with the legacy `weight_g` / `weight_v` names load too).

Streaming glue of the reference (kept for parity tests): a chunk is vocoded together with the last mel
frames of the previous one, and its source is overwritten by the previous chunk's source there
(`cache_source`); `fade_in_out` then cross-fades the overlapping audio with a Hamming window.
Ours, `StreamingHiFT`, is exact instead: every stage is a finite convolution (`HiFTVocoder.receptive_field`),
so a chunk is vocoded with enough left context and its right edge is held back until its future context
has arrived; the harmonic phase is carried across chunks. Streamed audio then equals `inference` on the
whole mel (same draws), with no seams to hide.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from assistant.tts.cosyvoice import SAMPLE_RATE
from assistant.tts.cosyvoice.batch_work import Work, WorkSteps, run_alone
from assistant.tts.cosyvoice.hift_source import F0Predictor, SineSource, SourceNoise

log = logging.getLogger(__name__)


@dataclass
class HiFTConfig:
    """Sizes of the vocoder (defaults: CosyVoice2-0.5B)."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = SAMPLE_RATE
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


def _conv(module: nn.Module) -> nn.Conv1d | nn.ConvTranspose1d:
    """A layer of a ModuleList as the convolution it is (a ModuleList's items are typed as plain modules)."""
    assert isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)), type(module)
    return module


def _pad(conv: nn.Module) -> int:
    """One-sided reach of a 'same'-padded Conv1d: its padding."""
    padding = _conv(conv).padding
    assert not isinstance(padding, str), padding  # every conv here has explicit padding
    return int(padding[0])


def _resblock_reach(block: nn.Module) -> int:
    """One-sided reach of a ResBlock in samples of its rate (its convolutions run in series)."""
    assert isinstance(block, ResBlock), type(block)
    return sum(_pad(c) for c in [*block.convs1, *block.convs2])


@dataclass(frozen=True)
class HiFTReach:
    """Receptive field in mel frames, each side: output frame j depends on mel frames j-mel_left ..
    j+mel_right and source frames j-source_left .. j+source_right; F0 frame j on mel j-f0 .. j+f0."""

    mel_left: int
    mel_right: int
    source_left: int
    source_right: int
    f0: int


class HiFTVocoder(nn.Module):
    """The official `HiFTGenerator` (inference only)."""

    stft_window: torch.Tensor  # a buffer (registered below)

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

    @torch.no_grad()
    def remove_weight_norm(self) -> HiFTVocoder:
        """Fold every weight-norm parametrisation into a plain weight (after loading): the same outputs,
        without recomputing g * v / |v| in every call. The state dict then no longer has the checkpoint's keys."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        return self

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
        """[B, n_fft/2+1, F] each -> waveform [B, hop*(F-1)] (float32): ``torch.istft`` (centered, Hann window,
        hop 4) written out as inverse FFT, windowed overlap-add and the window envelope, because torch.istft
        checks the envelope on the host (a device sync on every call, and no CUDA graph can hold it); with this
        window and hop the envelope never nears zero, so nothing needs checking."""
        n_fft, hop = self.cfg.n_fft, self.cfg.hop_len
        magnitude = torch.exp(log_magnitude.float()).clip(max=1e2)
        phase = torch.sin(phase_in.float())  # the reference's head passes phase through sin
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        window = self._window()
        frames = torch.fft.irfft(spec, n=n_fft, dim=1) * window.view(1, -1, 1)         # [B, n_fft, F]
        n_frames = frames.size(2)
        length = n_fft + hop * (n_frames - 1)

        def overlap_add(x: torch.Tensor) -> torch.Tensor:  # [B, n_fft, F] → [B, length]
            return F.fold(x, (1, length), (1, n_fft), stride=(1, hop)).view(x.size(0), length)

        envelope = overlap_add((window * window).view(1, -1, 1).expand(1, n_fft, n_frames))     # [1, length]
        half = n_fft // 2
        return overlap_add(frames)[:, half : length - half] / envelope[:, half : length - half]

    def source(
        self, f0: torch.Tensor, noise: SourceNoise | None = None, phase_offset: torch.Tensor | None = None
    ) -> torch.Tensor:
        """f0 [1, T] -> source [1, 1, 480*T] (float32); draws `noise` from the global RNG if None."""
        per_sample = f0.float().repeat_interleave(self.cfg.samples_per_frame, dim=1).unsqueeze(-1)  # [1, N, 1]
        if noise is None:
            noise = SourceNoise.draw(per_sample.size(1), self.m_source.n_harmonics, per_sample.device)
        return self.m_source(per_sample, noise, phase_offset).transpose(1, 2)

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T], source [B, 1, N] -> waveform [B, N] clamped to ±audio_limit (float32)."""
        cfg = self.cfg
        dtype = self.conv_pre.bias.dtype
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

    def receptive_field(self) -> HiFTReach:
        """How far (in mel frames, each side) one output frame depends on the mel, the source and F0.

        Derived from the layers' kernel sizes, strides, paddings and dilations by propagating the index
        interval of one output frame backwards through iSTFT, conv_post, the resblocks, the source branch
        (source resblock, strided conv, STFT) and the transposed convolutions, to conv_pre. Edges ignored.
        """
        cfg = self.cfg
        spf, n_fft, hop = cfg.samples_per_frame, cfg.n_fft, cfg.hop_len
        frame = 1000  # any frame far from both ends
        lo, hi = frame * spf, frame * spf + spf - 1  # output samples
        # iSTFT (center=True): STFT frame k covers samples [hop*k - n_fft/2, hop*k + n_fft/2 - 1]
        lo, hi = -((-(lo - n_fft // 2 + 1)) // hop), (hi + n_fft // 2) // hop
        lo, hi = lo - _pad(self.conv_post), hi + _pad(self.conv_post)
        n_kernels = len(cfg.resblock_kernel_sizes)
        src_lo, src_hi = lo * hop, hi * hop
        for i in reversed(range(len(self.ups))):
            blocks = self.resblocks[i * n_kernels : (i + 1) * n_kernels]
            reach = max(_resblock_reach(b) for b in blocks)
            lo, hi = lo - reach, hi + reach
            # source branch at this stage: resblock, then a (strided) conv over STFT frames, then the STFT
            s_reach = _resblock_reach(self.source_resblocks[i])
            down = _conv(self.source_downs[i])
            k, u, p = down.kernel_size[0], down.stride[0], _pad(down)
            f_lo, f_hi = (lo - s_reach) * u - p, (hi + s_reach) * u - p + k - 1
            src_lo, src_hi = min(src_lo, f_lo * hop - n_fft // 2), max(src_hi, f_hi * hop + n_fft // 2 - 1)
            if i == len(self.ups) - 1:
                lo, hi = lo - 1, hi - 1  # reflection pad (1, 0): index k is the upsampler's k - 1
            up = _conv(self.ups[i])
            k, u, p = up.kernel_size[0], up.stride[0], _pad(up)
            lo, hi = -((-(lo + p - k + 1)) // u), (hi + p) // u  # transposed conv: o = i*u - p + tap
        lo, hi = lo - _pad(self.conv_pre), hi + _pad(self.conv_pre)
        f0 = sum(_pad(m) for m in self.f0_predictor.condnet if isinstance(m, nn.Conv1d))
        return HiFTReach(
            mel_left=frame - lo,
            mel_right=hi - frame,
            source_left=frame - src_lo // spf,
            source_right=src_hi // spf - frame,
            f0=f0,
        )

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


class VocoderDecode(Work):
    """One stream's decoder window (`HiFTVocoder.decode`): mel [1, 80, W], source [1, 1, W * 480] →
    ``result`` audio [W * 480]; windows of equal length from several streams run as one batch."""

    def __init__(self, vocoder: HiFTVocoder, mel: torch.Tensor, source: torch.Tensor) -> None:
        self.vocoder, self.mel, self.source = vocoder, mel, source

    def batch_key(self, buckets: Sequence[int] = ()) -> Hashable:
        return id(self.vocoder), self.mel.size(2), self.mel.dtype

    @classmethod
    def run_batch(cls, items: list[VocoderDecode]) -> None:
        mel = torch.cat([it.mel for it in items]) if len(items) > 1 else items[0].mel
        source = torch.cat([it.source for it in items]) if len(items) > 1 else items[0].source
        audio = items[0].vocoder.decode(mel, source)                      # [B, N]
        for i, it in enumerate(items):
            it.result = audio[i]


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
    """Per-utterance streaming state of a `HiFTVocoder`: mel chunks in, audio out, equal to `inference`.

    Every stage of the vocoder is a finite convolution (`HiFTVocoder.receptive_field`: F0 ±5 frames,
    decoder ±14 frames of mel and ±15 of source), except the harmonic phase, a running sum over all frames.
    So each push
      1. computes F0 for the frames whose ±5-frame mel context is complete and keeps it (exact);
      2. computes the source of the frames whose F0 neighbours are exact, continuing the phase summed over
         all earlier frames (`phase_offset`), and keeps it (exact); the random draws of a sample are used
         once, for that sample, so the noise of each push covers its new frames only;
      3. runs the decoder over [emitted - context, received) and returns only the frames whose whole
         receptive field lies inside (exact), holding back the last `lookahead_frames` until the next push.
    Per push this costs the new frames plus a fixed overlap (~context + lookahead frames in the decoder,
    2x5 in the F0 predictor, 2 in the source); nothing is recomputed from the start.

    With the default (exact) look-ahead the concatenated audio equals whole-utterance `inference` on the
    same mel and draws to float32 rounding (1e-5 on the tiny model) everywhere: there are no seams, so no
    cross-fade. `final=True` returns everything left. A smaller `lookahead_frames` lowers latency; the held-
    back edge is then vocoded from provisional F0/source/mel context and is no longer exact.

    API changes from the first (unfinished, cross-fading) version: `push(mel, final)` returns a 1-D tensor
    [N] (was [1, N]); its `noise` covers the new frames only (was: the mel tail plus the new frames); the
    keyword `finalize` is still accepted; options are keyword-only (`overlap_frames` is gone, `mel_tail`
    too: see `held_frames`). Never share one between requests.
    """

    def __init__(self, vocoder: HiFTVocoder, *, lookahead_frames: int | None = None, context_frames: int | None = None):
        self.vocoder = vocoder
        reach = vocoder.receptive_field()
        self.f0_reach = reach.f0
        #: frames held back at the right edge; exact needs the source of frame j + source_right, whose
        #: F0 neighbour needs mel up to j + source_right + 1 + f0
        self.exact_lookahead = max(reach.mel_right, reach.source_right + 1 + reach.f0)
        self.lookahead = self.exact_lookahead if lookahead_frames is None else max(int(lookahead_frames), 0)
        self.context = max(reach.mel_left, reach.source_left) if context_frames is None else int(context_frames)
        self.spf = vocoder.cfg.samples_per_frame
        self.n_harmonics = vocoder.m_source.n_harmonics
        dev = next(vocoder.parameters()).device
        self.received = 0  # mel frames pushed so far
        self.emitted = 0  # frames whose audio has been returned
        self.closed = False
        self.mel: torch.Tensor | None = None  # [1, 80, received - mel_start]
        self.mel_start = 0
        self.f0 = torch.zeros(1, 0, device=dev)  # exact F0 of frames [f0_start, f0_end) (Hz)
        self.f0_start = 0  # also where the next source window starts
        self.f0_end = 0
        self.source = torch.zeros(1, 1, 0, device=dev)  # exact source of frames [src_start, src_end)
        self.src_start = 0
        self.src_end = 0
        self.noise = torch.zeros(1, 0, self.n_harmonics, device=dev)  # draws of [src_end, received) [1, n*spf, H]
        self.rand_ini: torch.Tensor | None = None  # [1, H], of the utterance's first push
        # harmonic phase summed over frames [0, f0_start), in cycles per sample, modulo 1 (float64)
        self.cycles = torch.zeros(1, self.n_harmonics, dtype=torch.float64, device=dev)
        self.spoken: list[torch.Tensor] | None = None  # set to [] to record the mel each returned frame came from

    @property
    def held_frames(self) -> int:
        """Mel frames received whose audio has not been returned yet."""
        return self.received - self.emitted

    @torch.inference_mode()
    def push(
        self,
        mel: torch.Tensor,
        final: bool = False,
        noise: SourceNoise | None = None,
        *,
        finalize: bool | None = None,
    ) -> torch.Tensor:
        """mel [1, 80, n] new frames -> audio [N] ready now (float32, 24 kHz); all the rest if `final`.

        noise: the draws of the new frames (sine_noise [1, n*480, H]); default: the global generator.
        """
        return run_alone(self.push_steps(mel, final or bool(finalize), noise))

    def push_steps(
        self, mel: torch.Tensor, final: bool = False, noise: SourceNoise | None = None
    ) -> WorkSteps[torch.Tensor]:
        """`push` as work steps (its decoder window can be batched with other streams')."""
        if self.closed:
            raise RuntimeError("StreamingHiFT: push after the final chunk")
        spf, n_new = self.spf, mel.size(2)
        device = mel.device
        if n_new:
            if noise is None:
                noise = SourceNoise.draw(n_new * spf, self.n_harmonics, device)
            if noise.sine_noise.size(1) != n_new * spf:
                raise ValueError(f"noise covers {noise.sine_noise.size(1)} samples, the chunk {n_new * spf}")
            if self.rand_ini is None:
                self.rand_ini = noise.rand_ini
            self.mel = mel if self.mel is None else torch.cat([self.mel.to(mel), mel], dim=2)
            self.noise = torch.cat([self.noise.to(device), noise.sine_noise.to(device, torch.float32)], dim=1)
            self.received += n_new
        self.closed = final
        if self.mel is None or self.received == 0:
            return torch.zeros(0, device=device)
        f0_more = self._f0(final)  # [1, received - f0_start]: exact, then provisional
        source_more = self._source(f0_more, final)  # [1, 1, (received - src_end) * spf] provisional
        audio = yield from self._decode(source_more, final)
        self._trim()
        return audio

    def adopt_first_push(self, mel: torch.Tensor, noise: SourceNoise, f0: torch.Tensor, source: torch.Tensor,
                         audio: torch.Tensor) -> torch.Tensor:
        """The first push (from nothing, not final) with its F0 [1, F], source [1, 1, F*spf] and decoded audio
        [F*spf] computed elsewhere, batched with other streams' (`hift_graphs.FirstPush`): leaves the state and
        returns the audio that `push(mel, False, noise)` would (its eager twin; tested)."""
        if self.received or self.closed:
            raise RuntimeError("StreamingHiFT.adopt_first_push: not the first push")
        spf, n = self.spf, mel.size(2)
        if noise.sine_noise.size(1) != n * spf:
            raise ValueError(f"noise covers {noise.sine_noise.size(1)} samples, the chunk {n * spf}")
        self.rand_ini = noise.rand_ini
        self.mel, self.received = mel, n
        f0_end = max(n - self.f0_reach, 0)                  # F0 is exact where its mel context is complete
        src_end = max(f0_end - 1, 0)                        # the source where the F0 on both sides is
        self.f0, self.f0_end = f0[:, :f0_end], f0_end
        self.source, self.src_end = source[:, :, : src_end * spf], src_end
        self.noise = noise.sine_noise.to(mel.device, torch.float32)[:, src_end * spf :]
        start = max(src_end - 1, 0)                         # the next source window starts a frame early
        steps = self.vocoder.m_source.frame_cycles(self.f0[:, :start]).double().sum(dim=1)     # [1, H]
        self.cycles = (self.cycles.to(steps) + steps) % 1
        self.f0, self.f0_start = self.f0[:, start:], start
        end = max(n - self.lookahead, 0)
        out = audio[: end * spf]
        if end and self.spoken is not None:
            self.spoken.append(mel[:, :, :end].clone())
        self.emitted = end
        self._trim()
        return out.float()

    def revise(self, mel: torch.Tensor, start: int) -> int:
        """Replace received mel frames [start, start + n) by better ones (mel [1, 80, n]: the exact recompute
        of frames first made provisionally). Only frames still in the buffer change, and only what is not
        final yet uses them: audio not yet returned (the held-back frames), their decoder context and the
        provisional F0; returned audio, exact F0 and exact source stay. Returns the frames replaced."""
        if self.mel is None:
            return 0
        lo = max(start, self.mel_start)
        hi = min(start + mel.size(2), self.received)
        if hi <= lo:
            return 0
        self.mel = self.mel.clone()
        self.mel[:, :, lo - self.mel_start : hi - self.mel_start] = mel[:, :, lo - start : hi - start].to(self.mel)
        return hi - lo

    # --- steps of one push ----------------------------------------------------------------------------

    def _f0(self, final: bool) -> torch.Tensor:
        """Extend the exact F0; return F0 of frames [f0_start, received) (exact, then provisional) [1, n]."""
        assert self.mel is not None
        reach, received = self.f0_reach, self.received
        start = max(self.f0_end - reach, 0)  # mel context of the first new frame
        mel = self.mel[:, :, start - self.mel_start :]
        predictor = self.vocoder.f0_predictor
        f0 = predictor(mel.to(predictor.classifier.weight.dtype)).float()  # [1, received - start]
        exact_end = received if final else max(received - reach, self.f0_end)
        self.f0 = torch.cat([self.f0.to(f0), f0[:, self.f0_end - start : exact_end - start]], dim=1)
        self.f0_end = exact_end
        return torch.cat([self.f0, f0[:, exact_end - start :]], dim=1)

    def _source(self, f0: torch.Tensor, final: bool) -> torch.Tensor:
        """Extend the exact source; return the provisional source of frames [src_end, received)."""
        spf, received, ws = self.spf, self.received, self.f0_start
        vocoder = self.vocoder
        if received == self.src_end:
            return self.source.new_zeros(1, 1, 0)
        # The window starts one frame early: the phase is interpolated between frame centres.
        skip = (self.src_end - ws) * spf
        sine_noise = torch.cat([self.noise.new_zeros(1, skip, self.n_harmonics), self.noise], dim=1)
        rand_ini = self.rand_ini if ws == 0 and self.rand_ini is not None else f0.new_zeros(1, self.n_harmonics)
        noise = SourceNoise(rand_ini.to(f0), sine_noise)
        source = vocoder.source(f0, noise, self.cycles.float().to(f0.device))[:, :, skip:]  # [1, 1, n * spf]
        # frame j's samples lie between the centres of j-1, j and j+1: exact once F0 of j+1 is
        exact_end = received if final else max(self.f0_end - 1, self.src_end)
        n_exact = (exact_end - self.src_end) * spf
        self.source = torch.cat([self.source.to(source), source[:, :, :n_exact]], dim=2)
        self.noise = self.noise[:, n_exact:]
        self.src_end = exact_end
        # the next window starts at exact_end - 1: fold the phase of the frames before it into `cycles`
        new_ws = max(exact_end - 1, 0)
        steps = vocoder.m_source.frame_cycles(self.f0[:, : new_ws - ws]).double().sum(dim=1)  # [1, H]
        self.cycles = (self.cycles.to(steps) + steps) % 1
        self.f0, self.f0_start = self.f0[:, new_ws - ws :], new_ws
        return source[:, :, n_exact:]

    def _decode(self, source_more: torch.Tensor, final: bool) -> WorkSteps[torch.Tensor]:
        """Vocode [emitted - context, received); return the audio of the frames now complete [N]."""
        assert self.mel is not None
        spf, received = self.spf, self.received
        end = received if final else max(received - self.lookahead, self.emitted)
        if end <= self.emitted:
            return self.source.new_zeros(0)
        w0 = min(max(self.emitted - self.context, self.mel_start, self.src_start), self.src_end)
        mel = self.mel[:, :, w0 - self.mel_start :]  # [1, 80, received - w0]
        source = torch.cat([self.source[:, :, (w0 - self.src_start) * spf :], source_more], dim=2)
        work = VocoderDecode(self.vocoder, mel, source)
        yield work
        audio = work.result  # [(received - w0) * spf]
        out = audio[(self.emitted - w0) * spf : (end - w0) * spf]
        if self.spoken is not None:
            self.spoken.append(self.mel[:, :, self.emitted - self.mel_start : end - self.mel_start].clone())
        log.debug("hift stream: frames %d-%d of %d (window from %d)", self.emitted, end, received, w0)
        self.emitted = end
        return out.float()

    def _trim(self) -> None:
        """Drop what no later push reads: mel before the decoder's and F0's context, old source."""
        assert self.mel is not None
        keep_mel = max(min(self.emitted - self.context, self.f0_end - self.f0_reach), 0)
        if keep_mel > self.mel_start:
            self.mel, self.mel_start = self.mel[:, :, keep_mel - self.mel_start :], keep_mel
        keep_src = max(min(self.emitted - self.context, self.src_end), 0)
        if keep_src > self.src_start:
            self.source = self.source[:, :, (keep_src - self.src_start) * self.spf :]
            self.src_start = keep_src
