"""``python -m lab attacks``: each attack of ``lab/attacks.py`` against a real ``assistant serve`` (a child
process), beside a normal voice session, with the server's cost measured from outside: peak RSS growth during
the attack, event-loop lag (``GET /healthz`` latency sampled every 50 ms), and whether the bystander's turn was
heard. ``--before DIR`` runs the same attacks against the code in another checkout first (a ``git worktree`` of
the commit to compare with) and prints the two tables side by side.

The servers run with their defaults (the flags both versions know), so every attack comes from this one client;
the offer flood runs last, since it spends that client's offer budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import aiohttp

from assistant.bench.processes import start_assistant, stop, wait_ready
from assistant.bench.shared_data import SHARED_AUDIO
from assistant.bench.v2v import BenchSession
from lab.attacks import SCENARIOS, Outcome, Target, run_scenario, warm_up


def add_attack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of the code to compare with (its `assistant serve` is attacked first)")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all): " + ", ".join(SCENARIOS))
    parser.add_argument("--audio", type=Path, default=SHARED_AUDIO, help="the shared speech files")
    parser.add_argument("--out", type=Path, default=Path("bench-out/attacks"), help="logs and results.json")


async def attack_server(tree: Path | None, names: list[str], audio: Path, out: Path, label: str) -> list[Outcome]:
    """Start ``assistant serve`` from ``tree`` (None: this code), run each scenario beside a bystander session."""
    env = {"PYTHONPATH": str(tree)} if tree is not None else {}
    child = start_assistant(label, "serve", ["--server.data_dir", str(out / f"{label}-data")], out,
                            cwd=tree, env=env)
    outcomes: list[Outcome] = []
    try:
        await asyncio.to_thread(wait_ready, [child])
        async with aiohttp.ClientSession() as http:
            bystander = BenchSession(index=0, url=child.url, http=http)
            await bystander.connect()
            await warm_up(Target(child.url, child.pid, audio), http, bystander)
            try:
                for name in names:
                    if child.proc.poll() is not None:
                        outcomes.append(Outcome(name, f"server gone (exit {child.proc.returncode})"))
                        continue
                    if bystander.failed:  # an earlier attack cost it its call: each row gets a live bystander
                        await bystander.close()
                        bystander = BenchSession(index=0, url=child.url, http=http)
                        await bystander.connect()
                    try:
                        outcome = await asyncio.wait_for(run_scenario(Target(child.url, child.pid, audio), name,
                                                                      http, bystander), 240)
                    except Exception as exc:  # an attack that broke the server or the client: a row that says so
                        outcome = Outcome(name, f"{type(exc).__name__}: {str(exc)[:80]}")
                    outcomes.append(outcome)
                    print(f"[{label}] {row(outcome)}", flush=True)
            finally:
                await bystander.close()
    finally:
        stop([child])
    return outcomes


def _heard(o: Outcome) -> str:
    if o.heard is None:
        return "-"
    return "yes" if o.heard else f"no ({o.heard_reason})" if o.heard_reason else "no"


def row(o: Outcome) -> str:
    heard = _heard(o)
    return (f"| {o.name} | {o.got} | {o.rss_growth_mb:+.0f} | {o.lag_p99_ms:.0f} / {o.lag_max_ms:.0f} | {heard} |")


def table(before: list[Outcome] | None, after: list[Outcome]) -> str:
    if before is None:
        lines = ["| attack | answer | RSS growth MB | loop lag p99 / max ms | bystander heard |",
                 "| --- | --- | --- | --- | --- |"]
        return "\n".join(lines + [row(o) for o in after])
    lines = ["| attack | before: answer | after: answer | RSS growth MB before → after | loop lag p99 / max ms "
             "before → after | bystander heard before → after |", "| --- | --- | --- | --- | --- | --- |"]
    for b, a in zip(before, after, strict=True):
        lines.append(f"| {a.name} | {b.got} | {a.got} | {b.rss_growth_mb:+.0f} → {a.rss_growth_mb:+.0f} | "
                     f"{b.lag_p99_ms:.0f} / {b.lag_max_ms:.0f} → {a.lag_p99_ms:.0f} / {a.lag_max_ms:.0f} | "
                     f"{_heard(b)} → {_heard(a)} |")
    return "\n".join(lines)


async def run_attack_bench(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from assistant.rtc.loopback_ice import allow_loopback_ice

    allow_loopback_ice()
    before = None
    if args.before is not None:
        before = await attack_server(args.before.resolve(), names, args.audio, args.out, "before")
    after = await attack_server(None, names, args.audio, args.out, "after")
    text = table(before, after)
    print("\n" + text)
    (args.out / "results.json").write_text(json.dumps(
        {"before": [o.__dict__ for o in before] if before else None, "after": [o.__dict__ for o in after]},
        indent=1, default=str))
    (args.out / "table.md").write_text(text + "\n")
    return 0
