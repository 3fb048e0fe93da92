"""Static work replayed as CUDA graphs: the engine's launch-bound pieces as one replay each.

A 0.5B LLM's decode step, a first chunk's flow solve (an encoder and ten passes of a 56-block U-Net) and the
vocoder's first push are thousands of small kernels each; on a big GPU launching them costs more than running
them. A `GraphedCall` wraps a function of no arguments that reads and writes only *static buffers* (tensors
whose address never changes: the caller copies its inputs into them before a call and reads the outputs
before the next). On CUDA `capture` records it once as a ``torch.cuda.CUDAGraph`` (after a few eager runs on
a side stream, so lazy inits and the allocator settle) and each call replays it. Off CUDA the same function
runs directly: that is how the CPU tests trace the graphed path. On CUDA before the capture, or when it failed,
the caller takes its eager path instead (`active` is False): a static function does the work of a whole batch
bucket, which only a replay makes worth it. The eager code each static function was written from stays the
reference it is tested against; `record` says what really ran.

Graphs that may replay at the same time (the decode thread's and the chunk thread's) must not share a memory
pool; graphs of one thread may (`memory_pool`), since their replays never overlap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")

GRAPH_WARMUP_RUNS = 3  # eager runs on a side stream before capture (allocator and lazy inits settle)


def memory_pool(device: torch.device) -> Any:
    """A CUDA graph memory pool for the graphs of one thread (None off CUDA)."""
    return torch.cuda.graph_pool_handle() if device.type == "cuda" else None


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes a static function is built for: powers of two up to ``max_batch``, and ``max_batch``."""
    sizes = {1, max(1, max_batch)}
    b = 2
    while b < max_batch:
        sizes.add(b)
        b *= 2
    return tuple(sorted(sizes))


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding n (the largest when none does: the caller splits the batch)."""
    return min((b for b in buckets if b >= n), default=max(buckets))


class GraphedCall(Generic[T]):
    """``fn`` over static buffers: a captured CUDA graph on CUDA, run directly elsewhere (module doc).

    ``graph``: capture on CUDA when asked (`capture`); False, or another device: always run directly.
    """

    def __init__(self, name: str, fn: Callable[[], T], device: torch.device, *, graph: bool,
                 pool: Any = None) -> None:
        self.name, self.fn, self.device, self.pool = name, fn, device, pool
        self.want_graph = graph and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: T | None = None
        self.replays = 0
        self.direct = 0
        path = "eager until captured" if self.want_graph else f"static step ({device.type}, capture skipped)"
        self.info: dict[str, object] = {"path": path, "capture_s": None, "error": None}

    @property
    def captured(self) -> bool:
        return self.graph is not None

    @property
    def active(self) -> bool:
        """Whether calls run here: the captured graph, or the function directly off CUDA (else: eager path)."""
        return self.graph is not None or not self.want_graph

    @property
    def record(self) -> dict[str, object]:
        """What runs (path), what the capture cost, how often the graph was replayed or the function run."""
        return {**self.info, "replays": self.replays, "direct_steps": self.direct}

    @torch.inference_mode()
    def capture(self) -> dict[str, object]:
        """Capture ``fn`` (CUDA; once) and time it; on failure keep running it directly and say why."""
        if not self.want_graph or self.graph is not None:
            return self.record
        t0 = time.perf_counter()
        try:
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUP_RUNS):
                    self.fn()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the engine's other thread keeps launching work on its own stream meanwhile; a
            # stream of our own, so two threads never capture on torch's one default capture stream
            with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(self.device),
                                  capture_error_mode="thread_local"):
                self.out = self.fn()
            graph.replay()
            current.synchronize()
            self.graph = graph
            self.info = {"path": "cuda-graph", "capture_s": time.perf_counter() - t0, "error": None}
        except Exception as exc:  # pragma: no cover - depends on the device stack
            log.warning("cosyvoice graph capture failed name=%s error=%s; eager path instead", self.name, exc)
            self.info = {"path": "eager (capture failed)", "capture_s": time.perf_counter() - t0, "error": str(exc)}
        log.info("cosyvoice graph name=%s path=%s capture_s=%s", self.name, self.info["path"], self.info["capture_s"])
        return self.record

    def __call__(self) -> T:
        """The outputs of ``fn`` on the buffers' current contents (after a replay: the graph's static outputs,
        valid until the next call)."""
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            assert self.out is not None
            return self.out
        self.direct += 1
        return self.fn()


__all__ = ["GRAPH_WARMUP_RUNS", "GraphedCall", "batch_buckets", "bucket_for", "memory_pool"]


class BucketGraphs(Generic[T]):
    """One `GraphedCall` per batch bucket (``calls``), ready, captured and recorded together."""

    calls: dict[int, GraphedCall[T]]

    @property
    def active(self) -> bool:
        """Ready to run: every bucket captured on CUDA, or anywhere else (run directly)."""
        return all(c.active for c in self.calls.values())

    def capture(self) -> list[dict[str, object]]:
        return [c.capture() for c in self.calls.values()]

    @property
    def record(self) -> dict[str, object]:
        """The buckets' records as one: the path, the first error, capture time and runs summed."""
        records = [c.record for c in self.calls.values()]
        return {"path": records[0]["path"], "buckets": sorted(self.calls),
                "error": next((r["error"] for r in records if r["error"]), None),
                "capture_s": sum(float(str(r["capture_s"] or 0.0)) for r in records),
                "replays": sum(int(str(r["replays"])) for r in records),
                "direct_steps": sum(int(str(r["direct_steps"])) for r in records)}
