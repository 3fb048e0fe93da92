"""``python -m lab ray``: voice-to-voice latency of one process against gateways sharing engines through Ray.

One run, two set-ups, the same turns:

1. **one process**: ``assistant serve`` with its engines in-process (the baseline);
2. **gateways + Ray**: a local Ray cluster with the engine applications (``ray.tts_replicas`` TTS replicas, one
   ASR replica), ``--gateways`` ``assistant serve`` processes with ``tts.backend = asr.backend = "ray"``, and the
   signaling dispatcher in front, which the bench talks to as if it were one server.

It prints the two v2v tables side by side (p50/p90 per column and level) with the difference of the p50s; the
hop alone (sequential calls on the idle cluster, through the same client code, to the TTS deployment and to a
bare Serve stream, the floor); and the hop as the gateways measured it during each level
(``assistant_ray_hop_seconds``: ``call`` = request in + first chunk back, ``chunk`` = each later chunk back,
``asr`` = a transcription's way there and back, ``asr_wait`` = its wait on the replica for a free worker),
read from their ``/metrics`` histograms (p50/p90 interpolated within buckets). JSON goes to ``--out``.
Both set-ups share this machine's cores with the bench client: compare them, not their absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from assistant.bench.figures import provenance, write_markdown
from assistant.bench.processes import AssistantProcess, cpu_seconds, start_assistant, stop, wait_ready
from assistant.bench.report import BenchResult, percentile, summarize_level
from assistant.bench.shared_data import shared_speech_files
from assistant.bench.v2v import bench_v2v
from assistant.config import Config
from assistant.tts.base import TTSRequest

if TYPE_CHECKING:
    from assistant.serve_ray.replicas import SentChunk

log = logging.getLogger(__name__)

COMPARED = ("v2v_ms", "server_v2v_ms", "asr_ms", "llm_first_text_ms", "tts_first_audio_ms", "downlink_ms")
HOP_METRIC = "assistant_ray_hop_seconds"


@contextlib.contextmanager
def one_process(out: Path, flags: Sequence[str]) -> Iterator[AssistantProcess]:
    server = start_assistant("one-process", "serve", flags, out)
    try:
        wait_ready([server])
        yield server
    finally:
        stop([server])


@contextlib.contextmanager
def gateways_on_ray(out: Path, flags: Sequence[str], gateways: int,
                    tts_replicas: int) -> Iterator[tuple[AssistantProcess, list[AssistantProcess], Config]]:
    """A local Ray cluster with the engines, ``gateways`` gateways and the dispatcher in front of them;
    (the dispatcher, the gateways, the engines' config)."""
    import ray
    from ray import serve

    from assistant.config import load_config
    from assistant.serve_ray.app import deploy, start_local_cluster

    ray_settings: dict[str, dict[str, object]] = {
        "tts": {"backend": "ray"}, "asr": {"backend": "ray"},
        "ray": {"app_name": "bench", "tts_replicas": tts_replicas, "tts_num_cpus": 0.5, "asr_num_cpus": 0.5},
    }
    ray_flags = [arg for section, keys in ray_settings.items() for key, value in keys.items()
                 for arg in (f"--{section}.{key}", str(value))]
    address = start_local_cluster(num_cpus=max(4, tts_replicas + 2))
    children: list[AssistantProcess] = []
    try:
        cfg = load_config(overrides=ray_settings)
        deploy(cfg)
        for i in range(gateways):
            children.append(start_assistant(
                f"gateway-{i}", "serve",
                ["--server.gateway_id", f"g{i}", "--ray.address", address, "--ray.deploy", "false", *ray_flags,
                 *flags], out))
        wait_ready(children)
        front = start_assistant("dispatch", "dispatch", ["--dispatch.gateways", ",".join(c.url for c in children)],
                                out)
        wait_ready([front])
        children.append(front)
        yield front, children[:gateways], cfg
    finally:
        stop(children)
        serve.shutdown()
        ray.shutdown()


# --- the hop alone: our TTS deployment against a bare Serve stream, same client code, same cluster ---------
class BareStream:
    """A Serve deployment that only streams (no engine): the floor any Serve hop pays. Its items look like the
    TTS replica's (a chunk, sent, started, replica), so the same client code reads both."""

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[SentChunk]:
        import numpy as np

        started = time.time()
        chunk = np.zeros(BARE_ITEM_SAMPLES, dtype=np.float32)
        for _ in range(BARE_ITEMS):
            await asyncio.sleep(BARE_GAP_S)  # spaced like an engine's chunks, so none queues behind another
            yield chunk, time.time(), started, "bare"


BARE_ITEMS, BARE_ITEM_SAMPLES, BARE_GAP_S = 4, 24_000, 0.02
HOP_CALLS = 40


async def measure_hops(cfg: Config, calls: int = HOP_CALLS) -> dict[str, dict[str, list[float]]]:
    """Hop samples (seconds) of ``calls`` sequential calls through ``RemoteTTS``: to a bare Serve stream and to
    the TTS deployment (a short sentence); {"bare"|"tts": {"call"|"chunk": [...]}}."""
    from ray import serve

    from assistant.serve_ray.client import RemoteTTS, TTSHandle, connect_tts
    from assistant.serve_ray.replicas import EngineInfo
    from assistant.tts.base import TTSCapabilities

    bare = serve.deployment(name="Bare")(BareStream).options(
        num_replicas=max(1, cfg.ray.tts_replicas), ray_actor_options={"num_cpus": 0.1})
    handle = await asyncio.to_thread(serve.run, bare.bind(), name="bench-bare", route_prefix=None)
    out: dict[str, dict[str, list[float]]] = {}
    try:
        for name in ("bare", "tts"):
            samples: dict[str, list[float]] = {"call": [], "chunk": []}

            def observe(kind: str, seconds: float, samples: dict[str, list[float]] = samples) -> None:
                samples.setdefault(kind, []).append(seconds)

            # The bare deployment has only ``synthesize``: the one method RemoteTTS.synthesize calls.
            engine = (RemoteTTS(cast(TTSHandle, handle), EngineInfo("bare", 24_000, TTSCapabilities(), False), observe)
                      if name == "bare" else await asyncio.to_thread(connect_tts, cfg, observe))
            for i in range(calls + 3):  # 3 warm-up calls, dropped
                async for _ in engine.synthesize(TTSRequest(text="Hello there. How are you today?")):
                    pass
                if i == 2:
                    for values in samples.values():
                        values.clear()
            out[name] = samples
    finally:
        await asyncio.to_thread(serve.delete, "bench-bare")
    return out


def format_micro(hops: dict[str, dict[str, list[float]]]) -> str:
    lines = [f"  {'':<22}{'n':>5}{'p50 ms':>9}{'p90 ms':>9}"]
    for name, label in (("bare", "bare Serve stream"), ("tts", "TTS deployment")):
        for kind in ("call", "chunk"):
            values = [v * 1000 for v in hops.get(name, {}).get(kind, [])]
            p50 = percentile(values, 50) if values else None
            p90 = percentile(values, 90) if values else None
            lines.append(f"  {label + ' ' + kind:<22}{len(values):>5}{_ms(p50)}{_ms(p90)}")
    return "\n".join(lines)


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
    lines = [f"  {'hop':<10}{'n':>7}{'p50 ms':>9}{'p90 ms':>9}"]
    for kind in ("call", "chunk", "asr", "asr_wait"):
        buckets = hist.get(kind, {})
        n = int(buckets.get(float("inf"), 0))
        p50, p90 = bucket_quantile(buckets, 0.5), bucket_quantile(buckets, 0.9)
        lines.append(f"  {kind:<10}{n:>7}{_ms(p50 * 1000 if p50 is not None else None)}"
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


Histograms = dict[str, dict[float, float]]


def hist_delta(after: Histograms, before: Histograms) -> Histograms:
    """What was observed between two snapshots of cumulative histograms."""
    return {kind: {le: count - before.get(kind, {}).get(le, 0.0) for le, count in buckets.items()}
            for kind, buckets in after.items()}


async def _levels_with_cpu(url: str, pids: Sequence[int], out: Path, args: argparse.Namespace,
                           hop_urls: Sequence[str] = ()) -> tuple[BenchResult, list[float | None], list[Histograms]]:
    """bench v2v one level at a time, with the CPU the given processes spent per session-second at each and
    (with ``hop_urls``) the hop histograms those gateways observed during each."""
    merged: BenchResult | None = None
    cores_per_session: list[float | None] = []
    hops: list[Histograms] = []
    for k in args.sessions:
        hops_before = await asyncio.to_thread(hop_histograms, hop_urls) if hop_urls else {}
        before, t0 = cpu_seconds(pids), time.monotonic()
        result = await bench_v2v(url, args.audio or shared_speech_files(), args.turns, [k], out / f"sessions-{k}",
                                 plot=not args.no_plot)
        after, wall = cpu_seconds(pids), time.monotonic() - t0
        cores_per_session.append((after - before) / (wall * k) if before is not None and after is not None
                                 else None)
        if hop_urls:
            hops.append(hist_delta(await asyncio.to_thread(hop_histograms, hop_urls), hops_before))
        if merged is None:
            merged = result
        else:
            merged.levels.extend(result.levels)
    assert merged is not None
    return merged, cores_per_session, hops


async def run_ray_bench(args: argparse.Namespace) -> int:
    origin = provenance()  # the machine's load as the bench starts
    out = Path(args.out)
    flags = ["--respond.engine", args.responder]
    from assistant.rtc.loopback_ice import allow_loopback_ice

    allow_loopback_ice()
    with one_process(out, flags) as server:
        one, one_cpu, _ = await _levels_with_cpu(server.url, [server.pid], out / "one-process", args)
    with gateways_on_ray(out, flags, args.gateways, args.tts_replicas) as (front, gws, cfg):
        micro = await measure_hops(cfg)  # the hop alone, on the idle cluster, before any session
        ray_result, gateway_cpu, level_hops = await _levels_with_cpu(
            front.url, [g.pid for g in gws], out / "gateways-ray", args, [g.url for g in gws])
    print(f"v2v, one process vs {args.gateways} gateways + Ray ({args.tts_replicas} TTS replicas, 1 ASR replica), "
          "milliseconds")
    print(format_side_by_side(one, ray_result))
    print(f"the hop alone, {HOP_CALLS} sequential calls on the idle cluster, same client code (RemoteTTS)")
    print(format_micro(micro))
    for k, hist in zip(args.sessions, level_hops, strict=True):
        print(f"\nthe Ray hop as the gateways measured it during the v2v run, sessions={k}")
        print(format_hops(hist))
    print("\nCPU cores busy per active session (CPU seconds / session-seconds)")
    print(f"  {'sessions':<10}{'one process (all engines)':>28}{'gateways (no engines)':>24}")
    for k, a, b in zip(args.sessions, one_cpu, gateway_cpu, strict=True):
        print(f"  {k:<10}{_cores(a):>28}{_cores(b):>24}")
    summary = {
        "one_process": [summarize_level(lv) for lv in one.levels],
        "gateways_ray": [summarize_level(lv) for lv in ray_result.levels],
        "hop_ms": [{kind: {"n": int(b.get(float("inf"), 0)), "p50": (bucket_quantile(b, 0.5) or 0) * 1000,
                           "p90": (bucket_quantile(b, 0.9) or 0) * 1000} for kind, b in hist.items()}
                   for hist in level_hops],
        "hop_alone_ms": {name: {kind: sorted(v * 1000 for v in values) for kind, values in kinds.items()}
                         for name, kinds in micro.items()},
        "cores_per_session": {"one_process": one_cpu, "gateway": gateway_cpu},
        "settings": {"gateways": args.gateways, "tts_replicas": args.tts_replicas, "sessions": args.sessions},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_hop.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nwrote {out / 'ray_hop.json'}")
    if args.markdown is not None:
        body = ray_markdown(one, ray_result, micro, level_hops, one_cpu, gateway_cpu, args)
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    bad = sum(1 for r in (one, ray_result) for lv in r.levels for t in lv.turns if t.status != "ok")
    return 0 if bad == 0 else 1


def _cores(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "—"


def _pair(stats: dict[str, float | None]) -> str:
    p50, p90 = stats.get("p50"), stats.get("p90")
    return "—" if p50 is None or p90 is None else f"{p50:.1f} / {p90:.1f} ms"


def ray_markdown(one: BenchResult, ray: BenchResult, micro: dict[str, dict[str, list[float]]],
                 level_hops: Sequence[Histograms], one_cpu: Sequence[float | None],
                 gateway_cpu: Sequence[float | None], args: argparse.Namespace) -> str:
    """The run as Markdown: v2v of both set-ups per level, CPU per session, the hop alone and during each level."""
    setup = f"{args.gateways} gateways + Ray ({args.tts_replicas} TTS, 1 ASR replica)"
    lines = [f"| | one process | {setup} |", "|---|---|---|"]
    for a, b in zip(one.levels, ray.levels, strict=True):
        sa, sb = summarize_level(a)["columns"]["v2v_ms"], summarize_level(b)["columns"]["v2v_ms"]
        lines.append(f"| v2v p50 / p90, {a.sessions} session{'s' if a.sessions > 1 else ''} | {_pair(sa)} | "
                     f"{_pair(sb)} |")
    lines.append("| CPU cores per active session | " + ", ".join(
        f"{_cores(c)} ({k})" for k, c in zip(args.sessions, one_cpu, strict=True)) + ", engines included | "
        + ", ".join(f"{_cores(c)} ({k})" for k, c in zip(args.sessions, gateway_cpu, strict=True))
        + ", gateways, no engines |")
    head = ["hop (p50 / p90)", f"alone, idle cluster, {HOP_CALLS} calls",
            *(f"during v2v, {k} session{'s' if k > 1 else ''}" for k in args.sessions)]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, label in (("bare", "bare Serve stream"), ("tts", "TTS")):
        for kind in ("call", "chunk"):
            values = [v * 1000 for v in micro.get(name, {}).get(kind, [])]
            alone = (f"{percentile(values, 50):.1f} / {percentile(values, 90):.1f} ms" if values else "—")
            during = [("—" if name == "bare" else _pair({
                "p50": None if (q := bucket_quantile(h.get(kind, {}), 0.5)) is None else q * 1000,
                "p90": None if (q := bucket_quantile(h.get(kind, {}), 0.9)) is None else q * 1000}))
                for h in level_hops]
            lines.append("| " + " | ".join([f"{label} {kind}", alone, *during]) + " |")
    for kind, label in (("asr", "ASR there and back"), ("asr_wait", "ASR wait for a worker")):
        during = [_pair({"p50": None if (q := bucket_quantile(h.get(kind, {}), 0.5)) is None else q * 1000,
                         "p90": None if (q := bucket_quantile(h.get(kind, {}), 0.9)) is None else q * 1000})
                  for h in level_hops]
        lines.append("| " + " | ".join([label, "—", *during]) + " |")
    return "\n".join(lines)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    from assistant.bench.v2v import session_levels

    parser.add_argument("--sessions", type=session_levels, default=[1, 4], help="concurrency levels (default: 1,4)")
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default: one per audio file)")
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="WAV", help="speech files to play")
    parser.add_argument("--gateways", type=int, default=2, help="gateway processes (default: %(default)s)")
    parser.add_argument("--tts-replicas", type=int, default=2, help="TTS replicas (default: %(default)s)")
    parser.add_argument("--responder", default="echo", help="respond.engine of both set-ups (default: echo)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/ray"), help="folder for the results")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
