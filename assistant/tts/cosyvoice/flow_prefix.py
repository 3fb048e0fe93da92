"""A voice prompt's share of the flow's streaming state, computed once per voice and forked per request.

`FlowPrefix` pushes the voice's prompt through a `StreamingFlow` one 25-token encoder chunk at a time, as far
as the chunks are exact: a chunk is final once the 3 tokens its look-ahead reads exist, and attention never
reaches past a chunk. What is left of the prompt (``P mod 25`` tokens) stays pending in the prefix and goes
through each request's first chunk together with its first tokens, exactly as one whole-utterance call
would compute it: at most 2 x 24 more frames in a request's first solve. So every frame a request computes is
the official one (up to the streaming approximations of `vocoding.py`) when ``P mod 25 >= 3``.

When ``P mod 25`` is 0, 1 or 2, the prompt's last whole chunk has no 3 known tokens after it. Then the first
``P mod 25`` tokens are dropped (`flow_prompt`; 80 ms at most) and the prompt is sealed: its last tokens
look ahead into zeros, not into a request's first tokens. That is the prefix's one approximation: the
encoder's look-ahead conv changes the prompt's last 3 tokens, and attention inside the encoder's last
25-token chunk carries that to the whole last prompt chunk (50 frames), which every request frame attends to
(measured in `fidelity.py`). Dropped or not, every frame keeps the fixed noise of its place in the whole
prompt. Either way the prompt's frames (encoder output, estimator keys and values at every Euler step) are
computed once per voice and shared read-only by all forks.

The prefix is built chunk by chunk (`build_steps`: one 25-token encoder chunk, i.e. one 50-frame solve, per
step), so the chunk scheduler can build it between other streams' chunks instead of making a request wait.
"""

from __future__ import annotations

import copy

import torch

from assistant.tts.cosyvoice.batch_work import WorkSteps, run_alone
from assistant.tts.cosyvoice.flow import CausalFlow, FlowSolve, StreamingFlow
from assistant.tts.cosyvoice.flow_cache import KVCache
from assistant.tts.cosyvoice.flow_encoder import Cache
from assistant.tts.cosyvoice.prompt_cache import PromptCache, digest
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

KVPrefixes = list[dict[object, tuple[torch.Tensor, torch.Tensor]]]  # per step: layer → shared (k, v)


def kv_prefixes(caches: list[Cache]) -> KVPrefixes:
    """Every `KVCache` of per-step estimator caches, compacted to exact-size (k, v): a shareable prefix."""
    return [{key: val.compact() for key, val in c.items() if isinstance(val, KVCache)} for c in caches]


def fork_caches(caches: list[Cache], kv: KVPrefixes, capacity: int) -> list[Cache]:
    """Per-request estimator caches continuing shared ones: conv tails and counters copied (they are only
    ever replaced), keys/values read from the shared prefix, new frames into the request's own buffers."""
    out = []
    for c, prefixes in zip(caches, kv, strict=True):
        fork = {key: val for key, val in c.items() if not isinstance(val, KVCache)}
        fork["capacity"] = capacity
        for key, pkv in prefixes.items():
            fork[key] = KVCache(prefix=pkv, capacity=capacity)
        out.append(fork)
    return out


def tensor_bytes(obj: object) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def flow_prompt(voice: CosyVoicePrompt, chunk: int, lookahead: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The voice's flow prompt as the prefix holds it: (tokens [1, P'], mel [1, 2P', 80], sealed).

    Whole when its last partial chunk holds the look-ahead of the last whole one (``P mod chunk >=
    lookahead``) or it is shorter than a chunk (not sealed: the rest goes through each request). Otherwise its
    first ``P mod chunk`` tokens are dropped and it is sealed (see the module doc).
    """
    tokens, feat = voice.speech_tokens, voice.speech_feat
    p = tokens.size(1)
    rest = p % chunk
    if p < chunk or rest >= lookahead:
        return tokens, feat, False
    return tokens[:, rest:], feat[:, 2 * rest :], True


def prefix_key(flow: CausalFlow, voice: CosyVoicePrompt) -> str:
    """The prompt cache's key of a voice's flow prefix (by content)."""
    return digest(id(flow), voice.speech_tokens, voice.speech_feat, voice.embedding)


class FlowPrefix:
    """A voice prompt pushed through the flow once; `fork` gives each request its own continuation (see the
    module doc). ``build=False`` leaves the building to `build_steps` (driven by the chunk scheduler)."""

    def __init__(self, flow: CausalFlow, voice: CosyVoicePrompt, build: bool = True) -> None:
        dev = next(flow.parameters()).device
        dtype = next(flow.parameters()).dtype
        self.flow = flow
        tokens, feat, self.sealed = flow_prompt(voice, flow.cfg.encoder_chunk_size, flow.cfg.pre_lookahead_len)
        self.prompt_tokens = tokens.size(1)
        self._tokens = tokens.to(dev, torch.int32)                          # [1, P']
        cut = voice.speech_tokens.size(1) - self.prompt_tokens              # every frame keeps the official noise
        self.state = StreamingFlow(flow, self._tokens, feat.to(dev, dtype), voice.embedding.to(dev, dtype),
                                   noise_offset=flow.cfg.token_mel_ratio * cut)
        self._kv: KVPrefixes | None = None
        self._reduced: dict[int, tuple[list[Cache], KVPrefixes]] = {}
        if build:
            with torch.inference_mode():
                run_alone(self.build_steps())

    @property
    def built(self) -> bool:
        return self._kv is not None

    def build_steps(self, reduced_steps: int | None = None) -> WorkSteps[FlowPrefix]:
        """Encode and solve the prompt one encoder chunk per step (each with its known look-ahead, so equal
        to one whole pass), then seal the last chunk or leave the rest pending (module doc); with
        ``reduced_steps`` the first-chunk solver's caches too."""
        st, cfg = self.state, self.flow.cfg
        chunk, look = cfg.encoder_chunk_size, cfg.pre_lookahead_len
        while st.pending.size(1) - look >= chunk:
            yield from st.encode_steps(chunk, look_ahead=True)
        if self.sealed:
            yield from st.encode_steps(st.pending.size(1), look_ahead=False)
        self._kv = kv_prefixes(st.step_caches)
        if reduced_steps and reduced_steps != cfg.n_timesteps:
            yield from self._reduced_steps(reduced_steps)
        return self

    @property
    def nbytes(self) -> int:
        """Bytes of the cached tensors (encoder and estimator state of every step, reduced-step solvers)."""
        st = self.state
        total = tensor_bytes(st.encoder_cache) + tensor_bytes(self._kv) + tensor_bytes(st.prompt_feat)
        total += sum(tensor_bytes(kv) for _, kv in self._reduced.values())
        total += sum(tensor_bytes({k: v for k, v in c.items() if not isinstance(v, KVCache)})
                     for c in st.step_caches)
        return total

    def fork(self, capacity: int = 0) -> StreamingFlow:
        """A request's own continuation (``capacity``: frames to reserve per estimator buffer)."""
        if self._kv is None:
            raise RuntimeError("FlowPrefix.fork before the prefix was built")
        st = copy.copy(self.state)
        st.encoder_cache = dict(self.state.encoder_cache)
        st.step_caches = fork_caches(self.state.step_caches, self._kv, capacity)
        return st

    def has_reduced(self, n_steps: int) -> bool:
        return n_steps in self._reduced

    def step_prefixes(self, n_steps: int | None = None) -> list[tuple[Cache, dict[object, tuple[torch.Tensor,
                                                                                            torch.Tensor]]]]:
        """Per Euler step of an ``n_steps`` solver (None: the model's): the prefix's conv tails and counters,
        and its keys/values per attention layer, as a read-only continuation reads them (`PrefixRows`)."""
        if self._kv is None:
            raise RuntimeError("FlowPrefix.step_prefixes before the prefix was built")
        caches, kv = self.state.step_caches, self._kv
        if n_steps is not None and n_steps != self.flow.cfg.n_timesteps:
            if n_steps not in self._reduced:
                run_alone(self._reduced_steps(n_steps))
            caches, kv = self._reduced[n_steps]
        return [({k: v for k, v in c.items() if not isinstance(v, KVCache)}, dict(kvs))
                for c, kvs in zip(caches, kv, strict=True)]

    @torch.inference_mode()
    def reduced_step_caches(self, n_steps: int) -> list[Cache]:
        """Estimator caches over the prefix's frames for an ``n_steps`` solver (a fresh fork each call)."""
        if n_steps not in self._reduced:
            run_alone(self._reduced_steps(n_steps))
        caches, kv = self._reduced[n_steps]
        return fork_caches(caches, kv, 0)

    def _reduced_steps(self, n_steps: int) -> WorkSteps[None]:
        flow, st = self.flow, self.state
        caches: list[Cache] = [{} for _ in range(n_steps)]
        n = st.encoded
        if n > 0:
            emb = flow.input_embedding(self._tokens[:, :n].long().clamp(min=0))
            h = flow.encoder(emb, None, streaming=True, cache={})
            mu = flow.encoder_proj(h).transpose(1, 2)                       # [1, 80, 2n]
            cond = st.prompt_feat[:, : 2 * n].transpose(1, 2).to(mu.dtype)
            z = st.noise(0, 2 * n)
            yield FlowSolve(flow, z, mu, st.spks, cond, caches, n_steps)
        self._reduced[n_steps] = (caches, kv_prefixes(caches))


def flow_prefix(
    flow: CausalFlow, voice: CosyVoicePrompt, cache: PromptCache | None, first_steps: int | None = None
) -> FlowPrefix:
    """The voice's `FlowPrefix`, from ``cache`` when its content was seen before (else built now and kept);
    with ``first_steps`` its reduced-step solver caches too (and the cache re-measures the entry)."""
    if cache is None:
        prefix = FlowPrefix(flow, voice)
    else:
        key = prefix_key(flow, voice)
        prefix = cache.get_or_make("flow", key, lambda: FlowPrefix(flow, voice))
    if first_steps and first_steps != flow.cfg.n_timesteps and not prefix.has_reduced(first_steps):
        prefix.reduced_step_caches(first_steps)
        if cache is not None:
            cache.resize("flow", prefix_key(flow, voice))
    return prefix


__all__ = ["FlowPrefix", "flow_prefix", "flow_prompt", "fork_caches", "kv_prefixes", "prefix_key", "tensor_bytes"]
