"""``python -m lab asr-threads``: what a second (or third) CTranslate2 thread buys an ASR pass on this machine.

The voice chat's passes share the CPUs with the language model, the voice and Smart Turn, and ``asr.workers`` passes
run at once. For each thread count this study loads the product's engine (``FasterWhisperEngine``, the configured
model and window) and times the held-out human clips one pass at a time (wall clock and the process's CPU time),
then two passes at once, as two sessions' turns would run. Thread counts are measured in rounds, interleaved, so a
machine that slows down over the run does not favour one of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def add_threads_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="asr.cpu_threads values to compare")
    parser.add_argument("--clips", type=int, default=12, help="held-out human clips (lab/data/human_heldout.txt)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the thread counts, interleaved")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for asr_threads.json")
    parser.add_argument("--config", default=None, help="config file (default: configs/default.toml)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as Markdown to FILE under a line naming this command, the commit "
                        "and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    from assistant.config import add_config_flags

    add_config_flags(parser, sections=("asr",))


def held_out_clips(count: int) -> list[np.ndarray]:
    """The first ``count`` held-out human clips, 16 kHz mono."""
    from assistant.audio import read_audio, resample
    from lab.human_set import HELD_OUT, human_dir

    names = [n.strip() for n in HELD_OUT.read_text().splitlines() if n.strip()][:count]
    out = []
    for name in names:
        audio, rate = read_audio(human_dir() / (name if name.endswith(".flac") else f"{name}.flac"))
        out.append(resample(audio, rate, 16_000) if rate != 16_000 else audio)
    return out


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def time_engine(engine: Any, clips: list[np.ndarray]) -> dict[str, list[float]]:
    """Each clip alone (wall and CPU seconds), then each with the next at once (wall seconds for both)."""
    alone, cpu, pairs = [], [], []
    for audio in clips:
        c0, t0 = cpu_seconds(), time.perf_counter()
        engine.transcribe(audio)
        alone.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
    with ThreadPoolExecutor(2) as pool:
        for i, audio in enumerate(clips):
            t0 = time.perf_counter()
            both = [pool.submit(engine.transcribe, audio), pool.submit(engine.transcribe, clips[(i + 1) % len(clips)])]
            for f in both:
                f.result()
            pairs.append(time.perf_counter() - t0)
    return {"alone": alone, "cpu": cpu, "pairs": pairs}


def run_threads(args: argparse.Namespace) -> int:
    from assistant.asr.whisper import FasterWhisperEngine
    from assistant.bench.figures import provenance, write_markdown
    from assistant.config import flag_overrides, load_config

    if args.clips < 2 or args.rounds < 1 or any(n < 1 for n in args.threads):
        raise SystemExit("--clips must be at least 2, --rounds at least 1, and every --threads at least 1")
    origin = provenance()
    cfg = load_config(args.config, overrides=flag_overrides(args)).asr
    clips = held_out_clips(args.clips)
    runs: dict[int, dict[str, list[float]]] = {n: {"alone": [], "cpu": [], "pairs": []} for n in args.threads}
    model = ""
    for _ in range(args.rounds):
        for n in args.threads:
            engine = FasterWhisperEngine(dataclasses.replace(cfg, cpu_threads=n, workers=2))
            model = engine.model_name
            engine.transcribe(clips[0])  # the first pass (allocations) is not timed
            for key, values in time_engine(engine, clips).items():
                runs[n][key] += values
            del engine
    rows = [{"threads": n,
             "alone_ms": round(1000 * statistics.median(r["alone"])),
             "alone_mean_ms": round(1000 * statistics.fmean(r["alone"])),
             "cpu_ms": round(1000 * statistics.fmean(r["cpu"])),
             "two_at_once_ms": round(1000 * statistics.median(r["pairs"]))} for n, r in runs.items()]
    print(f"{model}: {len(clips)} held-out human clips, {args.rounds} round(s); a pass alone (median, mean), its CPU "
          "(mean), and two passes at once (median wall time of both)")
    print(f"{'threads':>7s} {'alone ms':>8s} {'mean':>6s} {'cpu ms':>7s} {'two at once ms':>15s}")
    for r in rows:
        print(f"{r['threads']:7d} {r['alone_ms']:8d} {r['alone_mean_ms']:6d} {r['cpu_ms']:7d} "
              f"{r['two_at_once_ms']:15d}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "asr_threads.json").write_text(json.dumps(
        {"model": model, "clips": len(clips), "rounds": args.rounds, "rows": rows,
         "seconds": {str(n): r for n, r in runs.items()}}, indent=1))
    print(f"\nwrote {out / 'asr_threads.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, threads_markdown(model, len(clips), args.rounds, rows), origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0


def threads_markdown(model: str, clips: int, rounds: int, rows: list[dict[str, Any]]) -> str:
    lines = [f"`{model}`, {clips} held-out human clips, {rounds} rounds interleaved:", "",
             "| asr.cpu_threads | a pass alone, ms (median / mean) | its CPU, ms (mean) "
             "| two passes at once, ms (median) |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {r['threads']} | {r['alone_ms']} / {r['alone_mean_ms']} | {r['cpu_ms']} | {r['two_at_once_ms']} |"
              for r in rows]
    return "\n".join(lines)
