"""The flow estimator's streaming state of every running stream in one static arena, a slot per stream.

At every Euler step a stream's estimator state is the keys and values of each attention layer for all its own
frames (after the voice's prefix, which its voice shares) and the last input frames of each causal conv. Kept
in buffers of its own (`KVCache`, tensors in its step caches), a batch of streams at different points attends
in a Python loop, one stream after another, and writes its conv tails one by one. In the arena every stream
that holds a slot keeps them at the same place of a few tensors allocated once:

    keys, values  [slots * 2, steps, layers, heads, frames, head_dim]     (2: the guidance rows)
    conv tails    [slots * 2, steps, convs, channels, 2]

so a batch attends with one masked attention over all its streams (`flow_cache.attend_slots`) and writes
its new frames and tails with one indexed write each, whatever the batch size; the loop stays as the eager
twin (a stream without a slot takes it, and so does a batch with one).

Memory per stream is bounded by the frame cap: a slot holds ``frames`` own frames at every step and layer,
``bytes_per_frame`` each (full size in bf16: 2.3 MB, so 500 frames, 10 s of speech, are 1.15 GB a slot); the
arena is allocated once, ``slots x frames x bytes_per_frame``. A stream that outgrows its slot (a longer reply,
or a cold voice whose whole prompt goes through its own state) moves its keys and values to buffers of its own,
grown as before (bounded by the LLM's positions per request), and leaves the batched attention; a stream that
finds no free slot runs on buffers of its own from the start.
"""

from __future__ import annotations

import logging
import threading
import weakref

import torch
from torch import nn

from assistant.tts.cosyvoice.flow_cache import SlotView
from assistant.tts.cosyvoice.flow_decoder import CausalConv1d, CausalUNetEstimator, SelfAttention
from assistant.tts.cosyvoice.flow_encoder import Cache

log = logging.getLogger(__name__)

GROUP = 2  # rows per stream: the conditional and the unconditional (guidance) row


class SlotRef:
    """A stream's slot at one Euler step, as its step cache holds it (``"slot"``; `flow_cache.ArenaSlot`)."""

    def __init__(self, arena: FlowArena, step: int, slot: int) -> None:
        self.arena, self.step, self.slot = arena, step, slot
        self.row = slot * GROUP

    def kv(self, layer: nn.Module) -> tuple[SlotView, SlotView]:
        i = self.arena.layer_index[layer]
        return (SlotView(self.arena.k_views[self.step][i], self.row, GROUP),
                SlotView(self.arena.v_views[self.step][i], self.row, GROUP))

    def tail(self, conv: object) -> SlotView:
        return SlotView(self.arena.tail_views[self.step][self.arena.conv_index[conv]], self.row, GROUP)


class FlowArena:
    """Static keys, values and conv tails of ``slots`` streams, ``frames`` own frames each (module doc)."""

    def __init__(self, estimator: CausalUNetEstimator, n_steps: int, slots: int, frames: int) -> None:
        p = estimator.final_proj.weight
        self.layers = [m for m in estimator.modules() if isinstance(m, SelfAttention)]
        self.convs = [m for m in estimator.modules() if isinstance(m, CausalConv1d)]
        self.layer_index: dict[nn.Module, int] = {m: i for i, m in enumerate(self.layers)}
        self.conv_index: dict[object, int] = {m: i for i, m in enumerate(self.convs)}
        self.slots, self.frames, self.n_steps = slots, frames, n_steps
        heads, head_dim = self.layers[0].heads, self.layers[0].head_dim
        shape = (slots * GROUP, n_steps, len(self.layers), heads, frames, head_dim)
        self.k = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.v = torch.zeros(shape, dtype=p.dtype, device=p.device)
        channels = max(c.in_channels for c in self.convs)
        reach = max(c.kernel_size[0] - 1 for c in self.convs)
        self.tails = torch.zeros(slots * GROUP, n_steps, len(self.convs), channels, reach, dtype=p.dtype,
                                 device=p.device)
        # one view per (step, layer) and (step, conv), made once: a batch finds its streams in the same tensors
        self.k_views = [[self.k[:, s, i] for i in range(len(self.layers))] for s in range(n_steps)]
        self.v_views = [[self.v[:, s, i] for i in range(len(self.layers))] for s in range(n_steps)]
        self.tail_views = [[self.tails[:, s, i, : c.in_channels, : c.kernel_size[0] - 1]
                            for i, c in enumerate(self.convs)] for s in range(n_steps)]
        self.bytes_per_frame = 2 * GROUP * n_steps * len(self.layers) * heads * head_dim * p.element_size()
        self._free = list(range(slots))
        self._lock = threading.Lock()
        self._packed: weakref.WeakKeyDictionary[object, torch.Tensor] = weakref.WeakKeyDictionary()
        log.info("cosyvoice flow arena slots=%d frames=%d mb=%.0f", slots, frames, self.nbytes / 2**20)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.tails))

    @property
    def slot_bytes(self) -> int:
        """What one stream holds in the arena."""
        return self.nbytes // self.slots

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def take(self) -> int | None:
        """A free slot (None: all held; the stream runs on buffers of its own)."""
        with self._lock:
            return self._free.pop(0) if self._free else None

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._free:
                raise RuntimeError(f"flow arena slot {slot} released twice")
            self._free.append(slot)
            self._free.sort()

    @torch.inference_mode()
    def bind(self, step_caches: list[Cache], slot: int, prefix: object | None = None) -> None:
        """Keep a stream's estimator state (``step_caches``, before it computed anything of its own) in ``slot``:
        its conv tails so far (a voice's, packed once per ``prefix``; none: zeros) are copied in with one write,
        its keys and values go there from its first frame on (`RowCaches.kv`)."""
        if len(step_caches) != self.n_steps:
            raise ValueError(f"{len(step_caches)} step caches for an arena of {self.n_steps} steps")
        packed = self._packed.get(prefix) if prefix is not None else None
        if packed is None:
            packed = self._pack(step_caches)
            if prefix is not None:
                self._packed[prefix] = packed
        self.tails[slot * GROUP : (slot + 1) * GROUP].copy_(packed)
        for step, cache in enumerate(step_caches):
            for conv in self.convs:
                cache.pop(conv, None)                  # the arena holds them from now on
            cache["slot"] = SlotRef(self, step, slot)

    def _pack(self, step_caches: list[Cache]) -> torch.Tensor:
        """Step caches' conv tails [GROUP, C, n] in the arena's layout [GROUP, steps, convs, channels, reach]."""
        packed = self.tails.new_zeros(GROUP, *self.tails.shape[1:])
        for s, cache in enumerate(step_caches):
            for i, conv in enumerate(self.convs):
                tail = cache.get(conv)
                if tail is not None:
                    packed[:, s, i, : tail.size(1), : tail.size(2)] = tail
        return packed


__all__ = ["GROUP", "FlowArena", "SlotRef"]
