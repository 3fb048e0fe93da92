"""``python -m lab languages``: the price of hearing every language on a CPU, in one run.

1. ASR: the multilingual ``base`` with ``asr.language = auto`` (detection in every pass) against ``tiny.en`` with
   ``en``, on the same English turns. Each turn is a shared clip cut as the voice chat cuts it (the VAD's pad
   before the speech, the speculative pause after), transcribed by both engines in alternation (``--repeat``
   times each, so both see the same machine state; the median is kept), with the voice chat's own settings
   (int8, ``asr.cpu_threads``, the fitted window). The ratio of the sums is the price.
2. Voice to voice: ``assistant serve --asr.language auto`` (and ``en``, for comparison in the same run) as a child
   process, measured by ``assistant bench v2v``'s client at one session on the same English files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from assistant.audio import SPEECH_RATE, read_audio
from assistant.bench.figures import markdown_table, provenance, write_markdown
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, VADConfig

PAUSE_S = 0.096  # the speculative pause: the audio a speculative pass gets after the speech
ENGINES = {"tiny.en+en": "en", "base+auto": "auto"}  # label → asr.language (asr.model = auto picks the model)
V2V_LANGUAGES = ("auto", "en")  # asr.language of each server measured


@dataclass
class ASRRow:
    file: str
    audio_s: float
    median_ms: dict[str, float] = field(default_factory=dict)
    heard: dict[str, dict[str, Any]] = field(default_factory=dict)  # label → text, language, probability


def english_turns(folder: Path) -> list[tuple[str, np.ndarray]]:
    """(file, 16 kHz audio from the VAD's pad before the speech to the speculative pause after it) for each
    English clip of the shared manifest."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    pad = VADConfig().speech_pad_ms / 1000
    out = []
    for entry in manifest:
        if entry.get("lang") != "en":
            continue
        audio, rate = read_audio(folder / entry["file"])
        if rate != SPEECH_RATE:
            raise ValueError(f"{entry['file']}: {rate} Hz, not {SPEECH_RATE}")
        start = max(0, int((entry["speech_starts_s"] - pad) * rate))
        end = int((entry["speech_ends_s"] + PAUSE_S) * rate)
        out.append((entry["file"], audio[start:end]))
    return out


def measure_asr(folder: Path, repeat: int) -> list[ASRRow]:
    """Part 1 (module docstring): one row per English turn."""
    from assistant.asr.whisper import FasterWhisperEngine

    engines = {label: FasterWhisperEngine(ASRConfig(model="auto", language=lang)) for label, lang in ENGINES.items()}
    for engine in engines.values():
        engine.warmup()
    rows = []
    for name, audio in english_turns(folder):
        times: dict[str, list[float]] = {label: [] for label in engines}
        row = ASRRow(name, round(len(audio) / SPEECH_RATE, 2))
        for _ in range(repeat):
            for label, engine in engines.items():
                t0 = time.perf_counter()
                result = engine.transcribe(audio)
                times[label].append(time.perf_counter() - t0)
                row.heard[label] = {"text": result.text, "language": result.language,
                                    "p": result.language_probability}
        row.median_ms = {label: round(1000 * statistics.median(t), 1) for label, t in times.items()}
        rows.append(row)
        print(f"{name:28s} {row.audio_s:5.2f} s  " + "  ".join(f"{k} {v:7.1f} ms" for k, v in row.median_ms.items())
              + f"  heard {row.heard['base+auto']['language']} p={row.heard['base+auto']['p']:.2f}", flush=True)
    return rows


def asr_table(rows: list[ASRRow]) -> tuple[str, float]:
    """The Markdown table (one row per turn, then all turns) and the ratio of the sums."""
    base, fast = "base+auto", "tiny.en+en"
    table = [{"turn": r.file, "audio s": r.audio_s, f"{fast} ms": r.median_ms[fast], f"{base} ms": r.median_ms[base],
              "ratio": round(r.median_ms[base] / r.median_ms[fast], 2),
              "heard (base+auto)": f"{r.heard[base]['language']} p={r.heard[base]['p']:.2f}"} for r in rows]
    total = {label: sum(r.median_ms[label] for r in rows) for label in ENGINES}
    ratio = total[base] / total[fast]
    table.append({"turn": f"all {len(rows)}", "audio s": round(sum(r.audio_s for r in rows), 2),
                  f"{fast} ms": round(total[fast], 1), f"{base} ms": round(total[base], 1),
                  "ratio": round(ratio, 2), "heard (base+auto)": ""})
    return markdown_table(table), ratio


async def measure_v2v(files: list[Path], repeats: int, out: Path) -> dict[str, dict[str, Any]]:
    """Part 2 (module docstring): the summary of each server's level (one session)."""
    from assistant.bench.processes import start_assistant, stop, wait_ready
    from assistant.bench.report import summarize_level
    from assistant.bench.v2v import bench_v2v
    from assistant.rtc.loopback_ice import allow_loopback_ice

    allow_loopback_ice()
    summaries = {}
    for lang in V2V_LANGUAGES:
        server = start_assistant(f"serve-{lang}", "serve",
                                 ["--asr.language", lang, "--server.data_dir", str(out / f"data-{lang}")], out)
        try:
            await asyncio.to_thread(wait_ready, [server])
            result = await bench_v2v(server.url, files * repeats, None, 1, out / f"v2v-{lang}", plot=False)
        finally:
            await asyncio.to_thread(stop, [server])
        summaries[lang] = summarize_level(result.levels[0])
    return summaries


def v2v_table(summaries: dict[str, dict[str, Any]]) -> str:
    base = summaries["en"]["columns"]["v2v_ms"]["p50"]
    rows = []
    for lang, s in summaries.items():
        cols = s["columns"]
        p50 = cols["v2v_ms"]["p50"]
        rows.append({"asr.language": lang, "turns heard": f"{s['ok']} of {s['turns']}", "v2v p50 ms": p50,
                     "v2v p90 ms": cols["v2v_ms"]["p90"], "asr p50 ms": cols["asr_ms"]["p50"],
                     "endpoint p50 ms": cols["endpoint_ms"]["p50"],
                     "v2v p50 ÷ en": round(p50 / base, 2) if p50 and base else None})
    return markdown_table(rows)


def add_languages_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=5, help="ASR passes per turn and engine (the median is kept)")
    parser.add_argument("--repeats", type=int, default=3, help="times each file is played per v2v server")
    parser.add_argument("--no-v2v", action="store_true", help="only the ASR comparison")
    parser.add_argument("--out", type=Path, default=Path("bench-out/languages"), help="output folder")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")


async def run_languages(args: argparse.Namespace) -> int:
    from assistant.bench.shared_data import shared_speech_files

    origin = provenance()  # the machine's load as the bench starts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = await asyncio.to_thread(measure_asr, shared_path("audio"), args.repeat)
    table, ratio = asr_table(rows)
    print(f"\n{table}\n\nASR time, base+auto ÷ tiny.en+en over the turns: ×{ratio:.2f}")
    result: dict[str, Any] = {"asr": [r.__dict__ for r in rows], "asr_ratio": round(ratio, 3)}
    body = (f"ASR, median of {args.repeat} passes per turn, ms (both engines int8, alternating):\n\n{table}")
    if not args.no_v2v:
        files = shared_speech_files()
        summaries = await measure_v2v(files, args.repeats, out)
        vtable = v2v_table(summaries)
        print(f"\n{vtable}")
        result["v2v"] = summaries
        names = ", ".join(f.name for f in files)
        body += (f"\n\nVoice to voice at one session, {args.repeats} × ({names}) per server, ms:\n\n{vtable}")
    (out / "languages.json").write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"\nwrote {out / 'languages.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0
