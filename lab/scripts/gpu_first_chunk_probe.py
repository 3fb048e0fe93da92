"""Where a CosyVoice2 first packet goes on a GPU: the first chunk with the LLM's decode running beside it (as
shipped on CUDA) and held (``hold_ahead``, as on the CPU), at 1 and 4 streams; whether a thread waiting on the GPU
holds the interpreter; and a torch.profiler table of one request (kernel launches, their GPU time).

    PYTHONPATH=. python lab/scripts/gpu_first_chunk_probe.py OUT [cuda|cpu] [full|tiny] [tokens] [reps]

``full``: the official 0.5B shapes with random weights (bf16 on CUDA); ``tiny``: the fixture model (the CPU
check of this script). Output: OUT/probe.json (rewritten after each stage) and OUT/profile.txt. Run on the
device machine with shared/ (the fixtures, the texts) copied into the tree. Findings: docs/benchmarks.md.
"""
import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path

import torch

_args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
_args.add_argument("out", type=Path)
_args.add_argument("device", nargs="?", default="cuda", choices=("cuda", "cpu"))
_args.add_argument("model", nargs="?", default="full", choices=("full", "tiny"))
_args.add_argument("tokens", nargs="?", type=int, default=200, help="speech tokens forced per request")
_args.add_argument("reps", nargs="?", type=int, default=3, help="requests per setting at 1 stream (one fewer at 4)")
ARGS = _args.parse_args()
out, dev, which, tokens, reps = ARGS.out, ARGS.device, ARGS.model, ARGS.tokens, ARGS.reps
out.mkdir(parents=True, exist_ok=True)
T0 = time.perf_counter()


ALL: dict[str, object] = {}


def save(name: str, obj: object) -> None:
    ALL[name] = obj
    (out / "probe.json").write_text(json.dumps(ALL, indent=1, default=str))
    print(f"[{time.perf_counter() - T0:.0f}s] {name}: {json.dumps(obj, default=str)[:3000]}", flush=True)


def gil_probe() -> dict[str, float]:
    """Does a thread that waits on the GPU (.item()) hold up the other Python threads?"""
    n = 8192 if dev == "cuda" else 1024  # a GPU wait of a few ms; on a CPU, keep the check short
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)

    def count(seconds: float) -> int:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    base = count(1.0)
    stop, iters = threading.Event(), [0]

    def gpu() -> None:
        while not stop.is_set():
            (a @ a).sum().item()
            iters[0] += 1

    th = threading.Thread(target=gpu)
    th.start()
    time.sleep(0.2)
    busy = count(1.0)
    stop.set()
    th.join()
    return {"loop_alone": base, "loop_beside_item": busy, "ratio": round(busy / base, 3), "gpu_iters": iters[0]}


async def engine_probe() -> None:
    from assistant.bench.shared_data import shared_path
    from assistant.bench.tts import bench_voice, load_texts, measure_request, random_full_size, text_ids
    from assistant.config import TTSConfig
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine
    from assistant.tts.cosyvoice.schedule import StreamSchedule

    if which == "full":
        model = random_full_size(dev, "bfloat16" if dev == "cuda" else "float32")
    else:
        model = CosyVoice2.from_dir(shared_path("fixtures/cosyvoice2/tiny"), device=dev)
    cfg = TTSConfig(engine="cosyvoice2", device=dev, dtype="bfloat16" if dev == "cuda" else "float32",
                    max_concurrent=4, max_waiting=0, cuda_graphs=dev == "cuda", prompt_cache_mb=6144)
    engine = CosyVoiceEngine(cfg)
    engine.attach(model)
    loop = asyncio.get_running_loop()
    save("capture", await loop.run_in_executor(None, engine.batcher.capture))
    voice = bench_voice(model, None, 0, engine)
    if hasattr(engine, "prepare_voice"):
        await engine.prepare_voice(voice)
    sched = StreamSchedule.named("fast", 10, None)
    ids = text_ids(model, load_texts([])["zh_50"], 0)  # bench tts's zh_50, as gpu_check's bench runs it
    warm = text_ids(model, "warm up text", 0)
    for i in range(2):
        await measure_request(engine, warm, voice, sched, 60, i)
    save("warm", {"s": time.perf_counter() - T0})
    dec = engine.batcher.decoder
    assert hasattr(dec, "hold_ahead"), "DecodeWorker.hold_ahead is gone: the probe toggles it"
    keys = ("first_packet_ms", "first_flow_ms", "first_vocoder_ms", "prefill_ms", "decode_ms_per_token",
            "tokens_at_first_packet", "llm_wall_ms", "total_ms", "rtf", "underruns", "gap_ms")
    results: dict[str, list[dict[str, float]]] = {}
    for streams in (1, 4):
        for hold in (False, True, False, True):
            dec.hold_ahead = hold
            rows = []
            for r in range(reps if streams == 1 else max(1, reps - 1)):
                rs = await asyncio.gather(*(measure_request(engine, ids, voice, sched, tokens, 100 * r + s)
                                            for s in range(streams)))
                rows += [{k: round(float(x.get(k, 0.0)), 2) for k in keys} for x in rs]
            name = f"streams{streams}_hold{int(hold)}"
            results.setdefault(name, []).extend(rows)
            every = results[name]  # both passes of this setting (it runs twice, interleaved with the other)
            save(name, {"last": rows, "rows": every,
                        "first_packet_p50": statistics.median(x["first_packet_ms"] for x in every),
                        "flow_p50": statistics.median(x["first_flow_ms"] for x in every)})
    # A profile of one request at one stream, decode held off (as shipped on CUDA).
    dec.hold_ahead = False
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        req = await measure_request(engine, ids, voice, sched, tokens, 7)
    events = prof.key_averages()
    (out / "profile.txt").write_text(
        events.table(sort_by="cuda_time_total" if dev == "cuda" else "cpu_time_total", row_limit=30)
        + "\n\n" + events.table(sort_by="cpu_time_total", row_limit=30) if len(events) else
        "no events recorded (so with the CPU-only torch 2.13 of the development machine)\n")
    save("profiled_request", {**req, "profiled_events": len(events)})
    await engine.close()


save("gil", gil_probe())
asyncio.run(engine_probe())
save("done", {"s": time.perf_counter() - T0})
