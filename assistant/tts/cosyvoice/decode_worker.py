"""The decode thread: one batched speech-LLM step for every active request per iteration.

    submit(job) ──▶ waiting ──prefill into a free KV slot──▶ decoding ──eos──▶ (slot freed)
                                      │  ONE step for all decoding jobs per iteration (stacked, sampled on
                                      │  the device; a replayed CUDA graph on CUDA)
                                      ▼
                        the chunk thread (`chunk_scheduler.py`) turns each job's tokens into audio

The tokens reach the host one step late (the copy of step k overlaps step k+1), so there is no host sync per
step; a job's end (eos) is therefore seen one step after it was sampled and the extra step's token is
discarded. On CUDA the thread runs on its own stream and waits on the events of its own steps only, never on
the device (the chunk thread's work runs on another stream meanwhile). Each step's time is counted apart for
steps that ran while the chunk thread was busy and steps that ran alone (``stats``), so contention shows.

Cancelling a request frees its KV slot at the next iteration (within one decode step).

First packets first (``hold_ahead``, the default on the CPU, where both threads share the cores and the memory
bandwidth): while a job's first chunk is under way, only jobs still short of their own first chunk's tokens
are stepped; the others' later tokens would only slow that chunk down (`first_packets_first`). And waiting
jobs are prefilled one at a time, each once the jobs before it have their first chunk's tokens
(`admissible`): a job's first chunk then runs beside the next one's prefill, where one prefill of all of them
would have made every first packet wait for the whole batch. On a GPU neither is held: batching is cheap there.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING

import torch

from assistant.tts.cosyvoice.admission import EngineBusy
from assistant.tts.cosyvoice.decode_state import DecodeState
from assistant.tts.cosyvoice.engine_thread import EngineThread
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.llm import SpeechLM
from assistant.tts.cosyvoice.prompt_cache import PromptCache

if TYPE_CHECKING:
    from assistant.tts.cosyvoice.chunk_scheduler import ChunkWorker

log = logging.getLogger(__name__)

# tokens (host or device), their jobs, and on CUDA the event that says the copy to the host is done
Inflight = tuple[torch.Tensor, list[SpeechJob], "torch.cuda.Event | None"]


def first_chunk_tokens(job: SpeechJob, lookahead: int) -> int:
    """Tokens the job's first chunk needs: its first hop and the flow encoder's look-ahead."""
    return job.schedule.first_hop + lookahead


def short_of_first_chunk(job: SpeechJob, lookahead: int) -> bool:
    """Has the job played nothing and still too few tokens for its first chunk?"""
    return job.t_first_audio is None and len(job.decoded) < first_chunk_tokens(job, lookahead)


def first_packets_first(decoding: list[SpeechJob], first_chunks: bool, lookahead: int) -> list[SpeechJob]:
    """The jobs to step now: all, unless a first chunk is under way (``first_chunks``); then only those that
    still lack tokens for their first chunk."""
    if not first_chunks:
        return decoding
    return [j for j in decoding if short_of_first_chunk(j, lookahead)]


def admissible(free: int, decoding: list[SpeechJob], lookahead: int) -> int:
    """How many waiting jobs to prefill now when first packets go first: one, once no job is short of its
    first chunk's tokens. On shared cores a prefill batch costs the sum of its prompts; one at a time, each
    job's first chunk (chunk thread) runs beside the next job's prefill (decode thread)."""
    if free == 0 or any(short_of_first_chunk(j, lookahead) for j in decoding):
        return 0
    return 1


class DecodeWorker(EngineThread):
    """Owns the KV slots (which job holds which) and the decode thread; the model side is `DecodeState`."""

    def __init__(
        self, lm: SpeechLM, cache: PromptCache, chunks: ChunkWorker, *, slots: int, max_positions: int,
        cuda_graphs: bool, static_step: bool, cpu_threads: int, lookahead: int = 3, hold_ahead: bool | None = None,
    ) -> None:
        self.state = DecodeState(lm, slots, max_positions, cuda_graphs=cuda_graphs, static_step=static_step)
        super().__init__("cosyvoice-decode", self.state.device, cpu_threads)
        self.cache, self.chunks = cache, chunks
        self.lookahead = lookahead
        self.hold_ahead = self.device.type == "cpu" if hold_ahead is None else hold_ahead
        self._incoming: list[SpeechJob] = []
        self._captures: list[threading.Event] = []
        self._waiting: list[SpeechJob] = []
        self._decoding: list[SpeechJob] = []
        self._inflight: Inflight | None = None
        self._free = list(range(slots))
        self.steps = 0                  # decode steps run
        self.batch_rows = 0             # sum of rows over steps (mean batch = batch_rows / steps)
        self.decode_s = 0.0             # wall time of decode steps
        self.busy_steps = 0             # steps that ran while the chunk thread was working
        self.busy_s = 0.0
        self.held_rows = 0              # job-steps held back while a first chunk was under way (others stepped)
        self.held_s = 0.0               # time no job was stepped because all were held

    @property
    def path(self) -> dict[str, object]:
        """Which decode step runs: the CUDA graph (with its capture time and replays), the static step, eager."""
        return self.state.path

    def submit(self, job: SpeechJob) -> None:
        job.t_submit = time.perf_counter()
        if job.seed is None:
            job.seed = random.getrandbits(62)
        self.chunks.expect(job)
        with self._cond:
            self._incoming.append(job)
            self._cond.notify()

    def capture(self, timeout: float | None = None) -> dict[str, object]:
        """Capture the decode graph now, in the decode thread (a graph belongs to the thread that records it,
        between two steps); returns `path`."""
        done = threading.Event()
        with self._cond:
            self._captures.append(done)
            self._cond.notify()
        done.wait(timeout)
        return self.path

    def running(self) -> set[int]:
        return set(map(id, self._decoding))

    def stats(self) -> dict[str, object]:
        alone = self.steps - self.busy_steps
        return {
            "decode_steps": self.steps,
            "mean_batch": self.batch_rows / max(self.steps, 1),
            "decode_s": self.decode_s,
            "decode_step_ms_alone": 1000 * (self.decode_s - self.busy_s) / alone if alone else None,
            "decode_step_ms_beside_chunks": 1000 * self.busy_s / self.busy_steps if self.busy_steps else None,
            "decode_rows_held": self.held_rows,
            "decode_held_s": self.held_s,
            "kv_cache_mb": self.state.cache_bytes / 2**20,
            "decode_path": self.path,
        }

    # --- the thread ----------------------------------------------------------------------------------------

    def _after(self) -> None:
        for done in self._captures:
            done.set()
        for job in self._decoding + self._waiting + self._incoming:
            self.chunks.fail(job, EngineBusy("the synthesis engine was closed"))

    def _loop(self) -> None:
        while True:
            with self._cond:
                t_wait = None
                while (not self._stop and not self._incoming and not self._captures and self._inflight is None
                       and not self._stepping() and not self._startable()):
                    t_wait = t_wait or time.perf_counter()
                    self._cond.wait()
                if t_wait is not None and self._decoding:  # jobs were decoding: held (first packets first)
                    self.held_s += time.perf_counter() - t_wait
                if self._stop:
                    break
                self._waiting.extend(self._incoming)
                self._incoming.clear()
                captures, self._captures = self._captures, []
            self._follow_default_stream()  # inputs made elsewhere (voices, warm-up) on the default stream
            for done in captures:
                try:
                    self.state.capture()
                finally:
                    done.set()
            try:
                with torch.inference_mode():
                    self._iteration()
            except Exception as exc:  # a bug here must not kill every session: fail the jobs involved
                log.exception("cosyvoice decode iteration failed")
                self._inflight = None
                for job in self._decoding + self._waiting:
                    self.chunks.fail(job, exc)

    def _room(self) -> int:
        """How many waiting jobs may start now (free slots; `admissible` when first packets go first)."""
        if not self.hold_ahead:
            return len(self._free)
        return admissible(len(self._free), [j for j in self._decoding if j.slot >= 0], self.lookahead)

    def _startable(self) -> bool:
        """Waiting jobs to start now, or cancelled ones to drop."""
        return bool(self._waiting) and (self._room() > 0 or any(j.cancelled.is_set() for j in self._waiting))

    def _stepping(self) -> list[SpeechJob]:
        """The decoding jobs to step now (`first_packets_first` when holding ahead); cancelled ones too, so
        that the iteration ends them."""
        decoding = [j for j in self._decoding if j.slot >= 0]
        if not self.hold_ahead:
            return decoding
        now = first_packets_first(decoding, self.chunks.first_chunks, self.lookahead)
        return now + [j for j in decoding if j.cancelled.is_set() and j not in now]

    def _iteration(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
        for job in [j for j in self._decoding if j.cancelled.is_set()]:
            self._end_decoding(job)
        room = self._room()
        starting: list[SpeechJob] = []
        while self._waiting and len(starting) < room:
            starting.append(self._waiting.pop(0))
        if starting:
            try:
                self._start(starting)
            except Exception as exc:
                log.exception("cosyvoice jobs failed to start")
                for job in starting:
                    self.chunks.fail(job, exc)
                    self._end_decoding(job)
        previous, self._inflight = self._inflight, None
        active = [j for j in self._decoding if j.slot >= 0]
        decoding = [j for j in self._stepping() if not j.cancelled.is_set()]
        self.held_rows += len(active) - len(decoding)
        if decoding:
            self._inflight = self._step(decoding)           # queued on the device, not waited for
        if previous is not None:
            self._collect(*previous)                         # the step before: its tokens are ready by now
        if self._inflight is not None and self._inflight[2] is None:
            inflight, self._inflight = self._inflight, None  # CPU: nothing runs ahead, take the tokens now
            self._collect(*inflight)

    def _start(self, jobs: list[SpeechJob]) -> None:
        """Give the jobs free slots, prefill their prompts in one forward (each prompt's start from the cache)
        and hand their first tokens on."""
        t0 = time.perf_counter()
        prompts = []
        for job in list(jobs):
            try:
                prompts.append(self.state.prompt(job, self.cache))
            except Exception as exc:  # this job only (a prompt too long for a slot, ...)
                log.exception("cosyvoice job failed to start")
                jobs.remove(job)
                self.chunks.fail(job, exc)
                self._end_decoding(job)
        if not jobs:
            return
        for job in jobs:
            job.slot = self._free.pop(0)
        self._free.sort()
        tokens = self.state.start(jobs, prompts)
        self._decoding.extend(jobs)
        self._collect(tokens, jobs, None)                    # one read-back per start, not per step
        for job in jobs:
            job.stats["admit_wait_ms"] = 1000 * (t0 - job.t_submit)
            job.stats["prefill_ms"] = 1000 * (time.perf_counter() - t0)
            job.stats["decode_ms"] = 0.0
            job.stats["prefill_batch"] = float(len(jobs))
            self.chunks.add(job)

    def _step(self, decoding: list[SpeechJob]) -> Inflight:
        """One decode step for every decoding job; tokens stay on the device (a pinned copy on CUDA)."""
        t0 = time.perf_counter()
        busy = self.chunks.busy
        tokens = self.state.step(decoding)
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
        if busy:
            self.busy_steps += 1
            self.busy_s += dt
        for j in decoding:
            j.stats["decode_ms"] = j.stats.get("decode_ms", 0.0) + 1000 * dt
        return tokens, list(decoding), event

    def _collect(self, tokens: torch.Tensor, jobs: list[SpeechJob], event: torch.cuda.Event | None) -> None:
        """A step's tokens on the host: hand them to the jobs' streams, end jobs at a stop id or their limit."""
        t0 = time.perf_counter()
        if event is not None:
            event.synchronize()
        values = tokens.tolist()
        if event is not None:
            self.decode_s += time.perf_counter() - t0
        stop_ids = self.state.lm.cfg.stop_ids
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
            self.chunks.wake()

    def _end_decoding(self, job: SpeechJob) -> None:
        job.decode_done = True
        job.stats["llm_wall_ms"] = 1000 * (time.perf_counter() - job.t_submit)
        if job in self._decoding:
            self._decoding.remove(job)
        if job.slot >= 0:
            self._free.append(job.slot)
            self._free.sort()
            job.slot = -1
        self.chunks.wake()


__all__ = ["DecodeWorker"]
