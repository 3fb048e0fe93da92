"""How many operations a fast-schedule chunk dispatches (torch profiler), alone and batched, on each path.

On a GPU each operation is at least one kernel launch, and a small chunk is launch-bound; on the CPU the
count stands in for that (the issue's "first chunk launches ~18 000 kernels"). Counted: top-level ``aten::``
operations (those not called by another aten operation: what the Python code dispatched), and on CUDA the
kernel launches and graph launches. A batch of N chunks is one run of N streams' work steps together; its
counts are reported per stream too. Paths: a warm first chunk eager or static (`first_chunk.py`: on CUDA two
graph launches and no kernel launches of its own), a later chunk with each stream attended in turn (loop) or
all at once over the flow arena (`flow_arena.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

if TYPE_CHECKING:
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt


def _count(prof: profile) -> dict[str, int]:
    ops = launches = graphs = 0
    for e in prof.events():
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops += 1
        elif e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            launches += 1
        elif e.name == "cudaGraphLaunch":
            graphs += 1
    return {"aten_ops": ops, "kernel_launches": launches, "graph_launches": graphs}


def _profiled(run: Callable[[], None], streams: int, chunk: str, path: str, warm: bool = True) -> dict[str, object]:
    if warm:
        run()                                      # warm: allocator, lazy inits (the caller made a fresh batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run()
    counts = _count(prof)
    return {"streams": streams, "chunk": chunk, "path": path, **counts,
            "aten_ops_per_stream": counts["aten_ops"] / streams,
            "kernel_launches_per_stream": counts["kernel_launches"] / streams,
            "graph_launches_per_stream": counts["graph_launches"] / streams}


def _streams(model: CosyVoice2, voice: CosyVoicePrompt, tokens: list[int], n: int, first_hop: int,
             cache: PromptCache, first_chunk: FirstChunkGraphs | None = None) -> list[StreamingSynthesis]:
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis

    out = []
    for i in range(n):
        s = StreamingSynthesis(model.flow, model.hift, voice, StreamSchedule.fast(first_hop), cache=cache, seed=i,
                               first_chunk=first_chunk)
        for t in tokens:
            s.add(t)
        out.append(s)
    return out


def _together(batch: list[StreamingSynthesis]) -> None:
    from assistant.tts.cosyvoice.batch_work import run_together

    run_together([s.chunk_steps() for s in batch])


@torch.inference_mode()
def first_chunk_ops(model: CosyVoice2, voice: CosyVoicePrompt, tokens: list[int], streams: int,
                    first_hop: int = 10, static: bool = False) -> dict[str, object]:
    """Profile the first chunk of ``streams`` warm streams (the voice's prefix built first) made together:
    eagerly, or (``static``) by the voice's static first chunk (`first_chunk.py`: on CUDA two graph launches,
    on the CPU its static functions run op by op)."""
    from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
    from assistant.tts.cosyvoice.flow_prefix import flow_prefix
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.schedule import StreamSchedule

    cache = PromptCache()
    prefix = flow_prefix(model.flow, voice, cache)      # built and kept: every stream below forks it (warm)
    graphs = None
    if static:
        graphs = FirstChunkGraphs(model.flow, model.hift, StreamSchedule.fast(first_hop), streams,
                                  graphs=torch.device(model.device).type == "cuda")
        graphs.prepare(prefix)
    look = model.flow.cfg.pre_lookahead_len
    batches = [_streams(model, voice, tokens[: first_hop + look], streams, first_hop, cache, graphs)
               for _ in range(2)]
    return _profiled(lambda: _together(batches.pop(0)), streams, "first", "static" if static else "eager")


@torch.inference_mode()
def later_chunk_ops(model: CosyVoice2, voice: CosyVoicePrompt, tokens: list[int], streams: int,
                    first_hop: int = 10, arena_frames: int = 0) -> dict[str, object]:
    """Profile the third chunk of ``streams`` warm streams made together (their own frames attended one stream
    after another, or with ``arena_frames`` in one flow arena: `flow_arena.py`); ``tokens`` cover at least
    three chunks."""
    from assistant.tts.cosyvoice.flow_arena import FlowArena
    from assistant.tts.cosyvoice.flow_prefix import flow_prefix
    from assistant.tts.cosyvoice.prompt_cache import PromptCache

    cache = PromptCache()
    flow_prefix(model.flow, voice, cache)
    flow = model.flow
    arena = FlowArena(flow.decoder.estimator, flow.cfg.n_timesteps, streams, arena_frames) if arena_frames else None

    def third_chunk(profiled: bool) -> dict[str, object] | None:
        batch = _streams(model, voice, tokens, streams, first_hop, cache)
        if arena is not None:
            for s in batch:
                s.bind_arena(arena)
        for _chunk in range(2):                         # the first two chunks, unprofiled
            _together(batch)
        try:
            if not profiled:
                _together(batch)
                return None
            return _profiled(lambda: _together(batch), streams, "later", "arena" if arena else "loop", warm=False)
        finally:
            for s in batch:
                s.release_arena()

    third_chunk(False)                                  # warm: allocator, lazy inits
    out = third_chunk(True)
    assert out is not None
    return out


__all__ = ["first_chunk_ops", "later_chunk_ops"]
