"""``python -m lab first-piece``: what a reply's first piece costs the CPU voice before anyone hears it.

A voice that speaks a piece only once it has all of it (Piper, Kokoro) starts the reply when the chunker hands it
the first clause (``chunker.reply_first_min_chars``): a shorter first piece reaches the voice sooner (the model has
written fewer tokens) and is spoken sooner if the voice's time follows the text's length. This study times the
voice's first chunk through the product's engine (its thread pool, the way a turn asks it) for first pieces of
growing length, each on a warm engine, and fits ``first chunk ≈ fixed + per character × length``: the fixed part
is what no shorter piece can save.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from assistant.config import add_config_flags, flag_overrides, load_config
from assistant.tts.base import TTSEngine, TTSRequest

# First pieces as the chunker cuts them from the bundled model's replies (a word and a comma, a short sentence, a
# clause, a whole sentence), shortest first.
PIECES: tuple[str, ...] = (
    "No,",
    "Sure.",
    "I'm sorry,",
    "Good morning!",
    "Ottawa is the capital of Canada.",
    "Cut it into small cubes and leave it out for about fifteen minutes.",
    "Iced tea with lemon is refreshing on a hot day, and it takes only a few minutes to make at home.",
)


def add_first_piece_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per piece (median reported)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for first_piece.json")
    parser.add_argument("--config", default=None, help="config file (default: configs/default.toml)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as Markdown to FILE under a line naming this command, the commit "
                        "and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    add_config_flags(parser, sections=("tts",))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y ≈ a + b·x``: (a, b) (``statistics.linear_regression``; a ``ValueError`` for fewer than two
    points or one x only)."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


async def time_piece(engine: TTSEngine, text: str) -> tuple[float, float]:
    """One piece through ``engine.synthesize``: (ms to its first chunk, seconds of audio in all)."""
    t0 = time.perf_counter()
    first = 0.0
    samples = 0
    async for chunk in engine.synthesize(TTSRequest(text=text)):
        if not first:
            first = (time.perf_counter() - t0) * 1000
        samples += len(chunk)
    return first, samples / engine.sample_rate


async def run_first_piece(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown
    from assistant.tts import create_tts

    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    origin = provenance()
    cfg = load_config(args.config, overrides=flag_overrides(args))
    engine = create_tts(cfg.tts)
    try:
        await engine.warmup()
        rows: list[dict[str, object]] = []
        for text in PIECES:
            await time_piece(engine, text)  # this length's first run (ONNX shapes) is not timed
            runs = [await time_piece(engine, text) for _ in range(args.repeats)]
            ms = [r[0] for r in runs]
            rows.append({"piece": text, "chars": len(text), "audio_s": round(runs[0][1], 2),
                         "first_chunk_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1)})
    finally:
        await engine.close()
    fixed, per_char = fit_line([float(r["chars"]) for r in rows],  # type: ignore[arg-type]
                               [float(r["first_chunk_ms"]) for r in rows])  # type: ignore[arg-type]
    print(f"{cfg.tts.engine} ({cfg.tts.voice or 'its default voice'}, {cfg.tts.threads} thread(s)): the first chunk of "
          f"a first piece, median of {args.repeats}")
    print(f"{'chars':>5s} {'audio s':>7s} {'first ms':>8s} {'min ms':>7s}  piece")
    for r in rows:
        print(f"{r['chars']:5d} {r['audio_s']:7.2f} {r['first_chunk_ms']:8.1f} {r['min_ms']:7.1f}  {r['piece']}")
    print(f"fit: first chunk ≈ {fixed:.0f} ms + {per_char:.2f} ms per character")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_piece.json").write_text(json.dumps(
        {"engine": cfg.tts.engine, "threads": cfg.tts.threads, "repeats": args.repeats, "rows": rows,
         "fit": {"fixed_ms": round(fixed, 1), "per_char_ms": round(per_char, 2)}}, indent=1))
    print(f"\nwrote {out / 'first_piece.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, first_piece_markdown(rows, fixed, per_char), origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0


def first_piece_markdown(rows: list[dict[str, object]], fixed: float, per_char: float) -> str:
    lines = ["| first piece | characters | audio s | first chunk ms (median) | min |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['piece']} | {r['chars']} | {r['audio_s']} | {r['first_chunk_ms']} | {r['min_ms']} |" for r in rows]
    return "\n".join([*lines, "", f"Fit: first chunk ≈ {fixed:.0f} ms + {per_char:.2f} ms per character."])
