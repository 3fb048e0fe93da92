"""``assistant bench ray``: voice-to-voice latency of one process against gateways sharing engines through Ray.

One run, two set-ups, the same turns:

1. **one process**: ``assistant serve`` with its engines in-process (the baseline);
2. **gateways + Ray**: a local Ray cluster with the engine applications (``ray.tts_replicas`` TTS replicas, one
   ASR replica), ``--gateways`` ``assistant serve`` processes with ``tts.backend = asr.backend = "ray"``, and the
   signaling dispatcher in front, which the bench talks to as if it were one server.

It prints the two v2v tables side by side (p50/p90 per column and level), the difference of the p50s, and the
hop itself as the gateways measured it (``assistant_ray_hop_seconds``: ``call`` = request in + first chunk
back, ``chunk`` = each later chunk back, ``asr`` = a transcription's round trip minus the engine's time),
read from their ``/metrics`` histograms (p50/p90 interpolated within buckets). JSON goes to ``--out``.
Both set-ups share this machine's cores with the bench client: compare them, not their absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from assistant.bench.report import BenchResult, summarize_level
from assistant.bench.v2v import bench_v2v

log = logging.getLogger(__name__)

# `assistant serve` with loopback ICE: aioice leaves 127.0.0.1 out of its candidates, and on one machine the
# bench client and the gateways meet there.
SERVE_WITH_LOOPBACK = ("import sys; from assistant.bench.v2v import allow_loopback_ice; allow_loopback_ice(); "
                       "from assistant.cli import main; sys.exit(main(sys.argv[1:]))")
COMPARED = ("v2v_ms", "server_v2v_ms", "asr_ms", "llm_first_text_ms", "tts_first_audio_ms", "downlink_ms")
HOP_METRIC = "assistant_ray_hop_seconds"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_assistant(args: Sequence[str], log_path: Path, *, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """``assistant <args>`` in a child process with loopback ICE, its output in ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed when the child ends
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.Popen([sys.executable, "-c", SERVE_WITH_LOOPBACK, *args], cwd=cwd, env=env,
                            stdout=out, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 240.0) -> None:
    """Block until ``url/readyz`` answers 200 (raises if the process exits or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s:g} s")


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """User + system CPU time these processes have used so far (Linux ``/proc``; None elsewhere)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return total / tick
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def one_process(out: Path, flags: Sequence[str]) -> Iterator[tuple[str, list[int]]]:
    port = free_port()
    proc = start_assistant(["serve", "--server.port", str(port), *flags], out / "one-process.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        yield url, [proc.pid]
    finally:
        stop([proc])


@contextlib.contextmanager
def gateways_on_ray(out: Path, flags: Sequence[str], gateways: int,
                    tts_replicas: int) -> Iterator[tuple[str, list[str], list[int]]]:
    """A local Ray cluster with the engines, ``gateways`` gateways and the dispatcher; (front URL, gateway
    URLs, gateway pids)."""
    import ray
    from ray import serve

    from assistant.config import load_config
    from assistant.serve_ray.app import deploy

    app = "bench"
    ray_flags = ["--tts.backend", "ray", "--asr.backend", "ray", "--ray.app_name", app,
                 "--ray.tts_replicas", str(tts_replicas), "--ray.tts_num_cpus", "0.5", "--ray.asr_num_cpus", "0.5"]
    ray.init(num_cpus=max(4, tts_replicas + 2), include_dashboard=False, namespace="assistant", log_to_driver=False)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        overrides: dict[str, dict[str, Any]] = {}
        for flag, value in zip(ray_flags[::2], ray_flags[1::2], strict=True):
            section, key = flag[2:].split(".", 1)
            overrides.setdefault(section, {})[key] = value
        deploy(load_config(overrides=overrides))
        address = ray.get_runtime_context().gcs_address
        urls = []
        for i in range(gateways):
            port = free_port()
            procs.append(start_assistant(
                ["serve", "--server.port", str(port), "--server.gateway_id", f"g{i}", "--ray.address", address,
                 "--ray.deploy", "false", *ray_flags, *flags], out / f"gateway-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_ready(url, proc)
        port = free_port()
        front = start_assistant(["dispatch", "--server.port", str(port), "--dispatch.gateways", ",".join(urls)],
                                out / "dispatch.log")
        procs.append(front)
        front_url = f"http://127.0.0.1:{port}"
        wait_ready(front_url, front)
        yield front_url, urls, [p.pid for p in procs[:gateways]]
    finally:
        stop(procs)
        serve.shutdown()
        ray.shutdown()


# --- the hop, from the gateways' histograms -------------------------------------------------------------
def hop_histograms(urls: Sequence[str]) -> dict[str, dict[float, float]]:
    """kind → {upper bound (s): cumulative count}, summed over the gateways' ``/metrics``."""
    texts = []
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            texts.append(resp.read().decode())
    return parse_hop_histograms(texts)


def parse_hop_histograms(texts: Sequence[str]) -> dict[str, dict[float, float]]:
    """The hop histograms of several Prometheus exposition texts, summed bucket by bucket."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name != HOP_METRIC:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets = out.setdefault(sample.labels["kind"], {})
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
    return out


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, linear within its bucket (Prometheus' histogram_quantile)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_bound, prev_count = bound, count
    return prev_bound


def format_hops(hist: dict[str, dict[float, float]]) -> str:
    lines = [f"  {'hop':<8}{'n':>7}{'p50 ms':>9}{'p90 ms':>9}"]
    for kind in ("call", "chunk", "asr"):
        buckets = hist.get(kind, {})
        n = int(buckets.get(float("inf"), 0))
        p50, p90 = bucket_quantile(buckets, 0.5), bucket_quantile(buckets, 0.9)
        lines.append(f"  {kind:<8}{n:>7}{_ms(p50 * 1000 if p50 is not None else None)}"
                     f"{_ms(p90 * 1000 if p90 is not None else None)}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{value:>9.1f}" if value is not None else f"{'—':>9}"


def format_side_by_side(one: BenchResult, ray: BenchResult) -> str:
    """Per level: p50 and p90 of each column, one process | gateways + Ray | the p50 difference."""
    lines = []
    for a, b in zip(one.levels, ray.levels, strict=True):
        sa, sb = summarize_level(a), summarize_level(b)
        lines.append(f"sessions={a.sessions}   one process: ok {sa['ok']}/{sa['turns']}   "
                     f"gateways + Ray: ok {sb['ok']}/{sb['turns']}")
        lines.append(f"  {'column':<20}{'one p50':>9}{'one p90':>9}{'ray p50':>9}{'ray p90':>9}{'Δ p50':>9}")
        for name in COMPARED:
            ca, cb = sa["columns"][name], sb["columns"][name]
            delta = cb["p50"] - ca["p50"] if ca["p50"] is not None and cb["p50"] is not None else None
            lines.append(f"  {name:<20}{_ms(ca['p50'])}{_ms(ca['p90'])}{_ms(cb['p50'])}{_ms(cb['p90'])}{_ms(delta)}")
        lines.append("")
    return "\n".join(lines)


async def _levels_with_cpu(url: str, pids: Sequence[int], out: Path, args: argparse.Namespace,
                           ) -> tuple[BenchResult, list[float | None]]:
    """bench v2v one level at a time, with the CPU the given processes spent per session-second at each."""
    merged: BenchResult | None = None
    cores_per_session: list[float | None] = []
    for k in args.sessions:
        before, t0 = cpu_seconds(pids), time.monotonic()
        result = await bench_v2v(url, args.audio, args.turns, [k], out / f"sessions-{k}", plot=not args.no_plot)
        after, wall = cpu_seconds(pids), time.monotonic() - t0
        cores_per_session.append((after - before) / (wall * k) if before is not None and after is not None
                                 else None)
        if merged is None:
            merged = result
        else:
            merged.levels.extend(result.levels)
    assert merged is not None
    return merged, cores_per_session


async def run_ray_bench(args: argparse.Namespace) -> int:
    out = Path(args.out)
    flags = ["--respond.engine", args.responder]
    from assistant.bench.v2v import allow_loopback_ice

    allow_loopback_ice()
    with one_process(out, flags) as (url, pids):
        one, one_cpu = await _levels_with_cpu(url, pids, out / "one-process", args)
    with gateways_on_ray(out, flags, args.gateways, args.tts_replicas) as (front, urls, pids):
        ray_result, gateway_cpu = await _levels_with_cpu(front, pids, out / "gateways-ray", args)
        hist = hop_histograms(urls)
    print(f"v2v, one process vs {args.gateways} gateways + Ray ({args.tts_replicas} TTS replicas, 1 ASR replica), "
          "milliseconds")
    print(format_side_by_side(one, ray_result))
    print("the Ray hop as the gateways measured it (all levels)")
    print(format_hops(hist))
    print("\nCPU cores busy per active session (CPU seconds / session-seconds)")
    print(f"  {'sessions':<10}{'one process (all engines)':>28}{'gateways (no engines)':>24}")
    for k, a, b in zip(args.sessions, one_cpu, gateway_cpu, strict=True):
        print(f"  {k:<10}{_cores(a):>28}{_cores(b):>24}")
    summary = {
        "one_process": [summarize_level(lv) for lv in one.levels],
        "gateways_ray": [summarize_level(lv) for lv in ray_result.levels],
        "hop_ms": {kind: {"n": int(b.get(float("inf"), 0)),
                          "p50": (bucket_quantile(b, 0.5) or 0) * 1000, "p90": (bucket_quantile(b, 0.9) or 0) * 1000}
                   for kind, b in hist.items()},
        "cores_per_session": {"one_process": one_cpu, "gateway": gateway_cpu},
        "settings": {"gateways": args.gateways, "tts_replicas": args.tts_replicas, "sessions": args.sessions},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_hop.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nwrote {out / 'ray_hop.json'}")
    bad = sum(1 for r in (one, ray_result) for lv in r.levels for t in lv.turns if t.status != "ok")
    return 0 if bad == 0 else 1


def _cores(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "—"


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    from assistant.bench.v2v import _levels

    parser.add_argument("--sessions", type=_levels, default=[1, 4], help="concurrency levels (default: 1,4)")
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default: one per audio file)")
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="WAV", help="speech files to play")
    parser.add_argument("--gateways", type=int, default=2, help="gateway processes (default: %(default)s)")
    parser.add_argument("--tts-replicas", type=int, default=2, help="TTS replicas (default: %(default)s)")
    parser.add_argument("--responder", default="echo", help="respond.engine of both set-ups (default: echo)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/ray"), help="folder for the results")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
