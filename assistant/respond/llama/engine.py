"""The engine: one GGUF model, one llama.cpp context with a sequence per slot, one thread decoding them together.

- **One engine thread decodes every active slot in one batch per step**: each generating slot's next token,
  and a chunk (``respond.prefill_chunk``) of each new prompt beside them. A long reply in one session cannot
  delay another session's first token by more than a step.
- **A conversation's prefix stays in its slot's KV cache across turns** (``kv_reuse.py``): a new prompt goes to
  the free slot where it costs least (its own tokens the slot lacks, plus another live conversation's it would
  throw away); only the new tokens are evaluated.
- **Bounded.** ``respond.slots`` replies at once, ``respond.max_waiting`` waiting for a slot; past that the turn
  fails with a "busy" :class:`~assistant.respond.base.ResponderError`.
- **A first clause before another reply's later words.** A reply whose reader has speech ahead of its caller
  (:meth:`LlamaEngine.voiced`: ~1.5 s of whole clauses) sits out the steps in which another reply is not voiced yet
  (its prompt, or its first clauses before that much speech: "I'm sorry," alone is not), for at most
  ``YIELD_BUDGET_S`` in all: that caller is waiting in silence, this one is hearing the
  reply. The idle slots' preparation of their next prompt goes on in such steps ``FIRST_DUE_AHEAD_TOKENS`` at a
  time.
- **Cancellation.** :meth:`LlamaEngine.cancel` flags the request; the engine drops it before its next step.
- **No crashing CPU path.** llama.cpp's "extra buffer types" (weights repacked for AMX or other CPU-specific
  kernels) are off unless ``respond.extra_buffers`` turns them on: on Intel Xeons with AMX they segfault in the
  first decode. The model loads through ``native.py``, the one module that imports llama.cpp.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assistant.cpus import default_threads, free_cpus, usable_cpus
from assistant.respond.base import ResponderError
from assistant.respond.llama.kv_reuse import KEEP_S, ReusePlan, plan_reuse, slot_cost
from assistant.respond.llama.model_file import ModelFileError

log = logging.getLogger(__name__)

AHEAD_TOKENS = 32  # a reply runs at most this many tokens ahead of its reader (the speech path), then waits
STEP_GRACE = 8.0  # a step is hung past this many times what its tokens took on average (load comes and goes)
# The most a voiced reply sits out steps, in all, while other replies are before their first clause: well under
# the speech it has ahead (~1.5 s, clauses.VOICED_CHARS), so its next clause is not late for its caller.
YIELD_BUDGET_S = 0.3
# In a step a first clause waits for, the idle slots' preparation of their next prompt adds at most this many
# tokens: each costs ~4 ms beside a 25 ms step (SmolLM2, one thread, 500 tokens of context; 64 tokens: 272 ms), so
# a whole chunk of 256 would make that step ~1 s (extrapolated). Left out of such steps altogether, preparation
# never finished at four sessions and 12 of 160 turns evaluated ~300 tokens of history while their caller waited
# (up to 3 s).
FIRST_DUE_AHEAD_TOKENS = 8

MSG_BUSY = "The language model is busy. Please try again."
MSG_FAILED = "The language model failed to answer."
MSG_TOO_LONG = "The instructions are longer than the language model's context."  # prompt.py says it too
MSG_CLOSED = "The language model is shutting down."


@dataclass(frozen=True)
class _Token:
    text: str
    n_tokens: int
    logprob: float | None = None  # the model's log-probability of this token (a request that asked: doubt.py)


@dataclass(frozen=True)
class _End:
    reason: str  # stop | length | cancelled | error
    input_tokens: int
    output_tokens: int
    error: str = ""


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    max_tokens: int
    temperature: float
    deliver: Callable[[_Token | _End], None]  # thread-safe
    submitted: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    cancelled_at: float = 0.0
    done: bool = False
    reused: int = 0
    shifted: int = 0  # of the reused tokens, those moved into place when it started (a shift costs time)
    generated: int = 0
    after_cancel: int = 0  # tokens made after the cancel was asked (at most the step already running)
    consumed: int = 0  # tokens the reader has taken (the engine stays at most AHEAD_TOKENS ahead of it)
    stalled: bool = False  # the engine is waiting for the reader
    first_token_at: float = 0.0
    slot: int = -1
    warmup: bool = False
    logprobs: bool = False  # give each token its log-probability (the reply's doubt: respond/llama/doubt.py)
    voiced: bool = False  # its reader has speech ahead (voiced): it may sit out steps for others' first clauses
    yielded_s: float = 0.0  # how long it has sat out steps so far (at most YIELD_BUDGET_S)
    key: str = ""  # the conversation it belongs to (a session id; "" unknown): which slot holds it (_admit)


@dataclass(eq=False)
class _Slot:
    seq: int
    cache: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds, at positions 0..n-1
    request: _Request | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to evaluate
    ahead: list[int] = field(default_factory=list)  # no reply running: the next prompt's start, evaluated meanwhile
    last: _Request | None = None  # the reply that ran here last (whose conversation the cache holds)
    next_token: int | None = None  # sampled, not yet evaluated
    sampler: Any = None
    decoder: Any = None  # the reply's incremental UTF-8 decoder
    used_at: float = 0.0
    key: str = ""  # the conversation whose tokens the cache holds ("" unknown)


_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 cont


class _LlamaLog:
    """llama.cpp's log lines into ours: warnings and errors only, one line per message (fragments joined)."""

    def __init__(self) -> None:
        self.buffer = ""
        self.level = logging.DEBUG
        self.callback: Any = None

    def install(self, llama_cpp: Any) -> None:
        if self.callback is None:
            self.callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self.callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, user_data: Any) -> None:
        if level != 5:  # 5 continues the previous message
            self.level = _LOG_LEVELS.get(level, logging.DEBUG)
        self.buffer += text.decode("utf-8", errors="replace")
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            if line.strip() and self.level >= logging.WARNING:
                log.log(self.level, "llama.cpp %s", line.strip())


_LLAMA_LOG = _LlamaLog()


def install_llama_log(llama_cpp: Any) -> None:
    """Route llama.cpp's log lines into ours (warnings and errors only) from here on, in this process."""
    _LLAMA_LOG.install(llama_cpp)


class LlamaEngine:
    """One GGUF model, one llama.cpp context with ``slots`` sequences, one thread that decodes them together."""

    def __init__(self, path: Path, *, slots: int = 4, context_tokens: int = 2048, threads: int = 0,
                 prompt_threads: int = 0, gpu_layers: int = 0, prefill_chunk: int = 256, max_waiting: int = 8,
                 ahead_tokens: int = AHEAD_TOKENS, extra_buffers: bool = False) -> None:
        from assistant.respond.llama.native import llama_cpp, load_model, model_params

        if slots < 1 or context_tokens < 64 or max_waiting < 0 or prefill_chunk < 1:
            raise ValueError("respond.slots >= 1, respond.context_tokens >= 64, respond.max_waiting >= 0 and "
                             "respond.prefill_chunk >= 1 are required")
        self.L = llama_cpp
        self.path = path
        self.slots_n = slots
        self.max_waiting = max_waiting
        self.prefill_chunk = prefill_chunk
        self.ahead_tokens = max(1, ahead_tokens)
        self.threads = threads if threads > 0 else default_threads()
        # One conversation's prompt on more threads when the cores are free at its step's start (_wide_threads)
        self.usable_cpus = usable_cpus()
        self.prompt_threads = max(self.threads, prompt_threads)
        self._batch_threads = self.threads
        install_llama_log(llama_cpp)
        llama_cpp.llama_backend_init()
        t0 = time.perf_counter()
        rss0 = _rss_bytes()
        self.model = load_model(path, model_params(gpu_layers=gpu_layers, extra_buffers=extra_buffers))
        if not self.model:
            raise ModelFileError(f"llama.cpp could not load the language model file (corrupt, truncated, or a "
                                 f"model this llama.cpp does not know): {path}")
        try:
            cparams = llama_cpp.llama_context_default_params()
            n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
            per_slot = min(context_tokens, n_ctx_train) if n_ctx_train > 0 else context_tokens
            cparams.n_ctx = per_slot * slots
            cparams.n_seq_max = slots
            cparams.kv_unified = False  # each slot its own stream of per_slot cells
            cparams.n_batch = max(512, prefill_chunk + slots)
            cparams.n_ubatch = cparams.n_batch
            cparams.n_threads = self.threads
            cparams.n_threads_batch = self.threads
            cparams.no_perf = True
            # On CPU, llama.cpp's flash attention made a 16-token prompt at 1024 tokens of context 179 ms against
            # 129 ms without it (SmolLM2, 1 thread): the cost of a long history. On a GPU it is the faster one.
            cparams.flash_attn_type = -1 if gpu_layers != 0 else 0
            self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
            if not self.ctx:
                raise ModelFileError(f"llama.cpp could not make a context ({slots} slots × {per_slot} tokens) for "
                                     f"the language model file: {path}")
        except BaseException:
            llama_cpp.llama_model_free(self.model)
            raise
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ctx))
        self.n_batch = int(cparams.n_batch)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.can_shift = bool(llama_cpp.llama_memory_can_shift(self.mem))
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.description = _model_desc(llama_cpp, self.model)
        self.template = _chat_template(llama_cpp, self.model)
        self._piece = ctypes.create_string_buffer(256)
        self.load_seconds = time.perf_counter() - t0
        self.file_bytes = path.stat().st_size
        self.kv_bytes_per_slot = _kv_bytes(llama_cpp, self.model, self.n_ctx_seq)
        self.rss_bytes = max(0, _rss_bytes() - rss0)
        self._slots = [_Slot(seq) for seq in range(slots)]
        self._home: dict[str, _Slot] = {}  # a conversation's latest slot (at most one key per slot)
        self._waiting: deque[_Request] = deque()
        self._prepares: list[tuple[_Request, list[int]]] = []
        self._ahead_in_step = False  # a step evaluates some slot's next-prompt start (``settled``)
        self._cond = threading.Condition()
        self._closing = False
        self._rotate = 0
        self._step_tokens = 0  # tokens of the step running now (0: none)
        self._timed_tokens, self._timed_s, self._token_s = 0.0, 0.0, 0.0  # what steps took (_time_step)
        self.stats: dict[str, int] = {"requests": 0, "busy": 0, "cancelled": 0, "tokens_after_cancel": 0,
                                      "prompt_tokens": 0, "reused_tokens": 0, "generated_tokens": 0,
                                      "steps": 0, "errors": 0, "prepared": 0, "wide_steps": 0, "yields": 0}
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        self._thread.start()
        log.info("llm.loaded file=%s model=%r slots=%d ctx_per_slot=%d threads=%d prompt_threads=%d gpu_layers=%d "
                 "can_shift=%s file_mb=%.0f kv_mb_per_slot=%.1f rss_mb=%.0f load_s=%.2f", path, self.description, slots,
                 self.n_ctx_seq, self.threads, self.prompt_threads, gpu_layers, self.can_shift, self.file_bytes / 2**20,
                 self.kv_bytes_per_slot / 2**20, self.rss_bytes / 2**20, self.load_seconds)

    # --- tokens ------------------------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """``text`` as tokens, special tokens (the template's markers) parsed, no BOS added (the template has it)."""
        data = text.encode("utf-8")
        size = len(data) + 16
        buf = (self.L.llama_token * size)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, size, False, True)
        if n < 0:  # too small: -n is the size needed
            size = -n
            buf = (self.L.llama_token * size)()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, size, False, True)
        return list(buf[:n])

    def token_text(self, token: int) -> str:
        return bytes(self.L.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", errors="replace")

    def _piece_bytes(self, token: int) -> bytes:
        n = self.L.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        if n < 0:
            self._piece = ctypes.create_string_buffer(-n + 16)
            n = self.L.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        return bytes(self._piece.raw[: max(0, n)])

    # --- requests (any thread) ---------------------------------------------------------------------------------
    def submit(self, prompt: list[int], max_tokens: int, temperature: float,
               deliver: Callable[[_Token | _End], None], *, warmup: bool = False, logprobs: bool = False,
               key: str = "") -> _Request:
        """Queue a reply; :class:`ResponderError` (busy) if every slot is taken and the waiting room is full.
        ``logprobs``: each token comes with the model's log-probability of it. ``key``: the conversation it
        belongs to (a session id), so its slot is told from another conversation's (:meth:`_admit`)."""
        if not prompt:
            raise ValueError("empty prompt")
        room = self.n_ctx_seq - len(prompt)
        if room < 1:
            raise ResponderError(MSG_TOO_LONG)
        request = _Request(prompt, max(1, min(max_tokens, room)), temperature, deliver, warmup=warmup,
                           logprobs=logprobs, key=key)
        with self._cond:
            if self._closing:
                raise ResponderError(MSG_CLOSED)
            busy = sum(1 for s in self._slots if s.request is not None and not s.request.cancelled)
            waiting = sum(1 for r in self._waiting if not r.cancelled)
            if busy >= self.slots_n and waiting >= self.max_waiting:
                self.stats["busy"] += 1
                log.warning("llm.busy slots=%d waiting=%d", busy, waiting)
                raise ResponderError(MSG_BUSY)
            self._waiting.append(request)
            self.stats["requests"] += 0 if warmup else 1
            self._cond.notify()
        return request

    def prepare(self, request: _Request, tokens: list[int]) -> None:
        """After ``request`` ended: make its slot's cache hold ``tokens`` (the start of the conversation's next
        prompt), evaluating what is missing while the slot is idle, so the next turn evaluates only its own words.
        Ignored if the slot has been given to another reply meanwhile."""
        with self._cond:
            self._prepares.append((request, tokens))
            self._cond.notify()

    def consumed(self, request: _Request, n_tokens: int) -> None:
        """The reader has taken ``n_tokens`` of ``request``'s tokens: a reply waiting for it may go on."""
        with self._cond:  # under the lock: the engine decides to wait for the reader under it too
            request.consumed = n_tokens
            if request.stalled:
                request.stalled = False
                self._cond.notify()

    def voiced(self, request: _Request) -> None:
        """``request``'s reader has speech ahead of its caller (~1.5 s of whole clauses): from now on the reply may sit
        out steps (up to ``YIELD_BUDGET_S`` in all) in which another reply is not voiced yet (thread-safe)."""
        request.voiced = True

    def cancel(self, request: _Request) -> None:
        """Stop ``request``: the engine drops it before its next step (thread-safe, idempotent)."""
        if request.done or request.cancelled:
            return
        with self._cond:
            request.cancelled = True
            request.cancelled_at = time.monotonic()
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread (every reply still running ends cancelled) and free the model."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            log.error("llm.close engine thread did not stop; leaving the model loaded")
            return
        for slot in self._slots:
            if slot.sampler is not None:
                self.L.llama_sampler_free(slot.sampler)
                slot.sampler = None
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)
        log.info("llm.closed file=%s", self.path)

    def progress(self) -> tuple[bool, int, float]:
        """(has work it could be doing now, decode steps so far, how long the step running now may take): a
        watchdog that sees work and no new steps for a while knows the engine is stuck (a reply waiting for its
        reader is not work), but a step is given its time: one prompt chunk of a 3B model on a CPU takes longer
        than the watchdog's usual limit. A step may take ``STEP_GRACE`` times what its tokens took on average."""
        with self._cond:
            busy = any(s.request is not None and (s.pending or not s.request.stalled) for s in self._slots)
            steps = self.stats["steps"]
        tokens, per_token = self._step_tokens, self._token_s
        return busy, steps, STEP_GRACE * tokens * per_token if tokens else 0.0

    @property
    def active(self) -> int:
        """Slots running a reply."""
        return sum(1 for s in self._slots if s.request is not None)

    @property
    def settled(self) -> bool:
        """Nothing left to evaluate ahead of the next turns: no preparation queued, none being applied (read under
        the lock the engine applies them under: unlocked, a queue just taken but not yet in a slot read as settled,
        and a test saw the preparation counted after it), and no slot's next-prompt start waiting or in a step."""
        with self._cond:
            return not self._prepares and not self._ahead_in_step and not any(s.ahead for s in self._slots)

    @property
    def waiting(self) -> int:
        """Replies waiting for a slot."""
        return sum(1 for r in self._waiting if not r.cancelled)

    def slot_caches(self) -> list[int]:
        """Tokens each slot's KV cache holds (tests, diagnostics)."""
        return [len(s.cache) for s in self._slots]

    # --- the engine thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._has_work():
                    self._cond.wait()
                if self._closing:
                    break
                self._reap()
                self._prepare_idle()
                self._admit()
            try:
                self._step()
            except Exception as exc:  # never let the thread die: fail the replies of this step
                log.exception("llm.step_failed")
                self._fail_all(f"{type(exc).__name__}: {exc}")
            finally:
                self._ahead_in_step = False
        for slot in self._slots:
            if slot.request is not None:
                self._finish(slot, "cancelled")
        for request in self._waiting:
            request.done = True
            request.deliver(_End("cancelled", len(request.prompt), 0, MSG_CLOSED))
        self._waiting.clear()

    def _has_work(self) -> bool:
        """Something to do: a cancel to reap, a request to admit, a prompt to evaluate, a reply whose reader is
        not too far behind (under the lock)."""
        if self._prepares or any(r.cancelled for r in self._waiting) or (
                self._waiting and any(s.request is None for s in self._slots)):
            return True
        work = False
        for slot in self._slots:
            r = slot.request
            if r is None:
                work = work or bool(slot.ahead)
                continue
            if r.cancelled or slot.pending:
                work = True
            elif slot.next_token is not None:
                r.stalled = r.generated - r.consumed >= self.ahead_tokens
                work = work or not r.stalled
        return work

    def _reap(self) -> None:
        """Drop cancelled requests, waiting or running (under the lock)."""
        for slot in self._slots:
            if slot.request is not None and slot.request.cancelled:
                self._finish(slot, "cancelled")
        if any(r.cancelled for r in self._waiting):
            for request in [r for r in self._waiting if r.cancelled]:
                request.done = True
                request.deliver(_End("cancelled", len(request.prompt), 0))
                self.stats["cancelled"] += 1
            self._waiting = deque(r for r in self._waiting if not r.cancelled)

    def _prepare_idle(self) -> None:
        """Apply the pending :meth:`prepare` calls whose slot still holds their conversation (under the lock)."""
        prepares, self._prepares = self._prepares, []
        for request, tokens in prepares:
            slot = self._slots[request.slot] if 0 <= request.slot < len(self._slots) else None
            if slot is None or slot.request is not None or slot.last is not request or not tokens:
                continue
            if len(tokens) >= self.n_ctx_seq:
                continue
            plan = plan_reuse(slot.cache, [*tokens, -1], can_shift=self.can_shift)  # every token may be reused
            self._move(slot, plan)
            slot.cache = list(tokens[: plan.n_past])
            slot.ahead = list(tokens[plan.n_past:])
            self.stats["prepared"] += 1

    def _move(self, slot: _Slot, plan: ReusePlan) -> ReusePlan:
        """The slot's KV cache to ``plan``: shifted chunks moved into place, everything past ``n_past`` gone."""
        L, mem, seq = self.L, self.mem, slot.seq
        for start, n, delta in plan.shifts:
            # The cached tokens skipped before this chunk go; the chunk moves down to where the prompt has it.
            L.llama_memory_seq_rm(mem, seq, start + delta, start)
            L.llama_memory_seq_add(mem, seq, start, start + n, delta)
        if not L.llama_memory_seq_rm(mem, seq, plan.n_past, -1):
            L.llama_memory_seq_rm(mem, seq, -1, -1)  # a partial removal refused: start this slot over
            return ReusePlan(0)
        return plan

    def _admit(self) -> None:
        """Give waiting requests (first come, first served) the free slot where they cost least
        (:func:`~assistant.respond.llama.kv_reuse.slot_cost`: their tokens the slot lacks, plus another live
        conversation's they would throw away); a slot that holds no other live conversation before one that does
        (:meth:`_holds_other`, for requests that name their conversation), and among equals the one used longest
        ago."""
        while self._waiting:
            free = [s for s in self._slots if s.request is None]
            if not free:
                return
            request = self._waiting.popleft()
            now = time.monotonic()
            plans = [(plan_reuse(s.cache, request.prompt, can_shift=self.can_shift), s) for s in free]
            _, plan, slot = min(((self._choice_cost(p, s, request, now), p, s) for p, s in plans),
                                key=lambda cps: cps[0])
            self._start(slot, request, plan)

    def _choice_cost(self, plan: ReusePlan, slot: _Slot, request: _Request, now: float) -> tuple[bool, int, float]:
        """What giving ``request`` the free ``slot`` costs, compared in order: it throws away another live
        conversation, the tokens (:func:`~assistant.respond.llama.kv_reuse.slot_cost`), the slot's last use."""
        other = self._holds_other(slot, request)
        idle = now - slot.used_at if other is None else (0.0 if other else KEEP_S)
        return bool(other), slot_cost(plan, len(request.prompt), len(slot.cache), idle), slot.used_at

    def _holds_other(self, slot: _Slot, request: _Request) -> bool | None:
        """Whether ``slot``'s cache is another conversation's that is still going on: one of another key whose
        latest slot it is. A stale copy of a conversation (it has run in another slot since) or the request's own
        is not: taking it throws nothing away. None where either key is unknown (then a cache used within
        ``KEEP_S`` counts as live, :func:`~assistant.respond.llama.kv_reuse.slot_cost`). Two sessions with nearly
        the same history (the bench plays the same clips in each) otherwise took each other's slots turn after
        turn, each evaluating ~200-300 tokens again (2 s before the first word at four sessions)."""
        if not (request.key and slot.key):
            return None
        return slot.key != request.key and self._home.get(slot.key) is slot

    def _start(self, slot: _Slot, request: _Request, plan: ReusePlan) -> None:
        plan = self._move(slot, plan)
        slot.ahead = []  # not evaluated yet: the new prompt's plan covers it
        slot.last = request
        if self._home.get(slot.key) is slot:  # the conversation held here is gone from it
            del self._home[slot.key]
        slot.key = request.key
        if request.key:
            self._home[request.key] = slot
        slot.cache = list(request.prompt[: plan.n_past])
        slot.pending = list(request.prompt[plan.n_past:])
        slot.request, slot.next_token = request, None
        slot.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        slot.sampler = self._sampler(request.temperature)
        request.slot, request.reused = slot.seq, plan.n_past
        request.shifted = sum(n for _, n, _ in plan.shifts)
        self.stats["prompt_tokens"] += len(request.prompt)
        self.stats["reused_tokens"] += plan.n_past
        log.debug("llm.start slot=%d prompt=%d reused=%d shifted=%d waited_ms=%.0f", slot.seq, len(request.prompt),
                  plan.n_past, request.shifted, (time.monotonic() - request.submitted) * 1000)

    def _sampler(self, temperature: float) -> Any:
        L = self.L
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if temperature <= 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            return chain
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(40))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(0.95, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(0.05, 1))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(temperature))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(L.LLAMA_DEFAULT_SEED))
        return chain

    def _step(self) -> None:
        """One batch: every generating slot's next token, then prompt chunks; decode; sample."""
        L, batch = self.L, self.batch
        batch.n_tokens = 0
        outputs: list[tuple[_Slot, int]] = []
        added: list[tuple[_Slot, list[int]]] = []
        order = self._slots[self._rotate:] + self._slots[: self._rotate]
        self._rotate = (self._rotate + 1) % len(self._slots)
        generating: list[_Slot] = []
        for slot in order:  # generating slots: one token each, unless far ahead of their reader
            request = slot.request
            if request is not None and slot.next_token is not None:
                if request.generated - request.consumed >= self.ahead_tokens:
                    with self._cond:  # (see consumed)
                        request.stalled = request.generated - request.consumed >= self.ahead_tokens
                    if request.stalled:
                        continue
                generating.append(slot)
        first_due = any(s.request is not None and s.pending for s in order) or any(
            s.request is not None and not s.request.voiced for s in generating)
        yielding: list[_Request] = []
        for slot in generating:  # first: a voiced reply sits out a step another's first clause needs (its budget)
            request = slot.request
            assert request is not None and slot.next_token is not None
            if first_due and request.voiced and request.yielded_s < YIELD_BUDGET_S:
                yielding.append(request)
                continue
            outputs.append((slot, self._add(slot, [slot.next_token], True)))
            added.append((slot, [slot.next_token]))
            slot.next_token = None
        budget = max(self.prefill_chunk, 1)
        for slot in order:  # then the prompts, a chunk each while the step's budget lasts
            if slot.request is None or not slot.pending or budget <= 0:
                continue
            room = self.n_batch - batch.n_tokens
            chunk = slot.pending[: min(budget, room)]
            if not chunk:
                break
            last = len(chunk) == len(slot.pending)
            index = self._add(slot, chunk, last)
            del slot.pending[: len(chunk)]
            added.append((slot, chunk))
            budget -= len(chunk)
            if last:
                outputs.append((slot, index))
        if first_due:  # a first clause waits for this step: the preparation goes on, a few tokens at a time
            budget = min(budget, FIRST_DUE_AHEAD_TOKENS)
        for slot in order:  # idle slots: the start of their conversation's next prompt, with the room left
            if slot.request is None and slot.ahead and budget > 0 and batch.n_tokens < self.n_batch:
                chunk = slot.ahead[: min(budget, self.n_batch - batch.n_tokens)]
                self._ahead_in_step = True  # before the chunk leaves ``ahead``: never read as settled between
                self._add(slot, chunk, False)
                del slot.ahead[: len(chunk)]
                added.append((slot, chunk))
                budget -= len(chunk)
        if batch.n_tokens == 0:
            return
        self._step_tokens = n = int(batch.n_tokens)
        self._wide_threads(n, len({slot.seq for slot, _ in added}))
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, batch)
        self._step_tokens = 0
        seconds = time.perf_counter() - t0
        self._time_step(n, seconds)
        self.stats["steps"] += 1
        for request in yielding:
            request.yielded_s += seconds
        self.stats["yields"] += len(yielding)
        if rc != 0:
            slots = {id(s): s for s, _ in added}
            log.error("llm.decode_failed rc=%d tokens=%d slots=%d", rc, batch.n_tokens, len(slots))
            for slot in slots.values():
                self._reset_slot(slot)
                self._finish(slot, "error", MSG_FAILED)
            return
        for slot, tokens in added:
            slot.cache.extend(tokens)
        now = time.monotonic()
        for slot, index in outputs:
            request = slot.request
            assert request is not None
            token = int(L.llama_sampler_sample(slot.sampler, self.ctx, index))
            if request.cancelled:
                request.after_cancel += 1
                self.stats["tokens_after_cancel"] += 1
                self._finish(slot, "cancelled")
                continue
            if L.llama_vocab_is_eog(self.vocab, token):
                self._finish(slot, "stop")
                continue
            request.generated += 1
            if not request.first_token_at:
                request.first_token_at = now
            text = slot.decoder.decode(self._piece_bytes(token))
            request.deliver(_Token(text, request.generated, self._logprob(index, token) if request.logprobs else None))
            if request.generated >= request.max_tokens or len(slot.cache) + 1 >= self.n_ctx_seq:
                self._finish(slot, "length")
            else:
                slot.next_token = token

    def _wide_threads(self, tokens: int, slots: int) -> None:
        """The threads of a step of ``tokens`` of ``slots`` conversations: llama.cpp evaluates a step of several
        tokens (a prompt) on its batch threads, one token on ``threads``. A prompt is what a caller waits for before
        the reply's first word, so one conversation's prompt, alone in its step, gets the cores that are free as it
        starts, up to ``prompt_threads`` (nothing else running: two threads on two idle cores, ~1.6x faster); otherwise
        ``threads``, because llama.cpp's threads wait for each other at every layer and one that has to share its
        core stalls the step (two threads on two busy cores made a prompt ~2x slower than one), and a step that
        other conversations' tokens share would stall them too. The reply's tokens that follow stay on
        ``threads``, leaving the other cores to the voice."""
        if self.prompt_threads <= self.threads:
            return
        want = self.threads
        if tokens > 1 and slots == 1:
            want = max(self.threads, min(self.prompt_threads, free_cpus(self.usable_cpus)))
        if want > self.threads:
            self.stats["wide_steps"] += 1
        if want != self._batch_threads:
            self.L.llama_set_n_threads(self.ctx, self.threads, want)
            self._batch_threads = want

    def _time_step(self, tokens: int, seconds: float) -> None:
        """What a token costs in a step, over the steps so far (the recent ones weigh more)."""
        self._timed_tokens = self._timed_tokens * 0.9 + tokens
        self._timed_s = self._timed_s * 0.9 + seconds
        self._token_s = self._timed_s / self._timed_tokens

    def _logprob(self, index: int, token: int) -> float:
        """The model's log-probability of ``token`` at batch row ``index`` (a log-softmax over the vocabulary: ~0.1 ms
        for SmolLM2's 49k tokens, so only for a request that asks)."""
        import numpy as np

        logits = np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
        top = float(logits.max())
        return float(logits[token]) - top - float(np.log(np.exp(logits - top).sum()))

    def _add(self, slot: _Slot, tokens: list[int], logits_last: bool) -> int:
        """Append ``tokens`` (continuing the slot's positions) to the batch; the index of the last one."""
        batch = self.batch
        pos = len(slot.cache)  # a slot adds one run per step (its next token, or a prompt chunk)
        for k, token in enumerate(tokens):
            i = batch.n_tokens
            batch.token[i] = token
            batch.pos[i] = pos + k
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = slot.seq
            batch.logits[i] = bool(logits_last and k == len(tokens) - 1)
            batch.n_tokens = i + 1
        return int(batch.n_tokens - 1)

    def _reset_slot(self, slot: _Slot) -> None:
        self.L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        slot.cache = []

    def _finish(self, slot: _Slot, reason: str, error: str = "") -> None:
        request = slot.request
        if request is None:
            return
        slot.request, slot.pending, slot.next_token = None, [], None
        slot.used_at = time.monotonic()
        if slot.sampler is not None:
            self.L.llama_sampler_free(slot.sampler)
            slot.sampler = None
        if slot.decoder is not None and reason in ("stop", "length"):
            tail = slot.decoder.decode(b"", final=True)
            if tail:
                request.deliver(_Token(tail, request.generated))
        slot.decoder = None
        request.done = True
        if reason == "cancelled":
            self.stats["cancelled"] += 1
            log.info("llm.cancelled slot=%d generated=%d tokens_after_cancel=%d", slot.seq, request.generated,
                     request.after_cancel)
        elif reason == "error":
            self.stats["errors"] += 1
        if not request.warmup:
            self.stats["generated_tokens"] += request.generated
        request.deliver(_End(reason, len(request.prompt), request.generated, error))

    def _fail_all(self, why: str) -> None:
        with self._cond:
            for slot in self._slots:
                if slot.request is not None:
                    self._reset_slot(slot)
                    self._finish(slot, "error", MSG_FAILED)
        log.error("llm.failed_step reason=%s", why)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _model_desc(L: Any, model: Any) -> str:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_model_desc(model, buf, len(buf))
    return buf.value[: max(0, n)].decode("utf-8", errors="replace")


def _chat_template(L: Any, model: Any) -> str:
    raw = L.llama_model_chat_template(model, None)
    return raw.decode("utf-8", errors="replace") if raw else ""


def _kv_bytes(L: Any, model: Any, n_ctx: int) -> int:
    """f16 K and V for ``n_ctx`` positions of every layer (the cache one slot takes)."""
    n_head = max(1, int(L.llama_model_n_head(model)))
    head_dim = int(L.llama_model_n_embd(model)) // n_head
    width = int(L.llama_model_n_head_kv(model)) * head_dim
    return int(L.llama_model_n_layer(model)) * n_ctx * 2 * width * 2

