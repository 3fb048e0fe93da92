"""Two worker threads per process run every active CosyVoice2 request on the device.

    submit(job) ──▶ waiting ──prefill into a free KV slot──▶ decoding ──eos──▶ (slot freed)
                                      │  decode thread: ONE step for all decoding jobs per iteration
                                      │  (stacked, one forward, sampled on the device)
                                      ▼
                       chunk thread: the job's stream (flow prefix, flow, vocoder) ──▶ chunks ──▶ done

Continuous batching of the speech LLM: `SlotDecoder` keeps a static KV cache with one row (slot) per
concurrent request, ``[layers, slots, kv_heads, max_positions, head_dim]``, and runs Qwen2's layers over
all rows at once with its own attention (each row masked to its own length and at its own RoPE position).
Rows never see each other, so a request decodes to the same tokens alone or in a batch (tested). Static
shapes also make the decode step capturable as a CUDA graph (``torch.compile(mode="reduce-overhead")``),
which removes the per-layer launch overhead that dominates a 0.5B model's step on a big GPU.

Flow and vocoder chunks run in their own thread (on CUDA, on their own stream), beside the decode loop, so
decoding never waits behind chunk work: chunks of requests that have not played anything yet go first,
then any request whose audio runs out soonest (earliest deadline). A cold voice's flow prefix is built
there too, while the LLM is still decoding the first tokens.

Sampling is batched on the device (`sample_tokens`): the official repetition-aware top-p/top-k sampling
for every row at once, with random numbers from a counter-based hash of (request seed, step), so a seeded
request draws the same tokens alone or batched, on any device, without a CPU generator. The tokens reach
the host one step late (the copy of step k overlaps step k+1), so there is no host sync per step; a job's
end (eos) is therefore seen one step after it was sampled and the extra step's token is discarded.
`llm.RasSampler` (CPU generator, one request at a time) stays the exact path of the parity tests.

Admission is bounded: ``slots`` requests run, ``max_waiting`` more may wait; beyond that `reserve`
raises `EngineBusy` at once. Cancelling a request frees its admission ticket immediately and its KV slot
at the worker's next iteration (within one decode step).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.base import TTSBusy
from assistant.tts.cosyvoice.llm import SpeechLM, SpeechLMConfig
from assistant.tts.cosyvoice.prompt_cache import DEFAULT_MAX_BYTES, PromptCache, digest
from assistant.tts.cosyvoice.streaming import Chunk, StreamingSynthesis, StreamSchedule
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

MASK32 = 0xFFFFFFFF


class EngineBusy(TTSBusy):
    """Every synthesis slot and every waiting place is taken; try again later (429 busy on the TTS API)."""


# --- the batched decoder -----------------------------------------------------------------------------------


class SlotDecoder(nn.Module):
    """Qwen2 decoding over a static per-slot KV cache (gpt-fast style), sharing the LM's weights.

    The layers' projections, norms and MLPs are HF's own modules (so numerics match the reference); only
    the attention over the cache and the cache writes are ours.
    """

    def __init__(self, lm: SpeechLM, slots: int, max_positions: int) -> None:
        super().__init__()
        qwen = lm.llm.model.model                      # HF Qwen2Model
        cfg = qwen.config
        self.lm = [lm]                                 # not a submodule: keep state_dict and .to() apart
        self.layers, self.norm, self.rotary = qwen.layers, qwen.norm, qwen.rotary_emb
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.slots, self.max_positions = slots, max_positions
        p = lm.llm_decoder.weight
        shape = (len(self.layers), slots, self.n_kv, max_positions, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, device=p.device, dtype=p.dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, device=p.device, dtype=p.dtype), persistent=False)
        self._graphed: Callable[..., torch.Tensor] | None = None
        self.graph: dict[str, Any] = {"path": f"eager ({p.device.type})", "capture_s": None, "error": None}

    @property
    def cache_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def _qkv(self, layer: nn.Module, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """h [n, T, D] normed, pos [n, T] → q [n, H, T, d], k and v [n, KV, T, d] (RoPE applied)."""
        n, t, _ = h.shape
        attn = layer.self_attn
        q = attn.q_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(n, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(h, pos)                 # [n, T, d]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    @torch.inference_mode()
    def prefill(
        self, slot: int, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Run one request's prompt x [L, D] into ``slot`` → last hidden state [D].

        ``past`` (from `prefix_kv`): keys/values [layers, KV, P, d] of the positions before x (a cached
        prompt start); they are copied into the slot and x continues at position P.
        """
        start = 0 if past is None else past[0].size(2)
        length = x.size(0)
        end = start + length
        if past is not None:
            self.k_cache[:, slot, :, :start] = past[0]
            self.v_cache[:, slot, :, :start] = past[1]
        pos = torch.arange(start, end, device=x.device).unsqueeze(0)  # [1, L]
        h = x.unsqueeze(0)                                             # [1, L, D]
        group = self.n_heads // self.n_kv
        mask = None
        if start:
            keys = torch.arange(end, device=x.device)
            mask = keys.unsqueeze(0) <= pos.view(-1, 1)                  # [L, P + L]: the past and causal
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            self.k_cache[li, slot, :, start:end] = k[0]
            self.v_cache[li, slot, :, start:end] = v[0]
            if start:
                k = self.k_cache[li, slot : slot + 1, :, :end]
                v = self.v_cache[li, slot : slot + 1, :, :end]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            if mask is None:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [1, H, L, d]
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[0, -1]

    @torch.inference_mode()
    def prefix_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [layers, KV, L, d] of a prompt start x [L, D] at positions 0..L-1 (to cache)."""
        length = x.size(0)
        pos = torch.arange(length, device=x.device).unsqueeze(0)
        h = x.unsqueeze(0)
        group = self.n_heads // self.n_kv
        ks, vs = [], []
        for layer in self.layers:
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            ks.append(k[0])
            vs.append(v[0])
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return torch.stack(ks), torch.stack(vs)

    def _decode(self, x: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One token for rows 0..n-1: x [n, D], pos [n] (where each row's token goes) → hidden [n, D]."""
        n = x.size(0)
        rows = torch.arange(n, device=x.device)
        keys = torch.arange(kv_len, device=x.device)
        mask = (keys.unsqueeze(0) <= pos.unsqueeze(1)).view(n, 1, 1, kv_len)  # each row sees its own past
        h = x.unsqueeze(1)                                                      # [n, 1, D]
        group = self.n_heads // self.n_kv
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos.unsqueeze(1))
            self.k_cache[li, rows, :, pos] = k[:, :, 0]                          # [n, KV, d]
            self.v_cache[li, rows, :, pos] = v[:, :, 0]
            keys_ = self.k_cache[li, :n, :, :kv_len]                             # [n, KV, S, d]
            vals_ = self.v_cache[li, :n, :, :kv_len]
            qg = q.reshape(n, self.n_kv, group, self.head_dim)                   # heads of one KV head together
            o = F.scaled_dot_product_attention(qg, keys_, vals_, attn_mask=mask)  # [n, KV, G, d]
            h = h + layer.self_attn.o_proj(o.reshape(n, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[:, 0]

    def _decode_static(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._decode(x, pos, self.max_positions)

    def enable_cuda_graphs(self) -> None:
        """Compile the all-slots decode step with CUDA graphs (static shapes: every slot, full cache); the
        capture itself happens in `capture` (at warm-up), never in the middle of a request."""
        self._graphed = torch.compile(self._decode_static, mode="reduce-overhead", fullgraph=True)
        self.graph = {"path": "cuda-graph (not captured yet)", "capture_s": None, "error": None}

    @torch.inference_mode()
    def capture(self) -> dict[str, Any]:
        """Compile and capture the graphed step now (a few dummy steps on free slots 0..), timing it; on
        failure fall back to eager and say why. Returns `graph`: which path runs, what the capture cost."""
        if self._graphed is None:
            return self.graph
        p = self.k_cache
        x = torch.zeros(self.slots, self.layers[0].self_attn.q_proj.in_features, device=p.device, dtype=p.dtype)
        pos = torch.zeros(self.slots, dtype=torch.long, device=p.device)
        t0 = time.perf_counter()
        try:
            for _ in range(3):  # warm-up run, recording run, one replay
                self._graphed(x, pos)
            if p.device.type == "cuda":
                torch.cuda.synchronize(p.device)
            self.graph = {"path": "cuda-graph", "capture_s": time.perf_counter() - t0, "error": None}
        except Exception as exc:  # pragma: no cover - depends on the device stack
            log.warning("cuda-graph capture failed (%s); decoding eagerly", exc)
            self._graphed = None
            self.graph = {"path": "eager (capture failed)", "capture_s": time.perf_counter() - t0, "error": str(exc)}
        log.info("cosyvoice decode path=%s capture_s=%s", self.graph["path"], self.graph["capture_s"])
        return self.graph

    @torch.inference_mode()
    def decode(self, x: torch.Tensor, pos: torch.Tensor, kv_len: int | None = None) -> torch.Tensor:
        """x [n, D], pos [n] for rows 0..n-1 (n <= slots) → hidden [n, D].

        Eager: only the first n rows and the keys up to ``kv_len`` (the longest row + 1; the caller knows it,
        so nothing is read back from the device). Graphed: always every slot and the whole cache (rows past n
        get a dummy token at position 0 of their own free slot).
        """
        n = x.size(0)
        if self._graphed is not None:
            xs = x.new_zeros(self.slots, x.size(1))
            ps = pos.new_zeros(self.slots)
            xs[:n], ps[:n] = x, pos
            try:
                return self._graphed(xs, ps)[:n].clone()
            except Exception as exc:  # pragma: no cover - depends on the device stack
                log.warning("cuda-graph decode failed (%s); using eager decoding", exc)
                self._graphed = None
                self.graph = {**self.graph, "path": "eager (graph failed at run time)", "error": str(exc)}
        if kv_len is None:
            kv_len = int(pos.max().item()) + 1
        return self._decode(x, pos, kv_len)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


# --- sampling on the device ---------------------------------------------------------------------------------


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


# --- jobs -------------------------------------------------------------------------------------------------


@dataclass
class SpeechJob:
    """One utterance (sentence or clause) to synthesise, and its progress.

    Decode state belongs to the decode thread, the stream to the chunk thread; ``decoded`` and
    ``decode_done`` are how tokens pass from one to the other (append, then set).
    """

    text_ids: torch.Tensor                      # [1, T]
    voice: CosyVoicePrompt
    prompt_text: torch.Tensor | None            # [1, Tp] ids before the text (transcript or instruction)
    prompt_speech: torch.Tensor | None          # [1, P] speech tokens the LLM continues (zero-shot)
    schedule: StreamSchedule
    deliver: Callable[[Chunk | BaseException | None], None]  # thread-safe; None = finished
    greedy: bool = False                        # argmax decoding (tests); else the official sampling
    min_tokens: int | None = None               # None: the model's 2 per text token
    max_tokens: int | None = None               # None: the model's 20 per text token
    ignore_eos: bool = False                    # benchmarks: exactly max_tokens tokens
    speed: float = 1.0
    seed: int | None = None                     # None: a random one (drawn at submit)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # decode thread
    slot: int = -1
    pos: int = 0                                # where the next token goes in the slot (host mirror)
    lo: int = 0
    hi: int = 0
    steps: int = 0                              # tokens sampled (stop ids included)
    decoded: list[int] = field(default_factory=list)
    decode_done: bool = False
    # chunk thread
    stream: StreamingSynthesis | None = None
    fed: int = 0                                # tokens handed to the stream
    t_due: float | None = None                  # when the stream's next chunk became due (queueing)
    # statistics (ms unless named otherwise)
    stats: dict[str, float] = field(default_factory=dict)
    t_submit: float = 0.0
    t_first_audio: float | None = None
    audio_s: float = 0.0

    def cancel(self) -> None:
        self.cancelled.set()


class Ticket:
    """An admission place held by one request (several jobs in turn); `release` frees it at once."""

    def __init__(self, owner: SpeechBatcher) -> None:
        self._owner: SpeechBatcher | None = owner

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release_ticket()


class SpeechBatcher:
    """The engine-wide workers: batched LLM decode steps in one thread, flow/vocoder chunks in another."""

    def __init__(
        self,
        lm: SpeechLM,
        flow: nn.Module,
        hift: nn.Module,
        *,
        slots: int = 4,
        max_waiting: int = 4,
        max_positions: int = 2048,
        cuda_graphs: bool = False,
        sample_rate: int = 24000,
        cache: PromptCache | None = None,
        cpu_threads: tuple[int, int] | None = None,
    ) -> None:
        self.lm, self.flow, self.hift = lm, flow, hift
        # On the CPU the two workers split the cores (torch's intra-op threads are per thread): two pools of
        # spinning OpenMP threads on the same cores wait at every barrier for each other (10x slower seen).
        n = torch.get_num_threads()
        self.cpu_threads = cpu_threads or (max(1, n // 2), max(1, n - n // 2))
        self.sample_rate = sample_rate
        self.slots, self.max_waiting = slots, max_waiting
        self.decoder = SlotDecoder(lm, slots, max_positions)
        if cuda_graphs:
            self.decoder.enable_cuda_graphs()
        self.cache = cache if cache is not None else PromptCache(DEFAULT_MAX_BYTES)
        p = lm.llm_decoder.weight
        self.device = p.device
        dev = p.device
        # per-slot decode state on the device (no host round trip per step)
        self._next = torch.zeros(slots, p.size(1), device=dev, dtype=p.dtype)       # next input embedding
        self._pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self._seeds = torch.zeros(slots, dtype=torch.long, device=dev)
        self._steps = torch.zeros(slots, dtype=torch.long, device=dev)
        self._lo = torch.zeros(slots, dtype=torch.long, device=dev)
        self._ignore_eos = torch.zeros(slots, dtype=torch.bool, device=dev)
        self._greedy = torch.zeros(slots, dtype=torch.bool, device=dev)
        self._recent = torch.full((slots, lm.cfg.win_size), -1, dtype=torch.long, device=dev)
        stop = torch.zeros(lm.cfg.speech_token_size + 3, dtype=torch.bool, device=dev)
        stop[list(lm.cfg.stop_ids)] = True
        self._stop_rows = stop
        self._cond = threading.Condition()
        self._incoming: list[SpeechJob] = []
        self._captures: list[threading.Event] = []
        self._tickets = 0
        self._stop = False
        self._waiting: list[SpeechJob] = []
        self._decoding: list[SpeechJob] = []
        self._inflight: tuple[torch.Tensor, list[SpeechJob], Any] | None = None
        self._free = list(range(slots))
        self._row_index: dict[tuple[int, ...], torch.Tensor] = {}
        self._chunk_cond = threading.Condition()
        self._chunking: list[SpeechJob] = []     # jobs whose stream the chunk thread serves
        self.steps = 0                          # decode steps run (stats)
        self.batch_rows = 0                     # sum of rows over steps (mean batch = batch_rows / steps)
        self.decode_s = 0.0                     # wall time of decode steps
        self.chunk_s = 0.0                      # wall time of chunk work
        self._chunk_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name="cosyvoice-decode", daemon=True)
        self._chunker = threading.Thread(target=self._run_chunks, name="cosyvoice-chunks", daemon=True)
        self._thread.start()
        self._chunker.start()

    # --- admission (any thread) ------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.slots + self.max_waiting

    @property
    def tickets(self) -> int:
        return self._tickets

    def reserve(self) -> Ticket:
        """A place for one request, or `EngineBusy` when all ``slots + max_waiting`` are held."""
        with self._cond:
            if self._stop:
                raise EngineBusy("the synthesis engine is shutting down")
            if self._tickets >= self.capacity:
                raise EngineBusy(
                    f"all {self.slots} synthesis slots and {self.max_waiting} waiting places are taken"
                )
            self._tickets += 1
        return Ticket(self)

    def _release_ticket(self) -> None:
        with self._cond:
            self._tickets -= 1
            self._cond.notify()

    def submit(self, job: SpeechJob) -> None:
        """Queue a job (its request holds a ticket); results arrive through ``job.deliver``."""
        job.t_submit = time.perf_counter()
        if job.seed is None:
            job.seed = random.getrandbits(62)
        with self._cond:
            self._incoming.append(job)
            self._cond.notify()

    def cancel(self, job: SpeechJob) -> None:
        job.cancel()
        with self._cond:
            self._cond.notify()
        with self._chunk_cond:
            self._chunk_cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        with self._chunk_cond:
            self._chunk_cond.notify()
        self._thread.join(timeout=5)
        self._chunker.join(timeout=5)

    def running(self) -> int:
        """Jobs holding a KV slot or still making chunks (for tests and metrics)."""
        with self._chunk_cond:
            chunking = set(map(id, self._chunking))
        return len(chunking | set(map(id, self._decoding)))

    def stats(self) -> dict[str, Any]:
        """Counters for logs, metrics and the bench."""
        return {
            "slots": self.slots,
            "tickets": self.tickets,
            "running": self.running(),
            "decode_steps": self.steps,
            "mean_batch": self.batch_rows / max(self.steps, 1),
            "decode_s": self.decode_s,
            "chunk_s": self.chunk_s,
            "kv_cache_mb": self.decoder.cache_bytes / 2**20,
            "decode_path": self.decoder.graph,
        }

    # --- the decode thread -------------------------------------------------------------------------------

    def capture(self, timeout: float | None = None) -> dict[str, Any]:
        """Capture the decode step's CUDA graph now, in the decode thread (graphs belong to the thread that
        records them); returns the decoder's `graph` record (path, capture seconds, error)."""
        done = threading.Event()
        with self._cond:
            self._captures.append(done)
            self._cond.notify()
        done.wait(timeout)
        return self.decoder.graph

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads[0])
        while True:
            with self._cond:
                while (not self._stop and not self._incoming and not self._waiting and not self._decoding
                       and not self._captures):
                    self._cond.wait()
                if self._stop:
                    break
                self._waiting.extend(self._incoming)
                self._incoming.clear()
                captures, self._captures = self._captures, []
            for done in captures:
                try:
                    self.decoder.capture()
                finally:
                    done.set()
            try:
                with torch.inference_mode():
                    self._iteration()
            except Exception as exc:  # a bug here must not kill every session: fail the jobs involved
                log.exception("cosyvoice decode iteration failed")
                self._inflight = None
                for job in self._decoding + self._waiting:
                    self._fail(job, exc)
        for done in self._captures:
            done.set()
        for job in self._decoding + self._waiting + self._incoming:
            self._fail(job, EngineBusy("the synthesis engine was closed"))

    def _iteration(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
        for job in [j for j in self._decoding if j.cancelled.is_set()]:
            self._end_decoding(job)
        while self._waiting and self._free:
            job = self._waiting.pop(0)
            try:
                self._start(job)
            except Exception as exc:
                log.exception("cosyvoice job failed to start")
                self._fail(job, exc)
                self._end_decoding(job)
        previous, self._inflight = self._inflight, None
        decoding = [j for j in self._decoding if j.slot >= 0]
        if decoding:
            self._inflight = self._step(decoding)           # queued on the device, not waited for
        if previous is not None:
            self._collect(*previous)                         # the step before: its tokens are ready by now
        if self._inflight is not None and self._inflight[2] is None:
            inflight, self._inflight = self._inflight, None  # CPU: nothing runs ahead, take the tokens now
            self._collect(*inflight)

    def _start(self, job: SpeechJob) -> None:
        """Prefill the prompt into a free slot (the prompt start from the cache) and sample the first token."""
        lm = self.lm
        t0 = time.perf_counter()
        prefix, rest = lm.build_lm_input_parts(job.text_ids, job.prompt_text, job.prompt_speech)
        lo, hi = lm.length_limits(int(job.text_ids.numel()))
        job.lo = lo if job.min_tokens is None else job.min_tokens
        job.hi = hi if job.max_tokens is None else job.max_tokens
        length = prefix.size(1) + rest.size(1)
        room = self.decoder.max_positions - length
        if room < 1:
            raise ValueError(f"prompt of {length} positions exceeds max_positions {self.decoder.max_positions}")
        if job.hi > room:
            log.warning("speech tokens capped at %d (max_positions %d)", room, self.decoder.max_positions)
            job.hi = room
        key = digest(id(lm), job.prompt_text if job.prompt_text is not None else "none")
        past = self.cache.get_or_make("llm", key, lambda: self.decoder.prefix_kv(prefix[0]))
        job.slot = self._free.pop(0)
        self._free.sort()
        hidden = self.decoder.prefill(job.slot, rest[0], past)
        job.pos = length
        s = job.slot
        self._pos[s] = length
        self._seeds[s] = int(job.seed or 0) & ((1 << 62) - 1)
        self._steps[s] = 0
        self._lo[s] = job.lo
        self._ignore_eos[s] = job.ignore_eos
        self._greedy[s] = job.greedy
        self._recent[s] = -1
        self._decoding.append(job)
        tokens = self._sample(hidden.unsqueeze(0), [job])
        self._collect(tokens, [job], None)                   # one read-back per request, at its start
        job.stats["admit_wait_ms"] = 1000 * (t0 - job.t_submit)
        job.stats["prefill_ms"] = 1000 * (time.perf_counter() - t0)
        job.stats["decode_ms"] = 0.0
        with self._chunk_cond:
            self._chunking.append(job)
            self._chunk_cond.notify()

    def _rows(self, jobs: list[SpeechJob]) -> torch.Tensor:
        """The jobs' slots as a device index (made once per combination, not copied every step)."""
        key = tuple(j.slot for j in jobs)
        rows = self._row_index.get(key)
        if rows is None:
            rows = self._row_index[key] = torch.tensor(key, dtype=torch.long, device=self.device)
        return rows

    def _sample(self, hidden: torch.Tensor, jobs: list[SpeechJob]) -> torch.Tensor:
        """hidden [B, D] of jobs' rows → their next tokens [B] on the device; device state updated."""
        rows = self._rows(jobs)

        def sel(t: torch.Tensor) -> torch.Tensor:
            return t[rows]

        logp = self.lm.logp_from_hidden(hidden)                                          # [B, V]
        cfg = self.lm.cfg
        steps, lo, ignore = sel(self._steps), sel(self._lo), sel(self._ignore_eos)
        eos_block = torch.zeros_like(self._stop_rows).unsqueeze(0).expand(len(jobs), -1).clone()
        eos_block[:, cfg.eos_id] = steps < lo
        eos_block |= ignore.unsqueeze(1) & self._stop_rows.unsqueeze(0)
        logp = logp.masked_fill(eos_block, -float("inf"))
        tokens = sample_tokens(logp, sel(self._recent), sel(self._seeds), steps, sel(self._greedy), cfg)
        idx = rows
        self._recent[idx] = torch.cat([self._recent[idx][:, 1:], tokens.unsqueeze(1)], dim=1)
        self._steps[idx] += 1
        emb = self.lm.speech_embedding.weight
        self._next[idx] = emb[tokens.clamp(max=emb.size(0) - 1)]
        return tokens

    def _step(self, decoding: list[SpeechJob]) -> tuple[torch.Tensor, list[SpeechJob], Any]:
        """One decode step for every decoding job, stacked by slot (rows 0..max slot); tokens stay on device."""
        t0 = time.perf_counter()
        n = max(j.slot for j in decoding) + 1
        kv_len = max(j.pos for j in decoding) + 1
        # Idle rows below the top slot carry whatever their last input was to their own free slot.
        hidden = self.decoder.decode(self._next[:n], self._pos[:n], kv_len)              # [n, D]
        rows = self._rows(decoding)
        self._pos[rows] += 1
        for j in decoding:
            j.pos += 1
        tokens = self._sample(hidden[rows], decoding)
        event = None
        if self.device.type == "cuda":
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            tokens = host
        self.steps += 1
        self.batch_rows += len(decoding)
        dt = time.perf_counter() - t0
        self.decode_s += dt
        for j in decoding:
            j.stats["decode_ms"] = j.stats.get("decode_ms", 0.0) + 1000 * dt
        return tokens, list(decoding), event

    def _collect(self, tokens: torch.Tensor, jobs: list[SpeechJob], event: Any) -> None:
        """A step's tokens on the host: hand them to the jobs' streams, end jobs at a stop id or their limit."""
        t0 = time.perf_counter()
        if event is not None:
            event.synchronize()
        values = tokens.tolist()
        if event is not None:
            self.decode_s += time.perf_counter() - t0
        stop_ids = self.lm.cfg.stop_ids
        notify = False
        for job, token in zip(jobs, values, strict=True):
            if job.decode_done or job.slot < 0:
                continue  # ended a step ago: this row's token is the discarded extra step
            job.steps += 1
            if token in stop_ids:
                self._end_decoding(job)
            else:
                job.decoded.append(token)
                if len(job.decoded) >= job.hi:
                    self._end_decoding(job)
            notify = True
        if notify:
            with self._chunk_cond:
                self._chunk_cond.notify()

    def _end_decoding(self, job: SpeechJob) -> None:
        job.decode_done = True
        job.stats["llm_wall_ms"] = 1000 * (time.perf_counter() - job.t_submit)
        if job in self._decoding:
            self._decoding.remove(job)
        if job.slot >= 0:
            self._free.append(job.slot)
            self._free.sort()
            job.slot = -1
        with self._chunk_cond:
            self._chunk_cond.notify()

    # --- the chunk thread --------------------------------------------------------------------------------

    def _run_chunks(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads[1])
        ctx = torch.cuda.stream(self._chunk_stream) if self._chunk_stream is not None else contextlib.nullcontext()
        with ctx:
            while True:
                with self._chunk_cond:
                    while not self._stop and not self._work():
                        self._chunk_cond.wait()
                    if self._stop:
                        break
                    jobs = list(self._chunking)
                try:
                    with torch.inference_mode():
                        self._chunk_iteration(jobs)
                except Exception as exc:  # pragma: no cover - defensive: fail the jobs, keep serving
                    log.exception("cosyvoice chunk iteration failed")
                    for job in jobs:
                        self._fail(job, exc)
        with self._chunk_cond:
            jobs, self._chunking = list(self._chunking), []
        for job in jobs:
            self._send(job, EngineBusy("the synthesis engine was closed"))

    def _work(self) -> bool:
        """Anything for the chunk thread (called under its lock)?"""
        for job in self._chunking:
            if job.cancelled.is_set() or job.stream is None:
                return True
            done = job.decode_done
            if job.fed < len(job.decoded) or (done and not job.stream.llm_done):
                return True
            if job.stream.due():
                return True
        return False

    def _feed(self, job: SpeechJob) -> None:
        """Hand the job's new tokens to its stream (creating it on first use: a cold voice's prefix here)."""
        if job.stream is None:
            job.stream = StreamingSynthesis(
                self.flow, self.hift, job.voice, job.schedule, cache=self.cache, seed=job.seed, speed=job.speed,
                capacity_tokens=min(job.hi, 8 * int(job.text_ids.numel()) + 50),
            )
            job.stats["setup_ms"] = job.stream.setup_ms
        done = job.decode_done                    # read before the tokens: all of them are there once set
        decoded = job.decoded
        while job.fed < len(decoded):
            job.stream.add(decoded[job.fed])
            job.fed += 1
        if done and not job.stream.llm_done and job.fed == len(job.decoded):
            job.stream.finish()

    def _chunk_iteration(self, jobs: list[SpeechJob]) -> None:
        for job in jobs:
            if job.cancelled.is_set():
                self._finish(job)
                continue
            try:
                self._feed(job)
            except Exception as exc:
                log.exception("cosyvoice stream failed to start")
                self._fail(job, exc)
                continue
            assert job.stream is not None
            if job.stream.due() and job.t_due is None:
                job.t_due = time.perf_counter()         # after its stream exists: a cold prefix is not queueing
        due = [j for j in jobs if j.stream is not None and not j.cancelled.is_set() and j.stream.due()]
        if not due:
            return

        def deadline(j: SpeechJob) -> float:
            if j.t_first_audio is None:
                return j.t_submit - 1e6  # nothing played yet: before everyone who is playing
            return j.t_first_audio + j.audio_s

        self._make_chunk(min(due, key=deadline))        # one chunk, then look again (new tokens, cancels)

    def _make_chunk(self, job: SpeechJob) -> None:
        assert job.stream is not None
        t0 = time.perf_counter()
        queue_ms = 1000 * (t0 - job.t_due) if job.t_due is not None else 0.0
        job.t_due = None
        try:
            chunk = job.stream.next_chunk()
        except Exception as exc:
            log.exception("cosyvoice chunk failed")
            self._fail(job, exc)
            return
        self.chunk_s += time.perf_counter() - t0
        chunk.queue_ms = queue_ms
        if chunk.audio.size == 0 and not chunk.final:
            return  # everything held back for context (vocoder look-ahead): nothing to play yet
        if job.t_first_audio is None:
            job.t_first_audio = time.perf_counter()
            chunk.setup_ms = job.stats.get("setup_ms", 0.0)
            job.stats.update(first_flow_ms=chunk.flow_ms, first_vocoder_ms=chunk.vocoder_ms,
                             first_queue_ms=queue_ms, first_packet_ms=1000 * (job.t_first_audio - job.t_submit),
                             tokens_at_first_packet=float(chunk.tokens_seen),
                             decoded_at_first_packet=float(len(job.decoded)))
        job.audio_s += chunk.audio.size / self.sample_rate
        if chunk.final:
            job.stats["stream_bytes"] = float(job.stream.nbytes)
        chunk.stats = dict(job.stats, tokens=float(len(job.decoded)))
        self._send(job, chunk)
        if chunk.final:
            self._send(job, None)
            self._finish(job)

    def _send(self, job: SpeechJob, item: Chunk | BaseException | None) -> None:
        try:
            job.deliver(item)
        except RuntimeError:  # the consumer's event loop is gone
            job.cancel()

    def _fail(self, job: SpeechJob, exc: BaseException) -> None:
        self._send(job, exc)
        job.cancel()
        self._finish(job)

    def _finish(self, job: SpeechJob) -> None:
        """Drop the job from the chunk thread's list (the decode thread frees its slot on `cancelled`)."""
        job.cancel()
        with self._chunk_cond:
            if job in self._chunking:
                self._chunking.remove(job)
        with self._cond:
            self._cond.notify()
        job.stream = None


__all__ = ["EngineBusy", "SlotDecoder", "SpeechBatcher", "SpeechJob", "Ticket", "sample_tokens", "uniforms"]
