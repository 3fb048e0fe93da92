"""The speech LLM's sampling for a batch of rows, on the device, with no host round trip.

`sample_tokens` is the official repetition-aware top-p/top-k sampling (`llm.RasSampler`) for every row at once.
Its random numbers come from a counter-based hash of (request seed, step), not from a generator: a seeded
request draws the same tokens alone or batched, on any device. `llm.RasSampler` (CPU generator, one request
at a time) stays the exact path of the parity tests.
"""

from __future__ import annotations

import torch

from assistant.tts.cosyvoice.llm import SpeechLMConfig

MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) of int64 values in [0, 2^32), elementwise, on any device."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, steps: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n] uniforms in [0, 1) from (seed, step, j) alone: a row's draws never depend on other rows."""
    j = torch.arange(n, device=seeds.device)
    x = _mix32(_mix32(seeds.unsqueeze(1) ^ (steps.unsqueeze(1) * 0x9E3779B9)) + j * 0x85EBCA6B)
    return (x >> 8).float() * (1.0 / (1 << 24))


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row: probs [B, K] (unnormalised), u [B] → index [B]."""
    cdf = probs.cumsum(dim=-1)
    r = u.unsqueeze(1) * cdf[:, -1:]
    return (cdf <= r).sum(dim=-1).clamp(max=probs.size(1) - 1)


def sample_tokens(
    logp: torch.Tensor,
    recent: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    greedy: torch.Tensor,
    cfg: SpeechLMConfig,
) -> torch.Tensor:
    """Repetition-aware sampling (as `llm.RasSampler`) for every row at once, on logp's device.

    logp [B, V] (masked already); recent [B, W] the last W tokens (-1: none yet); seeds, steps [B] int64;
    greedy [B] bool (argmax rows). Nucleus: the ``top_k`` most likely tokens whose preceding mass is below
    ``top_p``; if the drawn token already fills ``win_size * tau_r`` of the window, draw again from the whole
    distribution without it.
    """
    probs = logp.float().softmax(dim=-1)
    u = uniforms(seeds, steps, 2)
    top, idx = probs.topk(cfg.top_k, dim=-1)                                 # sorted, descending
    keep = (top.cumsum(dim=-1) - top) < cfg.top_p
    keep[:, 0] = True
    first = idx.gather(1, _draw(top * keep, u[:, 0]).unsqueeze(1))           # [B, 1]
    repeats = (recent[:, -cfg.win_size :] == first).sum(dim=-1)
    again = _draw(probs.scatter(1, first, 0.0), u[:, 1])                     # [B]
    token = torch.where(repeats >= cfg.win_size * cfg.tau_r, again, first[:, 0])
    return torch.where(greedy, logp.argmax(dim=-1), token)


__all__ = ["sample_tokens", "uniforms"]
