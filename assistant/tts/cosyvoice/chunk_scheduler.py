"""The chunk thread: every running request's audio, chunks batched across streams, earliest deadline first.

Each request's stream makes its chunks as work steps (`StreamingSynthesis.chunk_steps`: encoder work of its
own, flow solves and vocoder windows yielded as `batch_work.Work`). One round of this thread:

1. feed every job the tokens decoded since the last round (a job's first tokens create its stream);
2. take the most urgent job with a chunk due or under way — the one whose audio so far runs out first
   (`SpeechJob.deadline`; a job that has played nothing yet before all others) — and advance it to its next
   piece of work;
3. fill the batch with other due or started jobs whose next piece has the same key (same solve length and
   step count, or the same vocoder window), in deadline order, up to ``max_batch``;
4. run the batch as one model call, then advance each member to its next piece (or to its finished chunk,
   which is delivered at once).

So a batch never waits for a stream that is not due, the most urgent stream is always in the batch, and the
others ride along for the price of one call. A warm voice prepared for it (`first_chunk.py`) makes the first
chunks of its streams as two static graphs (flow, vocoder), one replay each per batch. When no chunk is due, the
round builds a cold voice's flow prefix one encoder chunk at a time (`prefix_builds.py`), so later requests of
that voice are warm while no stream ever waits for a whole prefix, and then prepares that voice's static first
chunk; no first chunk waits for either: they pause while any request, from its submission (`expect`) on, has
not played its first chunk. A voice prepared explicitly (`prepare`: warm-up, a registered voice) is prepared
between two rounds.

On CUDA the thread runs on its own stream; it synchronises that stream only (for stage timings), never the
device, so the decode thread's steps and a graph capture there are not disturbed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from assistant.tts.cosyvoice.admission import EngineBusy
from assistant.tts.cosyvoice.batch_work import Work, WorkSteps, run_grouped
from assistant.tts.cosyvoice.engine_thread import EngineThread
from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
from assistant.tts.cosyvoice.flow import CausalFlow
from assistant.tts.cosyvoice.flow_arena import FlowArena
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.hift import HiFTVocoder
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.prefix_builds import PrefixBuilds
from assistant.tts.cosyvoice.prompt_cache import PromptCache
from assistant.tts.cosyvoice.streaming import Chunk, StreamingSynthesis

log = logging.getLogger(__name__)

MAX_BUILT_WAITING = 8   # prefixes built beside cold requests whose static first chunk waits for an idle round


@dataclass(eq=False)
class _Prepare:
    """A voice's static first chunk to prepare, and the event its caller waits on."""

    prefix: FlowPrefix
    done: threading.Event = field(default_factory=threading.Event)
    record: dict[str, object] = field(default_factory=dict)


@dataclass(eq=False)
class _Task:
    """A job's chunk under way: its steps and the piece of work it waits for."""

    steps: WorkSteps[Chunk]
    job: SpeechJob
    pending: Work | None = None
    t_start: float = 0.0
    queue_ms: float = 0.0


class ChunkWorker(EngineThread):
    """Owns the jobs' streams; see the module doc for one round."""

    def __init__(
        self, flow: CausalFlow, hift: HiFTVocoder, cache: PromptCache, *, sample_rate: int, max_batch: int,
        buckets: tuple[int, ...] = (), cpu_threads: int = 1, first_chunk: FirstChunkGraphs | None = None,
        arena: FlowArena | None = None,
    ) -> None:
        super().__init__("cosyvoice-chunks", next(flow.parameters()).device, cpu_threads)
        self.flow, self.hift, self.cache = flow, hift, cache
        self.sample_rate, self.max_batch, self.buckets = sample_rate, max(1, max_batch), buckets
        self.first_chunk, self.arena = first_chunk, arena
        self.wake_decoder: Callable[[], None] = lambda: None
        self._jobs: list[SpeechJob] = []
        self._arriving: set[SpeechJob] = set()   # submitted, not handed over yet (in prefill or decoding)
        self._tasks: dict[SpeechJob, _Task] = {}
        self._prepares: list[_Prepare] = []      # voices to prepare between two rounds (and who waits)
        self._built: deque[FlowPrefix] = deque(maxlen=MAX_BUILT_WAITING)   # built here, to prepare when idle
        self._builds = PrefixBuilds(cache, on_built=self._built.append)
        self.busy = False                # read by the decode thread (its step time with or without us)
        self.first_chunks = False        # read by the decode thread: a job's first chunk is under way
        self.chunk_s = 0.0               # wall time of rounds that did work
        self.batches = 0                 # model calls made
        self.batched_items = 0           # pieces of work in them (mean batch = batched_items / batches)
        self.max_seen_batch = 0

    def expect(self, job: SpeechJob) -> None:
        """A job was submitted (its tokens come later, by `add`): prefix builds wait for its first chunk."""
        with self._cond:
            self._arriving.add(job)

    def add(self, job: SpeechJob) -> None:
        with self._cond:
            self._arriving.discard(job)
            self._jobs.append(job)
            self._cond.notify()

    def running(self) -> set[int]:
        with self._cond:
            return set(map(id, self._jobs))

    def prepare(self, prefix: FlowPrefix, timeout: float | None = None) -> dict[str, object]:
        """Prepare a warm voice's static first chunk now, in the chunk thread between two rounds (on CUDA its
        graphs share the thread's memory pool), and wait for it; returns what was prepared."""
        if self.first_chunk is None:
            return {"path": "eager (no static first chunk)"}
        item = _Prepare(prefix)
        with self._cond:
            self._prepares.append(item)
            self._cond.notify()
        item.done.wait(timeout)
        return item.record

    def stats(self) -> dict[str, object]:
        first: dict[str, object] = self.first_chunk.stats() if self.first_chunk is not None else \
            {"first_chunk_path": "eager"}
        if self.arena is not None:
            first.update(arena_slots=self.arena.slots, arena_free=self.arena.free, arena_frames=self.arena.frames,
                         arena_mb=self.arena.nbytes / 2**20)
        return {"chunk_s": self.chunk_s, "flow_batches": self.batches,
                "mean_flow_batch": self.batched_items / max(self.batches, 1), "max_flow_batch": self.max_seen_batch,
                "prefixes_built": self._builds.built, **first}

    def fail(self, job: SpeechJob, exc: BaseException) -> None:
        self._send(job, exc)
        job.cancel()
        self._finish(job)

    # --- the thread ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._has_work():
                    self._cond.wait()
                if self._stop:
                    return
                jobs = list(self._jobs)
                prepares, self._prepares = self._prepares, []
            for item in prepares:
                self._prepare(item)
            t0 = time.perf_counter()
            self.busy = True
            try:
                with torch.inference_mode():
                    self._round(jobs)
            except Exception as exc:  # pragma: no cover - defensive: fail the jobs, keep serving
                log.exception("cosyvoice chunk round failed")
                for job in jobs:
                    self.fail(job, exc)
            finally:
                self.busy = False
                self.chunk_s += time.perf_counter() - t0

    def _after(self) -> None:
        with self._cond:
            jobs, self._jobs = list(self._jobs), []
            prepares, self._prepares = self._prepares, []
        for item in prepares:
            item.done.set()
        for job in jobs:
            self._send(job, EngineBusy("the synthesis engine was closed"))

    def _prepare(self, item: _Prepare) -> None:
        """Prepare one voice's static first chunk (a failure is logged and leaves the voice on the eager path)."""
        assert self.first_chunk is not None
        try:
            self._follow_default_stream()          # the prefix was built elsewhere, on the default stream
            item.record = self.first_chunk.prepare(item.prefix)
        except Exception as exc:  # pragma: no cover - defensive: the eager path serves the voice
            log.exception("cosyvoice first chunk preparation failed")
            item.record = {"path": "eager (preparation failed)", "error": str(exc)}
        finally:
            item.done.set()

    def _has_work(self) -> bool:
        """Anything to do (called under the lock)?"""
        if self._tasks or self._prepares or self._may_build(self._jobs) or self._may_prepare_built(self._jobs):
            return True
        for job in self._jobs:
            if job.cancelled.is_set() or job.stream is None:
                return True
            if job.fed < len(job.decoded) or (job.decode_done and not job.stream.llm_done):
                return True
            if job.stream.due():
                return True
        return False

    def _round(self, jobs: list[SpeechJob]) -> None:
        self._follow_default_stream()  # voices and prefixes made elsewhere on the default stream are complete
        for job in [j for j in self._tasks if j.cancelled.is_set()]:
            del self._tasks[job]                   # its chunk is dropped half made
        for job in jobs:
            if job.cancelled.is_set():
                self._finish(job)
                continue
            try:
                self._feed(job)
            except Exception as exc:
                log.exception("cosyvoice stream failed to start")
                self.fail(job, exc)
                continue
            assert job.stream is not None
            if job.t_due is None and job not in self._tasks and job.stream.due():
                job.t_due = time.perf_counter()
        live = [j for j in jobs if not j.cancelled.is_set() and j.stream is not None]
        ready = sorted((j for j in live if j in self._tasks or (j.stream is not None and j.stream.due())),
                       key=SpeechJob.deadline)
        if ready:
            self._run_batch(ready)
        elif self._may_build(live):
            self._run_builds()
        elif self._may_prepare_built(live):
            self._prepare(_Prepare(self._built.popleft()))
        self._note_first_chunks()

    def _note_first_chunks(self) -> None:
        """Publish whether a first chunk is under way (the decode thread may hold jobs meanwhile: see
        `decode_worker.first_packets_first`); wake the decode thread when none is any more."""
        was, self.first_chunks = self.first_chunks, any(j.t_first_audio is None for j in self._tasks)
        if was and not self.first_chunks:
            self.wake_decoder()

    def _may_build(self, jobs: list[SpeechJob]) -> bool:
        """Prefix builds go on only while every job, submitted or running, has played its first chunk: a piece
        of a build is not interrupted, and a first packet should not wait behind one (called under the lock,
        or with ``jobs`` a copy taken under it)."""
        return bool(self._builds) and self._no_first_packet_waits(jobs)

    def _may_prepare_built(self, jobs: list[SpeechJob]) -> bool:
        """A prefix built here is prepared (its static first chunk) under the same rule as the builds."""
        if self.first_chunk is None:
            self._built.clear()
            return False
        return bool(self._built) and not self._builds and self._no_first_packet_waits(jobs)

    def _no_first_packet_waits(self, jobs: list[SpeechJob]) -> bool:
        with self._cond:
            self._arriving = {j for j in self._arriving if not j.cancelled.is_set()}
            arriving = bool(self._arriving)
        return not arriving and all(j.t_first_audio is not None or j.cancelled.is_set() for j in jobs)

    def _feed(self, job: SpeechJob) -> None:
        """Hand the job's new tokens to its stream (creating it on first use; a cold voice's prefix build is
        queued here)."""
        if job.stream is None:
            job.stream = StreamingSynthesis(
                self.flow, self.hift, job.voice, job.schedule, cache=self.cache, seed=job.seed, speed=job.speed,
                capacity_tokens=min(job.hi, 8 * int(job.text_ids.numel()) + 50), first_chunk=self.first_chunk,
            )
            job.stats["setup_ms"] = job.stream.setup_ms
            job.stats["cold_voice"] = float(job.stream.cold)
            if self.arena is not None:
                job.stats["arena_slot"] = float(job.stream.bind_arena(self.arena))
            if job.stream.missing_prefix is not None:
                self._builds.want(job.stream.missing_prefix)
        done = job.decode_done                    # read before the tokens: all of them are there once set
        decoded = job.decoded
        while job.fed < len(decoded):
            job.stream.add(decoded[job.fed])
            job.fed += 1
        if done and not job.stream.llm_done and job.fed == len(job.decoded):
            job.stream.finish()

    def _start(self, job: SpeechJob) -> _Task | None:
        """Start the job's due chunk and advance it to its first piece of work (None: it finished already)."""
        assert job.stream is not None
        now = time.perf_counter()
        task = _Task(job.stream.chunk_steps(), job, t_start=now,
                     queue_ms=1000 * (now - job.t_due) if job.t_due is not None else 0.0)
        job.t_due = None
        self._tasks[job] = task
        return task if self._advance(task, first=True) else None

    def _advance(self, task: _Task, first: bool = False) -> bool:
        """Run the task to its next piece of work; False when it ended (chunk delivered, or failed)."""
        try:
            task.pending = next(task.steps) if first else task.steps.send(None)
            return True
        except StopIteration as stop:
            task.pending = None
            del self._tasks[task.job]
            self._deliver(task.job, stop.value, task.queue_ms)
            return False
        except Exception as exc:
            task.pending = None
            log.exception("cosyvoice chunk failed")
            self._tasks.pop(task.job, None)
            self.fail(task.job, exc)
            return False

    def _run_batch(self, ready: list[SpeechJob]) -> None:
        """Steps 2-4 of a round (module doc): the leader, its batch-mates, one model call, advance each."""
        leader: _Task | None = None
        batch: list[_Task] = []
        key: Hashable = None
        for job in ready:
            task = self._tasks.get(job)
            if task is None:
                if leader is not None and len(batch) >= self.max_batch:
                    break
                task = self._start(job)
                if task is None:
                    continue
            assert task.pending is not None
            if leader is None:
                leader, key = task, task.pending.batch_key(self.buckets)
                batch.append(task)
            elif len(batch) < self.max_batch and type(task.pending) is type(leader.pending) \
                    and task.pending.batch_key(self.buckets) == key:
                batch.append(task)
        if not batch:
            return
        self._note_first_chunks()
        self._run_work(batch)

    def _run_builds(self) -> None:
        """Nothing due: one batched piece of the cold voices' prefix builds."""
        self._count(self._builds.step(self.max_batch, self.buckets))

    def _count(self, items: int) -> None:
        if items:
            self.batches += 1
            self.batched_items += items
            self.max_seen_batch = max(self.max_seen_batch, items)

    def _run_work(self, batch: list[_Task]) -> None:
        try:
            run_grouped([t.pending for t in batch if t.pending is not None], self.buckets)
        except Exception as exc:
            log.exception("cosyvoice batched work failed")
            for task in batch:
                self._tasks.pop(task.job, None)
                self.fail(task.job, exc)
            return
        self._count(len(batch))
        for task in batch:
            self._advance(task)

    def _deliver(self, job: SpeechJob, chunk: Chunk, queue_ms: float) -> None:
        assert job.stream is not None
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

    def _finish(self, job: SpeechJob) -> None:
        """Drop the job (any thread; the decode thread frees its slot on `cancelled`, the next round drops
        its chunk under way)."""
        job.cancel()
        with self._cond:
            self._arriving.discard(job)
            if job in self._jobs:
                self._jobs.remove(job)
        self.wake_decoder()
        stream, job.stream = job.stream, None
        if stream is not None:
            stream.release_arena()


__all__ = ["ChunkWorker"]
