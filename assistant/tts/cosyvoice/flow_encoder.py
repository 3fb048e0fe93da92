"""Token encoder of the CosyVoice2 flow: a conformer that upsamples speech tokens to mel frames.

Speech tokens (25 Hz) are embedded, mixed with a few look-ahead tokens by a small causal conv
(`LookaheadConv`), run through conformer blocks, upsampled x2 to the mel frame rate (50 Hz) and run
through four more conformer blocks. Attention is the Transformer-XL style relative-position
self-attention of ESPnet. In streaming mode every block only sees whole chunks to its left
(25 tokens before upsampling, 50 frames after), so earlier outputs do not change as tokens arrive.

Module and parameter names follow the official checkpoint (`flow.pt`, prefix `encoder.`).
Inference only, no padding masks, no dropout: a batch holds streams at the same position (one voice's first chunks).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Streaming state of one utterance: stateful layers keep their own entry, keyed by the layer (attention: cached
# keys/values; causal convs: their last input frames), beside a few counters keyed by name ("frames", "tokens").
# The entries are of each layer's own kind, so the values are untyped. None = whole-utterance call.
Cache = dict[object, Any]


def chunk_attention_mask(size: int, chunk: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """Bool [size, offset+size]: query i (at position offset+i) may see key j in its chunk or before."""
    keys = torch.arange(offset + size, device=device)
    queries = torch.arange(offset, offset + size, device=device)
    chunk_end = (queries // chunk + 1) * chunk  # first position past each query's chunk
    return keys.unsqueeze(0) < chunk_end.unsqueeze(1)


def relative_position_table(length: int, d_model: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Sinusoidal table of relative positions length-1 ... -(length-1): [1, 2*length-1, d_model].

    Same values as ESPnet's `RelPositionalEncoding` (the positive positions first, in decreasing order),
    computed for just the length needed instead of a 5000-row table.
    """
    pos = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device).unsqueeze(1)  # [2L-1, 1]
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model)
    )
    table = torch.zeros(2 * length - 1, d_model, device=device)
    table[:, 0::2] = torch.sin(pos * div_term)
    table[:, 1::2] = torch.cos(pos * div_term)
    return table.unsqueeze(0).to(device=device, dtype=dtype)


def causal_left_pad(x: torch.Tensor, n: int, cache: Cache | None, key: object) -> torch.Tensor:
    """x [B, C, T] with n frames prepended: zeros at the start, else the previous call's last n frames."""
    if cache is None:
        return F.pad(x, (n, 0))
    past = cache.get(key)
    if past is None:
        past = x.new_zeros(x.size(0), x.size(1), n)
    elif past.size(0) != x.size(0):  # one stream's cache continued by a batch of streams (a voice's prefix)
        past = past.expand(x.size(0), -1, -1)
    x = torch.cat([past, x], dim=2)
    cache[key] = x[:, :, x.size(2) - n :]
    return x


class LinearInput(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(d_model)."""

    def __init__(self, in_dim: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        # `out.2` (dropout) of the checkpoint layout has no weights and is omitted.
        self.out = nn.Sequential(nn.Linear(in_dim, d_model), nn.LayerNorm(d_model, eps=1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x) * math.sqrt(self.d_model)  # [B, T, D]


class RelPositionSelfAttention(nn.Module):
    """Multi-head self-attention with learned content (u) and position (v) biases (Transformer-XL)."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.h, self.d_k = n_head, d_model // n_head
        self.linear_q = nn.Linear(d_model, d_model)
        self.linear_k = nn.Linear(d_model, d_model)
        self.linear_v = nn.Linear(d_model, d_model)
        self.linear_out = nn.Linear(d_model, d_model)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_head, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_head, self.d_k))

    def forward(
        self, x: torch.Tensor, pos_table: torch.Tensor, mask: torch.Tensor | None, cache: Cache | None = None
    ) -> torch.Tensor:
        """x [B, T, D] new positions; pos_table [1, 2S-1, D] for S = cached + T keys;
        mask bool [T, S] (True = may attend) or None; cache holds this layer's past keys/values."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)  # [B, H, T, dk]
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        if cache is not None:
            if self in cache:
                k_past, v_past = cache[self]
                if k_past.size(0) != b:  # one stream's cache continued by a batch of streams (a voice's prefix)
                    k_past, v_past = k_past.expand(b, -1, -1, -1), v_past.expand(b, -1, -1, -1)
                k, v = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)  # [B, H, S, dk]
            cache[self] = (k, v)
        s = k.size(2)
        past = s - t
        p = self.linear_pos(pos_table).view(1, -1, self.h, self.d_k).transpose(1, 2)  # [1, H, 2S-1, dk]

        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))  # [B, H, T, S]
        position = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))  # [B, H, T, 2S-1]
        # Table column c holds relative position S-1-c. Query i sits at past+i, key j at j, so
        # c = (S-1-past) + j - i: a strided view with row stride 2S-2.
        position = position.contiguous()
        n = 2 * s - 1
        position = position.as_strided(
            (b, self.h, t, s), (self.h * t * n, t * n, n - 1, 1), position.storage_offset() + s - 1 - past
        )
        scores = (content + position) / math.sqrt(self.d_k)
        if mask is not None:
            blocked = ~mask
            attn = torch.softmax(scores.masked_fill(blocked, -float("inf")), dim=-1).masked_fill(blocked, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.h * self.d_k)
        return self.linear_out(out)


class FeedForward(nn.Module):
    """Position-wise feed-forward with SiLU ("swish")."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, hidden)
        self.w_2 = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerBlock(nn.Module):
    """Pre-norm block: self-attention then feed-forward (no macaron, no conv module in CosyVoice2)."""

    def __init__(self, d_model: int, n_head: int, hidden: int):
        super().__init__()
        self.self_attn = RelPositionSelfAttention(d_model, n_head)
        self.feed_forward = FeedForward(d_model, hidden)
        self.norm_mha = nn.LayerNorm(d_model, eps=1e-12)
        self.norm_ff = nn.LayerNorm(d_model, eps=1e-12)

    def forward(
        self, x: torch.Tensor, pos_table: torch.Tensor, mask: torch.Tensor | None, cache: Cache | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos_table, mask, cache)
        return x + self.feed_forward(self.norm_ff(x))


class LookaheadConv(nn.Module):
    """Residual conv stack that lets each token see `lookahead` future tokens.

    conv1 (kernel lookahead+1) looks right, conv2 (kernel 3) looks left (causal). At the end of the
    stream the future is zeros; mid-stream the caller passes the next tokens as `context`.
    """

    def __init__(self, channels: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, cache: Cache | None = None) -> torch.Tensor:
        """x [B, T, C], context [B, <=lookahead, C] -> [B, T, C]; cache: conv2's last input frames."""
        h = x.transpose(1, 2)  # [B, C, T]
        n_ctx = 0
        if context is not None and context.size(1) > 0:
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
            n_ctx = context.size(1)
        h = F.pad(h, (0, self.lookahead - n_ctx))
        h = F.leaky_relu(self.conv1(h))  # [B, C, T]
        h = self.conv2(causal_left_pad(h, self.conv2.kernel_size[0] - 1, cache, self))
        return h.transpose(1, 2) + x


class RepeatUpsample(nn.Module):
    """x`stride` nearest-neighbour repeat followed by a causal conv (kernel 2*stride+1)."""

    def __init__(self, channels: int, stride: int = 2):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, 2 * stride + 1)

    def forward(self, x: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """x [B, C, T] -> [B, C, stride*T]; cache: the conv's last input frames."""
        x = x.repeat_interleave(self.stride, dim=2)
        return self.conv(causal_left_pad(x, 2 * self.stride, cache, self))


class UpsampleConformerEncoder(nn.Module):
    """Tokens [B, T, D_in] -> frames [B, up*T, D] (see the module docstring)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        attention_heads: int,
        linear_units: int,
        num_blocks: int,
        num_up_blocks: int,
        lookahead: int,
        static_chunk_size: int,
        upsample: int = 2,
    ):
        super().__init__()
        self.static_chunk_size = static_chunk_size
        self.upsample = upsample
        self.embed = LinearInput(input_size, output_size)
        self.pre_lookahead_layer = LookaheadConv(output_size, lookahead)
        self.encoders = nn.ModuleList(
            [ConformerBlock(output_size, attention_heads, linear_units) for _ in range(num_blocks)]
        )
        self.up_layer = RepeatUpsample(output_size, upsample)
        self.up_embed = LinearInput(output_size, output_size)
        self.up_encoders = nn.ModuleList(
            [ConformerBlock(output_size, attention_heads, linear_units) for _ in range(num_up_blocks)]
        )
        self.after_norm = nn.LayerNorm(output_size, eps=1e-5)

    def forward(
        self,
        xs: torch.Tensor,
        context: torch.Tensor | None = None,
        streaming: bool = False,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """xs [B, T, D_in] token embeddings, context [B, n, D_in] look-ahead embeddings -> [B, up*T, D].

        With a cache (streaming only) xs continues the tokens of earlier calls: only they are computed,
        attending to the cached keys. Exact when earlier calls ended on chunk boundaries. A cache of one
        stream may be continued by B streams at once (a voice's prefix by several requests' first chunks);
        it then holds the batch's state afterwards, so pass a copy (``dict(cache)``).
        """
        if cache is not None and not streaming:
            raise ValueError("an encoder cache needs streaming=True (full attention would need the future)")
        past = cache.get("tokens", 0) if cache is not None else 0
        n = xs.size(1)
        xs = self.embed(xs)
        if context is not None and context.size(1) > 0:
            context = self.embed(context)  # only feeds the look-ahead conv
        xs = self.pre_lookahead_layer(xs, context, cache)
        pos = relative_position_table(past + n, xs.size(2), xs.device, xs.dtype)
        mask = chunk_attention_mask(n, self.static_chunk_size, xs.device, past) if streaming else None
        for block in self.encoders:
            xs = block(xs, pos, mask, cache)

        xs = self.up_layer(xs.transpose(1, 2), cache).transpose(1, 2)  # [1, up*T, D]
        xs = self.up_embed(xs)
        up_past, up_n = past * self.upsample, n * self.upsample
        pos = relative_position_table(up_past + up_n, xs.size(2), xs.device, xs.dtype)
        up_chunk = self.static_chunk_size * self.upsample
        mask = chunk_attention_mask(up_n, up_chunk, xs.device, up_past) if streaming else None
        for block in self.up_encoders:
            xs = block(xs, pos, mask, cache)
        if cache is not None:
            cache["tokens"] = past + n
        return self.after_norm(xs)
