"""Velocity estimator of the CosyVoice2 flow: a one-level causal 1-D U-Net with transformer blocks.

Input per frame: the current sample x, the encoder output mu, the speaker vector and the prompt
condition (80 channels each, 320 in all), plus the flow time t. Every conv is causal (left padded),
so in streaming mode (static chunk attention mask) a frame depends only on frames of its own and
earlier chunks.

Module and parameter names follow the official checkpoint (`flow.pt`, prefix `decoder.estimator.`);
the transformer blocks reproduce the diffusers `BasicTransformerBlock` used by Matcha-TTS
(LayerNorm -> self-attention -> LayerNorm -> GELU feed-forward, both residual).

In streaming mode every layer runs once over a batch of streams, and what is a stream's own (its convolutions'
left tails, its attention over its cached frames) is asked of their streaming state (`flow_cache.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.cosyvoice.flow_cache import MASK_BIAS, RowCaches, Rows, attend
from assistant.tts.cosyvoice.flow_encoder import Cache, chunk_attention_mask


def timestep_features(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal features of the flow time t [B] -> [B, dim] (sin half, then cos half), always in float32.

    ``1000 * t`` in bf16 keeps 8 bits of t: the angles, and so the whole velocity field, would drift.
    """
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = scale * t.float().unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class CausalConv1d(nn.Conv1d):
    """Conv1d that pads kernel_size-1 zeros on the left: output t sees inputs <= t."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        n = self.kernel_size[0] - 1
        return super().forward(F.pad(x, (n, 0)) if rows is None else rows.left_pad(x, n, self))


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of a [B, C, T] tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalConvBlock(nn.Module):
    """masked causal conv(k=3) -> LayerNorm over channels -> Mish."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        # Indices 0 and 2 carry weights in the checkpoint (1 and 3 were transposes); keep that layout.
        self.block = nn.Sequential(
            CausalConv1d(dim, dim_out, 3), nn.Identity(), ChannelLayerNorm(dim_out), nn.Identity(), nn.Mish()
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        conv, _, norm, _, act = self.block
        return act(norm(conv(x * mask, rows))) * mask


class CausalResnetBlock(nn.Module):
    """Two conv blocks with the time embedding added in between, plus a 1x1 residual projection."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalConvBlock(dim, dim_out)
        self.block2 = CausalConvBlock(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, t_emb: torch.Tensor, rows: Rows | None = None
    ) -> torch.Tensor:
        h = self.block1(x, mask, rows) + self.mlp(t_emb).unsqueeze(-1)
        h = self.block2(h, mask, rows)
        return h + self.res_conv(x * mask)


class TimestepMLP(nn.Module):
    """Linear -> SiLU -> Linear on the sinusoidal time features."""

    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention without q/k/v biases, with an additive [B, T, T] mask bias."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # `to_out.1` was dropout

    def forward(self, x: torch.Tensor, bias: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        """x [B, T, C] new frames, bias [B, T, T] among them (cached frames are all visible)."""
        b, t, _ = x.shape
        q, k, v = (
            proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
            for proj in (self.to_q, self.to_k, self.to_v)
        )
        bias = bias.unsqueeze(1)
        out = attend(q, k, v, bias, None, True) if rows is None else rows.attend(self, q, k, v, bias)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class GeluProjection(nn.Module):
    """Linear followed by exact GELU."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class GeluFeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        # net.1 was dropout; an Identity keeps the checkpoint index of net.2.
        self.net = nn.ModuleList([GeluProjection(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + GELU feed-forward on [B, T, C]."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = SelfAttention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = GeluFeedForward(dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), bias, rows)
        return x + self.ff(self.norm3(x))


class CausalUNetEstimator(nn.Module):
    """v = estimator(x, mask, mu, t, spks, cond): the flow's velocity field, [B, 80, T] in and out."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        channels: int,
        attention_head_dim: int,
        n_blocks: int,
        num_mid_blocks: int,
        num_heads: int,
        static_chunk_size: int,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.static_chunk_size = static_chunk_size
        time_dim = 4 * channels
        self.time_mlp = TimestepMLP(in_channels, time_dim)

        def transformers() -> nn.ModuleList:
            return nn.ModuleList([TransformerBlock(channels, num_heads, attention_head_dim) for _ in range(n_blocks)])

        # One level: [resnet, transformers, conv]; the skip doubles the up block's input channels.
        self.down_blocks = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        CausalResnetBlock(in_channels, channels, time_dim),
                        transformers(),
                        CausalConv1d(channels, channels, 3),
                    ]
                )
            ]
        )
        self.mid_blocks = nn.ModuleList(
            [
                nn.ModuleList([CausalResnetBlock(channels, channels, time_dim), transformers()])
                for _ in range(num_mid_blocks)
            ]
        )
        self.up_blocks = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        CausalResnetBlock(2 * channels, channels, time_dim),
                        transformers(),
                        CausalConv1d(channels, channels, 3),
                    ]
                )
            ]
        )
        self.final_block = CausalConvBlock(channels, channels)
        self.final_proj = nn.Conv1d(channels, out_channels, 1)

    def attention_bias(self, mask: torch.Tensor, streaming: bool, dtype: torch.dtype, past: int = 0) -> torch.Tensor:
        """Frame mask [B, 1, T] -> additive bias [B, T, T] among the new frames: 0 allowed, -1e10 blocked.

        `past` cached frames precede the T new ones; they are always visible (earlier chunks, real frames),
        so the bias covers the new keys only and the chunk grid is counted from frame 0 of the stream.
        """
        t = mask.size(-1)
        keys = mask.bool()
        allowed = keys.expand(-1, t, -1)
        if streaming:
            chunks = chunk_attention_mask(t, self.static_chunk_size, mask.device, past)[:, past:]
            allowed = allowed & chunks.unsqueeze(0)
        return (1.0 - allowed.to(dtype)) * MASK_BIAS

    def streams_bias(self, mask: torch.Tensor, pasts: list[int], dtype: torch.dtype) -> torch.Tensor:
        """`attention_bias` of a batch of streams in streaming mode: mask [B, 1, T], ``pasts[i]`` the frames
        stream i computed before (its rows are B / len(pasts) consecutive ones) → [B, T, T]. Made once per
        solve: it is the same at every Euler step."""
        if len(set(pasts)) == 1:
            return self.attention_bias(mask, True, dtype, pasts[0])
        g = mask.size(0) // len(pasts)  # the chunk grid is counted from each stream's own frame 0
        return torch.cat([self.attention_bias(mask[i * g : (i + 1) * g], True, dtype, p) for i, p in enumerate(pasts)])

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
        cache: Cache | list[Cache] | None = None,
        lengths: list[int] | None = None,
        *,
        rows: Rows | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B]; spks [B, 80] -> velocity [B, 80, T].

        With caches (streaming only; one per stream and Euler step: a dict, or a list for a batch of
        streams, each owning B / len(list) consecutive rows) the T frames continue earlier calls'. ``lengths``:
        each stream's real frames (the rest are padding, zero in ``mask``). ``rows``: the streaming state
        already wrapped (`RowCaches`, `PrefixRows`; instead of ``cache``); ``bias``: the attention bias
        [B, T, T] when the caller made it once for every step (`streams_bias`).
        """
        if (cache is not None or rows is not None) and not streaming:
            raise ValueError("an estimator cache needs streaming=True")
        if rows is None and cache is not None:
            rows = RowCaches(cache if isinstance(cache, list) else [cache], x.size(0), x.size(2), lengths)
        dtype = self.time_mlp.linear_1.weight.dtype
        t_emb = self.time_mlp(timestep_features(t, self.in_channels).to(dtype))  # [B, 4C]
        h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)  # [B, 320, T]
        if bias is None and isinstance(rows, RowCaches):
            bias = self.streams_bias(mask, [rows.past(i) for i in range(len(rows.caches))], h.dtype)
        elif bias is None:
            bias = self.attention_bias(mask, streaming, h.dtype)

        def level(blocks: nn.Module) -> list[nn.Module]:  # a ModuleList's members (a level, its transformers)
            assert isinstance(blocks, nn.ModuleList)
            return list(blocks)

        def run(blocks: nn.Module, h: torch.Tensor) -> torch.Tensor:
            h = h.transpose(1, 2)  # [B, T, C]
            for block in level(blocks):
                h = block(h, bias, rows)
            return h.transpose(1, 2)

        resnet, blocks, conv = level(self.down_blocks[0])
        h = run(blocks, resnet(h, mask, t_emb, rows))
        skip = h
        h = conv(h * mask, rows)
        for mid in self.mid_blocks:
            resnet, blocks = level(mid)
            h = run(blocks, resnet(h, mask, t_emb, rows))
        resnet, blocks, conv = level(self.up_blocks[0])
        h = torch.cat([h, skip], dim=1)
        h = run(blocks, resnet(h, mask, t_emb, rows))
        h = conv(h * mask, rows)
        h = self.final_block(h, mask, rows)
        if rows is not None:
            rows.advance()
        return self.final_proj(h * mask) * mask
