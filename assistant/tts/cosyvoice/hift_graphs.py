"""The vocoder's first push of a stream as one static graph, for a batch of streams.

A stream's first push (`StreamingHiFT.push` from nothing: its first chunk's ``frames`` mel frames) runs the F0
predictor, the source and the decoder over exactly those frames, with no state of its own yet: only the mel and
the stream's random draws go in. `FirstPush` runs that for B streams at once over static buffers, one
`GraphedCall` per batch bucket (one replay on CUDA, run directly on the CPU), voice-independent, so every
stream's first chunk shares it; each stream then takes its row into its own state (`adopt_first_push`), which
is what its eager twin, `StreamingHiFT.push`, leaves (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from assistant.tts.cosyvoice.batch_work import Work
from assistant.tts.cosyvoice.graphs import BucketGraphs, GraphedCall, bucket_for
from assistant.tts.cosyvoice.hift import HiFTVocoder
from assistant.tts.cosyvoice.hift_source import SourceNoise

Pushed = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # f0 [B, F], source [B, 1, F*spf], audio [B, F*spf]


class FirstPush(BucketGraphs[Pushed]):
    """F0, source and decoded audio of B streams' first ``frames`` mel frames (module doc)."""

    def __init__(self, vocoder: HiFTVocoder, frames: int, buckets: Sequence[int], *, graph: bool,
                 pool: Any = None) -> None:
        self.vocoder, self.frames = vocoder, frames
        dev = next(vocoder.parameters()).device
        spf, h = vocoder.cfg.samples_per_frame, vocoder.m_source.n_harmonics
        mel_bins = vocoder.cfg.in_channels
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.calls: dict[int, GraphedCall[Pushed]] = {}
        for b in buckets:
            self.inputs[b] = (torch.zeros(b, mel_bins, frames, device=dev),       # mel (float32)
                              torch.zeros(b, h, device=dev),                      # rand_ini
                              torch.zeros(b, frames * spf, h, device=dev))        # sine_noise
            self.calls[b] = GraphedCall(f"first vocoder push x{b}", self._caller(b), dev, graph=graph, pool=pool)
        self._phase = torch.zeros(max(buckets), h, device=dev)                   # no phase before frame 0

    def _caller(self, b: int) -> Callable[[], Pushed]:
        return lambda: self.push(*self.inputs[b])


    def push(self, mel: torch.Tensor, rand_ini: torch.Tensor, sine_noise: torch.Tensor) -> Pushed:
        """The static function: mel [B, 80, F], rand_ini [B, H], sine_noise [B, F*spf, H] → (f0 [B, F], source
        [B, 1, F*spf], audio [B, F*spf]), as `StreamingHiFT`'s first push computes them (float32)."""
        voc = self.vocoder
        f0 = voc.f0_predictor(mel.to(voc.f0_predictor.classifier.weight.dtype)).float()
        source = voc.source(f0, SourceNoise(rand_ini, sine_noise), self._phase[: mel.size(0)])
        return f0, source, voc.decode(mel, source)

    def run(self, mels: list[torch.Tensor], noises: list[SourceNoise]) -> list[Pushed]:
        """Each stream's first mel [1, 80, F] and draws → its (f0, source, audio) rows, in batches of the
        buckets (the rows past a batch's streams keep earlier contents: their results are not read)."""
        out: list[Pushed] = []
        largest = max(self.calls)
        for lo in range(0, len(mels), largest):
            k = len(mels[lo : lo + largest])
            b = bucket_for(k, list(self.calls))
            mel, rand_ini, sine = self.inputs[b]
            mel[:k].copy_(torch.cat(mels[lo : lo + k]))
            rand_ini[:k].copy_(torch.cat([n.rand_ini for n in noises[lo : lo + k]]))
            sine[:k].copy_(torch.cat([n.sine_noise for n in noises[lo : lo + k]]))
            f0, source, audio = (x[:k].clone() for x in self.calls[b]())   # overwritten by the next replay
            out += [(f0[i : i + 1], source[i : i + 1], audio[i]) for i in range(k)]
        return out


class FirstPushWork(Work):
    """One stream's first vocoder push from a `FirstPush`: every stream's runs in one batch. ``result``: the
    decoded audio of its frames [F * spf]; ``f0`` and ``source`` beside it."""

    f0: torch.Tensor
    source: torch.Tensor

    def __init__(self, push: FirstPush, mel: torch.Tensor, noise: SourceNoise) -> None:
        if mel.size(2) != push.frames:
            raise ValueError(f"a first push takes {push.frames} frames, got {mel.size(2)}")
        self.push, self.mel, self.noise = push, mel, noise

    def batch_key(self, buckets: Sequence[int] = ()) -> Hashable:
        return id(self.push)

    @classmethod
    def run_batch(cls, items: list[FirstPushWork]) -> None:
        pushed = items[0].push.run([it.mel for it in items], [it.noise for it in items])
        for it, (f0, source, audio) in zip(items, pushed, strict=True):
            it.f0, it.source, it.result = f0, source, audio


__all__ = ["FirstPush", "FirstPushWork"]
