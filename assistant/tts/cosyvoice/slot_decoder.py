"""The speech LLM's decoder over a static per-slot KV cache, and its decode step as a replayable graph.

`SlotDecoder` keeps a static KV cache with one row (slot) per concurrent request,
``[layers, slots, kv_heads, max_positions, head_dim]``, and runs Qwen2's layers over all rows at once with
its own attention (each row masked to its own length and at its own RoPE position). Rows never see each
other, so a request decodes to the same tokens alone or in a batch (tested).

`StaticDecodeStep` is the decode step of every slot over static buffers with the whole cache as keys: its
shapes never change, so on CUDA it is captured once as a ``torch.cuda.CUDAGraph`` (at warm-up, before the
engine says ready) and each step is one replay instead of hundreds of kernel launches, which dominate a
0.5B model's step on a big GPU. Elsewhere the same static step runs directly (capture skipped): that is how
the CPU tests trace the GPU's path. The record (`record`) says what really runs and counts the replays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from assistant.tts.cosyvoice.device_time import upload
from assistant.tts.cosyvoice.graphs import GraphedCall, memory_pool
from assistant.tts.cosyvoice.llm import SpeechLM

log = logging.getLogger(__name__)


class SlotDecoder(nn.Module):
    """Qwen2 decoding over a static per-slot KV cache (gpt-fast style), sharing the LM's weights.

    The layers' projections, norms and MLPs are HF's own modules (so numerics match the reference); only
    the attention over the cache and the cache writes are ours. One more row than ``slots`` is a scratch slot
    no request holds: a static prefill writes its padding there (`prefill_rows`).
    """

    k_cache: torch.Tensor                              # buffers (registered below)
    v_cache: torch.Tensor

    def __init__(self, lm: SpeechLM, slots: int, max_positions: int) -> None:
        super().__init__()
        qwen = lm.llm.model.model                      # HF Qwen2Model
        cfg = qwen.config
        self.lm = [lm]                                 # not a submodule: keep state_dict and .to() apart
        self.layers, self.norm, self.rotary = qwen.layers, qwen.norm, qwen.rotary_emb
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.slots, self.max_positions = slots, max_positions
        self.scratch = slots                           # the row no request holds
        p = lm.llm_decoder.weight
        shape = (len(self.layers), slots + 1, self.n_kv, max_positions, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, device=p.device, dtype=p.dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, device=p.device, dtype=p.dtype), persistent=False)

    @property
    def cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def _qkv(self, layer: Qwen2DecoderLayer, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """h [n, T, D] normed, pos [n, T] → q [n, H, T, d], k and v [n, KV, T, d] (RoPE applied)."""
        n, t, _ = h.shape
        attn = layer.self_attn
        q = attn.q_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(h, pos)                 # [n, T, d]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    @torch.inference_mode()
    def prefill(
        self, slot: int, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Run one request's prompt x [L, D] into ``slot`` → last hidden state [D].

        ``past`` (from `prefix_kv`): keys/values [layers, KV, P, d] of the positions before x (a cached
        prompt start); they are copied into the slot and x continues at position P.
        """
        start = 0 if past is None else past[0].size(2)
        length = x.size(0)
        end = start + length
        if past is not None:
            self.k_cache[:, slot, :, :start] = past[0]
            self.v_cache[:, slot, :, :start] = past[1]
        pos = torch.arange(start, end, device=x.device).unsqueeze(0)  # [1, L]
        h = x.unsqueeze(0)                                             # [1, L, D]
        group = self.n_heads // self.n_kv
        mask = None
        if start:
            keys = torch.arange(end, device=x.device)
            mask = keys.unsqueeze(0) <= pos.view(-1, 1)                  # [L, P + L]: the past and causal
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            self.k_cache[li, slot, :, start:end] = k[0]
            self.v_cache[li, slot, :, start:end] = v[0]
            if start:
                k = self.k_cache[li, slot : slot + 1, :, :end]
                v = self.v_cache[li, slot : slot + 1, :, :end]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            if mask is None:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [1, H, L, d]
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[0, -1]

    @torch.inference_mode()
    def prefill_many(
        self, slots: list[int], xs: list[torch.Tensor], pasts: list[tuple[torch.Tensor, torch.Tensor] | None]
    ) -> torch.Tensor:
        """Several requests' prompts at once (one forward for all; one request: `prefill`) → last hidden
        states [B, D]. Rows are padded at the end to the longest; each row is masked to its own past and
        causal positions, so a padded position never reaches a real one, and only real positions are written
        to a slot (a padded one's keys would land past the row's end, where decoding overwrites before it reads).
        """
        if len(xs) == 1:
            return self.prefill(slots[0], xs[0], pasts[0]).unsqueeze(0)
        dev = xs[0].device
        starts = [0 if p is None else p[0].size(2) for p in pasts]
        lengths = [x.size(0) for x in xs]
        length = max(lengths)
        span = max(s + n for s, n in zip(starts, lengths, strict=True))
        for slot, start, past in zip(slots, starts, pasts, strict=True):
            if past is not None:
                self.k_cache[:, slot, :, :start] = past[0]
                self.v_cache[:, slot, :, :start] = past[1]
        h = torch.stack([F.pad(x, (0, 0, 0, length - x.size(0))) for x in xs])           # [B, L, D]
        pos = upload(starts, torch.long, dev).unsqueeze(1) + torch.arange(length, device=dev)  # [B, L]
        mask = (torch.arange(span, device=dev) <= pos.unsqueeze(2)).unsqueeze(1)         # [B, 1, L, S]
        rows = upload(slots, torch.long, dev)
        # every row's real positions, flattened: (row, t) in the batch → (slot, start + t) in the cache
        src_b, src_t, dst_slot, dst_pos = upload(
            [[i for i, n in enumerate(lengths) for _ in range(n)], [t for n in lengths for t in range(n)],
             [slot for slot, n in zip(slots, lengths, strict=True) for _ in range(n)],
             [start + t for start, n in zip(starts, lengths, strict=True) for t in range(n)]], torch.long, dev)
        group = self.n_heads // self.n_kv
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            self.k_cache[li, dst_slot, :, dst_pos] = k.transpose(1, 2)[src_b, src_t]      # one write for all rows
            self.v_cache[li, dst_slot, :, dst_pos] = v.transpose(1, 2)[src_b, src_t]
            keys = self.k_cache[li, rows, :, :span].repeat_interleave(group, dim=1)       # [B, H, S, d]
            vals = self.v_cache[li, rows, :, :span].repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)             # [B, H, L, d]
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(len(xs), length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        last = upload([n - 1 for n in lengths], torch.long, dev)
        return self.norm(h)[torch.arange(len(xs), device=dev), last]

    def prefill_rows(self, x: torch.Tensor, start: torch.Tensor, n: torch.Tensor, slot: torch.Tensor,
                     span: int) -> torch.Tensor:
        """The static prefill (`prefill_graphs.py`; its eager twin: `prefill_many`): prompts x [B, L, D] padded to
        L, each row's cached start, real length and slot [B] (a row with n = 0 is a placeholder: it, and every
        row's padding, writes only to the scratch slot), keys up to ``span`` (>= every start + n) → last hidden
        states [B, D] (meaningless for a placeholder). Shapes never depend on the values: one graph per (B, L)."""
        b, length, _ = x.shape
        dev = x.device
        t = torch.arange(length, device=dev)
        pos = start.unsqueeze(1) + t                                         # [B, L]
        real = t.unsqueeze(0) < n.unsqueeze(1)
        dst_slot = torch.where(real, slot.unsqueeze(1), self.scratch)          # [B, L]
        dst_pos = torch.where(real, pos, t.unsqueeze(0))
        group = self.n_heads // self.n_kv
        mask = torch.arange(span, device=dev) <= pos.unsqueeze(2)             # [B, L, S]: its past and causal
        mask = mask.unsqueeze(1).expand(b, group, length, span).reshape(b, 1, group * length, span)
        h = x
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            self.k_cache[li, dst_slot, :, dst_pos] = k.transpose(1, 2)         # [B, L, KV, d]
            self.v_cache[li, dst_slot, :, dst_pos] = v.transpose(1, 2)
            keys = self.k_cache[li, slot, :, :span]                             # [B, KV, S, d]
            vals = self.v_cache[li, slot, :, :span]
            qg = q.reshape(b, self.n_kv, group * length, self.head_dim)         # heads of one KV head together
            o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=mask)  # [B, KV, G*L, d]
            o = o.reshape(b, self.n_heads, length, self.head_dim).transpose(1, 2).reshape(b, length, -1)
            h = h + layer.self_attn.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[torch.arange(b, device=dev), (n - 1).clamp(min=0)]

    @torch.inference_mode()
    def prefix_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [layers, KV, L, d] of a prompt start x [L, D] at positions 0..L-1 (to cache)."""
        length = x.size(0)
        pos = torch.arange(length, device=x.device).unsqueeze(0)
        h = x.unsqueeze(0)
        group = self.n_heads // self.n_kv
        ks, vs = [], []
        for layer in self.layers:
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            ks.append(k[0])
            vs.append(v[0])
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return torch.stack(ks), torch.stack(vs)

    def step(self, x: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One token for rows 0..n-1: x [n, D], pos [n] (where each row's token goes) → hidden [n, D];
        keys up to ``kv_len`` (the longest row + 1, or the whole cache for a static step)."""
        n = x.size(0)
        rows = torch.arange(n, device=x.device)
        keys = torch.arange(kv_len, device=x.device)
        mask = (keys.unsqueeze(0) <= pos.unsqueeze(1)).view(n, 1, 1, kv_len)  # each row sees its own past
        h = x.unsqueeze(1)                                                      # [n, 1, D]
        group = self.n_heads // self.n_kv
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos.unsqueeze(1))
            self.k_cache[li, rows, :, pos] = k[:, :, 0]                          # [n, KV, d]
            self.v_cache[li, rows, :, pos] = v[:, :, 0]
            keys_ = self.k_cache[li, :n, :, :kv_len]                             # [n, KV, S, d]
            vals_ = self.v_cache[li, :n, :, :kv_len]
            qg = q.reshape(n, self.n_kv, group, self.head_dim)                   # heads of one KV head together
            o = F.scaled_dot_product_attention(qg, keys_, vals_, attn_mask=mask)  # [n, KV, G, d]
            h = h + layer.self_attn.o_proj(o.reshape(n, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[:, 0]

    @torch.inference_mode()
    def decode(self, x: torch.Tensor, pos: torch.Tensor, kv_len: int | None = None) -> torch.Tensor:
        """Eager step: x [n, D], pos [n] for rows 0..n-1 (n <= slots) → hidden [n, D]; only those rows and
        the keys up to ``kv_len`` (the caller knows it, so nothing is read back from the device)."""
        if kv_len is None:
            kv_len = int(pos.max().item()) + 1
        return self.step(x, pos, kv_len)


class StaticDecodeStep:
    """Every slot's decode step over the caller's static buffers ``x`` [slots, D] and ``pos`` [slots] (updated
    in place between steps), with the whole cache as keys, and what the caller does with the hidden states in
    the same graph (``then``: the sampling, `decode_state.py`); captured as a CUDA graph by `capture` on CUDA,
    run directly elsewhere (see the module doc and `graphs.py`).

    Rows of free slots decode a stale input at a stale position of their own slot: harmless, since a slot's
    prefill overwrites its prompt positions and a row only ever attends to positions it has written since.
    The same holds for `capture` itself, which therefore is safe while requests run: it writes each slot
    exactly what that slot's next real step writes.
    """

    def __init__(self, decoder: SlotDecoder, x: torch.Tensor, pos: torch.Tensor, cuda_graph: bool,
                 then: Callable[[torch.Tensor], torch.Tensor] | None = None, pool: Any = None) -> None:
        self.decoder, self.x, self.pos, self.then = decoder, x, pos, then
        self.call: GraphedCall[torch.Tensor] = GraphedCall("decode step", self._run, x.device, graph=cuda_graph,
                                                          pool=pool if pool is not None else memory_pool(x.device))

    @property
    def want_graph(self) -> bool:
        return self.call.want_graph

    @property
    def active(self) -> bool:
        """Whether steps run here: the captured graph, or the traced step; else the caller decodes eagerly
        (before the capture, or after it failed: the static step attends over the whole cache, which only a
        replayed graph makes worth it)."""
        return self.call.active

    @property
    def record(self) -> dict[str, object]:
        """What runs (path), what the capture cost, and how often the graph was replayed or the step run."""
        return self.call.record

    def _run(self) -> torch.Tensor:
        hidden = self.decoder.step(self.x, self.pos, self.decoder.max_positions)
        return hidden if self.then is None else self.then(hidden)

    def capture(self) -> dict[str, object]:
        """Capture the step (CUDA; once) and time it; on failure fall back to the eager step and say why."""
        return self.call.capture()

    def __call__(self) -> torch.Tensor:
        """The step on the buffers' current contents: hidden states [slots, D], or what ``then`` made of them
        (the graph's static output: read it before the next step)."""
        return self.call()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


__all__ = ["SlotDecoder", "StaticDecodeStep"]
