"""Prefill as static graphs: the prompts of the requests that start together, one CUDA graph per (batch, length)
bucket, captured at warm-up beside the decode step's.

A request's prefill (its text, the task token and its voice's speech tokens after the cached start: ~300
positions for a 10 s voice) is one forward of the 24 Qwen2 layers: ~600 kernel launches, on the way to every
first packet. `StaticPrefill` pads the starting requests to a batch bucket and their prompts to a length bucket
and replays that bucket's graph of `SlotDecoder.prefill_rows` (its eager twin: `prefill_many`, the reference the
CPU tests hold it to; it also serves whatever fits no bucket: a longer prompt, a longer cached start).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from assistant.tts.cosyvoice.device_time import upload_into
from assistant.tts.cosyvoice.graphs import GraphedCall, bucket_for
from assistant.tts.cosyvoice.slot_decoder import SlotDecoder

PREFILL_LENGTHS = (128, 256, 384, 512, 1024)   # prompt positions after the cached start (text + voice tokens)
MAX_START = 128                                 # cached start positions (sos + the voice's transcript) a graph covers

Past = tuple[torch.Tensor, torch.Tensor] | None   # a cached prompt start's keys/values [layers, KV, P, d]


class StaticPrefill:
    """Prefill graphs of ``decoder`` for ``batches`` x length buckets (module doc); ``graph``: capture on CUDA
    (off CUDA the static function runs directly)."""

    def __init__(self, decoder: SlotDecoder, batches: Sequence[int], *, graph: bool, pool: Any = None,
                 lengths: Sequence[int] = PREFILL_LENGTHS) -> None:
        self.decoder = decoder
        p = decoder.k_cache
        dev, width = p.device, decoder.norm.weight.size(0)
        self.lengths = tuple(n for n in lengths if n + MAX_START <= decoder.max_positions) or \
            (decoder.max_positions - MAX_START,)
        self.batches = tuple(batches)
        longest = max(self.lengths)
        # per batch bucket: prompts [b, longest, D] (each length bucket reads its first positions), start, n, slot
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {
            b: (torch.zeros(b, longest, width, dtype=p.dtype, device=dev), torch.zeros(b, dtype=torch.long, device=dev),
                torch.zeros(b, dtype=torch.long, device=dev),
                torch.full((b,), decoder.scratch, dtype=torch.long, device=dev)) for b in self.batches}
        self.calls = {(b, n): GraphedCall(f"prefill x{b} len {n}", self._caller(b, n), dev, graph=graph, pool=pool)
                      for b in self.batches for n in self.lengths}

    def _caller(self, b: int, length: int) -> Callable[[], torch.Tensor]:
        x, start, n, slot = self.inputs[b]
        span = min(self.decoder.max_positions, length + MAX_START)
        return lambda: self.decoder.prefill_rows(x[:, :length], start, n, slot, span)

    @property
    def active(self) -> bool:
        return all(c.active for c in self.calls.values())

    def capture(self) -> None:
        for call in self.calls.values():
            call.capture()

    @property
    def record(self) -> dict[str, object]:
        records = [c.record for c in self.calls.values()]
        return {"path": records[0]["path"], "graphs": len(records),
                "capture_s": sum(float(str(r["capture_s"] or 0.0)) for r in records),
                "replays": sum(int(str(r["replays"])) for r in records),
                "direct_steps": sum(int(str(r["direct_steps"])) for r in records),
                "error": next((r["error"] for r in records if r["error"]), None)}

    def fits(self, xs: Sequence[torch.Tensor], pasts: Sequence[Past]) -> bool:
        """Whether these prompts fit a bucket (else: the eager prefill)."""
        return (len(xs) <= max(self.batches) and max(x.size(0) for x in xs) <= max(self.lengths)
                and all(p is None or p[0].size(2) <= MAX_START for p in pasts))

    def run(self, slots: list[int], xs: list[torch.Tensor], pasts: list[Past]) -> torch.Tensor:
        """`SlotDecoder.prefill_many` through a bucket's graph → last hidden states [B, D] (call when `fits`)."""
        dec, k = self.decoder, len(xs)
        starts = [0 if p is None else p[0].size(2) for p in pasts]
        for s, p, past in zip(slots, starts, pasts, strict=True):
            if past is not None:                                  # the cached start, copied into the slot
                dec.k_cache[:, s, :, :p] = past[0]
                dec.v_cache[:, s, :, :p] = past[1]
        b = bucket_for(k, self.batches)
        length = bucket_for(max(x.size(0) for x in xs), self.lengths)
        x, start, n, slot = self.inputs[b]
        for i, xi in enumerate(xs):
            x[i, : xi.size(0)].copy_(xi)
        rest = b - k                                              # placeholders: nothing, into the scratch slot
        upload_into(start, starts + [0] * rest)
        upload_into(n, [xi.size(0) for xi in xs] + [0] * rest)
        upload_into(slot, slots + [dec.scratch] * rest)
        return self.calls[(b, length)]()[:k].clone()             # the graph's output: overwritten by its next replay


__all__ = ["MAX_START", "PREFILL_LENGTHS", "StaticPrefill"]
