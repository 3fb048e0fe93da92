"""The flow estimator's streaming state: what each stream keeps between calls, and attention over it.

Streaming (one cache per stream and Euler step) works on a batch of streams at once: the streams' rows are
stacked (``group`` consecutive rows per stream: its conditional and unconditional CFG rows), every layer of the
estimator (`flow_decoder.py`) runs once over the whole batch, and only what is a stream's own is done per stream:
its convolutions' left tails and its attention over its own cached frames (`RowCaches`). Rows may be padded at
the end to a common length (``lengths``): padded frames are masked as keys and never written to a cache, so a
stream's frames come out the same alone or in a batch (up to float summation order; tested).

- `KVCache`: one layer's keys and values at one step for one stream (a voice prefix shared read-only, then its
  own frames in a buffer of its own, or in its slot of the flow arena);
- `RowCaches`: a batch's caches, what the estimator's layers ask of them (`left_pad`, `attend`, `advance`);
  streams whose state sits in the flow arena (`flow_arena.py`: a slot each) attend as one batch whatever their
  positions (`attend_slots`: one masked attention over the voices' prefixes, their own frames gathered by slot
  and the new frames) and write their new keys, values and conv tails with one indexed write each; the
  per-stream loop (`attend`) stays as their eager twin;
- `PrefixRows`: streams that only read one voice's prefix (the static first chunk, `flow_graphs.py`).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.cosyvoice.device_time import upload
from assistant.tts.cosyvoice.flow_encoder import Cache

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


__all__ = ["MASK_BIAS", "ArenaSlot", "KVCache", "PrefixRows", "RowCaches", "Rows", "SlotView", "attend",
           "attend_shared", "attend_slots", "prefix_attention"]
