"""Velocity estimator of the CosyVoice2 flow: a one-level causal 1-D U-Net with transformer blocks.

Input per frame: the current sample x, the encoder output mu, the speaker vector and the prompt
condition (80 channels each, 320 in all), plus the flow time t. Every conv is causal (left padded),
so in streaming mode (static chunk attention mask) a frame depends only on frames of its own and
earlier chunks.

Module and parameter names follow the official checkpoint (`flow.pt`, prefix `decoder.estimator.`);
the transformer blocks reproduce the diffusers `BasicTransformerBlock` used by Matcha-TTS
(LayerNorm -> self-attention -> LayerNorm -> GELU feed-forward, both residual).

Streaming (one cache per stream and Euler step) works on a batch of streams at once: the streams' rows are
stacked (``group`` consecutive rows per stream: its conditional and unconditional CFG rows), every layer runs
once over the whole batch, and only what is a stream's own is done per stream: its convolutions' left tails
and its attention over its own cached frames (`RowCaches`). Rows may be padded at the end to a common length
(``lengths``): padded frames are masked as keys and never written to a cache, so a stream's frames come out
the same alone or in a batch (up to float summation order; tested). Streams whose state sits in the flow
arena (`flow_arena.py`: a slot each) attend as one batch whatever their positions (`attend_slots`: one masked
attention over the voices' prefixes, their own frames gathered by slot and the new frames) and write their
new keys, values and conv tails with one indexed write each; the per-stream loop stays as their eager twin.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.cosyvoice.device_time import upload
from assistant.tts.cosyvoice.flow_encoder import Cache, chunk_attention_mask

MASK_BIAS = -1.0e10  # additive attention bias of a blocked position (as the reference, not -inf)

log = logging.getLogger(__name__)


class SlotView(NamedTuple):
    """A stream's place in the flow arena for one attention layer (keys or values) or conv (tails) at one Euler
    step: the arena's tensor for it, ``[slots * group, ...]``, and the stream's first row there."""

    arena: torch.Tensor
    row: int
    group: int

    @property
    def own(self) -> torch.Tensor:
        return self.arena[self.row : self.row + self.group]


class ArenaSlot(Protocol):
    """A stream's slot in the flow arena at one Euler step (held in its step cache as ``"slot"``;
    `flow_arena.SlotRef`): ``row``, its first row in every arena tensor."""

    row: int

    def kv(self, layer: nn.Module) -> tuple[SlotView, SlotView]: ...

    def tail(self, conv: object) -> SlotView: ...


def timestep_features(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal features of the flow time t [B] -> [B, dim] (sin half, then cos half), always in float32.

    ``1000 * t`` in bf16 keeps 8 bits of t: the angles, and so the whole velocity field, would drift.
    """
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = scale * t.float().unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class KVCache:
    """Keys and values of one attention layer at one Euler step, for one request's stream.

    Two parts: an optional ``prefix`` (the voice prompt's frames, shared read-only by every request of that
    voice) and the request's own frames in a buffer written in place and grown by doubling, so a chunk
    writes only its new frames (no re-concatenation of the past per block and step). Attention runs over
    both parts without joining them (`attend`). A write with ``commit=False`` (a provisional solve) leaves
    the committed length unchanged, so the next write overwrites it. Bound to a slot of the flow arena
    (`bind`), the own frames are the slot's rows there (a fixed number of frames); past them they move to a
    buffer of their own, as before.
    """

    def __init__(self, prefix: tuple[torch.Tensor, torch.Tensor] | None = None, capacity: int = 0) -> None:
        self.prefix = prefix                         # (k, v) [B, H, P, d]
        self.capacity_hint = capacity
        self.k: torch.Tensor | None = None           # [B, H, cap, d]
        self.v: torch.Tensor | None = None
        self.length = 0                              # committed own frames
        self.slot: tuple[SlotView, SlotView] | None = None

    def bind(self, slot: tuple[SlotView, SlotView]) -> None:
        """Keep the own frames in an arena slot (before any is written)."""
        if self.k is not None:
            raise RuntimeError("KVCache.bind after frames were written")
        self.slot = slot
        self.k, self.v = slot[0].own, slot[1].own

    @property
    def prefix_frames(self) -> int:
        return 0 if self.prefix is None else self.prefix[0].size(2)

    @property
    def frames(self) -> int:
        return self.prefix_frames + self.length

    @property
    def nbytes(self) -> int:
        """Bytes of this request's own buffers (their capacity; the shared prefix is counted by its owner, an
        arena slot by the arena)."""
        return 0 if self.k is None or self.slot is not None else 2 * self.k.numel() * self.k.element_size()

    def _reserve(self, like: torch.Tensor, n: int) -> None:
        if self.k is not None and self.k.size(2) >= n:
            return
        if self.slot is not None:
            log.debug("cosyvoice flow stream outgrew its arena slot frames=%d cap=%d: own buffers from here",
                      n, self.slot[0].arena.size(2))
            self.slot = None
        cap = max(n, self.capacity_hint, 2 * (0 if self.k is None else self.k.size(2)), 64)
        b, h, _, d = like.shape
        k = like.new_empty(b, h, cap, d)
        v = like.new_empty(b, h, cap, d)
        if self.k is not None and self.v is not None and self.length:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def append(self, k: torch.Tensor, v: torch.Tensor, commit: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, H, T, d] after the committed frames; return the own frames so far (views)."""
        t = k.size(2)
        end = self.length + t
        self._reserve(k, end)
        assert self.k is not None and self.v is not None
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        keys, values = self.k[:, :, :end], self.v[:, :, :end]
        if commit:
            self.length = end
        return keys, values

    def compact(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All frames (prefix, then own) as two exact-size tensors: the prefix of later forks."""
        parts_k = [] if self.prefix is None else [self.prefix[0]]
        parts_v = [] if self.prefix is None else [self.prefix[1]]
        if self.k is not None and self.v is not None and self.length:
            parts_k.append(self.k[:, :, : self.length])
            parts_v.append(self.v[:, :, : self.length])
        return torch.cat(parts_k, dim=2).clone(), torch.cat(parts_v, dim=2).clone()


class RowCaches:
    """The streaming caches of a batch: ``caches[i]`` belongs to stream i, whose rows are
    ``[i * group, (i + 1) * group)``; ``lengths[i]`` of the T frames of this call are real (the rest pad).
    ``solve``: a dict shared by the Euler steps of one solve (the arena layout is made once for all of them)."""

    def __init__(self, caches: list[Cache], rows: int, frames: int, lengths: list[int] | None = None,
                 solve: dict[str, object] | None = None) -> None:
        if rows % len(caches):
            raise ValueError(f"{rows} batch rows do not split into {len(caches)} streams")
        self.caches = caches
        self.group = rows // len(caches)
        self.frames = frames
        self.lengths = list(lengths) if lengths is not None else [frames] * len(caches)
        self.padded = any(n != frames for n in self.lengths)
        self.solve = solve if solve is not None else {}

    def rows(self, i: int) -> slice:
        return slice(i * self.group, (i + 1) * self.group)

    def past(self, i: int) -> int:
        """Frames stream i has computed before this call."""
        return int(self.caches[i].get("frames", 0))

    def left_pad(self, x: torch.Tensor, n: int, key: object) -> torch.Tensor:
        """x [B, C, T] with each stream's previous n input frames prepended (zeros at its start); each stream
        keeps its last n real frames for its next call (in its arena slot, or its cache)."""
        slots: list[ArenaSlot | None] = [c.get("slot") for c in self.caches]
        if len(slots) > 1 and all(s is not None for s in slots):
            views = [s.tail(key) for s in slots if s is not None]
            if all(v.arena is views[0].arena for v in views):
                return self._left_pad_slots(x, n, views)
        tails = [c.get(key) if s is None else s.tail(key).own for c, s in zip(self.caches, slots, strict=True)]
        if len(tails) == 1 and tails[0] is not None:
            past = tails[0]
        elif all(t is None for t in tails):
            past = x.new_zeros(x.size(0), x.size(1), n)
        else:
            past = torch.cat([t if t is not None else x.new_zeros(self.group, x.size(1), n) for t in tails])
        out = torch.cat([past, x], dim=2)
        for i, (c, slot) in enumerate(zip(self.caches, slots, strict=True)):
            end = n + self.lengths[i]
            tail = out[:, :, end - n : end] if len(self.caches) == 1 else out[self.rows(i), :, end - n : end]
            if slot is not None and self.commits(i):
                slot.tail(key).own.copy_(tail)
            elif slot is None:
                c[key] = tail
        return out

    def _left_pad_slots(self, x: torch.Tensor, n: int, views: list[SlotView]) -> torch.Tensor:
        """`left_pad` of streams that keep their tails in the arena: one gather, one indexed write."""
        lay = self.layout(x.device)
        arena = views[0].arena                                           # [slots * group, C, n]
        out = torch.cat([arena.index_select(0, lay.rows), x], dim=2)     # [B, C, n + T]
        tails = out.gather(2, lay.tail_index(n).expand(-1, x.size(1), -1))   # frames [len_i, len_i + n) of out
        if lay.commit_rows is not None:
            arena.index_copy_(0, lay.commit_rows, tails if lay.all_commit else tails[lay.commit_sel])
        return out

    def layout(self, device: torch.device) -> SlotLayout:
        """Where this batch's streams sit in the arena (made once per solve, `SlotLayout`)."""
        lay = self.solve.get("layout")
        if not isinstance(lay, SlotLayout):
            lay = self.solve["layout"] = SlotLayout(self, [c["slot"].row for c in self.caches], device)
        return lay

    def kv(self, i: int, layer: nn.Module) -> KVCache:
        cache = self.caches[i]
        kv = cache.get(layer)
        if kv is None:
            kv = cache[layer] = KVCache(capacity=cache.get("capacity", 0))
        slot = cache.get("slot")
        if slot is not None and kv.slot is None and kv.k is None:      # first use of a slot-bound stream
            kv.bind(slot.kv(layer))
        return kv

    def commits(self, i: int) -> bool:
        """False for a provisional solve: its keys and values are overwritten by the next call."""
        return not self.caches[i].get("provisional", False)

    def advance(self) -> None:
        for i, c in enumerate(self.caches):
            c["frames"] = self.past(i) + self.lengths[i]

    def fits_slots(self, kvs: list[KVCache]) -> bool:
        """Whether this layer's streams all keep their frames in one arena, with room for the new ones."""
        first = kvs[0].slot
        if first is None:
            return False
        cap = first[0].arena.size(2)
        return all(kv.slot is not None and kv.slot[0].arena is first[0].arena and kv.length + n <= cap
                   for kv, n in zip(kvs, self.lengths, strict=True))

    def attend(self, layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: torch.Tensor) -> torch.Tensor:
        """``layer``'s attention of every stream's rows over its cached frames and its new ones (q, k, v
        [B, H, T, d], bias [B, 1, T, T]); the new frames are written to each stream's cache."""
        if len(self.caches) == 1:
            return attend(q, k, v, bias, self.kv(0, layer), self.commits(0), self.lengths[0])
        kvs = [self.kv(i, layer) for i in range(len(self.caches))]
        if self.fits_slots(kvs):
            return attend_slots(q, k, v, bias, kvs, self)
        if all(kv.length == 0 and kv.prefix is kvs[0].prefix for kv in kvs):
            return attend_shared(q, k, v, bias, kvs, self)
        # each stream over its own cached frames
        parts = [attend(q[self.rows(i)], k[self.rows(i)], v[self.rows(i)], bias[self.rows(i)], kv,
                        self.commits(i), self.lengths[i]) for i, kv in enumerate(kvs)]
        return torch.cat(parts)


class SlotLayout:
    """Where a batch's streams sit in the flow arena, made once per solve and shared by its steps and layers:
    each batch row's arena row, where each row's conv tail lies, which rows commit; at the first attention
    (`attention`) each stream's committed frames and the mask over them, where its new frames go, and the runs of
    rows that share a voice prefix. Index tensors are uploaded once (`device_time.upload`)."""

    def __init__(self, rows: RowCaches, starts: list[int], device: torch.device) -> None:
        g, self.group, self.device = rows.group, rows.group, device
        self.batch = rows
        self.row_list = [start + j for start in starts for j in range(g)]
        self.rows = upload(self.row_list, torch.long, device)                         # [B] arena row of each
        self.row_lengths = [rows.lengths[i] for i in range(len(starts)) for _ in range(g)]
        commit = [i for i in range(len(self.row_list)) if rows.commits(i // g)]
        self.all_commit = len(commit) == len(self.row_list)
        self.commit_sel = None if self.all_commit else upload(commit, torch.long, device)
        self.commit_rows = upload([self.row_list[i] for i in commit], torch.long, device) if commit else None
        self._tails: dict[int, torch.Tensor] = {}
        self._attention: SlotAttention | None = None

    def tail_index(self, n: int) -> torch.Tensor:
        """[B, 1, n]: where each row's last n real input frames lie in its padded input (past n first)."""
        index = self._tails.get(n)
        if index is None:
            index = self._tails[n] = upload([[length + j for j in range(n)] for length in self.row_lengths],
                                            torch.long, self.device).unsqueeze(1)
        return index

    def attention(self, kvs: list[KVCache], dtype: torch.dtype) -> SlotAttention:
        if self._attention is None:
            self._attention = SlotAttention(self, kvs, dtype)
        return self._attention


class SlotAttention:
    """The attention part of a `SlotLayout` (see there); ``kvs``: one layer's caches, lengths before the solve."""

    def __init__(self, lay: SlotLayout, kvs: list[KVCache], dtype: torch.dtype) -> None:
        g, rows = lay.group, lay.batch
        self.rows = lay.rows
        self.past = [kv.length for kv in kvs]                                        # committed own frames
        self.lmax = max(self.past)
        self.past_bias: torch.Tensor | None = None                                    # [B, 1, 1, Lmax]
        if self.lmax:
            past_rows = upload([p for p in self.past for _ in range(g)], torch.long, lay.device)
            keys = torch.arange(self.lmax, device=lay.device)
            blocked = (keys.unsqueeze(0) >= past_rows.unsqueeze(1)).to(dtype) * MASK_BIAS
            self.past_bias = blocked.view(len(past_rows), 1, 1, self.lmax)
        src_r: list[int] = []
        src_t: list[int] = []
        dst_r: list[int] = []
        dst_t: list[int] = []
        for i, (p, n) in enumerate(zip(self.past, rows.lengths, strict=True)):
            for j in range(g):
                r = i * g + j
                src_r += [r] * n
                src_t += range(n)
                dst_r += [lay.row_list[r]] * n
                dst_t += range(p, p + n)
        self.writes = upload([src_r, src_t, dst_r, dst_t], torch.long, lay.device) if src_r else None
        # runs of consecutive streams with the same prefix (the same voice): (first stream, batch rows [a, b));
        # each layer reads its own prefix tensors from its caches
        self.groups: list[tuple[int, int, int]] = []
        for i, kv in enumerate(kvs):
            if self.groups and kvs[self.groups[-1][0]].prefix is kv.prefix:
                self.groups[-1] = (self.groups[-1][0], self.groups[-1][1], (i + 1) * g)
            else:
                self.groups.append((i, i * g, (i + 1) * g))
        self.pmax = max(kv.prefix_frames for kv in kvs)
        self.commits = [rows.commits(i) for i in range(len(kvs))]


def attend_slots(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, kvs: list[KVCache], rows: RowCaches
) -> torch.Tensor:
    """One attention for a batch of streams whose own frames sit in the arena, whatever their positions: each
    row's queries q [B, H, T, d] over its voice's prefix (all visible), its committed frames (gathered by slot,
    masked past its length) and the new frames (``bias`` [B, 1, T, T], padding included). The new frames are
    written to the slots with one indexed write (padding left out) and the committing streams' lengths move on.
    Its eager twin: `attend` per stream."""
    assert kvs[0].slot is not None
    ks, vs = kvs[0].slot[0].arena, kvs[0].slot[1].arena                   # [slots * g, H, frames, d]
    lay = rows.layout(q.device).attention(kvs, q.dtype)
    g, t = rows.group, q.size(2)
    if lay.writes is not None:
        src_r, src_t, dst_r, dst_t = lay.writes
        ks[dst_r, :, dst_t] = k.transpose(1, 2)[src_r, src_t]             # [N, H, d]
        vs[dst_r, :, dst_t] = v.transpose(1, 2)[src_r, src_t]
    q = q * (1.0 / math.sqrt(q.size(-1)))
    scores = []
    prefixes = [(kvs[i].prefix, a, b) for i, a, b in lay.groups]       # this layer's
    if lay.pmax:
        parts = []
        for prefix, a, b in prefixes:
            if prefix is None:
                parts.append(q.new_full((b - a, q.size(1), t, lay.pmax), MASK_BIAS))
            else:
                on = _prefix_scores(q[a:b], prefix[0], (b - a) // g)
                parts.append(F.pad(on, (0, lay.pmax - on.size(-1)), value=MASK_BIAS) if on.size(-1) < lay.pmax
                             else on)
        scores.append(parts[0] if len(parts) == 1 else torch.cat(parts))         # [B, H, T, Pmax]
    if lay.lmax and lay.past_bias is not None:
        past_k = ks[:, :, : lay.lmax].index_select(0, lay.rows)                   # [B, H, Lmax, d]
        scores.append(torch.matmul(q, past_k.transpose(-2, -1)) + lay.past_bias)
    scores.append(torch.matmul(q, k.transpose(-2, -1)) + bias)                   # [B, H, T, T]
    weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = torch.matmul(weights[..., lay.pmax + lay.lmax :], v)
    if lay.lmax:
        past_v = vs[:, :, : lay.lmax].index_select(0, lay.rows)
        out = out + torch.matmul(weights[..., lay.pmax : lay.pmax + lay.lmax], past_v)
    if lay.pmax:
        parts = [out.new_zeros(b - a, *out.shape[1:]) if prefix is None else
                 _prefix_values(weights[a:b, ..., : prefix[1].size(2)], prefix[1], (b - a) // g)
                 for prefix, a, b in prefixes]
        out = out + (parts[0] if len(parts) == 1 else torch.cat(parts))
    for kv, n, commit in zip(kvs, rows.lengths, lay.commits, strict=True):
        if commit:
            kv.length += n
    return out


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    kv: KVCache | None,
    commit: bool,
    length: int | None = None,
) -> torch.Tensor:
    """Attention of q [B, H, T, d] over the cached frames (all visible) and the new k, v [B, H, T, d] (``bias``
    [B, 1, T, T] between new frames); the first ``length`` new frames (default all; the rest is padding,
    masked by ``bias``) are written into ``kv``."""
    if kv is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    t = q.size(2)
    n = t if length is None else length
    past = kv.length
    own_k, own_v = kv.append(k[:, :, :n], v[:, :, :n], commit)     # [B, H, past + n, d]
    if kv.prefix is None and past == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    q = q * (1.0 / math.sqrt(q.size(-1)))
    parts_k = ([kv.prefix[0]] if kv.prefix is not None else []) + [own_k]
    parts_v = ([kv.prefix[1]] if kv.prefix is not None else []) + [own_v]
    scores = [torch.matmul(q, pk.transpose(-2, -1)) for pk in parts_k]
    scores[-1][..., past:] += bias[..., :n]                  # only new keys can be masked
    weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = None
    start = 0
    for pv in parts_v:
        m = pv.size(2)
        part = torch.matmul(weights[..., start : start + m], pv)
        out = part if out is None else out + part
        start += m
    assert out is not None
    return out


def attend_shared(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, kvs: list[KVCache], rows: RowCaches
) -> torch.Tensor:
    """`attend` for a batch of streams that share their cached frames: the same voice prefix (or none) and no
    frames of their own yet (a stream's first solves). One attention for the whole batch: the prefix's keys
    broadcast over the streams, the new frames masked by ``bias`` [B, 1, T, T] (padding included); each
    stream's new frames are still written to its own cache."""
    for i, kv in enumerate(kvs):
        r, n = rows.rows(i), rows.lengths[i]
        kv.append(k[r, :, :n], v[r, :, :n], rows.commits(i))
    prefix = kvs[0].prefix
    if prefix is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return prefix_attention(q, k, v, bias, prefix, len(kvs))


def _streams_as_queries(x: torch.Tensor, n: int) -> torch.Tensor:
    """[n*g, h, t, k] → [g, h, n*t, k]: the streams' rows stacked as queries of their group row."""
    b, h, t = x.shape[:3]
    g = b // n
    return x.reshape(n, g, h, t, -1).permute(1, 2, 0, 3, 4).reshape(g, h, n * t, -1)


def _back(x: torch.Tensor, n: int, t: int) -> torch.Tensor:
    """[g, h, n*t, k] → [n*g, h, t, k] (the inverse of `_streams_as_queries`)."""
    g, h = x.shape[:2]
    return x.reshape(g, h, n, t, -1).permute(2, 0, 1, 3, 4).reshape(n * g, h, t, -1)


def _prefix_scores(q: torch.Tensor, prefix_k: torch.Tensor, n: int) -> torch.Tensor:
    """Scaled queries of n streams q [n*g, H, T, d] against one prefix's keys [g, H, P, d] → [n*g, H, T, P]
    (the streams stacked as rows: a broadcast would copy the prefix per stream)."""
    return _back(torch.matmul(_streams_as_queries(q, n), prefix_k.transpose(-2, -1)), n, q.size(2))


def _prefix_values(weights: torch.Tensor, prefix_v: torch.Tensor, n: int) -> torch.Tensor:
    """Attention weights of n streams on one prefix [n*g, H, T, P] → their share of the output [n*g, H, T, d]."""
    return _back(torch.matmul(_streams_as_queries(weights, n), prefix_v), n, weights.size(2))


def prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor], streams: int,
) -> torch.Tensor:
    """Attention of ``streams`` streams' rows q, k, v [B, H, T, d] (B = streams x group) over one shared
    ``prefix`` (k, v [group, H, P, d], all visible) and their own new frames (``bias`` [B, 1, T, T])."""
    p = prefix[0].size(2)
    q = q * (1.0 / math.sqrt(q.size(-1)))
    on_prefix = _prefix_scores(q, prefix[0], streams)                                            # [B, H, T, P]
    on_new = torch.matmul(q, k.transpose(-2, -1)) + bias                                          # [B, H, T, T]
    weights = torch.softmax(torch.cat([on_prefix, on_new], dim=-1).float(), dim=-1).to(q.dtype)
    return _prefix_values(weights[..., :p], prefix[1], streams) + torch.matmul(weights[..., p:], v)


class PrefixRows:
    """The streaming state of ``streams`` streams that all continue one read-only prefix and have no frames of
    their own: a voice prompt's conv tails (``tails``: conv → [group, C, n]) and keys/values (``kv``: attention
    layer → (k, v) [group, H, P, d]). Nothing is written, so a solve on it is a pure function of its inputs: a
    warm voice's first chunk, solved provisionally for a batch of streams as one static graph
    (`flow_graphs.py`). Its eager twin is `RowCaches` over each stream's fork of the prefix."""

    def __init__(self, tails: Cache, kv: dict[object, tuple[torch.Tensor, torch.Tensor]], streams: int) -> None:
        self.tails, self.kv, self.streams = tails, kv, streams

    def left_pad(self, x: torch.Tensor, n: int, key: object) -> torch.Tensor:
        tail = self.tails.get(key)
        past = x.new_zeros(x.size(0), x.size(1), n) if tail is None else tail.repeat(self.streams, 1, 1)
        return torch.cat([past, x], dim=2)

    def attend(self, layer: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: torch.Tensor) -> torch.Tensor:
        prefix = self.kv.get(layer)
        if prefix is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return prefix_attention(q, k, v, bias, prefix, self.streams)

    def advance(self) -> None:
        """Nothing: the prefix is read-only."""


Rows = RowCaches | PrefixRows


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
