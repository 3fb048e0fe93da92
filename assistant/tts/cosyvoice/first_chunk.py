"""The engine's first chunks as static graphs: which warm voices have them, and what a stream's first chunk uses.

A request's first packet waits for its first chunk: the flow's solve of its first ``hop`` tokens and the
vocoder's first push. Both are built here as static functions for every batch bucket up to the engine's batch
(`flow_graphs.FirstChunkFlow` per warm voice, `hift_graphs.FirstPush` once), and on CUDA captured as graphs,
so the first chunks of all the streams that are due together are two replays. They are made when a voice is
prepared (warm-up, `CosyVoiceEngine.prepare_voice`) or, for a voice whose prefix was built beside a cold
request, when the chunk thread has nothing due: never inside a request. A voice's solver lives as long as its
`FlowPrefix` does in the prompt cache (a weak key: evicting the voice drops its graphs and what they hold).

Only a schedule like the engine's (the fast one, the same first hop, Euler steps and vocoder look-ahead) uses
them; any other stream, a cold voice's flow, a stream at another speed, and every chunk after the first take
the eager path, which stays the reference (``cuda_graphs`` off: eager everywhere on CUDA).
"""

from __future__ import annotations

import logging
import time
import weakref

import torch

from assistant.tts.cosyvoice.flow import CausalFlow
from assistant.tts.cosyvoice.flow_graphs import FirstChunkFlow
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.graphs import batch_buckets, memory_pool
from assistant.tts.cosyvoice.hift import HiFTVocoder
from assistant.tts.cosyvoice.hift_graphs import FirstPush
from assistant.tts.cosyvoice.schedule import StreamSchedule

log = logging.getLogger(__name__)


class FirstChunkGraphs:
    """Static first chunks for ``schedule`` (module doc), batch buckets up to ``max_batch``; ``graphs``: capture
    them on CUDA (else, off CUDA, their static functions run directly: how the CPU tests trace them)."""

    def __init__(self, flow: CausalFlow, hift: HiFTVocoder, schedule: StreamSchedule, max_batch: int, *,
                 graphs: bool) -> None:
        self.flow, self.hift, self.schedule = flow, hift, schedule
        self.device = next(flow.parameters()).device
        self.buckets = batch_buckets(max_batch)
        self.graphs = graphs
        self.pool = memory_pool(self.device) if graphs else None   # the chunk thread's graphs never overlap
        self.n_steps = schedule.first_chunk_steps or flow.cfg.n_timesteps
        self.frames = flow.cfg.token_mel_ratio * schedule.first_hop
        self._flows: weakref.WeakKeyDictionary[FlowPrefix, FirstChunkFlow] = weakref.WeakKeyDictionary()
        self.push: FirstPush | None = None
        self.capture_s = 0.0
        self.prepared = 0

    def matches(self, schedule: StreamSchedule) -> bool:
        """Whether a stream on ``schedule`` computes its first chunk as these do."""
        s = self.schedule
        return (schedule.name == "fast" and schedule.first_hop == s.first_hop
                and (schedule.first_chunk_steps or self.flow.cfg.n_timesteps) == self.n_steps)

    def has(self, prefix: FlowPrefix) -> bool:
        return prefix in self._flows

    @torch.inference_mode()
    def prepare(self, prefix: FlowPrefix) -> dict[str, object]:
        """Build the voice's first-chunk solver (and the vocoder's first push, once) and capture them on CUDA.
        Call from the thread that runs the chunks (their replays share one memory pool), between its rounds."""
        t0 = time.perf_counter()
        if self.push is None:
            self.push = FirstPush(self.hift, self.frames, self.buckets, graph=self.graphs, pool=self.pool)
            self.push.capture()
        solver = self._flows.get(prefix)
        if solver is None:
            solver = FirstChunkFlow(self.flow, prefix, self.schedule.first_hop, self.n_steps, self.buckets,
                                    graph=self.graphs, pool=self.pool)
            solver.capture()
            self._flows[prefix] = solver
            self.prepared += 1
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()   # preparation, not a request: it may wait
        dt = time.perf_counter() - t0
        self.capture_s += dt
        log.info("cosyvoice first chunk prepared prompt_tokens=%d buckets=%s path=%s seconds=%.2f",
                 prefix.prompt_tokens, ",".join(map(str, self.buckets)), solver.record["path"], dt)
        return {"flow": solver.record, "vocoder": self.push.record, "seconds": dt}

    def flow_for(self, prefix: FlowPrefix | None, schedule: StreamSchedule) -> FirstChunkFlow | None:
        """The voice's static first-chunk solver for a stream on ``schedule``, if prepared and ready."""
        if prefix is None or not self.matches(schedule):
            return None
        solver = self._flows.get(prefix)
        return solver if solver is not None and solver.active else None

    def push_for(self, schedule: StreamSchedule) -> FirstPush | None:
        """The vocoder's static first push for a stream on ``schedule``, if ready."""
        if self.push is None or not self.push.active or not self.matches(schedule):
            return None
        return self.push

    def stats(self) -> dict[str, object]:
        flows = list(self._flows.values())
        return {"first_chunk_voices": len(flows), "first_chunk_prepared": self.prepared,
                "first_chunk_capture_s": self.capture_s,
                "first_chunk_flow_replays": sum(int(str(f.record["replays"])) for f in flows),
                "first_chunk_flow_direct": sum(int(str(f.record["direct_steps"])) for f in flows),
                "first_chunk_path": flows[0].record["path"] if flows else None,
                "first_chunk_error": next((f.record["error"] for f in flows if f.record["error"]), None),
                "first_push": self.push.record if self.push is not None else None}


__all__ = ["FirstChunkGraphs"]
