"""``python -m lab isolation``: what the embedded model's child process costs and what it buys.

In one run, on one machine:

1. **Voice to voice**, ``assistant serve`` with the model in this process (``--respond.backend local``) against the
   model in its supervised child process (``process``, the default) and, with ``--arms local,process,process+asr``,
   the ASR engine in a child of its own too, at each ``--sessions`` level, the placements taking turns over
   ``--rounds`` rounds (in order in odd rounds, reversed in even ones, so none always runs on a warmer or cooler
   machine). Every heard turn of a placement pools into its p50/p90.
2. **Memory**: the server's resident set, and the child's, after each run (Linux ``/proc``).
3. **The boundary by itself** (``--boundary``): a child hosting nothing but a probe (``engine_host/probe.py``)
   takes an ASR pass's audio (1, 5 and 15 s at 16 kHz, float32) and sends back a TTS reply's chunks (50 chunks of
   40 ms at 22.05 kHz): the time each costs over the socket pair, against the same call in process. It is what
   moving ASR or TTS into a child would add to every pass and every chunk.
4. **Crash to answer**, ``--crashes`` times: the child is killed with SIGSEGV and a reply is asked for at the same
   moment (it waits for the restart, as a turn does): the time from the kill to the engine ready again, and to
   the reply's first words. Each crash is counted as the first in a row (the child had run a while), so every
   restart is immediate, as a lone crash's is.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from assistant.bench.processes import start_assistant, stop, wait_ready
from assistant.bench.report import BenchResult, percentile
from assistant.bench.shared_data import shared_speech_files
from assistant.bench.v2v import bench_v2v, session_levels
from assistant.config import RespondConfig

log = logging.getLogger(__name__)

# An arm: its name and the flags that place the engines. "local" is everything in the server; "process" the default
# (the model in its child process); "process+asr" the ASR engine in a child of its own too.
ARMS = {
    "local": ["--respond.backend", "local"],
    "process": ["--respond.backend", "process"],
    "process+asr": ["--respond.backend", "process", "--asr.backend", "process"],
}
QUESTION = "What is the capital of France?"


def add_isolation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=session_levels, default=[1, 4],
                        help="concurrency levels for voice to voice, e.g. 1,4 (default)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every arm per level (default 2)")
    parser.add_argument("--arms", default="local,process",
                        help=f"placements to compare, the first the baseline: any of {', '.join(ARMS)} "
                        "(default local,process)")
    parser.add_argument("--turns", type=int, default=0,
                        help="turns per session in each run (default: one per shared clip)")
    parser.add_argument("--max-tokens", type=int, default=48,
                        help="respond.max_tokens of the servers (default 48): v2v ends at the first sound, and "
                        "long replies only make each turn wait for the last")
    parser.add_argument("--crashes", type=int, default=10, help="crashes for the crash-to-answer time (0: skip)")
    parser.add_argument("--boundary", type=int, default=200,
                        help="round trips per payload for the boundary's own cost (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="respond.threads for the model (default 1)")
    parser.add_argument("--out", default="bench-out/isolation", help="folder for logs and v2v.json files")
    parser.add_argument("--markdown", default="", help="also write the tables as Markdown to this file")


def rss_mb(pid: int) -> float | None:
    """A process's resident set in MiB (``/proc/PID/status``), None if it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


@dataclasses.dataclass
class Placement:
    v2v: dict[int, list[float]] = dataclasses.field(default_factory=dict)  # level → every heard turn's v2v ms
    ok: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # level → [heard, turns]
    server_mb: list[float] = dataclasses.field(default_factory=list)
    child_mb: list[float] = dataclasses.field(default_factory=list)


def arms_of(args: argparse.Namespace) -> list[str]:
    arms = [a.strip() for a in str(args.arms).split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or len(arms) < 2:
        raise ValueError(f"--arms: two or more of {', '.join(ARMS)}, got {args.arms!r}")
    return arms


def run_v2v(args: argparse.Namespace, folder: Path) -> dict[str, Placement]:
    from assistant.rtc.loopback_ice import allow_loopback_ice

    allow_loopback_ice()  # the servers are children on this machine (they offer 127.0.0.1 too)
    arms = arms_of(args)
    results = {arm: Placement() for arm in arms}
    for level in args.sessions:
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else arms[::-1]
            for arm in order:
                name = f"serve-{arm}-{level}-{r}"
                flags = [*ARMS[arm], "--respond.threads", str(args.threads),
                         "--respond.max_tokens", str(args.max_tokens)]
                child = start_assistant(name, "serve", flags, folder)
                try:
                    wait_ready([child])
                    result: BenchResult = asyncio.run(bench_v2v(child.url, shared_speech_files(), args.turns or None,
                                                                level, folder / name, plot=False))
                    mine = results[arm]
                    for lv in result.levels:
                        heard = [float(v) for t in lv.turns if (v := t.columns.get("v2v_ms")) is not None]
                        mine.v2v.setdefault(level, []).extend(heard)
                        counts = mine.ok.setdefault(level, [0, 0])
                        counts[0] += len(heard)
                        counts[1] += len(lv.turns)
                    if (mb := rss_mb(child.pid)) is not None:
                        mine.server_mb.append(mb)
                    mine.child_mb.append(sum(mb for pid in children_of(child.pid) if (mb := rss_mb(pid)) is not None))
                finally:
                    stop([child])
                log.info("bench.isolation v2v arm=%s level=%d round=%d", arm, level, r)
    return results


async def crash_to_answer(args: argparse.Namespace) -> list[tuple[float, float]]:
    """(kill → ready, kill → first words) in ms, per crash."""
    from assistant.respond import create_responder
    from assistant.respond.base import ReplyOptions
    from assistant.respond.hosted import HostedResponder

    cfg = RespondConfig(engine="llama", backend="process", threads=args.threads, temperature=0.0, slots=4,
                        restart_wait_s=120.0)
    responder = HostedResponder(cfg, create_responder(dataclasses.replace(cfg, engine="rules", backend="local")))
    await responder.start()
    responder.host.stable_s = 0.0  # every crash is the first in a row (see the module docstring)
    out: list[tuple[float, float]] = []
    try:
        for i in range(args.crashes):
            pid = responder.host.pid
            if pid is None:
                raise RuntimeError(f"the child is not running: {responder.health}")
            ready_at: list[float] = []
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGSEGV)
            while responder.health.ready:  # the death noticed (the supervisor has the exit)
                await asyncio.sleep(0.001)

            waiter = asyncio.create_task(_stamp_ready(responder.host, ready_at))
            stream = responder.respond(QUESTION, [], ReplyOptions())
            first = await anext(stream)
            answered = time.perf_counter()
            await stream.aclose()
            await waiter
            if not first.strip():
                raise RuntimeError("the restarted model said nothing")
            out.append(((ready_at[0] - t0) * 1000, (answered - t0) * 1000))
            log.info("bench.isolation crash=%d ready_ms=%.0f answer_ms=%.0f", i, *out[-1])
    finally:
        await responder.aclose()
    return out


async def boundary(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """(payload, p50 µs in process, p50 µs through a child) per payload shape."""
    import numpy as np

    from assistant.engine_host.probe import Probe
    from assistant.engine_host.supervisor import EngineProcess

    local = Probe({})
    host = EngineProcess("probe", "assistant.engine_host.probe:make_probe", {}, hang_timeout_s=30.0)
    await host.start()
    out: list[tuple[str, float, float]] = []
    try:
        for seconds in (1, 5, 15):
            audio = np.zeros(16000 * seconds, dtype=np.float32)
            here, there = [], []
            for _ in range(args.boundary):
                t0 = time.perf_counter()
                local.take(audio)
                t1 = time.perf_counter()
                await host.call("take", audio)
                t2 = time.perf_counter()
                here.append((t1 - t0) * 1e6)
                there.append((t2 - t1) * 1e6)
            out.append((f"ASR pass: {seconds} s of 16 kHz audio in", percentile(here, 50), percentile(there, 50)))
        here, there = [], []
        for _ in range(max(1, args.boundary // 10)):
            t0 = time.perf_counter()
            async for _chunk in local.chunks(50, 882):
                pass
            t1 = time.perf_counter()
            async for _chunk in host.stream("chunks", 50, 882):
                pass
            t2 = time.perf_counter()
            here.append((t1 - t0) * 1e6 / 50)
            there.append((t2 - t1) * 1e6 / 50)
        out.append(("TTS chunk: 40 ms at 22.05 kHz out (per chunk, 50 a reply)", percentile(here, 50),
                    percentile(there, 50)))
    finally:
        await host.close()
    return out


async def _stamp_ready(host: Any, stamps: list[float]) -> None:
    await host.wait_ready(120.0)
    stamps.append(time.perf_counter())


def _p(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q):.0f}" if values else "—"


def format_results(v2v: dict[str, Placement], crashes: list[tuple[float, float]],
                   wire: list[tuple[str, float, float]] | None = None) -> str:
    lines: list[str] = []
    if wire:
        lines += ["== the process boundary by itself (µs, p50): a probe that only carries the data",
                  "| payload | in process | through a child | added |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| {name} | {here:.0f} | {there:.0f} | {there - here:.0f} |" for name, here, there in wire]
        lines.append("")
    if v2v:
        arms = list(v2v)
        base = arms[0]
        lines += [f"== voice to voice (ms: p50 / p90), each placement against {base}; heard: turns with a reply heard",
                  "| sessions | " + " | ".join(arms) + " | " + " | ".join(f"{a}/{base} p50, p90" for a in arms[1:])
                  + " | heard |",
                  "| ---: | " + " | ".join("---:" for _ in arms) + " | " + " | ".join("---:" for _ in arms[1:])
                  + " | --- |"]
        levels = sorted({lv for p in v2v.values() for lv in p.v2v})
        for level in levels:
            values = {a: v2v[a].v2v.get(level, []) for a in arms}
            cells = [f"{_p(values[a], 50)} / {_p(values[a], 90)}" for a in arms]
            ratios = []
            for a in arms[1:]:
                b, v = values[base], values[a]
                r50, r90 = (percentile(v, q) / percentile(b, q) for q in (50, 90)) if b and v else (0.0, 0.0)
                ratios.append(f"{r50:.3f}, {r90:.3f}" if b and v else "—")
            heard = ", ".join(f"{v2v[a].ok.get(level, [0, 0])[0]}/{v2v[a].ok.get(level, [0, 0])[1]}" for a in arms)
            lines.append(f"| {level} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {heard} |")
        lines += ["", "== memory after each run (MiB resident, median of the runs)",
                  "| placement | server | its children | together |", "| --- | ---: | ---: | ---: |"]
        for arm in arms:
            p = v2v[arm]
            server = percentile(p.server_mb, 50) if p.server_mb else 0.0
            child = percentile(p.child_mb, 50) if p.child_mb else 0.0
            lines.append(f"| {arm} | {server:.0f} | {child:.0f} | {server + child:.0f} |")
    if crashes:
        ready = [c[0] for c in crashes]
        answer = [c[1] for c in crashes]
        lines += ["", f"== a crash (SIGSEGV) to the next answer, {len(crashes)} crashes (ms)",
                  "| | p50 | p90 | max |", "| --- | ---: | ---: | ---: |",
                  f"| kill → engine ready again | {_p(ready, 50)} | {_p(ready, 90)} | {max(ready):.0f} |",
                  f"| kill → the next reply's first words | {_p(answer, 50)} | {_p(answer, 90)} | {max(answer):.0f} |"]
    return "\n".join(lines)


def run_isolation_bench(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        v2v = run_v2v(args, folder) if args.sessions and args.rounds > 0 else {}
        crashes = asyncio.run(crash_to_answer(args)) if args.crashes > 0 else []
        wire = asyncio.run(boundary(args)) if args.boundary > 0 else []
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        print(f"bench isolation: {exc}")
        return 2
    text = format_results(v2v, crashes, wire)
    print(text)
    if args.markdown:
        write_markdown(Path(args.markdown), text, origin)
    return 0


__all__ = ["add_isolation_arguments", "run_isolation_bench"]
