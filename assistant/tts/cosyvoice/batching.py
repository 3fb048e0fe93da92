"""One worker thread per process that runs every active CosyVoice2 request on the device.

    submit(job) ──▶ waiting ──prefill into a free KV slot──▶ decoding ──eos──▶ vocoding ──▶ done
                                      │                          ▲
                                      └── each loop iteration: ONE decode step for all decoding jobs
                                          (stacked, one forward), then the chunks that are due

Continuous batching of the speech LLM: `SlotDecoder` keeps a static KV cache with one row (slot) per
concurrent request, ``[layers, slots, kv_heads, max_positions, head_dim]``, and runs Qwen2's layers over
all rows at once with its own attention (each row masked to its own length and at its own RoPE position).
Rows never see each other, so a request decodes to the same tokens alone or in a batch (tested). Static
shapes also make the decode step capturable as a CUDA graph (``torch.compile(mode="reduce-overhead")``),
which removes the per-layer launch overhead that dominates a 0.5B model's step on a big GPU.

Flow and vocoder chunks run in the same thread between decode steps: chunks of requests that have not
played anything yet go first, then any request whose audio runs out soonest (earliest deadline); chunks
that are comfortably ahead of playback wait, so decoding keeps going for everyone.

Admission is bounded: ``slots`` requests run, ``max_waiting`` more may wait; beyond that `reserve`
raises `EngineBusy` at once. Cancelling a request frees its admission ticket immediately and its KV slot
at the worker's next iteration (within one decode step).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.cosyvoice.llm import GreedySampler, RasSampler, SpeechLM
from assistant.tts.cosyvoice.streaming import Chunk, FlowPrefixCache, StreamingSynthesis, StreamSchedule
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

# A chunk whose request still has this much audio queued ahead of the listener can wait for the next
# iteration; decode steps for everyone matter more then.
VOCODE_SLACK_S = 0.6


class EngineBusy(RuntimeError):
    """Every synthesis slot and every waiting place is taken; try again later (HTTP 503)."""


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
    def prefill(self, slot: int, x: torch.Tensor) -> torch.Tensor:
        """Run one request's prompt x [L, D] into ``slot`` (positions 0..L-1) → last hidden state [D]."""
        length = x.size(0)
        pos = torch.arange(length, device=x.device).unsqueeze(0)  # [1, L]
        h = x.unsqueeze(0)                                         # [1, L, D]
        group = self.n_heads // self.n_kv
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(h), pos)
            self.k_cache[li, slot, :, :length] = k[0]
            self.v_cache[li, slot, :, :length] = v[0]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [1, H, L, d]
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(1, length, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)[0, -1]

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
        """Compile the all-slots decode step with CUDA graphs (static shapes: every slot, full cache)."""
        self._graphed = torch.compile(self._decode_static, mode="reduce-overhead", fullgraph=True)

    @torch.inference_mode()
    def decode(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [n, D], pos [n] for rows 0..n-1 (n <= slots) → hidden [n, D].

        Eager: only the first n rows and the keys up to the longest row. Graphed: always every slot and
        the whole cache (rows past n get a dummy token at position 0 of their own free slot).
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
        return self._decode(x, pos, int(pos.max().item()) + 1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


# --- jobs -------------------------------------------------------------------------------------------------


@dataclass
class SpeechJob:
    """One utterance (sentence or clause) to synthesise, and its progress (owned by the worker thread)."""

    text_ids: torch.Tensor                      # [1, T]
    voice: CosyVoicePrompt
    prompt_text: torch.Tensor | None            # [1, Tp] ids before the text (transcript or instruction)
    prompt_speech: torch.Tensor | None          # [1, P] speech tokens the LLM continues (zero-shot)
    schedule: StreamSchedule
    sampler: GreedySampler | RasSampler
    deliver: Callable[[Chunk | BaseException | None], None]  # thread-safe; None = finished
    min_tokens: int | None = None               # None: the model's 2 per text token
    max_tokens: int | None = None               # None: the model's 20 per text token
    ignore_eos: bool = False                    # benchmarks: exactly max_tokens tokens
    speed: float = 1.0
    seed: int | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    # worker state
    slot: int = -1
    stream: StreamingSynthesis | None = None
    decoded: list[int] = field(default_factory=list)
    pos: int = 0
    next_input: torch.Tensor | None = None      # [D] embedding of the last token
    lo: int = 0
    hi: int = 0
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
    """The engine-wide worker: batched LLM decode steps, interleaved flow/vocoder chunks."""

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
    ) -> None:
        self.lm, self.flow, self.hift = lm, flow, hift
        self.sample_rate = sample_rate
        self.slots, self.max_waiting = slots, max_waiting
        self.decoder = SlotDecoder(lm, slots, max_positions)
        if cuda_graphs:
            self.decoder.enable_cuda_graphs()
        self.prefixes = FlowPrefixCache()
        self._cond = threading.Condition()
        self._incoming: list[SpeechJob] = []
        self._tickets = 0
        self._stop = False
        self._waiting: list[SpeechJob] = []
        self._running: list[SpeechJob] = []
        self._free = list(range(slots))
        self.steps = 0                          # decode steps run (stats)
        self.batch_rows = 0                     # sum of rows over steps (mean batch = batch_rows / steps)
        self._thread = threading.Thread(target=self._run, name="cosyvoice-batcher", daemon=True)
        self._thread.start()

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
        with self._cond:
            self._incoming.append(job)
            self._cond.notify()

    def cancel(self, job: SpeechJob) -> None:
        job.cancel()
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def running(self) -> int:
        """Jobs holding a KV slot or vocoding (worker view; for tests and metrics)."""
        return len(self._running)

    # --- the worker thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._stop and not self._incoming and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stop:
                    break
                self._waiting.extend(self._incoming)
                self._incoming.clear()
            try:
                with torch.inference_mode():
                    self._iteration()
            except Exception as exc:  # a bug here must not kill every session: fail the jobs involved
                log.exception("cosyvoice batcher iteration failed")
                for job in self._running + self._waiting:
                    self._fail(job, exc)
        for job in self._running + self._waiting + self._incoming:
            self._fail(job, EngineBusy("the synthesis engine was closed"))

    def _iteration(self) -> None:
        self._drop_cancelled()
        self._admit()
        decoding = [j for j in self._running if j.slot >= 0]
        if decoding:
            self._step(decoding)
        self._vocode(any(j.slot >= 0 for j in self._running))

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
        for job in [j for j in self._running if j.cancelled.is_set()]:
            self._finish(job)

    def _admit(self) -> None:
        while self._waiting and self._free:
            job = self._waiting.pop(0)
            try:
                self._start(job)
            except Exception as exc:
                log.exception("cosyvoice job failed to start")
                self._fail(job, exc)

    def _start(self, job: SpeechJob) -> None:
        """Prefill the prompt into a free slot and sample the first token."""
        lm = self.lm
        x = lm.build_lm_input(job.text_ids, job.prompt_text, job.prompt_speech)[0]   # [L, D]
        lo, hi = lm.length_limits(int(job.text_ids.numel()))
        job.lo = lo if job.min_tokens is None else job.min_tokens
        job.hi = hi if job.max_tokens is None else job.max_tokens
        room = self.decoder.max_positions - x.size(0)
        if room < 1:
            raise ValueError(f"prompt of {x.size(0)} positions exceeds max_positions {self.decoder.max_positions}")
        if job.hi > room:
            log.warning("speech tokens capped at %d (max_positions %d)", room, self.decoder.max_positions)
            job.hi = room
        job.stream = StreamingSynthesis(
            self.flow, self.hift, job.voice, job.schedule, prefixes=self.prefixes, seed=job.seed, speed=job.speed
        )
        job.slot = self._free.pop(0)
        self._free.sort()
        self._running.append(job)
        hidden = self.decoder.prefill(job.slot, x)
        job.pos = x.size(0)
        self._accept(job, lm.logp_from_hidden(hidden))

    def _step(self, decoding: list[SpeechJob]) -> None:
        """One decode step for every decoding job, stacked by slot (rows 0..max slot)."""
        n = max(j.slot for j in decoding) + 1
        p = self.lm.llm_decoder.weight
        x = torch.zeros(n, p.size(1), device=p.device, dtype=p.dtype)                 # [n, D]
        pos = torch.zeros(n, dtype=torch.long, device=p.device)
        for j in decoding:
            x[j.slot], pos[j.slot] = j.next_input, j.pos
        # Idle rows below the top slot carry a dummy token to position 0 of their own free slot.
        hidden = self.decoder.decode(x, pos)                                           # [n, D]
        logp = self.lm.logp_from_hidden(hidden[[j.slot for j in decoding]])            # [B, V]
        self.steps += 1
        self.batch_rows += len(decoding)
        for j, row in zip(decoding, logp, strict=True):
            j.pos += 1
            self._accept(j, row)

    def _accept(self, job: SpeechJob, logp: torch.Tensor) -> None:
        """Sample the next token from logp [V]; feed it to the job's stream or end its decoding."""
        cfg = self.lm.cfg
        step = len(job.decoded)
        if job.ignore_eos:
            logp = logp.clone()
            logp[list(cfg.stop_ids)] = -float("inf")
        elif step < job.lo:
            logp = logp.clone()
            logp[cfg.eos_id] = -float("inf")
        token = job.sampler(logp, job.decoded)
        assert job.stream is not None
        if token in cfg.stop_ids:
            self._end_decoding(job)
            return
        job.decoded.append(token)
        job.stream.add(token)
        if len(job.decoded) >= job.hi:
            self._end_decoding(job)
            return
        job.next_input = self.lm.speech_embedding.weight[token]

    def _end_decoding(self, job: SpeechJob) -> None:
        assert job.stream is not None
        job.stream.finish()
        self._free_slot(job)

    def _free_slot(self, job: SpeechJob) -> None:
        if job.slot >= 0:
            self._free.append(job.slot)
            self._free.sort()
            job.slot = -1

    def _vocode(self, decoding: bool) -> None:
        """Make due chunks: first chunks first, then by deadline; defer the comfortable ones while decoding."""
        due = [j for j in self._running if j.stream is not None and j.stream.due() and not j.cancelled.is_set()]
        if not due:
            return
        now = time.perf_counter()

        def deadline(j: SpeechJob) -> float:
            if j.t_first_audio is None:
                return j.t_submit - 1e6  # nothing played yet: before everyone who is playing
            return j.t_first_audio + j.audio_s

        due.sort(key=deadline)
        for i, job in enumerate(due):
            urgent = job.t_first_audio is None or deadline(job) - now < VOCODE_SLACK_S
            if decoding and i > 0 and not urgent:
                continue
            self._make_chunk(job)

    def _make_chunk(self, job: SpeechJob) -> None:
        assert job.stream is not None
        try:
            chunk = job.stream.next_chunk()
        except Exception as exc:
            log.exception("cosyvoice chunk failed")
            self._fail(job, exc)
            return
        if chunk.audio.size == 0 and not chunk.final:
            return  # everything held back for context (vocoder look-ahead): nothing to play yet
        if job.t_first_audio is None:
            job.t_first_audio = time.perf_counter()
        job.audio_s += chunk.audio.size / self.sample_rate
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
        self._finish(job)

    def _finish(self, job: SpeechJob) -> None:
        self._free_slot(job)
        if job in self._running:
            self._running.remove(job)
        if job in self._waiting:
            self._waiting.remove(job)
        job.stream = None


def describe(batcher: SpeechBatcher) -> dict[str, Any]:
    """Counters for logs and metrics."""
    return {
        "slots": batcher.slots,
        "tickets": batcher.tickets,
        "running": batcher.running(),
        "decode_steps": batcher.steps,
        "mean_batch": batcher.batch_rows / max(batcher.steps, 1),
        "kv_cache_mb": batcher.decoder.cache_bytes / 2**20,
    }


__all__ = ["EngineBusy", "SlotDecoder", "SpeechBatcher", "SpeechJob", "Ticket", "describe"]
