"""The engine's workers: every active CosyVoice2 request on the device, in two threads, behind one admission.

    reserve() ── Ticket ──▶ submit(job) ──▶ DecodeWorker (decode thread: batched LLM steps, `decode_worker.py`)
                                                 │ tokens
                                                 ▼
                                            ChunkWorker (chunk thread: flow + vocoder chunks, batched across
                                                 │        streams, earliest deadline first, `chunk_scheduler.py`)
                                                 ▼
                                            job.deliver(chunk)

Admission is bounded (`admission.py`): ``slots`` requests run, ``max_waiting`` more may wait; beyond that
`reserve` raises `EngineBusy` at once. Cancelling a request frees its ticket immediately, its KV slot within
one decode step and its chunk work at the chunk thread's next round.

On the CPU the two threads split the cores (torch's intra-op threads are per thread: two pools of spinning
OpenMP threads on the same cores wait at every barrier for each other, 10x slower seen). On CUDA the
interpreter's switch interval is shortened, so the decode thread, which needs the GIL only to launch a graph
replay, does not wait the default 5 ms behind the chunk thread's Python.
"""

from __future__ import annotations

import logging
import sys

import torch

from assistant.tts.cosyvoice import SAMPLE_RATE
from assistant.tts.cosyvoice.admission import Admission, EngineBusy, Ticket
from assistant.tts.cosyvoice.chunk_scheduler import ChunkWorker
from assistant.tts.cosyvoice.decode_worker import DecodeWorker
from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
from assistant.tts.cosyvoice.flow import CausalFlow
from assistant.tts.cosyvoice.flow_arena import FlowArena
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.hift import HiFTVocoder
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.llm import SpeechLM
from assistant.tts.cosyvoice.prompt_cache import DEFAULT_MAX_BYTES, PromptCache
from assistant.tts.cosyvoice.schedule import StreamSchedule

log = logging.getLogger(__name__)

CUDA_SWITCH_INTERVAL_S = 0.0005   # GIL hand-over between the two workers on CUDA (Python's default: 5 ms)


class SpeechBatcher:
    """The engine-wide workers: batched LLM decode steps in one thread, batched flow/vocoder chunks in another.

    ``cuda_graphs``: replay the decode step (sampling included) as a CUDA graph (captured by `capture`, at
    warm-up), and a prepared warm voice's first chunk as two (flow, vocoder; `prepare_voice`) for streams on
    ``schedule``; ``static_step`` / ``static_chunks``: run those same static functions without capturing (any
    device: how the CPU tests trace the graphed paths). ``arena_frames``: keep each running stream's flow state
    in a static arena of ``slots`` slots of that many frames (one batched attention over all streams,
    `flow_arena.py`; 0: per-stream buffers). ``flow_batch``: most streams in one flow or vocoder call
    (default ``slots``);
    ``buckets``: solve lengths a stream's frames may be padded up to so more streams share a call;
    ``hold_ahead``: hold LLM steps of jobs that have their first chunk's tokens while a first chunk is under
    way (default: on the CPU, where the two threads share cores and memory bandwidth; `decode_worker.py`).
    """

    def __init__(
        self,
        lm: SpeechLM,
        flow: CausalFlow,
        hift: HiFTVocoder,
        *,
        slots: int = 4,
        max_waiting: int = 4,
        max_positions: int = 2048,
        cuda_graphs: bool = False,
        static_step: bool = False,
        static_chunks: bool = False,
        schedule: StreamSchedule | None = None,
        arena_frames: int = 0,
        sample_rate: int = SAMPLE_RATE,
        cache: PromptCache | None = None,
        cpu_threads: tuple[int, int] | None = None,
        flow_batch: int | None = None,
        buckets: tuple[int, ...] = (),
        hold_ahead: bool | None = None,
    ) -> None:
        self.lm, self.flow, self.hift = lm, flow, hift
        n = torch.get_num_threads()
        self.cpu_threads = cpu_threads or (max(1, n // 2), max(1, n - n // 2))
        self.sample_rate = sample_rate
        self.slots, self.max_waiting = slots, max_waiting
        self.cache = cache if cache is not None else PromptCache(DEFAULT_MAX_BYTES)
        self.device = lm.llm_decoder.weight.device
        if self.device.type == "cuda" and sys.getswitchinterval() > CUDA_SWITCH_INTERVAL_S:
            sys.setswitchinterval(CUDA_SWITCH_INTERVAL_S)
            log.info("cosyvoice: interpreter switch interval set to %.1f ms", 1000 * CUDA_SWITCH_INTERVAL_S)
        self.admission = Admission(slots, max_waiting)
        graphs = cuda_graphs and self.device.type == "cuda"
        first_chunk = FirstChunkGraphs(flow, hift, schedule or StreamSchedule.fast(), flow_batch or slots,
                                       graphs=graphs) if graphs or static_chunks else None
        arena = FlowArena(flow.decoder.estimator, flow.cfg.n_timesteps, slots, arena_frames) if arena_frames else None
        self.chunks = ChunkWorker(flow, hift, self.cache, sample_rate=sample_rate, max_batch=flow_batch or slots,
                                  buckets=buckets, cpu_threads=self.cpu_threads[1], first_chunk=first_chunk,
                                  arena=arena)
        self.decoder = DecodeWorker(lm, self.cache, self.chunks, slots=slots, max_positions=max_positions,
                                    cuda_graphs=cuda_graphs, static_step=static_step, cpu_threads=self.cpu_threads[0],
                                    lookahead=flow.cfg.pre_lookahead_len, hold_ahead=hold_ahead)
        self.chunks.wake_decoder = self.decoder.wake
        self.decoder.start()
        self.chunks.start()

    # --- admission and requests (any thread) ---------------------------------------------------------------

    @property
    def tickets(self) -> int:
        return self.admission.tickets

    def reserve(self) -> Ticket:
        """A place for one request, or `EngineBusy` when all ``slots + max_waiting`` are held."""
        return self.admission.reserve()

    def submit(self, job: SpeechJob) -> None:
        """Queue a job (its request holds a ticket); results arrive through ``job.deliver``."""
        self.decoder.submit(job)

    def cancel(self, job: SpeechJob) -> None:
        job.cancel()
        self.decoder.wake()
        self.chunks.wake()

    def capture(self, timeout: float | None = None) -> dict[str, object]:
        """Capture the decode step's CUDA graph now (warm-up); returns the decode path's record."""
        return self.decoder.capture(timeout)

    def prepare_voice(self, prefix: FlowPrefix, timeout: float | None = None) -> dict[str, object]:
        """Build (and on CUDA capture) a warm voice's static first chunk now, in the chunk thread; returns what
        was prepared. A request never waits for this: until it is done the voice's first chunks run eagerly."""
        return self.chunks.prepare(prefix, timeout)

    def close(self) -> None:
        self.admission.close()
        self.decoder.close()
        self.chunks.close()

    def running(self) -> int:
        """Jobs holding a KV slot or still making chunks (for tests and metrics)."""
        return len(self.chunks.running() | self.decoder.running())

    def stats(self) -> dict[str, object]:
        """Counters for logs, metrics and the bench."""
        return {"slots": self.slots, "tickets": self.tickets, "running": self.running(),
                **self.decoder.stats(), **self.chunks.stats()}


__all__ = ["EngineBusy", "SpeechBatcher", "SpeechJob", "Ticket"]
