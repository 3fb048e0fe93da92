"""How many operations a fast-schedule first chunk dispatches (torch profiler), alone and batched.

On a GPU each operation is at least one kernel launch, and a small chunk is launch-bound; on the CPU the
count stands in for that (the issue's "first chunk launches ~18 000 kernels"). Counted: top-level ``aten::``
operations (those not called by another aten operation: what the Python code dispatched), and on CUDA the
kernel launches. A batch of N first chunks is one run of N streams' work steps together; its counts are
reported per stream too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, profile

if TYPE_CHECKING:
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt


def _count(prof: profile) -> dict[str, int]:
    ops = launches = 0
    for e in prof.events():
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops += 1
        elif e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"):
            launches += 1
    return {"aten_ops": ops, "kernel_launches": launches}


@torch.inference_mode()
def first_chunk_ops(model: CosyVoice2, voice: CosyVoicePrompt, tokens: list[int], streams: int,
                    first_hop: int = 10) -> dict[str, float]:
    """Profile the first chunk of ``streams`` warm streams (the voice's prefix built first) made together."""
    from assistant.tts.cosyvoice.flow_prefix import flow_prefix
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis

    schedule = StreamSchedule.fast(first_hop)
    cache = PromptCache()
    flow_prefix(model.flow, voice, cache)          # built and kept: every stream below forks it (warm)
    look = model.flow.cfg.pre_lookahead_len

    def make() -> list[StreamingSynthesis]:
        out = []
        for i in range(streams):
            s = StreamingSynthesis(model.flow, model.hift, voice, schedule, cache=cache, seed=i)
            for t in tokens[: first_hop + look]:
                s.add(t)
            out.append(s)
        return out

    def run(batch: list[StreamingSynthesis]) -> None:
        if len(batch) == 1:
            batch[0].next_chunk()
        else:
            from assistant.tts.cosyvoice.batch_work import run_together

            run_together([s.chunk_steps() for s in batch])

    run(make())                                    # warm: allocator, lazy inits
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    batch = make()
    with profile(activities=activities) as prof:
        run(batch)
    counts = _count(prof)
    return {"streams": streams, **counts, "aten_ops_per_stream": counts["aten_ops"] / streams,
            "kernel_launches_per_stream": counts["kernel_launches"] / streams}


__all__ = ["first_chunk_ops"]
