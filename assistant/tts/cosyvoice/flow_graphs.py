"""A warm voice's first chunk of flow as one static graph: the encoder and every Euler step, for a batch of streams.

On the way to a request's first packet its first chunk's flow was the big cost on a GPU, and a launch-bound
one: thousands of small kernels (the encoder, then ten passes of a 56-block U-Net over 20 frames, twice for
guidance). For a warm voice that chunk depends on very little: the request's first ``hop + lookahead`` tokens.
Everything else is the voice's (`FlowPrefix`): the prompt tokens still pending in the prefix, their prompt mel,
the fixed noise of the frames, the speaker vector, the encoder's cache, every Euler step's conv tails and
keys/values. `FirstChunkFlow` holds those once and solves the first chunk of B streams of the voice together,
the streams reading the prefix and writing nothing (`PrefixRows`), as a `GraphedCall` per batch bucket: one
replay on CUDA, the same function run directly on the CPU. It is built, and captured, when the voice is
prepared (`first_chunk.py`), never inside a request.

Its eager twin is `CachedVocoding`'s first chunk: a provisional solve on each stream's own fork of the prefix.
The static one is always provisional: where the eager path commits the first chunk's tokens at once (a prompt
whose pending rest and the first hop fill an encoder chunk: ``P mod 25 + hop >= 25``, prompt not sealed), it
computes the same frames provisionally and the commit comes with the second chunk, whose solve then covers
them again (off the first packet's path). The audio is the same within float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from assistant.tts.cosyvoice.batch_work import Work
from assistant.tts.cosyvoice.device_time import upload_into
from assistant.tts.cosyvoice.flow import CausalFlow, guided_euler
from assistant.tts.cosyvoice.flow_cache import PrefixRows
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.graphs import BucketGraphs, GraphedCall, bucket_for


class FirstChunkFlow(BucketGraphs[torch.Tensor]):
    """The provisional first-chunk mel of B streams of one warm voice (module doc): the streams' first
    ``hop + lookahead`` tokens [B, hop + look] → mel [B, 80, 2 * hop] (float32), one `GraphedCall` per batch
    bucket, each with its own static token buffer."""

    def __init__(self, flow: CausalFlow, prefix: FlowPrefix, hop: int, n_steps: int | None,
                 buckets: Sequence[int], *, graph: bool, pool: Any = None) -> None:
        cfg = flow.cfg
        st = prefix.state
        self.flow, self.hop = flow, hop
        self.n_steps = n_steps or cfg.n_timesteps
        self.look = cfg.pre_lookahead_len
        self.rest = st.pending                                           # [1, r] prompt tokens not encoded yet
        self.n = self.rest.size(1) + hop                                 # tokens the chunk encodes
        start, frames = st.frames, cfg.token_mel_ratio * self.n
        n_prompt = st.prompt_feat.size(1)
        self.skip = max(n_prompt - start, 0)                             # the rest's prompt frames, cut
        self.z = st.noise(start, start + frames)                         # [1, 80, frames]
        self.cond = torch.zeros_like(self.z)
        if self.skip:
            self.cond[:, :, : self.skip] = st.prompt_feat[:, start : start + frames].transpose(1, 2)
        self.spks = st.spks                                              # [1, 80]
        self.encoder_cache = dict(st.encoder_cache)
        self.steps = prefix.step_prefixes(self.n_steps)                  # per step: conv tails, keys/values
        estimator = flow.decoder.estimator
        mask = torch.ones(1, 1, frames, device=self.z.device, dtype=self.z.dtype)
        self.bias = estimator.attention_bias(mask, True, self.z.dtype, start)   # [1, T, T], every row's
        dev = self.z.device
        self.calls: dict[int, GraphedCall[torch.Tensor]] = {}
        self.tokens: dict[int, torch.Tensor] = {}
        for b in buckets:
            self.tokens[b] = torch.zeros(b, hop + self.look, dtype=torch.long, device=dev)
            self.calls[b] = GraphedCall(f"first chunk flow x{b}", self._caller(b), dev, graph=graph, pool=pool)

    def _caller(self, b: int) -> Callable[[], torch.Tensor]:
        return lambda: self.solve(self.tokens[b])


    def solve(self, tokens: torch.Tensor) -> torch.Tensor:
        """The static function: tokens [B, hop + look] → mel [B, 80, 2 * hop] (float32), writing nothing."""
        flow, b = self.flow, tokens.size(0)
        seq = torch.cat([self.rest.expand(b, -1), tokens], dim=1).clamp(min=0)         # [B, n + look]
        emb = flow.input_embedding(seq)
        h = flow.encoder(emb[:, : self.n], emb[:, self.n :], streaming=True, cache=dict(self.encoder_cache))
        mu = flow.encoder_proj(h).transpose(1, 2)                                       # [B, 80, 2n]
        cfg = flow.cfg
        mel = guided_euler(
            flow.decoder.estimator, self.z.expand(b, -1, -1), mu, self.spks.expand(b, -1),
            self.cond.expand(b, -1, -1), n_steps=self.n_steps, rate=cfg.inference_cfg_rate,
            scheduler=cfg.t_scheduler, streaming=True, step_rows=[PrefixRows(t, kv, b) for t, kv in self.steps],
            bias=self.bias,
        )
        return mel[:, :, self.skip :]

    def run(self, token_lists: list[list[int]]) -> list[torch.Tensor]:
        """Each stream's first ``hop + look`` tokens → its mel [1, 80, 2 * hop], in batches of the buckets (the
        rows past a batch's streams keep earlier contents: their results are not read)."""
        out: list[torch.Tensor] = []
        largest = max(self.calls)
        for lo in range(0, len(token_lists), largest):
            part = token_lists[lo : lo + largest]
            b = bucket_for(len(part), list(self.calls))
            upload_into(self.tokens[b][: len(part)], part)
            mel = self.calls[b]()[: len(part)].clone()       # the graph's output is overwritten by its next replay
            out += [mel[i : i + 1] for i in range(len(part))]
        return out


class FirstChunkSolve(Work):
    """One stream's first-chunk mel from a `FirstChunkFlow`: streams of the same voice run as one batch.
    ``result``: mel [1, 80, 2 * hop] (float32)."""

    def __init__(self, solver: FirstChunkFlow, tokens: list[int]) -> None:
        if len(tokens) != solver.hop + solver.look:
            raise ValueError(f"a first chunk takes {solver.hop + solver.look} tokens, got {len(tokens)}")
        self.solver, self.tokens = solver, tokens

    def batch_key(self, buckets: Sequence[int] = ()) -> Hashable:
        return id(self.solver)

    @classmethod
    def run_batch(cls, items: list[FirstChunkSolve]) -> None:
        for it, mel in zip(items, items[0].solver.run([it.tokens for it in items]), strict=True):
            it.result = mel


__all__ = ["FirstChunkFlow", "FirstChunkSolve"]
