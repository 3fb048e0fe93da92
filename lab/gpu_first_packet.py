"""The GPU check's first-packet stages (issue 53): the graphed and batched paths against their eager twins on the
device, and the first packet at 1, 16 and 64 streams with the graphs on and off (`gpu_check.py` runs them).

``graphs``
    the static paths against their eager twins on the device. The tiny model in float32 (TF32 off): a warm
    voice's first-chunk flow and the vocoder's first push, at one stream and three in the bucket of four; the
    decode step with its sampling inside (seeded tokens); the prefill of a batch bucket; the flow arena's batched
    attention against the per-stream loop. Full-size shapes with random weights in bf16 (CUDA, or
    ``--full-size-bf16``): the first-chunk flow graph against the eager first chunk, relative to the mel's
    spread, within the check's bf16 guards; what the captures cost.
``first_packet_graphs_on`` / ``first_packet_graphs_off``
    the engine as served (`CosyVoiceEngine`), full-size shapes, random weights, bf16, the bench's ``zh_50`` text
    (200 speech tokens forced: 8 s of speech), a warm voice (a 10 s prompt), the flow arena holding every stream
    (``tts.flow_stream_frames``), N requests started together for N = 1, 16, 64: first packet p50/p90 as the
    client sees it (wall clock, from the request to its first audio on the host), the engine's split of it (the
    first chunk's flow and vocoder times come from CUDA events), and how many streams underran (a player that
    starts at the first chunk and waits when it runs dry). ``graphs_off``: the same engine with
    ``tts.cuda_graphs`` off (every step eager, the arena still on). Each run is cut at its share of the time
    left; a cut run reports the first packets that arrived and says how many did not. On the CPU (CI): the tiny
    model at 1 and 2 streams, "graphs on" tracing the static paths.

After each stage the summary ``gpu_first_packet.json`` (``{"commit", "gpu", "graphs_on": {"1": {"p50_ms",
"p90_ms", "underruns"}, ...}, "graphs_off": {...}}``) and its page ``gpu_first_packet.md`` are rewritten in the
output folder: commit both to docs/figures/ after a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from assistant.bench.figures import git_commit, markdown_table, provenance
from assistant.bench.shared_data import ENV as SHARED_ENV
from assistant.bench.shared_data import shared_candidates, shared_dir

if TYPE_CHECKING:
    import torch

    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

TINY = "fixtures/cosyvoice2/tiny"                   # inside the shared folder (`shared_data.py`)
STREAMS = {"cuda": (1, 16, 64), "cpu": (1, 2)}
TEXT = "zh_50"                                      # 50 characters of the bench's texts
TOKENS = {"cuda": 200, "cpu": 40}                   # speech tokens forced per request (4 per character on CUDA)
RUN_SHARE = {1: 0.2, 2: 0.3, 16: 0.3, 64: 0.5}      # a run's share of its stage's time (the rest to later runs)
# graph against eager on the device: float32 (TF32 off) differs by summation order only; bf16 by its rounding
MEL_TOL = {"cpu": 1e-4, "cuda": 2e-3}
AUDIO_TOL = {"cpu": 1e-4, "cuda": 5e-3}
BF16_MEL_MEAN_REL = 0.08   # as gpu_check and tests/cosyvoice/test_guards.py
BF16_MEL_MAX_REL = 0.6


class StageLike(Protocol):
    """What a stage function fills in (`gpu_check.Stage`)."""

    status: str
    facts: dict[str, object]
    notes: list[str]

    def check(self, row: Mapping[str, object], ok: bool | None) -> None: ...


# --- models ----------------------------------------------------------------------------------------------


def fixture(relative: str) -> Path:
    """A shared fixture folder, or a loud error naming where it was looked for."""
    found = shared_dir(relative)
    if found is None:
        raise FileNotFoundError(f"{relative} not found in any of {', '.join(map(str, shared_candidates()))} "
                                f"(set {SHARED_ENV})")
    return found / relative


def tiny(device: str, dtype: str) -> tuple[CosyVoice2, CosyVoicePrompt, dict[str, torch.Tensor]]:
    """The tiny fixture model, the golden prompt as a voice, and golden.pt."""
    import torch

    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    path = fixture(TINY)
    model = CosyVoice2.from_dir(path, device, dtype)
    g = torch.load(path / "golden.pt", weights_only=True)
    dev = torch.device(device)
    voice = CosyVoicePrompt("golden", "", g["in.prompt_speech_token"].to(dev), g["in.prompt_feat"].to(dev),
                            g["in.embedding"].to(dev))
    return model, voice, g


_FULL: dict[str, CosyVoice2] = {}


def full_size(device: str) -> CosyVoice2:
    """Full-size CosyVoice2-0.5B shapes with random weights, bf16 on CUDA (float32 on the CPU); built once."""
    if device not in _FULL:
        from assistant.bench.tts import random_full_size

        t0 = time.perf_counter()
        _FULL[device] = random_full_size(device, "bfloat16" if device == "cuda" else "float32")
        log.info("gpu_check.full_size_built seconds=%.1f", time.perf_counter() - t0)
    return _FULL[device]


@contextlib.contextmanager
def no_tf32(device: str) -> Iterator[None]:
    """float32 parity on CUDA is about the math, not TF32's 10-bit mantissa."""
    import torch

    if device != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.detach().float()).abs().max())


# --- graphs against eager --------------------------------------------------------------------------------


def stage_graphs(stage: StageLike, device: str, full: bool) -> None:
    """The static paths against their eager twins on the device (module doc)."""
    with no_tf32(device):
        _tiny_first_chunk(stage, device)
        _tiny_decode(stage, device)
        _tiny_prefill(stage, device)
        _tiny_arena(stage, device)
    if full:
        _full_size_first_chunk(stage, device)
    else:
        stage.notes.append("full size in bf16: CUDA only (or --full-size-bf16)")


def _first_tokens(g: dict[str, torch.Tensor], n: int) -> list[list[int]]:
    tokens = g["e2e.speech_tokens"]
    return [tokens[:n].tolist(), tokens.flip(0)[:n].tolist(), tokens[7 : 7 + n].tolist()]


def _tiny_first_chunk(stage: StageLike, device: str) -> None:
    import torch

    from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
    from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
    from assistant.tts.cosyvoice.hift import StreamingHiFT
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import first_chunk_mel
    from assistant.tts.cosyvoice.vocoding import NoiseTape, make_generator

    model, voice, g = tiny(device, "float32")
    schedule = StreamSchedule.fast(10)
    look = model.flow.cfg.pre_lookahead_len
    firsts = _first_tokens(g, schedule.first_hop + look)
    with torch.inference_mode():
        prefix = FlowPrefix(model.flow, voice)
        eager = [first_chunk_mel(model.flow, model.hift, voice, t, schedule.first_hop, None, prefix) for t in firsts]
        graphs = FirstChunkGraphs(model.flow, model.hift, schedule, 4, graphs=device == "cuda")
        prepared = graphs.prepare(prefix)
        stage.facts["tiny_first_chunk_prepared"] = json.dumps(prepared, default=str)
        solver = graphs.flow_for(prefix, schedule)
        push = graphs.push_for(schedule)
        assert solver is not None and push is not None, f"the first chunk's graphs are not ready: {prepared}"
        path = str(solver.record["path"])
        stage.facts.update(tiny_first_chunk_path=path,
                           tiny_first_chunk_capture_s=round(float(str(prepared["seconds"])), 3))
        for label, group in (("x1", firsts[:1]), ("x3 in the bucket of 4", firsts)):
            mels = solver.run(group)
            e = max(_err(m, w) for m, w in zip(mels, eager, strict=False))
            stage.check({"what": f"tiny fp32 first-chunk flow {label}: graph vs eager", "path": path, "max_abs": e,
                         "tol": MEL_TOL[device]}, e < MEL_TOL[device])
        dev = torch.device(device)
        spf = model.hift.cfg.samples_per_frame
        mels = [m.float() for m in eager]
        tapes = [NoiseTape(make_generator(dev, i), model.hift.m_source.n_harmonics, dev) for i in range(3)]
        noises = [t.span(0, m.size(2) * spf) for t, m in zip(tapes, mels, strict=True)]
        for label, k in (("x1", 1), ("x3 in the bucket of 4", 3)):
            pushed = push.run(mels[:k], noises[:k])
            e = 0.0
            for mel, noise, (f0, source, audio) in zip(mels, noises, pushed, strict=False):
                want = StreamingHiFT(model.hift, lookahead_frames=schedule.vocoder_lookahead).push(mel, False, noise)
                got = StreamingHiFT(model.hift, lookahead_frames=schedule.vocoder_lookahead).adopt_first_push(
                    mel, noise, f0, source, audio)
                e = max(e, _err(got, want))
            stage.check({"what": f"tiny fp32 first vocoder push {label}: graph vs eager",
                         "path": str(push.record["path"]), "max_abs": e, "tol": AUDIO_TOL[device]},
                        e < AUDIO_TOL[device])


def _tiny_decode(stage: StageLike, device: str) -> None:
    """The decode step with its sampling inside, captured, against eager decoding: seeded tokens."""
    import torch

    from assistant.tts.cosyvoice.decode_state import DecodeState
    from assistant.tts.cosyvoice.jobs import SpeechJob
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.schedule import StreamSchedule

    model, voice, g = tiny(device, "float32")

    def run(graph: bool) -> tuple[list[list[int]], dict[str, object]]:
        state = DecodeState(model.llm, 4, 256, cuda_graphs=graph, static_step=graph)
        jobs = [SpeechJob(g["in.e2e_text_token"], voice, None, None, StreamSchedule.fast(), lambda item: None,
                          seed=100 + i) for i in range(3)]
        with torch.inference_mode():
            prompts = [state.prompt(j, PromptCache()) for j in jobs]
            for j, slot in zip(jobs, (0, 2, 3), strict=True):
                j.slot = slot
            state.capture()
            out = [[int(t)] for t in state.start(jobs, prompts).tolist()]
            for step in range(30):
                stepping = jobs if step < 10 or step >= 20 else jobs[:2]     # one job held for ten steps
                for j, t in zip(stepping, state.step(stepping).tolist(), strict=True):
                    out[jobs.index(j)].append(t)
        return out, state.path

    eager, _ = run(False)
    graphed, path = run(True)
    wrong = sum(a != b for x, y in zip(eager, graphed, strict=True) for a, b in zip(x, y, strict=True))
    stage.check({"what": "tiny fp32 decode step with sampling: graph vs eager (90 seeded tokens)",
                 "path": str(path["path"]), "mismatches": wrong}, wrong == 0)


def _tiny_prefill(stage: StageLike, device: str) -> None:
    """The prefill graph of a batch bucket against the eager prefill: three prompts (one with a cached start)."""
    import torch

    from assistant.tts.cosyvoice.prefill_graphs import StaticPrefill
    from assistant.tts.cosyvoice.slot_decoder import SlotDecoder

    model, _, g = tiny(device, "float32")
    lm = model.llm
    head, rest = lm.build_lm_input_parts(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    with torch.inference_mode():
        xs = [rest[0], lm.build_lm_input(g["in.e2e_text_token"], None, None)[0],
              lm.build_lm_input(g["in.text_token"], None, None)[0]]
        eager = SlotDecoder(lm, 4, 256)
        pasts = [eager.prefix_kv(head[0]), None, None]
        want = eager.prefill_many([0, 2, 3], xs, pasts)
        graphs = StaticPrefill(SlotDecoder(lm, 4, 256), (4,), graph=device == "cuda", lengths=(128,))
        graphs.capture()
        got = graphs.run([0, 2, 3], xs, pasts)
    e = _err(got, want)
    stage.check({"what": "tiny fp32 prefill x3 in the bucket of 4: graph vs eager", "path": str(graphs.record["path"]),
                 "max_abs": e, "tol": MEL_TOL[device]}, e < MEL_TOL[device])


def _tiny_arena(stage: StageLike, device: str) -> None:
    """The flow arena's batched attention against the per-stream loop: four streams, two voices and a cold one."""
    import torch

    from assistant.tts.cosyvoice.flow import FlowSolve
    from assistant.tts.cosyvoice.flow_arena import FlowArena
    from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    model, voice, _ = tiny(device, "float32")
    flow, dev = model.flow, torch.device(device)
    gen = torch.Generator().manual_seed(5)
    other = CosyVoicePrompt("o", "", torch.randint(0, 6561, (1, 37), generator=gen, dtype=torch.int32).to(dev),
                            torch.randn(1, 74, 80, generator=gen).to(dev), torch.randn(1, 192, generator=gen).to(dev))
    with torch.inference_mode():
        prefixes = [FlowPrefix(flow, voice), FlowPrefix(flow, other)]
        voices = [prefixes[0], prefixes[1], prefixes[0], None]

        def caches() -> list[list[dict[object, Any]]]:
            return [p.fork().step_caches if p is not None else [{} for _ in range(flow.cfg.n_timesteps)]
                    for p in voices]

        loop, batched = caches(), caches()
        arena = FlowArena(flow.decoder.estimator, flow.cfg.n_timesteps, 4, 120)
        for c, p in zip(batched, voices, strict=True):
            slot = arena.take()
            assert slot is not None
            arena.bind(c, slot, p)
        worst = 0.0
        for r, lengths in enumerate(((20, 13, 7, 20), (11, 25, 3, 9))):
            runs = []
            for group in (loop, batched):
                items = []
                for i, (c, n) in enumerate(zip(group, lengths, strict=True)):
                    gi = torch.Generator().manual_seed(100 * r + i)
                    z, mu, cond = (torch.randn(1, 80, n, generator=gi).to(dev) for _ in range(3))
                    items.append(FlowSolve(flow, z, mu, torch.randn(1, 80, generator=gi).to(dev), cond, c))
                FlowSolve.run_batch(items)
                runs.append(items)
            worst = max(worst, *(_err(b.result, a.result) for a, b in zip(*runs, strict=True)))
    stage.check({"what": "tiny fp32 flow arena: one attention vs the per-stream loop (4 streams, 2 solves)",
                 "max_abs": worst, "tol": MEL_TOL[device]}, worst < MEL_TOL[device])


def _full_size_first_chunk(stage: StageLike, device: str) -> None:
    """Full size, random weights, bf16: the first-chunk flow graph against the eager first chunk."""
    import torch

    from assistant.bench.tts import bench_voice
    from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
    from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import first_chunk_mel

    model = full_size(device)
    voice = bench_voice(model, None, 0)
    schedule = StreamSchedule.fast(10)
    look = model.flow.cfg.pre_lookahead_len
    gen = torch.Generator().manual_seed(9)
    firsts = [torch.randint(0, 6561, (schedule.first_hop + look,), generator=gen).tolist() for _ in range(3)]
    with torch.inference_mode():
        t0 = time.perf_counter()
        prefix = FlowPrefix(model.flow, voice)
        stage.facts["full_prefix_s"] = round(time.perf_counter() - t0, 2)
        eager = [first_chunk_mel(model.flow, model.hift, voice, t, schedule.first_hop, None, prefix).float()
                 for t in firsts]
        graphs = FirstChunkGraphs(model.flow, model.hift, schedule, 4, graphs=device == "cuda")
        prepared = graphs.prepare(prefix)
        stage.facts["full_first_chunk_prepared"] = json.dumps(prepared, default=str)
        solver = graphs.flow_for(prefix, schedule)
        assert solver is not None, f"the first chunk's graph is not ready: {prepared}"
        stage.facts.update(full_first_chunk_path=str(solver.record["path"]),
                           full_first_chunk_capture_s=round(float(str(prepared["seconds"])), 2))
        for label, group in (("x1", firsts[:1]), ("x3 in the bucket of 4", firsts)):
            mels = solver.run(group)
            for i, (m, w) in enumerate(zip(mels, eager, strict=False)):
                d, spread = (m.float() - w).abs(), float(w.std())
                mean_rel, max_rel = float(d.mean()) / spread, float(d.max()) / spread
                stage.check({"what": f"full-size bf16 first-chunk flow {label}, stream {i}: graph vs eager",
                             "mean/std": mean_rel, "max/std": max_rel, "mel_std": spread},
                            bool(torch.isfinite(m).all()) and mean_rel < BF16_MEL_MEAN_REL
                            and max_rel < BF16_MEL_MAX_REL)


# --- first packet --------------------------------------------------------------------------------------


@dataclass
class Request:
    """One request's record as it streams (a run cut short keeps what arrived)."""

    t0: float
    first_ms: float | None = None
    arrivals: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)
    done: bool = False


async def _request(engine: Any, ids: torch.Tensor, voice: CosyVoicePrompt, tokens: int, seed: int,
                   rec: Request) -> None:
    async for chunk in engine.stream_ids(ids, voice, seed=seed, tokens=tokens):
        if chunk.audio.size:
            now = time.perf_counter()
            if rec.first_ms is None:
                rec.first_ms = 1000 * (now - rec.t0)
                rec.stats = dict(chunk.stats or {})
            rec.arrivals.append(now)
            rec.durations.append(chunk.audio.size / engine.sample_rate)
    rec.done = True


def _pct(values: list[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(np.asarray(values), q)), 1) if values else None


def _summarize(n: int, recs: list[Request], wall: float, cut: bool) -> dict[str, object]:
    from assistant.bench.tts import continuity

    first = [r.first_ms for r in recs if r.first_ms is not None]
    done = [r for r in recs if r.done]
    underran = sum(continuity(r.arrivals, r.durations)[0] > 0 for r in done)

    def mean(key: str) -> float | None:
        values = [r.stats[key] for r in recs if key in r.stats]
        return round(statistics.mean(values), 2) if values else None

    return {"streams": n, "p50_ms": _pct(first, 50), "p90_ms": _pct(first, 90), "underruns": underran,
            "first_packets": len(first), "finished": len(done), "cut": cut, "wall_s": round(wall, 2),
            "audio_s": round(sum(sum(r.durations) for r in recs), 1),
            # the engine's split of the first packet (means over the streams; flow and vocoder: CUDA events)
            "engine_first_packet_ms": mean("first_packet_ms"), "admit_wait_ms": mean("admit_wait_ms"),
            "prefill_ms": mean("prefill_ms"), "first_queue_ms": mean("first_queue_ms"),
            "first_flow_ms": mean("first_flow_ms"), "first_vocoder_ms": mean("first_vocoder_ms"),
            "tokens_at_first_packet": mean("tokens_at_first_packet")}


async def _measure(stage: StageLike, device: str, graphs: bool, deadline: float,
                   summary: FirstPacketSummary) -> None:
    import torch

    from assistant.bench.tts import bench_voice, load_texts, text_ids
    from assistant.config import TTSConfig
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    cuda = device == "cuda"
    model = full_size(device) if cuda else tiny(device, "float32")[0]
    streams, tokens = STREAMS[device], TOKENS[device]
    notes: list[str] = []
    text = load_texts(notes)[TEXT]
    stage.notes += notes
    frames = 2 * tokens + 16                                 # each stream's own frames fit its arena slot
    cfg = TTSConfig(engine="cosyvoice2", device=device, dtype="bfloat16" if cuda else "float32",
                    max_concurrent=max(streams), max_waiting=0, cuda_graphs=graphs, flow_stream_frames=frames,
                    prompt_cache_mb=8192)
    engine = CosyVoiceEngine(cfg)
    engine.attach(model, static_paths=graphs and not cuda)
    label = "graphs_on" if graphs else "graphs_off"
    stage.facts.update(model="full size, random weights, bf16" if cuda else "tiny fixture, float32", text=TEXT,
                       speech_tokens=tokens, arena_frames=frames, cuda_graphs=graphs)
    try:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        decode = await loop.run_in_executor(None, engine.batcher.capture)
        voice = bench_voice(model, None, 0, engine)
        await engine.prepare_voice(voice)
        ids = text_ids(model, text, 1)
        warm = text_ids(model, "warm up text", 0)
        await asyncio.gather(*(_request(engine, warm, voice, 40, 1000 + i, Request(time.perf_counter()))
                               for i in range(max(streams))))
        stats = engine.stats()
        stage.facts.update(warmup_s=round(time.perf_counter() - t0, 1), decode_path=str(decode.get("path")),
                           decode_capture_s=decode.get("capture_s"), decode_error=decode.get("error"),
                           first_chunk_path=stats.get("first_chunk_path"),
                           first_chunk_error=stats.get("first_chunk_error"),
                           first_chunk_capture_s=round(float(str(stats.get("first_chunk_capture_s", 0.0))), 2),
                           arena_mb=round(float(str(stats.get("arena_mb", 0.0)))))
        for k, n in enumerate(streams):
            left = deadline - time.monotonic()
            share = left if k == len(streams) - 1 else left * RUN_SHARE.get(n, 0.3)
            if share < 5:
                stage.notes.append(f"{n} streams not run: {left:.0f} s left")
                stage.status = "fail"
                continue
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            recs = [Request(time.perf_counter()) for _ in range(n)]
            t1 = time.perf_counter()
            tasks = [asyncio.ensure_future(_request(engine, ids, voice, tokens, 100 + i, r))
                     for i, r in enumerate(recs)]
            _, pending = await asyncio.wait(tasks, timeout=share)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            row = _summarize(n, recs, time.perf_counter() - t1, bool(pending))
            if cuda:
                row["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
            stage.check({"run": label, **row}, None)
            if pending:
                stage.notes.append(f"{n} streams cut at {share:.0f} s: {row['first_packets']} first packets, "
                                   f"{row['finished']} finished")
            summary.add(label, row)
            log.info("gpu_check.first_packet run=%s streams=%d p50_ms=%s p90_ms=%s underruns=%s cut=%s", label, n,
                     row["p50_ms"], row["p90_ms"], row["underruns"], row["cut"])
        final = engine.stats()
        if graphs:  # the graphed paths really ran: replays on CUDA, the static functions directly on the CPU
            ran = final.get("first_chunk_flow_replays" if cuda else "first_chunk_flow_direct")
            path = final.get("decode_path")
            decode_runs = path.get("replays" if cuda else "direct_steps") if isinstance(path, dict) else None
            prefill = path.get("prefill") if isinstance(path, dict) else None
            if isinstance(prefill, dict):
                stage.facts.update(prefill_path=prefill.get("path"), prefill_graphs=prefill.get("graphs"),
                                   prefill_capture_s=prefill.get("capture_s"), prefill_error=prefill.get("error"),
                                   prefill_runs=prefill.get("replays" if cuda else "direct_steps"))
            stage.check({"run": label, "what": "first chunks and decode steps on the graphed paths",
                         "first_chunk_batches": ran, "decode_steps": decode_runs},
                        bool(ran) and bool(decode_runs))
        stage.facts.update(first_chunk_flow_replays=final.get("first_chunk_flow_replays"),
                           first_chunk_flow_direct=final.get("first_chunk_flow_direct"),
                           mean_flow_batch=round(float(str(final.get("mean_flow_batch", 0.0))), 2),
                           max_flow_batch=final.get("max_flow_batch"),
                           decode_step_ms_alone=final.get("decode_step_ms_alone"),
                           decode_step_ms_beside_chunks=final.get("decode_step_ms_beside_chunks"))
    finally:
        await engine.close()
        del engine
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            stage.facts["gpu_mb_after_close"] = round(torch.cuda.memory_allocated() / 2**20)


def stage_first_packet(stage: StageLike, device: str, graphs: bool, seconds: float,
                       summary: FirstPacketSummary) -> None:
    """First packet at each stream count with the graphs on or off (module doc), within ``seconds``."""
    asyncio.run(_measure(stage, device, graphs, time.monotonic() + seconds, summary))


class FirstPacketSummary:
    """``gpu_first_packet.json`` and ``gpu_first_packet.md`` in the output folder, rewritten as rows arrive."""

    def __init__(self, out: Path, device: str, origin: str | None = None) -> None:
        self.out, self.device = out, device
        self.rows: dict[str, dict[str, dict[str, object]]] = {"graphs_on": {}, "graphs_off": {}}
        gpu = None
        if device == "cuda":
            import torch

            gpu = torch.cuda.get_device_name(0)
        self.doc: dict[str, object] = {"commit": git_commit(), "gpu": gpu}
        self.origin = origin or provenance()

    def add(self, label: str, row: dict[str, object]) -> None:
        self.rows[label][str(row["streams"])] = row
        self.write()

    def write(self) -> None:
        doc = {**self.doc, **{label: {n: {k: r[k] for k in ("p50_ms", "p90_ms", "underruns")}
                                      for n, r in rows.items()} for label, rows in self.rows.items()}}
        (self.out / "gpu_first_packet.json").write_text(json.dumps(doc, indent=2) + "\n", "utf-8")
        table = [{"graphs": label.removeprefix("graphs_"), **r} for label, rows in self.rows.items()
                 for r in rows.values()]
        parts = ["# CosyVoice2 first packet on a GPU (issue 53)", "", self.origin, "",
                 "Full-size shapes with random weights in bf16, the bench's `zh_50` (200 speech tokens forced: 8 s of "
                 "speech), a warm voice (10 s prompt), N requests started together; first packet as the client sees "
                 "it (ms), the engine's split of it (means; the first chunk's flow and vocoder from CUDA events), "
                 "streams that underran. `lab/gpu_first_packet.py` says how; the goal: p50 <= 150 ms at 1 stream, "
                 "<= 250 at 16, <= 500 at 64, no underrun at 16." if self.device == "cuda" else
                 "CPU mode (CI): the tiny fixture model; the figures say nothing about a GPU.", "",
                 markdown_table(table) if table else "(no run finished)"]
        (self.out / "gpu_first_packet.md").write_text("\n".join(parts) + "\n", "utf-8")


__all__ = ["FirstPacketSummary", "fixture", "full_size", "stage_first_packet", "stage_graphs", "tiny"]
