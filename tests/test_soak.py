"""Soak: K real aiortc peers loop speech turns for minutes; afterwards RSS, open file descriptors and asyncio
tasks must be back at their starting level.

``test_soak_short`` is the same soak in a short form (2 sessions, two rounds of 12 s, every check of the long one)
and runs in CI. ``test_soak`` is marked ``soak`` and runs only with ``--soak``; ``SOAK_SESSIONS`` (default 8) and
``SOAK_MINUTES`` (default 3) size it, and ``SOAK_REPORT`` names a JSON file for the figures (docs/reliability.md
quotes them).

Figures are for this whole process: the server and its clients share it (as they do in every test here).
Tolerances: file descriptors and tasks must return exactly to the start level. RSS is read after
``malloc_trim`` (freed heap handed back); it may stay above the start by the memory pools of the inference
runtimes (ONNX Runtime and CTranslate2 keep arenas at the high-water mark of the largest and most concurrent
work they saw). The soak therefore runs two rounds of K fresh sessions: a leak grows from the first round
to the second, pools do not (``ROUND_GROWTH_MB``). With two sessions in 12 s rounds the pools settle slowly and
noisily (measured 2026-12-02, five rounds of 2 × 12 s in a fresh process: 343 MB at the start, then 505, 553,
554, 543, 537 MB after each round; another run: 347, then 493, 512, 569): the short form's RSS bounds catch only
a gross leak, the long soak is the leak detector.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.waiting import own_tasks, until

SOAK_SESSIONS = int(os.environ.get("SOAK_SESSIONS", "8"))
SOAK_MINUTES = float(os.environ.get("SOAK_MINUTES", "3"))
SHORT_RSS_TOLERANCE_MB = 250.0  # 2 sessions × 24 s in a fresh process: the pools' plateau is ~200 MB over the start
SHORT_ROUND_GROWTH_MB = 100.0  # round 2 over round 1 measured +19 to +57 MB with 2 sessions
SOAK_RSS_TOLERANCE_MB = 300.0  # K sessions: ONNX/CTranslate2 arenas grow to the high-water mark of K at once
ROUND_GROWTH_MB = 48.0  # the second round of K sessions over the first: a leak grows here
FILES = ("en_weather.wav", "en_timer.wav", "en_story.wav")
SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


def _trim() -> None:
    """Hand freed heap back to the OS (glibc keeps it in its arenas otherwise), so RSS shows what is held."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def figures() -> dict[str, float]:
    """RSS (MB), open fds, asyncio tasks and live Python objects of this process, after a full collection."""
    gc.collect()
    _trim()
    rss_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))
    return {"rss_mb": round(rss_kb / 1024, 1), "fds": len(os.listdir("/proc/self/fd")), "tasks": len(own_tasks()),
            "py_objects": len(gc.get_objects())}


async def one_round(url: str, http: aiohttp.ClientSession, app: Any, utterances: list[Any], sessions: int,
                    seconds: float, peak: dict[str, float], rss_series: list[float]) -> dict[str, Any]:
    """K fresh peers loop turns for ``seconds``, then hang up; returns the round's turns and errors."""
    clients = [BenchSession(i, url, http) for i in range(sessions)]
    await asyncio.gather(*(c.connect() for c in clients))
    deadline = time.monotonic() + seconds

    async def loop(client: BenchSession) -> list[str]:
        await asyncio.sleep(client.index * 0.4)  # not in lockstep
        statuses = []
        k = 0
        while time.monotonic() < deadline:
            result = await client.run_turn(utterances[(client.index + k) % len(utterances)], k, SETTINGS)
            statuses.append(result.status)
            k += 1
        return statuses

    async def sample() -> None:
        while time.monotonic() < deadline:
            now = figures()
            rss_series.append(now["rss_mb"])
            for key in peak:
                peak[key] = max(peak[key], now[key])
            await asyncio.sleep(5)

    sampler = asyncio.create_task(sample())
    results = await asyncio.gather(*(loop(c) for c in clients))
    sampler.cancel()
    errors = sum(1 for c in clients for e in c.events if e.body.get("type") == "error")
    turns_server = sum(s.conversation.turns for s in app[SESSIONS].values())
    for c in clients:
        await c.close()
    await until(lambda: not app[SESSIONS], "every session of the round to close", 30)
    statuses = [s for r in results for s in r]
    return {"turns": len(statuses), "ok": statuses.count("ok"), "dropped": statuses.count("dropped"),
            "error": statuses.count("error"), "turns_server": turns_server, "error_events": errors}


async def soak(services: Services, tmp_path: Path, audio: Path, sessions: int, seconds: float,
               rounds: int = 1) -> dict[str, Any]:
    """``rounds`` rounds of ``sessions`` peers looping turns (``seconds`` in all); figures after each round.

    With two or more rounds, RSS after the last round against RSS after the first tells a leak (it grows
    with every round of sessions and turns) from memory pools that grow to a high-water mark and stay.
    """
    utterances = [load_utterance(audio / f) for f in FILES]
    cfg = test_config(server={"data_dir": str(tmp_path / "data"), "max_sessions": max(32, sessions)})
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        idle = figures()
        warm = BenchSession(99, url, http)  # one connect/hang-up first: lazily made pools and caches
        await warm.connect()
        await warm.close()
        await until(lambda: not app[SESSIONS] and len(own_tasks()) <= idle["tasks"], "the warm-up session's end", 30)
        before = figures()
        peak = dict(before)
        rss_series: list[float] = []  # every 5 s
        per_round = []
        t0 = time.monotonic()
        for _ in range(rounds):
            stats = await one_round(url, http, app, utterances, sessions, seconds / rounds, peak, rss_series)
            with contextlib.suppress(AssertionError):  # aiortc's transports finish closing; check() says if not
                await until(lambda: settled(before), "file descriptors and tasks back at the start", 10, 0.2)
            stats["after"] = figures()
            per_round.append(stats)
        wall = time.monotonic() - t0
    report = {
        "sessions": sessions,
        "rounds": rounds,
        "seconds": round(wall, 1),
        **{k: sum(r[k] for r in per_round) for k in ("turns", "ok", "dropped", "error", "turns_server",
                                                     "error_events")},
        "before": before,
        "peak": peak,
        "after_first_round": per_round[0]["after"],
        "after": per_round[-1]["after"],
        "rss_series_mb": rss_series,
    }
    print("\nsoak " + json.dumps(report))
    if out := os.environ.get("SOAK_REPORT"):
        Path(out).write_text(json.dumps(report, indent=2))
    return report


def settled(start: dict[str, float]) -> bool:
    """File descriptors and tasks back at (or below) ``start``."""
    now = figures()
    return now["fds"] <= start["fds"] and now["tasks"] <= start["tasks"]


def check(report: dict[str, Any], rss_tolerance_mb: float, round_growth_mb: float = ROUND_GROWTH_MB) -> None:
    before, first, after = report["before"], report["after_first_round"], report["after"]
    assert report["error_events"] == 0 and report["error"] == 0, report
    assert report["ok"] >= report["sessions"], report  # every session completed turns
    assert after["fds"] <= before["fds"] and after["tasks"] <= before["tasks"], report
    assert after["rss_mb"] <= before["rss_mb"] + rss_tolerance_mb, report
    if report["rounds"] > 1:  # no growth from one round of sessions to the next
        assert after["rss_mb"] <= first["rss_mb"] + round_growth_mb, report


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_soak_short(services: Services, tmp_path: Path, shared_audio: Path) -> None:
    """The soak in CI: the same two rounds and checks as ``test_soak``, 2 sessions for 2 × 12 s."""
    check(await soak(services, tmp_path, shared_audio, sessions=2, seconds=24, rounds=2), SHORT_RSS_TOLERANCE_MB,
          SHORT_ROUND_GROWTH_MB)


@pytest.mark.soak
@pytest.mark.timeout(int(SOAK_MINUTES * 60 + 600))
async def test_soak(services: Services, tmp_path: Path, shared_audio: Path) -> None:
    report = await soak(services, tmp_path, shared_audio, SOAK_SESSIONS, SOAK_MINUTES * 60, rounds=2)
    check(report, SOAK_RSS_TOLERANCE_MB)
