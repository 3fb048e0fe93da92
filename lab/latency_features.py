"""``python -m lab features``: the latency features compared — each on and off, in one run, as ratios to a
baseline; with ``--endpointing``, the ways to end a turn compared on sentences and on mid-sentence pauses.

Every variant is the same in-process server (models loaded once and shared) with a few settings changed,
measured by the same voice-to-voice client on the same utterances, one after another. Ratios are to the
first variant (the baseline) measured in the same run, so a busy or slow machine shifts every row alike.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assistant.bench.figures import provenance, write_markdown
from assistant.bench.report import summarize_level
from assistant.bench.shared_data import shared_speech_files
from assistant.bench.v2v import bench_v2v
from assistant.config import Config, apply_overrides, load_config
from assistant.pipeline.trace import GAPS
from assistant.rtc.loopback_ice import allow_loopback_ice
from assistant.server.app import create_app, wait_ready
from assistant.server.local import serve_on_loopback
from assistant.server.services import Services

log = logging.getLogger(__name__)

OFF = {
    "audio": {"own_receive_buffer": False},
    "turn": {"speculative": False, "smart_endpoint": False},
    "asr": {"partials": False},
}

# name -> settings applied on top of the config (the first is the baseline the others are compared to).
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "baseline (all off)": OFF,
    "+ own receive buffer": {**OFF, "audio": {"own_receive_buffer": True}},
    "+ speculative turn end": {**OFF, "turn": {"speculative": True, "smart_endpoint": False}},
    "+ speculative + smart endpoint": {**OFF, "turn": {"speculative": True, "smart_endpoint": True}},
    "all on (default)": {},
}
COLUMNS = ("v2v_ms", "server_v2v_ms", "endpoint_ms", "worker_wait_ms", "asr_ms", "tts_first_audio_ms", "unaccounted_ms")

# ``--endpointing``: what ends a turn, each on the same speculative pause (turn.speculative_pause_ms).
_SIGNALS = {"speculative": True}
ENDPOINTING: dict[str, dict[str, dict[str, Any]]] = {
    "fixed silence": {"turn": {**_SIGNALS, "smart_endpoint": False, "end_of_turn_model": False}},
    "transcript rule": {"turn": {**_SIGNALS, "smart_endpoint": True, "end_of_turn_model": False}},
    "end-of-turn model": {"turn": {**_SIGNALS, "smart_endpoint": False, "end_of_turn_model": True}},
    "model + transcript": {"turn": {**_SIGNALS, "smart_endpoint": True, "end_of_turn_model": True}},
}
PAUSE_FILES = Path(__file__).resolve().parents[1] / "tests" / "data" / "pauses"


@dataclass
class VariantResult:
    name: str
    settings: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    turns: list[dict[str, Any]] = field(default_factory=list)  # file, status, speech_ends, columns


def _variant_config(base: Config, settings: dict[str, dict[str, Any]]) -> Config:
    cfg = copy.deepcopy(base)
    apply_overrides(cfg, settings, "bench variant")
    return cfg


async def run_variants(
    base: Config, variants: dict[str, dict[str, dict[str, Any]]], files: list[Path], repeats: int, out: Path
) -> list[VariantResult]:
    services = Services(base)
    await services.load()
    results: list[VariantResult] = []
    try:
        for name, settings in variants.items():
            cfg = _variant_config(base, settings)
            app = create_app(cfg, services)
            async with serve_on_loopback(app) as url:
                await wait_ready(app)
                result = await bench_v2v(url, files * repeats, None, 1, out / _slug(name), plot=False)
                summary = summarize_level(result.levels[0])
                turns = [
                    {"file": t.file, "status": t.status, "speech_ends": t.speech_ends, "columns": t.columns,
                     "gaps": t.gaps_ms}
                    for t in result.levels[0].turns
                ]
            results.append(VariantResult(name, settings, summary, turns))
            log.info("bench.latency_features variant=%r v2v_p50=%s", name, summary["columns"]["v2v_ms"]["p50"])
    finally:
        await services.close()
    return results


def _slug(name: str) -> str:
    """A variant's folder name: "model + transcript" → "model-transcript"."""
    return re.sub(r"[^0-9a-z]+", "-", name.lower()).strip("-")


def format_table(results: list[VariantResult]) -> str:
    """Markdown: p50 / p90 per column, and the ratio of each variant's p50 to the baseline's."""
    base = results[0].summary["columns"]
    head = "| variant | turns ok | " + " | ".join(f"{c} p50 / p90" for c in COLUMNS) + " | v2v p50 ÷ baseline |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for r in results:
        cols = r.summary["columns"]
        cells = []
        for c in COLUMNS:
            s = cols[c]
            cells.append("–" if s["p50"] is None else f"{s['p50']:.0f} / {s['p90']:.0f}")
        b, v = base["v2v_ms"]["p50"], cols["v2v_ms"]["p50"]
        ratio = f"{v / b:.2f}" if b and v is not None else "–"
        rows.append(f"| {r.name} | {r.summary['ok']}/{r.summary['turns']} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(rows)


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" if values else "–"


# The wait at the end of a turn, split (pipeline/trace.py), and the idle gaps: the --endpointing columns.
WAIT_COLUMNS = ("endpoint_ms", "worker_wait_ms", "asr_ms", "end_of_turn_ms", "decide_ms")
GAP_COLUMNS = GAPS


def format_endpointing(results: list[VariantResult], pause_names: set[str]) -> str:
    """Markdown: per endpointing variant, on whole sentences (v2v, the wait split into its parts, the idle
    gaps; p50) and on the mid-sentence pause files (turns kept whole, false cut-offs, v2v)."""
    head = (
        "| endpointing | sentences: v2v_ms | server_v2v_ms | "
        + " | ".join(WAIT_COLUMNS)
        + " | gap: " + " | gap: ".join(GAP_COLUMNS)
        + " | pause files: one turn | pause files: false cut-off rate | pause files: v2v_ms |"
    )
    n = 3 + len(WAIT_COLUMNS) + len(GAP_COLUMNS) + 3
    rows = [head, "|" + "---|" * n]
    for r in results:
        whole = [t for t in r.turns if t["file"] not in pause_names and t["columns"].get("v2v_ms") is not None]
        pauses = [t for t in r.turns if t["file"] in pause_names]
        one = sum(1 for t in pauses if t["speech_ends"] == 1)
        cut = sum(1 for t in pauses if t["speech_ends"] > 1)
        heard = [t["columns"]["v2v_ms"] for t in pauses if t["columns"].get("v2v_ms") is not None]
        rate = f"{cut / len(pauses):.0%}" if pauses else "–"

        def col(name: str, key: str = "columns", turns: list[dict[str, Any]] = whole) -> str:
            return _p50([v for t in turns if (v := t.get(key, {}).get(name)) is not None])

        rows.append(
            f"| {r.name} | {col('v2v_ms')} | {col('server_v2v_ms')} | "
            + " | ".join(col(c) for c in WAIT_COLUMNS) + " | "
            + " | ".join(col(c, "gaps") for c in GAP_COLUMNS)
            + f" | {one}/{len(pauses)} | {rate} | {_p50(heard)} |"
        )
    return "\n".join(rows)


def add_features_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="TOML config the variants start from (default: configs/default.toml)")
    parser.add_argument("--audio", nargs="*", type=Path, help="speech files (default: ../shared/audio/en_*.wav)")
    parser.add_argument("--repeats", type=int, default=2, help="times each file is played per variant")
    parser.add_argument("--out", type=Path, default=Path("bench-out/features"), help="output folder")
    parser.add_argument(
        "--endpointing",
        action="store_true",
        help="compare what ends a turn (fixed silence, transcript rule, end-of-turn model, both) on the "
        "sentences and on the mid-sentence pause files (tests/data/pauses): endpoint time, v2v, false cut-offs",
    )
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")


async def run_features(args: argparse.Namespace) -> int:
    origin = provenance()  # the machine's load as the bench starts
    allow_loopback_ice()
    base = load_config(args.config)
    files = [Path(f) for f in (args.audio or shared_speech_files())]
    out = Path(args.out)
    if args.endpointing:
        pauses = sorted(PAUSE_FILES.glob("*.wav"))
        results = await run_variants(base, ENDPOINTING, files + pauses, args.repeats, out)
        table = format_endpointing(results, {p.name for p in pauses})
    else:
        results = await run_variants(base, VARIANTS, files, args.repeats, out)
        table = format_table(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "features.json").write_text(
        json.dumps([r.__dict__ for r in results], indent=2, ensure_ascii=False), encoding="utf-8"
    )
    with contextlib.suppress(OSError):
        (out / "features.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"\nwrote {out / 'features.json'}")
    if getattr(args, "markdown", None) is not None:
        note = ("ms, p50 over the turns heard; a false cut-off is a pause file that became more than one turn."
                if args.endpointing else "ms, p50 / p90 over the turns heard; ratios to the first variant of the run.")
        docs = write_markdown(args.markdown, f"{table}\n\n{note}", origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0
