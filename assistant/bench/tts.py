"""``assistant bench tts``: CosyVoice2 streaming latency — first packet and total time per text, and a
concurrency sweep with continuity — for our fast schedule and the official one, measured in the same run on
the same engine.

Timing does not depend on the weights' values, so the bench runs on the tiny fixture model, on a real
model directory, or on full-size modules with random weights (``--random-full-size``). The number of speech
tokens is forced (``--tokens-per-char`` x characters, eos ignored) so every run speaks the same length.
Without a text tokenizer (tiny fixture, random model) the text ids are random ids, one per character; without
the ONNX front end the 10 s reference voice is replaced by fixed random prompt tokens/features of the same
length (250 tokens, 500 mel frames); without the shared texts, made-up texts of the same lengths. The
report's notes say which.

Three first packets are told apart: **first after start** (the very first request of a fresh engine: nothing
warm, a new voice, before the decode graph is captured), **cold** (a voice never seen: it starts on its own
flow state; with the ONNX front end that includes encoding the clip) and **warm** (a registered voice: its
flow prefix is in the prompt cache). Each first packet is split into the stages the engine records. The
sweep starts N requests together (warm, and with ``--sweep-cold`` N new voices) and reports first packet
p50/p90 and **continuity**: the share of streams whose every chunk arrived before the audio before it had
played out (a player that starts at the first chunk and never drops audio). Results are written after every
phase, so a run cut short keeps what it measured. Tables: `tts_report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from assistant.bench.figures import provenance, write_markdown
from assistant.bench.shared_data import shared_candidates, shared_path
from assistant.bench.tts_report import plot, tables

if TYPE_CHECKING:
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

TEXTS_FILE = "texts/bench_texts.json"
REFERENCE_WAV = "audio/en_reference_voice.wav"
TINY_MODEL = "fixtures/cosyvoice2/tiny"
TEXT_NAMES = ("seed_benchmark_zh", "zh_20", "zh_50", "zh_100", "zh_200")
TOKEN_RATE = 25          # speech tokens per second of audio
PROMPT_SECONDS = 10.0    # the reference voice's length
FALLBACK_TEXTS = {       # used when the shared texts file is absent (same lengths; the notes say so)
    "seed_benchmark_zh": "欢" * 40, "zh_20": "今" * 20, "zh_50": "今" * 50, "zh_100": "今" * 100, "zh_200": "今" * 200,
}


def add_tts_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", default=None, help="CosyVoice2 model directory (default: the tiny fixture)")
    parser.add_argument("--random-full-size", action="store_true",
                        help="full-size CosyVoice2-0.5B modules with random weights (no download; slow on CPU)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (LLM and flow)")
    parser.add_argument("--streams", default=None,
                        help="concurrency sweep, comma separated (default 1,2,4,8,16 on CUDA, 1,2,4 on CPU)")
    parser.add_argument("--texts", default=None,
                        help="bench_texts.json names to time (default all; on CPU all but zh_200, to stay short)")
    parser.add_argument("--sweep-text", default="seed_benchmark_zh", help="text of the concurrency sweep")
    parser.add_argument("--schedules", default="fast,official", help="streaming schedules to compare, in order")
    parser.add_argument("--sweep-schedules", default=None, help="schedules of the sweep (default: --schedules)")
    parser.add_argument("--sweep-cold", action="store_true", help="the sweep also with a new voice per stream")
    parser.add_argument("--tokens-per-char", type=float, default=4.0, help="forced speech tokens per character")
    parser.add_argument("--first-chunk-tokens", type=int, default=10, help="fast schedule: first hop")
    parser.add_argument("--first-chunk-steps", type=int, default=0, help="fast: Euler steps of chunk 1 (0: 10)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per text (median reported)")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="no CUDA graphs (decode step, prefill, first chunk): every step eager")
    parser.add_argument("--flow-stream-frames", type=int, default=0,
                        help="frames a stream keeps in the flow arena (tts.flow_stream_frames; 0: none)")
    parser.add_argument("--out", default="bench-results/tts", help="directory for tts_bench.json and tts_bench.png")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    parser.add_argument("--skip-steps", action="store_true", help="skip the first-chunk Euler steps table")
    parser.add_argument("--skip-sweep", action="store_true", help="skip the concurrency sweep")
    parser.add_argument("--op-counts", default="",
                        help="stream counts whose first chunks to profile together (ops dispatched), e.g. 1,4")
    parser.add_argument("--fidelity", action="store_true",
                        help="the fast schedule against the official one by region (warm and cold, sweep text)")
    parser.add_argument("--prompt-cache-mb", type=int, default=6144,
                        help="prompt cache budget: room for the warm voice and one cold one (full size, float32: "
                        "~2.3 GB per 10 s voice) so a cold request never evicts the warm voice")


# --- model and inputs ------------------------------------------------------------------------------------


def random_full_size(device: str, dtype: str) -> CosyVoice2:
    """CosyVoice2 with the official 0.5B shapes and random weights (timing only)."""
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig
    from assistant.tts.cosyvoice.hift import HiFTConfig, HiFTVocoder
    from assistant.tts.cosyvoice.llm import QWEN2_05B_CONFIG, SpeechLM, SpeechLMConfig, qwen_config_from_dict
    from assistant.tts.cosyvoice.loader import LoadedModel, ModelSpec, parse_dtype

    dev, dt = torch.device(device), parse_dtype(dtype)
    torch.manual_seed(0)
    qwen = qwen_config_from_dict(QWEN2_05B_CONFIG)
    with torch.device(dev):
        llm = SpeechLM(SpeechLMConfig(), qwen)
        flow = CausalFlow(FlowConfig())
        hift = HiFTVocoder(HiFTConfig())
    llm = llm.to(dtype=dt).eval()
    llm.llm.rebuild_rotary(dev)
    flow = flow.to(dtype=dt).eval()
    hift = hift.eval()
    if hasattr(hift, "remove_weight_norm"):  # as the loader does
        hift.remove_weight_norm()
    spec = ModelSpec({}, SpeechLMConfig(), qwen, FlowConfig(), HiFTConfig())
    return CosyVoice2(LoadedModel(Path("random-full-size"), spec, llm, flow, hift, dev, dt))


def bench_voice(model: CosyVoice2, notes: list[str] | None, variant: int = 0,
           engine: CosyVoiceEngine | None = None) -> CosyVoicePrompt:
    """The 10 s reference voice, or fixed random prompt tokens/features of its length. ``variant`` > 0 gives a
    voice never seen before (a clip cut ``variant`` x 10 ms shorter, or another random prompt): a cold voice."""
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    wav = shared_path(REFERENCE_WAV)
    if model.voice_encoder.available and wav.is_file():
        from assistant.audio import read_audio
        from assistant.tts.base import ReferenceClip

        audio, sr = read_audio(wav)
        if notes is not None:
            notes.append(f"voice: {wav.name} encoded by the ONNX front end (cold: front end included)")
        audio = audio[: len(audio) - variant * sr // 100]
        if engine is not None:
            return engine.clip_voice(model, ReferenceClip(audio, sr, ""))
        return model.voice_encoder.encode("bench", audio, sr, "")
    n = int(PROMPT_SECONDS * TOKEN_RATE)
    gen = torch.Generator().manual_seed(variant)
    if notes is not None:
        notes.append(f"voice: fixed random prompt ({n} tokens, {2 * n} mel frames, random x-vector, 40 prompt "
                     "text ids) — no ONNX front end")
    return CosyVoicePrompt(
        f"bench-random-{variant}",
        "",
        torch.randint(0, 6561, (1, n), generator=gen, dtype=torch.int32),
        torch.randn(1, 2 * n, 80, generator=gen),
        torch.randn(1, 192, generator=gen),
        prompt_text_tokens=torch.randint(0, 1000, (1, 40), generator=gen),
    )


def text_ids(model: CosyVoice2, text: str, seed: int) -> torch.Tensor:
    if model.frontend.has_tokenizer:
        return torch.tensor([model.frontend.encode(text)], dtype=torch.long)
    vocab = int(model.llm.llm.model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 150000), (1, len(text)), generator=gen)


def load_texts(notes: list[str]) -> dict[str, str]:
    path = shared_path(TEXTS_FILE)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))["texts"]
    notes.append(f"texts: {TEXTS_FILE} not found (looked in {', '.join(map(str, shared_candidates()))}): "
                 "made-up texts of the same lengths")
    return dict(FALLBACK_TEXTS)


# --- measuring -------------------------------------------------------------------------------------------


def continuity(arrivals: list[float], durations: list[float]) -> tuple[int, float]:
    """Underruns and their total gap (s) for chunks arriving at ``arrivals`` with ``durations`` of audio, played
    by a player that starts at the first chunk and waits (never drops) when it runs dry."""
    underruns, gap, end = 0, 0.0, None
    for t, d in zip(arrivals, durations, strict=True):
        if end is not None and t > end:
            underruns += 1
            gap += t - end
        end = (t if end is None else max(end, t)) + d
    return underruns, gap


async def measure_request(engine: CosyVoiceEngine, text_ids: torch.Tensor, voice: CosyVoicePrompt | None,
               schedule: StreamSchedule, tokens: int, seed: int,
               make_voice: Callable[[], CosyVoicePrompt] | None = None) -> dict[str, Any]:
    """One streamed request: first packet (its stage split), total time, continuity, LLM wall vs decode.

    ``make_voice`` (a cold request): a callable run first, inside the timed span, that returns the voice.
    """
    t0 = time.perf_counter()
    front_ms = 0.0
    if make_voice is not None:
        voice = await asyncio.get_running_loop().run_in_executor(None, make_voice)
        front_ms = 1000 * (time.perf_counter() - t0)
    first = None
    samples = 0
    first_chunk = last = None
    arrivals: list[float] = []
    durations: list[float] = []
    assert voice is not None, "a voice, or make_voice to make one"
    async for chunk in engine.stream_ids(text_ids, voice, schedule=schedule, seed=seed, tokens=tokens):
        if chunk.audio.size:
            arrivals.append(time.perf_counter())
            durations.append(chunk.audio.size / engine.sample_rate)
            if first is None:
                first, first_chunk = arrivals[-1] - t0, chunk
        samples += chunk.audio.size
        last = chunk
    total = time.perf_counter() - t0
    audio_s = samples / engine.sample_rate
    underruns, gap = continuity(arrivals, durations)
    out = {"first_packet_ms": 1000 * (first or total), "total_ms": 1000 * total, "audio_s": audio_s,
           "rtf": total / max(audio_s, 1e-9), "front_end_ms": front_ms, "underruns": underruns,
           "gap_ms": 1000 * gap}
    fs = (first_chunk.stats or {}) if first_chunk is not None else {}
    decoded = max(fs.get("decoded_at_first_packet", 0.0), 1.0)
    out.update({
        "tokens_at_first_packet": fs.get("tokens_at_first_packet", 0.0),
        "admit_wait_ms": fs.get("admit_wait_ms", 0.0),
        "prefill_ms": fs.get("prefill_ms", 0.0),
        "decode_ms_per_token": fs.get("decode_ms", 0.0) / decoded,
        "prefix_ms": fs.get("setup_ms", 0.0),
        "first_flow_ms": fs.get("first_flow_ms", 0.0),
        "first_vocoder_ms": fs.get("first_vocoder_ms", 0.0),
        "first_queue_ms": fs.get("first_queue_ms", 0.0),
        "cold_voice": fs.get("cold_voice", 0.0),
    })
    ls = (last.stats or {}) if last is not None else {}
    out.update({"llm_wall_ms": ls.get("llm_wall_ms", 0.0), "llm_decode_ms": ls.get("decode_ms", 0.0),
                "stream_mb": ls.get("stream_bytes", 0.0) / 2**20})
    return out


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


SWEEP_SPLIT = ("admit_wait_ms", "prefill_ms", "decode_ms_per_token", "tokens_at_first_packet", "first_flow_ms",
               "first_vocoder_ms", "first_queue_ms")


def _sweep_row(sname: str, n: int, voice: str, runs: list[dict], wall: float, cuda: bool) -> dict:
    fp = [r["first_packet_ms"] for r in runs]
    return {
        "schedule": sname, "voice": voice, "streams": n,
        "first_packet_p50_ms": _pct(fp, 50), "first_packet_p90_ms": _pct(fp, 90),
        "continuity": sum(r["underruns"] == 0 for r in runs) / len(runs),
        "gap_ms_mean": statistics.mean(r["gap_ms"] for r in runs),
        "rtf_mean": statistics.mean(r["rtf"] for r in runs),
        "aggregate_rtf": wall / sum(r["audio_s"] for r in runs),
        "wall_s": wall,
        "stream_mb": statistics.mean(r["stream_mb"] for r in runs),
        "gpu_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        # where the first packets went, mean over the streams (the same split as one request's)
        "split": {k: statistics.mean(r.get(k, 0.0) for r in runs) for k in SWEEP_SPLIT},
    }


async def _bench(args: argparse.Namespace, model: CosyVoice2, notes: list[str],
                 save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    from assistant.config import TTSConfig
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine
    from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import first_chunk_mel

    streams = [int(s) for s in str(args.streams).split(",") if s.strip()]
    names = [n.strip() for n in str(args.texts).split(",") if n.strip()]
    texts = load_texts(notes)
    schedules = {
        name: StreamSchedule.named(name, args.first_chunk_tokens, args.first_chunk_steps or None)
        for name in str(args.schedules).split(",")
    }
    sweep_schedules = [s for s in str(args.sweep_schedules or args.schedules).split(",") if s in schedules]
    cuda = args.device.startswith("cuda")
    cfg = TTSConfig(engine="cosyvoice2", device=args.device, dtype=args.dtype, max_concurrent=max(streams),
                    max_waiting=0, cuda_graphs=cuda and not args.no_cuda_graphs, prompt_cache_mb=args.prompt_cache_mb,
                    flow_stream_frames=args.flow_stream_frames)
    engine = CosyVoiceEngine(cfg)
    engine.attach(model)
    result: dict[str, Any] = {"per_text": [], "sweep": [], "steps_quality": [], "op_counts": [], "fidelity": []}
    variants = iter(range(1, 10_000))

    def tokens_for(text: str) -> int:
        return max(1, round(args.tokens_per_char * len(text)))

    def new_voice() -> CosyVoicePrompt:
        return bench_voice(model, None, next(variants), engine)

    first_name = names[0] if names else args.sweep_text
    first_text = texts.get(first_name, FALLBACK_TEXTS.get(first_name, first_name))
    main_sched = "fast" if "fast" in schedules else next(iter(schedules))

    # 1. The first request after start: nothing captured or warm, a voice never seen.
    r = await measure_request(engine, text_ids(model, first_text, 1), None, schedules[main_sched],
                              tokens_for(first_text), 0, make_voice=new_voice)
    result["first_after_start"] = {"schedule": main_sched, "text": first_name, **r}
    print(f"  first request after start ({main_sched}): first packet {r['first_packet_ms']:.0f} ms", flush=True)
    save(result)

    # 2. Warm-up: graph capture (timed, apart), the registered voice's prefix, every schedule on every slot it
    #    is measured at (a schedule left out of the sweep runs at one stream only).
    t0 = time.perf_counter()
    result["decode_path"] = await asyncio.get_running_loop().run_in_executor(None, engine.batcher.capture)
    voice = bench_voice(model, notes, 0, engine)
    if hasattr(engine, "prepare_voice"):
        await engine.prepare_voice(voice)
    warm_ids = text_ids(model, "warm up text", 0)
    for sname, sched in schedules.items():
        n = max(streams) if sname in sweep_schedules and not args.skip_sweep else 1
        await asyncio.gather(*(measure_request(engine, warm_ids, voice, sched, 60, i) for i in range(n)))
    _sync(args.device)
    result["warmup_s"] = time.perf_counter() - t0
    save(result)

    # 3. Per text: warm first packet (registered voice) per schedule, and cold (a new voice) for ours.
    for name in names:
        text = texts.get(name, FALLBACK_TEXTS.get(name, name))
        ids = text_ids(model, text, 1)
        row: dict[str, Any] = {"text": name, "chars": len(text), "speech_tokens": tokens_for(text)}
        for sname, sched in schedules.items():
            runs = [await measure_request(engine, ids, voice, sched, tokens_for(text), r)
                    for r in range(args.repeats)]
            row[sname] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cold = [await measure_request(engine, ids, None, schedules[main_sched], tokens_for(text), r,
                                      make_voice=new_voice) for r in range(args.repeats)]
        row[f"{main_sched}_cold"] = {k: statistics.median(r[k] for r in cold) for k in cold[0]}
        result["per_text"].append(row)
        print(f"  {name}: " + ", ".join(f"{s} {row[s]['first_packet_ms']:.0f} ms" for s in schedules)
              + f", {main_sched} cold {row[f'{main_sched}_cold']['first_packet_ms']:.0f} ms", flush=True)
        save(result)

    # 4. Concurrency sweep: N requests started together, warm (and cold: N new voices).
    sweep_text = texts.get(args.sweep_text, FALLBACK_TEXTS.get(args.sweep_text, args.sweep_text))
    ids = text_ids(model, sweep_text, 2)
    for sname in [] if args.skip_sweep else sweep_schedules:
        sched = schedules[sname]
        for n in streams:
            for kind in ("warm", "cold") if args.sweep_cold else ("warm",):
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                runs = await asyncio.gather(*(
                    measure_request(engine, ids, voice if kind == "warm" else None, sched, tokens_for(sweep_text),
                                    100 + i, make_voice=new_voice if kind == "cold" else None) for i in range(n)))
                row = _sweep_row(sname, n, kind, runs, time.perf_counter() - t0, cuda)
                result["sweep"].append(row)
                print(f"  sweep {sname} {kind} x{n}: first packet p50 {row['first_packet_p50_ms']:.0f} ms, "
                      f"continuity {row['continuity']:.0%}", flush=True)
                save(result)

    # The engine's record, then its memory back (a full-size voice prefix is 2.3 GB) for the direct probes.
    result["engine_stats"] = _jsonable(engine.stats())
    await engine.close()
    engine.prompt_cache.clear()
    gc.collect()
    save(result)

    # 5. Ops dispatched by a chunk, alone and batched (torch profiler): a warm first chunk eager and static (the
    #    first chunk's graphs), a later chunk with its streams attended in turn and over the flow arena.
    if args.op_counts:
        from assistant.bench.op_counts import first_chunk_ops, later_chunk_ops

        toks = torch.randint(0, 6561, (64,), generator=torch.Generator().manual_seed(4)).tolist()
        for n in (int(x) for x in str(args.op_counts).split(",") if x.strip()):
            rows = [first_chunk_ops(model, voice, toks, n, args.first_chunk_tokens, static)
                    for static in (False, True)]
            rows += [later_chunk_ops(model, voice, toks, n, args.first_chunk_tokens, frames)
                     for frames in (0, 2 * len(toks)) if n > 1]         # one stream: no batch to attend at once
            result["op_counts"] += rows
            print(f"  x{n}: " + ", ".join(f"{r['chunk']} {r['path']} {r['aten_ops_per_stream']:.0f}" for r in rows)
                  + " ops per stream", flush=True)
            save(result)

    # 6. Quality of fewer Euler steps for the first chunk (mel difference vs 10 steps, same tokens).
    if not args.skip_steps:
        gen = torch.Generator().manual_seed(3)
        toks = torch.randint(0, 6561, (64,), generator=gen).tolist()
        prefix = FlowPrefix(model.flow, voice)
        ref = first_chunk_mel(model.flow, model.hift, voice, toks, args.first_chunk_tokens, None, prefix).float()
        for k in (10, 8, 6, 5, 4, 3, 2):
            first_chunk_mel(model.flow, model.hift, voice, toks, args.first_chunk_tokens, k, prefix)  # caches
            _sync(args.device)
            t0 = time.perf_counter()
            mel = first_chunk_mel(model.flow, model.hift, voice, toks, args.first_chunk_tokens, k, prefix).float()
            _sync(args.device)
            dt = time.perf_counter() - t0
            d = (mel - ref).abs()
            result["steps_quality"].append({"steps": k, "mean_abs": float(d.mean()), "max_abs": float(d.max()),
                                            "ref_std": float(ref.std()), "first_chunk_flow_ms": 1000 * dt})
        save(result)

    # 7. Fidelity: the fast schedule against the official one on the sweep text's length, warm and cold.
    if args.fidelity:
        from assistant.tts.cosyvoice.fidelity import compare, stream_tokens

        toks = torch.randint(0, 6561, (tokens_for(sweep_text),), generator=torch.Generator().manual_seed(5)).tolist()
        official = stream_tokens(model.flow, model.hift, voice, toks, StreamSchedule.official())
        for warm in (True, False):
            result["fidelity"].append(compare(model.flow, model.hift, voice, toks, warm=warm, official=official))
            save(result)
    return result


def _jsonable(obj: object) -> object:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj if isinstance(obj, (int, float, str, bool)) or obj is None else str(obj)


def run_tts_bench(args: argparse.Namespace) -> int:
    if getattr(args, "import_error", None):
        print(f"bench tts unavailable: {args.import_error}")
        return 2
    origin = provenance()  # the machine's load as the bench starts
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = str(args.device).startswith("cuda")
    if args.streams is None:
        args.streams = "1,2,4,8,16" if cuda else "1,2,4"
    if args.texts is None:
        args.texts = ",".join(TEXT_NAMES if cuda else TEXT_NAMES[:-1])
    notes: list[str] = []
    t0 = time.perf_counter()
    if args.random_full_size:
        model = random_full_size(args.device, args.dtype)
        notes.append("model: full-size CosyVoice2-0.5B shapes, random weights")
    else:
        from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2

        model_dir = Path(args.model_dir) if args.model_dir else shared_path(TINY_MODEL)
        model = CosyVoice2.from_dir(model_dir, args.device, args.dtype)
        notes.append(f"model: {model_dir}")
    if not model.frontend.has_tokenizer:
        notes.append("text: no tokenizer, random text ids (one per character)")
    notes.append(f"speech tokens forced: {args.tokens_per_char} per character, eos ignored")
    load_s = time.perf_counter() - t0
    print(f"bench tts: {'; '.join(notes)}; loaded in {load_s:.1f} s", flush=True)
    schedules = [s.strip() for s in str(args.schedules).split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "notes": notes, "device": args.device, "dtype": args.dtype, "schedules": schedules,
        "first_chunk_tokens": args.first_chunk_tokens, "first_chunk_steps": args.first_chunk_steps,
        "tokens_per_char": args.tokens_per_char, "torch": torch.__version__, "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
    }

    def save(partial: dict) -> None:
        """Write what is measured so far (a run cut short keeps it)."""
        (out / "tts_bench.json").write_text(json.dumps({**partial, **meta}, indent=2, ensure_ascii=False,
                                                       default=str), encoding="utf-8")

    result = asyncio.run(_bench(args, model, notes, save))
    result.update(meta)
    save(result)
    table = tables(result, schedules)
    (out / "tts_bench.md").write_text(table + "\n", encoding="utf-8")
    try:
        plot(result, schedules, out / "tts_bench.png")
    except (ImportError, ValueError) as exc:  # matplotlib is optional (not on every GPU machine); no sweep
        print(f"no plot: {exc}")
    print()
    print(table)
    print(f"\nwrote {out / 'tts_bench.json'}, {out / 'tts_bench.md'}")
    if args.markdown is not None:
        body = table + "\n\n" + "; ".join(notes) + "."
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0


__all__ = ["add_tts_bench_arguments", "bench_voice", "continuity", "load_texts", "measure_request", "random_full_size",
           "run_tts_bench", "text_ids"]
