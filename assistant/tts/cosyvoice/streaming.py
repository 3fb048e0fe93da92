"""One request's streaming token-to-audio: speech tokens in as the LLM makes them, audio chunks out.

`StreamingSynthesis` ties a schedule (`schedule.py`: when a chunk is due and which tokens it covers) to a
way of computing chunks (`vocoding.py`: the official recompute, or our cached flow with a streaming vocoder).
A `StreamingSynthesis` belongs to one request and is never shared.

On the fast schedule a voice whose `FlowPrefix` is not built yet (cold) starts at once on its own flow state;
the stream then names the prefix it lacks (``missing_prefix``), and whoever runs it (the chunk scheduler, or
`run_stream`) builds the prefix for later requests beside it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from assistant.tts.cosyvoice.batch_work import WorkSteps, run_alone
from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
from assistant.tts.cosyvoice.flow import CausalFlow
from assistant.tts.cosyvoice.flow_arena import FlowArena
from assistant.tts.cosyvoice.flow_cache import KVCache
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix, prefix_key, tensor_bytes
from assistant.tts.cosyvoice.hift import HiFTVocoder
from assistant.tts.cosyvoice.prompt_cache import PromptCache
from assistant.tts.cosyvoice.schedule import ChunkPlanner, StreamSchedule
from assistant.tts.cosyvoice.vocoding import CachedVocoding, RecomputeVocoding, make_generator
from assistant.tts.cosyvoice.voice import CosyVoicePrompt


@dataclass
class Chunk:
    """One piece of streamed audio and what it took."""

    audio: np.ndarray       # float32 [N] at the model's sample rate
    index: int              # 0 for the first chunk
    tokens_seen: int        # speech tokens the LLM had produced when this chunk was made
    covers: tuple[int, int]  # new-token range [a, b) this chunk's audio stands for
    final: bool
    flow_ms: float = 0.0    # chunk start → its mel ready (batch-mates' work in the same batches included)
    vocoder_ms: float = 0.0  # mel ready → audio ready
    setup_ms: float = 0.0   # first chunk: the stream's setup
    queue_ms: float = 0.0   # due → started (waiting behind other chunks)
    stats: dict[str, float] | None = None  # the request's statistics so far (engine: prefill, decode, ...)


@dataclass
class MissingPrefix:
    """A voice prefix a cold stream went without: build it (`FlowPrefix.build_steps`) and keep it."""

    key: str
    prefix: FlowPrefix
    reduced_steps: int | None = None

    def build_steps(self) -> WorkSteps[FlowPrefix]:
        return self.prefix.build_steps(self.reduced_steps)


class StreamingSynthesis:
    """Speech tokens in (one at a time, as the LLM makes them), audio chunks out, on a schedule.

    Per request; call `add` for each token, `due` tells whether a chunk can be made now, `next_chunk`
    makes it (`chunk_steps`: the same as work steps the scheduler can batch). After `finish` (the LLM
    stopped), the next chunk is the last. ``capacity_tokens``: how many speech tokens to reserve flow
    buffers for (a hint; they grow past it). ``prefix``: the voice's built prefix (else looked up in
    ``cache``; without one the stream starts cold). ``first_chunk``: the engine's static first chunks (a warm
    voice prepared there makes its first chunk with them).
    """

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFTVocoder,
        voice: CosyVoicePrompt,
        schedule: StreamSchedule,
        *,
        cache: PromptCache | None = None,
        prefix: FlowPrefix | None = None,
        seed: int | None = None,
        speed: float = 1.0,
        capacity_tokens: int = 0,
        first_chunk: FirstChunkGraphs | None = None,
    ) -> None:
        self.schedule = schedule
        self.tokens: list[int] = []
        self.llm_done = False
        self.done = False
        self.chunks = 0
        self.missing_prefix: MissingPrefix | None = None
        dev = next(flow.parameters()).device
        gen = make_generator(dev, seed)
        cfg = flow.cfg
        self.backend: RecomputeVocoding | CachedVocoding
        t0 = time.perf_counter()
        if schedule.name == "official":
            self.backend = RecomputeVocoding(flow, hift, voice, gen, speed)
        else:
            steps = schedule.first_chunk_steps
            if prefix is None and cache is not None:
                found = cache.get("flow", prefix_key(flow, voice))
                prefix = found if isinstance(found, FlowPrefix) else None
                if prefix is not None and steps and steps != cfg.n_timesteps and not prefix.has_reduced(steps):
                    prefix.reduced_step_caches(steps)                      # once per voice and step count
                    cache.resize("flow", prefix_key(flow, voice))
                elif prefix is None:
                    self.missing_prefix = MissingPrefix(prefix_key(flow, voice), FlowPrefix(flow, voice, build=False),
                                                        steps)
            first_flow = first_push = None
            if first_chunk is not None:
                first_flow, first_push = first_chunk.flow_for(prefix, schedule), first_chunk.push_for(schedule)
            self.backend = CachedVocoding(flow, hift, voice, prefix, gen, speed, steps, schedule.vocoder_lookahead,
                                          capacity_tokens, first_flow, first_push)
        self.setup_ms = 1000 * (time.perf_counter() - t0)
        self.arena: FlowArena | None = None
        self.slot: int | None = None
        self._slot_lock = threading.Lock()
        self.planner = ChunkPlanner(schedule, self.backend.prompt_tokens, cfg.encoder_chunk_size,
                                    cfg.pre_lookahead_len)

    @property
    def cold(self) -> bool:
        """On the fast schedule without the voice's prefix (its whole prompt goes through its first chunk)."""
        return isinstance(self.backend, CachedVocoding) and self.backend.cold

    @property
    def nbytes(self) -> int:
        """Bytes this request holds of its own (flow buffers and caches, its arena slot; not the shared voice
        prefix)."""
        backend = self.backend
        if isinstance(backend, CachedVocoding):
            st = backend.state
            own = sum(v.nbytes for c in st.step_caches for v in c.values() if isinstance(v, KVCache))
            slot = self.arena.slot_bytes if self.arena is not None and self.slot is not None else 0
            return own + slot + tensor_bytes(st.encoder_cache)
        return 0

    def bind_arena(self, arena: FlowArena) -> bool:
        """Keep this stream's flow state in a slot of ``arena`` (before its first chunk); False when no slot is
        free (or on the official schedule): it runs on buffers of its own. `release_arena` gives it back."""
        backend = self.backend
        if not isinstance(backend, CachedVocoding) or self.chunks or self.slot is not None:
            return False
        slot = arena.take()
        if slot is None:
            return False
        arena.bind(backend.state.step_caches, slot, backend.prefix)
        self.arena, self.slot = arena, slot
        return True

    def release_arena(self) -> None:
        """Give the stream's arena slot back (any thread; once: the stream is finished or dropped)."""
        with self._slot_lock:
            slot, self.slot = self.slot, None
        if slot is not None and self.arena is not None:
            self.arena.release(slot)

    def add(self, token: int) -> None:
        self.tokens.append(token)

    def finish(self) -> None:
        self.llm_done = True

    def due(self) -> bool:
        return not self.done and self.planner.due(len(self.tokens), self.llm_done)

    def next_chunk(self) -> Chunk:
        """Make the chunk that is due (call only when `due`)."""
        return run_alone(self.chunk_steps())

    def run_through(self, tokens: list[int]) -> list[Chunk]:
        """Known tokens handed over one at a time as the LLM would (each chunk made as soon as it is due), then
        the end: every chunk, in order."""
        out = []
        for tok in tokens:
            self.add(tok)
            while self.due():
                out.append(self.next_chunk())
        self.finish()
        while self.due():
            out.append(self.next_chunk())
        return out

    def chunk_steps(self) -> WorkSteps[Chunk]:
        """`next_chunk` as work steps. The chunk's tokens are fixed when it starts; tokens added meanwhile
        go to later chunks."""
        p = self.planner
        tokens = list(self.tokens)
        final = self.llm_done and len(tokens) < p.offset + p.hop + p.lookahead
        start = p.offset
        if final:
            end, upto = len(tokens), None
            self.done = True
        else:
            end = upto = p.offset + p.hop
            p.advance()
        audio = yield from self.backend.chunk_steps(tokens, start, upto)
        samples = audio.float().cpu().numpy()                 # the chunk's one wait for the device
        timing = self.backend.timings()
        chunk = Chunk(samples, self.chunks, len(tokens), (start, end), final, timing["flow_ms"],
                      timing["vocoder_ms"])
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
    prefix: FlowPrefix | None = None,
) -> list[Chunk]:
    """Stream a known token sequence as if the LLM produced it one token at a time (tests, bench). A cold
    voice's prefix is built afterwards and kept in ``cache`` (as the engine builds it beside the stream)."""
    s = StreamingSynthesis(flow, hift, voice, schedule, cache=cache, prefix=prefix, seed=seed)
    out = s.run_through(tokens)
    if s.missing_prefix is not None and cache is not None:
        with torch.inference_mode():
            cache.put("flow", s.missing_prefix.key, run_alone(s.missing_prefix.build_steps()))
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
    """The fast schedule's first-chunk mel [1, 80, 2*first_hop] of a warm voice with an ``n_steps`` solver."""
    dev = next(flow.parameters()).device
    prefix = prefix or FlowPrefix(flow, voice)
    voc = CachedVocoding(flow, hift, voice, prefix, make_generator(dev, 0), 1.0, n_steps)
    steps = n_steps if n_steps and n_steps != flow.cfg.n_timesteps else None
    return run_alone(voc._provisional_steps(tokens[: first_hop + flow.cfg.pre_lookahead_len], first_hop, steps))


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


__all__ = ["Chunk", "MissingPrefix", "StreamingSynthesis", "first_chunk_mel", "run_stream", "seam_steps"]
