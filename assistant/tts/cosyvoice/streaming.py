"""Streaming token-to-audio for CosyVoice2: when a chunk of speech tokens becomes audio, and how.

The speech LLM produces 25 tokens per second of audio. A chunk of ``hop`` new tokens can be turned into
audio once ``pre_lookahead_len`` (3) further tokens exist (the flow's encoder looks that far ahead). Two
schedules, both per request (a `StreamingSynthesis` is never shared between requests):

``official`` (the reference's token2wav, kept as the baseline the bench compares against)
    first hop 25 tokens + the padding that aligns prompt + hop to the encoder's 25-token attention chunk,
    then 50, 100, 100 ...; every chunk re-runs the flow over *all* tokens so far (``finalize=False``) and
    keeps the new frames; the vocoder sees the last 8 mel frames of the previous chunk again, its source
    there is overwritten by the previous source, and the overlapping audio is Hamming cross-faded. The last
    chunk re-runs the flow with full attention (``streaming=False, finalize=True``).

``fast`` (ours)
    first hop ``first_chunk_tokens`` (10), then doubling up to ``max_hop``; the flow carries its encoder and
    estimator caches (`StreamingFlow`), so each chunk costs only its new tokens; the voice prompt's share of
    those caches is computed once per voice (`FlowPrefix`) and forked per request. Caches are exact only up
    to the encoder's 25-token chunk boundaries, so frames past the last boundary are computed
    *provisionally* on a throw-away copy of the caches (optionally with fewer Euler steps for the very first
    chunk) and recomputed exactly later; those later frames continue the audio from where the provisional
    ones stopped. The vocoder (`StreamingHiFT`) carries F0, source phase and convolution context across
    chunks, holding back ``vocoder_lookahead`` frames of right context, so there is no overlap to cross-fade.

Random draws of the vocoder (harmonic phase, noise) come from a per-request generator, so concurrent
requests never disturb each other's audio and a seeded request is reproducible.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from assistant.tts.cosyvoice.flow import CausalFlow, StreamingFlow, time_schedule
from assistant.tts.cosyvoice.flow_decoder import KVCache
from assistant.tts.cosyvoice.hift import HiFTVocoder, StreamingHiFT, crossfade_window, fade_in_out
from assistant.tts.cosyvoice.hift_source import SourceNoise
from assistant.tts.cosyvoice.prompt_cache import PromptCache, digest
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

# The reference's vocoder overlap: 8 mel frames (160 ms, 3840 samples at 24 kHz) are vocoded twice and the
# audio of the overlap is cross-faded; long enough to hide the seam, short enough to cost little.
MEL_CACHE_FRAMES = 8
OFFICIAL_FIRST_HOP = 25     # the reference's token_hop_len
OFFICIAL_MAX_HOP = 100      # the reference's token_max_hop_len
HOP_GROWTH = 2              # the reference's stream_scale_factor; ours grows the same way
FAST_MAX_HOP = 50           # ours: smaller late chunks keep many sessions' chunks short and interleaved
# Ours: mel frames the streaming vocoder holds back for right context. Exact needs ~20 (HiFT's receptive
# field), which would swallow a 10-token (20-frame) first chunk whole; 4 frames (80 ms) leave the seams as
# smooth as the signal itself (tests: seam step <= the 99th percentile of nearby sample differences).
FAST_VOCODER_LOOKAHEAD = 4

Cache = dict[Any, Any]


@dataclass(frozen=True)
class StreamSchedule:
    """How many new speech tokens each chunk covers, and how chunks are computed (see the module doc)."""

    name: str = "fast"                      # "official" (recompute, baseline) or "fast" (cached)
    first_hop: int = 10                     # new tokens in the first chunk (look-ahead not counted)
    max_hop: int = FAST_MAX_HOP
    growth: int = HOP_GROWTH
    first_chunk_steps: int | None = None    # Euler steps for the first chunk's flow (None: the model's 10)
    vocoder_lookahead: int | None = None    # fast: mel frames the vocoder holds back (None: exact, no seams)
    align_first_to_prompt: bool = False     # official: pad the first hop so prompt + hop fills 25-token chunks
    align_to_chunks: bool = False           # fast: after the first chunk, end every chunk on an encoder chunk

    @classmethod
    def official(cls) -> StreamSchedule:
        return cls("official", OFFICIAL_FIRST_HOP, OFFICIAL_MAX_HOP, HOP_GROWTH, None, None, True)

    @classmethod
    def fast(
        cls,
        first_chunk_tokens: int = 10,
        max_hop: int = FAST_MAX_HOP,
        first_chunk_steps: int | None = None,
        vocoder_lookahead: int | None = FAST_VOCODER_LOOKAHEAD,
    ) -> StreamSchedule:
        if first_chunk_tokens < 1:
            raise ValueError("first_chunk_tokens must be >= 1")
        hop = max(max_hop, first_chunk_tokens)
        return cls("fast", first_chunk_tokens, hop, HOP_GROWTH, first_chunk_steps, vocoder_lookahead, False, True)

    @classmethod
    def named(cls, name: str, first_chunk_tokens: int = 10, first_chunk_steps: int | None = None) -> StreamSchedule:
        if name == "official":
            return cls.official()
        if name == "fast":
            return cls.fast(first_chunk_tokens, first_chunk_steps=first_chunk_steps)
        raise ValueError(f"unknown stream schedule {name!r} (official or fast)")


class ChunkPlanner:
    """Which tokens the next chunk covers: ``offset`` new tokens are done, the next chunk ends at
    ``offset + hop`` and is due once ``lookahead`` more tokens exist (or the LLM has finished).

    With ``align_to_chunks`` every chunk after the first ends on an encoder chunk boundary (counted from the
    first prompt token, so ``prompt_tokens`` says where the grid lies): its frames are then exact when made
    and never solved twice; only the first chunk's frames are provisional.
    """

    def __init__(self, schedule: StreamSchedule, prompt_tokens: int, encoder_chunk: int, lookahead: int) -> None:
        self.schedule = schedule
        self.lookahead = lookahead
        self.prompt_tokens = prompt_tokens
        self.encoder_chunk = encoder_chunk
        self.offset = 0
        self.base_hop = schedule.first_hop
        self.pad = (-prompt_tokens) % encoder_chunk if schedule.align_first_to_prompt else 0
        self.chunks = 0

    @property
    def hop(self) -> int:
        if self.chunks == 0:
            return self.base_hop + self.pad
        if not self.schedule.align_to_chunks:
            return self.base_hop
        c, p = self.encoder_chunk, self.prompt_tokens
        end = (p + self.offset + self.base_hop) // c * c - p       # the last boundary within the wanted hop
        if end <= self.offset:
            end = ((p + self.offset) // c + 1) * c - p             # or the next one
        return end - self.offset

    def due(self, n_tokens: int, llm_done: bool) -> bool:
        return llm_done or n_tokens - self.offset >= self.hop + self.lookahead

    def advance(self) -> None:
        self.offset += self.hop
        self.chunks += 1
        self.base_hop = min(self.schedule.max_hop, self.base_hop * self.schedule.growth)


def stretch_mel(mel: torch.Tensor, speed: float) -> torch.Tensor:
    """mel [1, 80, T] → [1, 80, T/speed] by linear interpolation (tempo change, pitch kept)."""
    if speed == 1.0 or mel.size(2) == 0:
        return mel
    return F.interpolate(mel, size=max(1, round(mel.size(2) / speed)), mode="linear")


def draw_noise(gen: torch.Generator, n_samples: int, n_harmonics: int, device: torch.device) -> SourceNoise:
    """One vocoder call's random draws from a per-request generator (not the global one)."""
    rand_ini = torch.rand(1, n_harmonics, generator=gen, device=gen.device).to(device)
    sine_noise = torch.randn(1, n_samples, n_harmonics, generator=gen, device=gen.device).to(device)
    return SourceNoise(rand_ini, sine_noise)


class NoiseTape:
    """A request's vocoder randomness as a function of absolute sample position.

    One harmonic start phase for the whole utterance and one noise sample per (sample, harmonic), drawn
    from the request's generator as the utterance grows: a chunked vocoder then sees exactly the draws a
    whole-utterance call would, so streaming does not change the excitation.
    """

    def __init__(self, gen: torch.Generator, n_harmonics: int, device: torch.device) -> None:
        self.gen, self.device = gen, device
        self.rand_ini = torch.rand(1, n_harmonics, generator=gen, device=gen.device).to(device)   # [1, H]
        self.noise = torch.zeros(1, 0, n_harmonics, device=device)                                # [1, N, H]

    def span(self, start: int, end: int) -> SourceNoise:
        """Draws for samples [start, end)."""
        have = self.noise.size(1)
        if end > have:
            more = torch.randn(1, end - have, self.noise.size(2), generator=self.gen, device=self.gen.device)
            self.noise = torch.cat([self.noise, more.to(self.device)], dim=1)
        return SourceNoise(self.rand_ini, self.noise[:, start:end])


def _sync(device: torch.device) -> None:
    """Wait for the device (stage timings; the chunk's audio is copied to the host right after anyway)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def solve_euler(
    flow: CausalFlow,
    z: torch.Tensor,
    mu: torch.Tensor,
    spks: torch.Tensor,
    cond: torch.Tensor,
    caches: list[Cache] | None,
    n_steps: int,
) -> torch.Tensor:
    """The flow's CFG Euler solver with ``n_steps`` steps (the model uses 10): z, mu, cond [1, 80, T] → mel.

    With 10 steps this is ``flow.decoder`` itself; other counts use the same cosine time schedule and the
    same guidance, with one estimator cache per step in ``caches`` (streaming) or none.
    """
    decoder = flow.decoder
    if n_steps == decoder.cfg.n_timesteps:
        mask = torch.ones(1, 1, z.size(2), device=z.device, dtype=z.dtype)
        return decoder(z, mu, mask, spks, cond, streaming=True, caches=caches)
    rate = decoder.cfg.inference_cfg_rate
    t_span = time_schedule(n_steps, decoder.cfg.t_scheduler, mu.device, torch.float32)  # fp32 whatever the model
    mu_in = torch.cat([mu, torch.zeros_like(mu)])          # [2, 80, T]: conditional, unconditional
    spks_in = torch.cat([spks, torch.zeros_like(spks)])
    cond_in = torch.cat([cond, torch.zeros_like(cond)])
    mask_in = torch.ones(2, 1, z.size(2), device=z.device, dtype=z.dtype)
    x = z
    for step in range(n_steps):
        t, dt = t_span[step], t_span[step + 1] - t_span[step]
        cache = caches[step] if caches is not None else None
        v = decoder.estimator(x.expand(2, -1, -1), mask_in, mu_in, t.expand(2), spks_in, cond_in, True, cache)
        v_cond, v_uncond = v.chunk(2)
        x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
    return x


# --- the official way: recompute the flow over all tokens every chunk -------------------------------------


class RecomputeVocoding:
    """token2wav as the reference streams it (baseline): flow over every token so far, vocoder with caches."""

    def __init__(
        self, flow: CausalFlow, hift: HiFTVocoder, voice: CosyVoicePrompt, gen: torch.Generator, speed: float = 1.0
    ) -> None:
        self.flow, self.hift, self.voice, self.gen, self.speed = flow, hift, voice, gen, speed
        self.device = next(flow.parameters()).device
        self.dtype = next(flow.parameters()).dtype
        self.overlap = MEL_CACHE_FRAMES * hift.cfg.samples_per_frame
        self.window = crossfade_window(self.overlap)
        self.mel_tail: torch.Tensor | None = None     # [1, 80, 8]
        self.source_tail: torch.Tensor | None = None  # [1, 1, 3840]
        self.speech_tail: torch.Tensor | None = None  # [1, 3840]

    @torch.inference_mode()
    def chunk(self, tokens: list[int], offset: int, upto: int | None) -> torch.Tensor:
        """Audio [N] of new tokens [offset, upto) (``upto`` None: the last chunk, everything left)."""
        final = upto is None
        t0 = time.perf_counter()
        lookahead = self.flow.cfg.pre_lookahead_len
        used = tokens if final else tokens[: upto + lookahead]
        dev, v = self.device, self.voice
        token = torch.tensor([used], dtype=torch.int32, device=dev)
        prompt = v.speech_tokens.to(dev, torch.int32)
        mel = self.flow.inference(
            token=token,
            token_len=torch.tensor([token.size(1)], device=dev),
            prompt_token=prompt,
            prompt_token_len=torch.tensor([prompt.size(1)], device=dev),
            prompt_feat=v.speech_feat.to(dev, self.dtype),
            prompt_feat_len=torch.tensor([v.speech_feat.size(1)], device=dev),
            embedding=v.embedding.to(dev, self.dtype),
            streaming=not final,
            finalize=final,
        )
        mel = stretch_mel(mel[:, :, offset * self.flow.cfg.token_mel_ratio :].float(), self.speed)
        _sync(self.device)
        t1 = time.perf_counter()
        self.timing = {"flow_ms": 1000 * (t1 - t0), "vocoder_ms": 0.0}
        if self.mel_tail is not None:
            mel = torch.cat([self.mel_tail, mel], dim=2)
        n = mel.size(2) * self.hift.cfg.samples_per_frame
        noise = draw_noise(self.gen, n, self.hift.m_source.n_harmonics, dev)
        speech, source = self.hift.inference(mel, cache_source=self.source_tail, noise=noise)
        if self.speech_tail is not None:
            speech = fade_in_out(speech, self.speech_tail, self.window)
        _sync(self.device)
        self.timing["vocoder_ms"] = 1000 * (time.perf_counter() - t1)
        if final:
            return speech[0]
        self.mel_tail = mel[:, :, -MEL_CACHE_FRAMES:]
        self.source_tail = source[:, :, -self.overlap :]
        self.speech_tail = speech[:, -self.overlap :]
        return speech[0, : -self.overlap]


# --- ours: cached flow, provisional frames past the last exact boundary ----------------------------------


KVPrefixes = list[dict[Any, tuple[torch.Tensor, torch.Tensor]]]  # per step: layer → shared (k, v)


def _kv_prefixes(caches: list[Cache]) -> KVPrefixes:
    """Every `KVCache` of per-step estimator caches, compacted to exact-size (k, v): a shareable prefix."""
    return [{key: val.compact() for key, val in c.items() if isinstance(val, KVCache)} for c in caches]


def _fork_caches(caches: list[Cache], kv: KVPrefixes, capacity: int) -> list[Cache]:
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


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def flow_prompt(voice: CosyVoicePrompt, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The voice's flow prompt cut to whole encoder chunks (tokens [1, P'], mel [1, 2P', 80]).

    The first ``P mod chunk`` tokens (under a second) are dropped so the prompt ends on a chunk boundary:
    then no prompt frame shares an attention chunk with the request's tokens, and the whole prompt can be
    computed once per voice. Prompts shorter than one chunk are kept whole.
    """
    tokens, feat = voice.speech_tokens, voice.speech_feat
    p = tokens.size(1)
    cut = p % chunk if p >= chunk else 0
    return tokens[:, cut:], feat[:, 2 * cut :]


class FlowPrefix:
    """A voice prompt pushed through the flow once; `fork` gives each request its own continuation.

    The whole prompt (cut to whole encoder chunks, `flow_prompt`) is encoded as a finished sequence:
    its last tokens look ahead into zeros, not into the request's first tokens as one whole-utterance call
    would. That is the one approximation (it touches only the prompt's last 3 tokens' context, never
    what a request's frames are computed from otherwise); in exchange every prompt frame's encoder output
    and estimator keys/values at every Euler step are computed once per voice and shared read-only by all
    forks. Reduced-step estimator caches (first-chunk solver) are built on demand and kept too.
    """

    def __init__(self, flow: CausalFlow, voice: CosyVoicePrompt) -> None:
        dev = next(flow.parameters()).device
        dtype = next(flow.parameters()).dtype
        self.flow = flow
        tokens, feat = flow_prompt(voice, flow.cfg.encoder_chunk_size)
        self.prompt_tokens = tokens.size(1)
        self._tokens = tokens.to(dev, torch.int32)                          # [1, P']
        self.state = StreamingFlow(flow, self._tokens, feat.to(dev, dtype), voice.embedding.to(dev, dtype))
        with torch.inference_mode():
            self.state.seal()
        self._kv = _kv_prefixes(self.state.step_caches)
        self._reduced: dict[int, tuple[list[Cache], KVPrefixes]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the cached tensors (encoder and estimator state of every step, reduced-step solvers)."""
        st = self.state
        total = _tensor_bytes(st.encoder_cache) + _tensor_bytes(self._kv) + _tensor_bytes(st.prompt_feat)
        total += sum(_tensor_bytes(kv) for _, kv in self._reduced.values())
        total += sum(_tensor_bytes({k: v for k, v in c.items() if not isinstance(v, KVCache)})
                     for c in st.step_caches)
        return total

    def fork(self, capacity: int = 0) -> StreamingFlow:
        """A request's own continuation (``capacity``: frames to reserve per estimator buffer)."""
        st = copy.copy(self.state)
        st.encoder_cache = dict(self.state.encoder_cache)
        st.step_caches = _fork_caches(self.state.step_caches, self._kv, capacity)
        return st

    @torch.inference_mode()
    def reduced_step_caches(self, n_steps: int) -> list[Cache]:
        """Estimator caches over the prefix's frames for an ``n_steps`` solver (a fresh fork each call)."""
        if n_steps not in self._reduced:
            flow, st = self.flow, self.state
            caches: list[Cache] = [{} for _ in range(n_steps)]
            n = st.encoded
            if n > 0:
                emb = flow.input_embedding(self._tokens[:, :n].long().clamp(min=0))
                h = flow.encoder(emb, None, streaming=True, cache={})
                mu = flow.encoder_proj(h).transpose(1, 2)                       # [1, 80, 2n]
                cond = st.prompt_feat[:, : 2 * n].transpose(1, 2).to(mu.dtype)
                z = flow.noise[:, :, : 2 * n].to(mu.dtype)
                solve_euler(flow, z, mu, st.spks, cond, caches, n_steps)
            self._reduced[n_steps] = (caches, _kv_prefixes(caches))
        caches, kv = self._reduced[n_steps]
        return _fork_caches(caches, kv, 0)



class CachedVocoding:
    """Our token2wav: each chunk costs its new tokens only (see the module doc)."""

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFTVocoder,
        prefix: FlowPrefix,
        gen: torch.Generator,
        speed: float = 1.0,
        first_chunk_steps: int | None = None,
        vocoder_lookahead: int | None = None,
        capacity_tokens: int = 0,
    ) -> None:
        self.flow, self.hift, self.prefix, self.gen, self.speed = flow, hift, prefix, gen, speed
        self.device = next(flow.parameters()).device
        self.state = prefix.fork(flow.cfg.token_mel_ratio * capacity_tokens)
        self.vocoder = StreamingHiFT(hift, lookahead_frames=vocoder_lookahead)
        self.n_prompt_frames = self.state.prompt_feat.size(1)
        self.given = 0              # new tokens handed to the flow state
        self.emitted = 0            # new-token mel frames already vocoded
        self.exact: torch.Tensor | None = None  # exact frames computed, not yet vocoded [1, 80, k]
        self.exact_start = 0        # new-frame index of self.exact's first frame
        n_steps = flow.cfg.n_timesteps
        self.first_steps = first_chunk_steps if first_chunk_steps and first_chunk_steps != n_steps else None
        self.provisional_frames = 0  # frames emitted from provisional mel (stats)
        self.tape = NoiseTape(gen, hift.m_source.n_harmonics, self.device)
        self.vocoded = 0            # mel frames handed to the vocoder (after any speed stretch)

    def _commit(self, tokens: list[int], avail: int, final: bool) -> None:
        """Hand tokens [given, avail) to the flow state; keep the exact frames it returns."""
        st = self.state
        before = max(st.frames - self.n_prompt_frames, 0)
        new = torch.tensor([tokens[self.given : avail]], dtype=torch.long, device=self.device)
        mel = st.push(new, finalize=final)                                  # [1, 80, 2k]
        self.given = avail
        if mel.size(2) == 0:
            return
        if self.exact is None:
            self.exact, self.exact_start = mel, before
        else:
            self.exact = torch.cat([self.exact, mel], dim=2)

    def _provisional(self, tokens: list[int], upto: int, n_steps: int | None) -> torch.Tensor:
        """Mel of new-token frames [exact end, 2*upto) on throw-away cache copies: [1, 80, k]."""
        flow, st = self.flow, self.state
        look = flow.cfg.pre_lookahead_len
        extra = torch.tensor([tokens[self.given : upto + look]], dtype=torch.long, device=self.device)
        seq = torch.cat([st.pending, extra], dim=1)                         # tokens from st.encoded on
        n = self.prefix.prompt_tokens + upto - st.encoded                   # tokens to encode
        if n <= 0:
            return self.state.prompt_feat.new_zeros(1, flow.cfg.output_size, 0).float()
        emb = flow.input_embedding(seq[:, : n + look].clamp(min=0))
        h = flow.encoder(emb[:, :n], emb[:, n:], streaming=True, cache=dict(st.encoder_cache))
        mu = flow.encoder_proj(h).transpose(1, 2)                           # [1, 80, 2n]
        start, end = st.frames, st.frames + mu.size(2)
        cond = torch.zeros_like(mu)
        if start < self.n_prompt_frames:
            cond[:, :, : self.n_prompt_frames - start] = st.prompt_feat[:, start:end].transpose(1, 2)
        z = flow.noise[:, :, start:end].to(mu.dtype)
        if n_steps is None:  # written past the committed frames, left uncommitted: the next chunk overwrites
            steps, caches = flow.cfg.n_timesteps, [{**c, "provisional": True} for c in st.step_caches]
        else:
            steps, caches = n_steps, self.prefix.reduced_step_caches(n_steps)
        mel = solve_euler(flow, z, mu, st.spks, cond, caches, steps)
        return mel[:, :, max(self.n_prompt_frames - start, 0) :].float()

    @torch.inference_mode()
    def chunk(self, tokens: list[int], offset: int, upto: int | None) -> torch.Tensor:
        """Audio [N] of new tokens [offset, upto) (``upto`` None: the last chunk)."""
        final = upto is None
        t0 = time.perf_counter()
        ratio = self.flow.cfg.token_mel_ratio
        first_reduced = self.first_steps is not None and self.emitted == 0 and not final
        if not first_reduced:  # only what this chunk needs: the work and the audio do not depend on timing
            look = self.flow.cfg.pre_lookahead_len
            self._commit(tokens, len(tokens) if final else min(len(tokens), upto + look), final)
        exact_end = max(self.state.frames - self.n_prompt_frames, 0)  # new-token frames known exactly
        target = exact_end if final else ratio * upto
        parts = []
        if self.exact is not None:
            lo = max(self.emitted - self.exact_start, 0)
            hi = min(target, exact_end) - self.exact_start
            if hi > lo:
                parts.append(self.exact[:, :, lo:hi])
        if not final and target > max(exact_end, self.emitted):
            prov = self._provisional(tokens, upto, self.first_steps if first_reduced else None)
            skip = max(self.emitted - exact_end, 0)                 # prov starts at frame exact_end
            parts.append(prov[:, :, skip : target - exact_end])
            self.provisional_frames += parts[-1].size(2)
        mel = torch.cat(parts, dim=2) if parts else torch.zeros(1, self.flow.cfg.output_size, 0, device=self.device)
        self.emitted = max(self.emitted, target)
        if self.exact is not None and self.exact_start < self.emitted:
            cut = min(self.emitted - self.exact_start, self.exact.size(2))
            self.exact, self.exact_start = self.exact[:, :, cut:], self.exact_start + cut
            if self.exact.size(2) == 0:
                self.exact = None
        mel = stretch_mel(mel, self.speed)
        _sync(self.device)
        t1 = time.perf_counter()
        self.timing = {"flow_ms": 1000 * (t1 - t0), "vocoder_ms": 0.0}
        if mel.size(2) == 0 and self.vocoder.held_frames == 0 and not final:
            return torch.zeros(0, device=self.device)
        spf = self.hift.cfg.samples_per_frame
        noise = self.tape.span(self.vocoded * spf, (self.vocoded + mel.size(2)) * spf)   # the new frames' draws
        self.vocoded += mel.size(2)
        audio = self.vocoder.push(mel, final, noise)
        _sync(self.device)
        self.timing["vocoder_ms"] = 1000 * (time.perf_counter() - t1)
        return audio


# --- one request's stream ---------------------------------------------------------------------------------


@dataclass
class Chunk:
    """One piece of streamed audio and what it took."""

    audio: np.ndarray       # float32 [N] at 24 kHz
    index: int              # 0 for the first chunk
    tokens_seen: int        # speech tokens the LLM had produced when this chunk was made
    covers: tuple[int, int]  # new-token range [a, b) this chunk's audio stands for
    final: bool
    flow_ms: float = 0.0    # time in the flow for this chunk
    vocoder_ms: float = 0.0  # time in the vocoder for this chunk
    setup_ms: float = 0.0   # first chunk: the stream's setup (a cold voice's flow prefix)
    queue_ms: float = 0.0   # due → started (waiting behind other chunks)
    stats: dict[str, float] | None = None  # the request's statistics so far (engine: prefill, decode, ...)


def flow_prefix(
    flow: CausalFlow, voice: CosyVoicePrompt, cache: PromptCache | None, first_steps: int | None = None
) -> FlowPrefix:
    """The voice's `FlowPrefix`, from ``cache`` when its content was seen before (else built and kept);
    with ``first_steps`` its reduced-step solver caches too (and the cache re-measures the entry)."""
    if cache is None:
        return FlowPrefix(flow, voice)
    key = digest(id(flow), voice.speech_tokens, voice.speech_feat, voice.embedding)
    prefix = cache.get_or_make("flow", key, lambda: FlowPrefix(flow, voice))
    if first_steps and first_steps != flow.cfg.n_timesteps and first_steps not in prefix._reduced:
        prefix.reduced_step_caches(first_steps)
        cache.resize("flow", key)
    return prefix


class StreamingSynthesis:
    """Speech tokens in (one at a time, as the LLM makes them), audio chunks out, on a schedule.

    Per request; call `add` for each token, `due` tells whether a chunk can be made now, `next_chunk`
    makes it. After `finish` (the LLM stopped), the next chunk is the last. ``capacity_tokens``: how many
    speech tokens to reserve flow buffers for (a hint; they grow past it).
    """

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFTVocoder,
        voice: CosyVoicePrompt,
        schedule: StreamSchedule,
        *,
        cache: PromptCache | None = None,
        seed: int | None = None,
        speed: float = 1.0,
        capacity_tokens: int = 0,
    ) -> None:
        self.schedule = schedule
        self.tokens: list[int] = []
        self.llm_done = False
        self.done = False
        self.chunks = 0
        dev = next(flow.parameters()).device
        gen = make_generator(dev, seed)
        cfg = flow.cfg
        self.backend: RecomputeVocoding | CachedVocoding
        t0 = time.perf_counter()
        if schedule.name == "official":
            prompt_tokens = voice.speech_tokens.size(1)
            self.backend = RecomputeVocoding(flow, hift, voice, gen, speed)
        else:
            prefix = flow_prefix(flow, voice, cache, schedule.first_chunk_steps)
            prompt_tokens = prefix.prompt_tokens
            self.backend = CachedVocoding(
                flow, hift, prefix, gen, speed, schedule.first_chunk_steps, schedule.vocoder_lookahead,
                capacity_tokens,
            )
        self.setup_ms = 1000 * (time.perf_counter() - t0)   # a cold voice's prefix is built here
        self.planner = ChunkPlanner(schedule, prompt_tokens, cfg.encoder_chunk_size, cfg.pre_lookahead_len)

    @property
    def nbytes(self) -> int:
        """Bytes this request holds of its own (flow buffers and caches; not the shared voice prefix)."""
        backend = self.backend
        if isinstance(backend, CachedVocoding):
            st = backend.state
            own = sum(v.nbytes for c in st.step_caches for v in c.values() if isinstance(v, KVCache))
            return own + _tensor_bytes(st.encoder_cache)
        return 0

    def add(self, token: int) -> None:
        self.tokens.append(token)

    def finish(self) -> None:
        self.llm_done = True

    def due(self) -> bool:
        return not self.done and self.planner.due(len(self.tokens), self.llm_done)

    def next_chunk(self) -> Chunk:
        """Make the chunk that is due (call only when `due`)."""
        p = self.planner
        final = self.llm_done and len(self.tokens) < p.offset + p.hop + p.lookahead
        start = p.offset
        if final:
            audio = self.backend.chunk(self.tokens, p.offset, None)
            end = len(self.tokens)
            self.done = True
        else:
            audio = self.backend.chunk(self.tokens, p.offset, p.offset + p.hop)
            end = p.offset + p.hop
            p.advance()
        timing = getattr(self.backend, "timing", {})
        chunk = Chunk(audio.float().cpu().numpy(), self.chunks, len(self.tokens), (start, end), final,
                      timing.get("flow_ms", 0.0), timing.get("vocoder_ms", 0.0))
        self.chunks += 1
        return chunk


def run_stream(
    flow: CausalFlow,
    hift: HiFTVocoder,
    voice: CosyVoicePrompt,
    tokens: list[int],
    schedule: StreamSchedule,
    seed: int | None = 0,
    cache: PromptCache | None = None,
) -> list[Chunk]:
    """Stream a known token sequence as if the LLM produced it one token at a time (tests, bench)."""
    s = StreamingSynthesis(flow, hift, voice, schedule, cache=cache, seed=seed)
    out = []
    for tok in tokens:
        s.add(tok)
        while s.due():
            out.append(s.next_chunk())
    s.finish()
    while s.due():
        out.append(s.next_chunk())
    return out


@torch.inference_mode()
def first_chunk_mel(
    flow: CausalFlow,
    hift: HiFTVocoder,
    voice: CosyVoicePrompt,
    tokens: list[int],
    first_hop: int,
    n_steps: int | None,
    prefix: FlowPrefix | None = None,
) -> torch.Tensor:
    """The fast schedule's first-chunk mel [1, 80, 2*first_hop] with an ``n_steps`` solver (quality checks)."""
    dev = next(flow.parameters()).device
    prefix = prefix or FlowPrefix(flow, voice)
    voc = CachedVocoding(flow, hift, prefix, make_generator(dev, 0), 1.0, n_steps)
    steps = n_steps if n_steps and n_steps != flow.cfg.n_timesteps else None
    return voc._provisional(tokens[: first_hop + flow.cfg.pre_lookahead_len], first_hop, steps)


def seam_steps(audio: np.ndarray, seams: list[int], window: int = 480) -> list[float]:
    """At each seam sample index: |x[s] - x[s-1]| over the 99th percentile of |Δx| within ±window."""
    diff = np.abs(np.diff(audio.astype(np.float64)))
    out = []
    for s in seams:
        if s <= 0 or s >= len(audio):
            continue
        lo, hi = max(s - window, 0), min(s + window, len(diff))
        ref = float(np.percentile(diff[lo:hi], 99)) if hi > lo else 0.0
        out.append(float(diff[s - 1]) / max(ref, 1e-9))
    return out


__all__ = [
    "MEL_CACHE_FRAMES",
    "CachedVocoding",
    "Chunk",
    "ChunkPlanner",
    "FlowPrefix",
    "NoiseTape",
    "RecomputeVocoding",
    "StreamSchedule",
    "StreamingSynthesis",
    "first_chunk_mel",
    "run_stream",
    "seam_steps",
    "solve_euler",
]
