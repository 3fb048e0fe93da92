"""``python -m lab phrase-breaks``: what cutting a slow clause before a joining word
(``chunker.reply_phrase_break_ms``) does to a reply a CPU voice speaks piece by piece: when its caller hears
the first words, and the silences inside it.

The replies are the bundled model's, as ``python -m lab replies`` wrote them (``replies.json``: its tuning and its
held-out half, told apart by each row's ``half``), or those a ``bench v2v`` run heard (``v2v.json``). Each is
replayed, the same way every time:

- **the model**: the reply split as a BPE tokenizer splits words (a word with its leading space, a mark on its own),
  one token every ``--token-ms``: 30 ms is the embedded model's pace at one session on the 2-core Xeon, 42 and 72 its
  median and p90 at four (the server logs of issue 58's runs: a reply's time over its tokens);
- **the chunker** the turn runner builds for a voice that speaks whole pieces (``reply_first_min_chars``,
  ``reply_runway_chars``), on the replay's clock, with ``phrase_break_ms`` swept;
- **the voice**: one piece at a time (``PieceByPiece``), each made in ``--synth-fixed-ms`` + ``--synth-ms-per-char``
  × its length and lasting ``--audio-fixed-s`` + ``--audio-s-per-char`` × its length (Piper's fits from the same
  logs: 62 ms + 3.8 ms a letter at four sessions, 0.34 s + 0.047 s a letter of audio, its own pauses included);
- **playout**: a piece plays from the later of its audio being made and the end of the piece before it.

Per reply: the first audio (from the model's first token), the longest silence between two pieces (beyond the
voice's own pauses, which the audio holds), and the pieces it was cut into. No voice runs and no model is loaded:
what the rule changes is the order of the text, which this replays exactly; what it costs a piece's prosody is a
matter for the ear, so the pieces are printed (``--show``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from assistant.config import ChunkerConfig
from assistant.tts.chunker import TextChunker

TOKEN = re.compile(r" ?[A-Za-z']+| ?\d+| ?[^\sA-Za-z\d]|\s+")  # a word with its space, a number, a mark
GAP_MS = 300  # a silence inside a reply a caller notices (a comma's pause is in the voice's audio already)


@dataclasses.dataclass(frozen=True)
class Voice:
    synth_fixed_ms: float = 62.0
    synth_ms_per_char: float = 3.8
    audio_fixed_s: float = 0.34
    audio_s_per_char: float = 0.047


@dataclasses.dataclass(frozen=True)
class Replay:
    first_audio_ms: float
    longest_gap_ms: float
    pieces: tuple[str, ...]


def tokens(text: str) -> list[str]:
    """``text`` as a model streams it: ``"".join(tokens(t)) == t``."""
    out = TOKEN.findall(text)
    if "".join(out) != text:  # anything the pattern missed goes out whole, at the end
        out.append(text[len("".join(out)):])
    return out


def replay(text: str, token_ms: float, cfg: ChunkerConfig, voice: Voice) -> Replay:
    """``text`` through the chunker at one token per ``token_ms`` and a voice that makes one piece at a time."""
    now = [0.0]
    chunker = TextChunker(cfg, clock=lambda: now[0] / 1000)
    released: list[tuple[float, str]] = []
    parts = tokens(text)
    for i, part in enumerate(parts, start=1):
        now[0] = i * token_ms
        released += [(now[0], piece) for piece in chunker.push(part)]
    released += [(len(parts) * token_ms, piece) for piece in chunker.flush()]
    made_at = 0.0  # the voice is free from
    end_ms = 0.0  # the audio before plays until
    first = gap = 0.0
    for k, (at, piece) in enumerate(released):
        made_at = max(made_at, at) + voice.synth_fixed_ms + voice.synth_ms_per_char * len(piece)
        start = max(made_at, end_ms)
        if k == 0:
            first = start
        else:
            gap = max(gap, start - end_ms)
        end_ms = start + 1000 * (voice.audio_fixed_s + voice.audio_s_per_char * len(piece))
    return Replay(round(first, 1), round(gap, 1), tuple(p for _, p in released))


def voice_chat(phrase_break_ms: int) -> ChunkerConfig:
    """The chunker the turn runner builds for Piper, with ``phrase_break_ms``."""
    base = ChunkerConfig()
    return dataclasses.replace(base, first_min_chars=base.reply_first_min_chars, runway_chars=base.reply_runway_chars,
                               phrase_break_ms=phrase_break_ms)


def load_replies(paths: Iterable[Path], half: str, preset: str = "config") -> list[str]:
    """Reply texts from ``lab replies``' replies.json (the English rows of ``half``, or of both for ``all``, under
    ``preset``: the calls' own prompt) and from v2v.json files."""
    out: list[str] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if "levels" in data:  # bench v2v
            out += [t["reply_text"] for lv in data["levels"] for t in lv["turns"] if t.get("reply_text")]
            continue
        for row in data.get("rows", data.get("replies", [])):
            if half != "all" and row.get("half") not in (None, half):
                continue
            if row.get("preset", preset) != preset or row.get("language", "en") != "en":
                continue
            text = row.get("reply") or row.get("heard") or ""
            if text.strip():
                out.append(text)
    return out


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def sweep(replies: Sequence[str], rates: Sequence[float], settings: Sequence[int],
          voice: Voice) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for rate in rates:
        for ms in settings:
            runs = [replay(text, rate, voice_chat(ms), voice) for text in replies]
            unbroken = [len(replay(text, rate, voice_chat(0), voice).pieces) for text in replies]
            first = [r.first_audio_ms for r in runs]
            gaps = [r.longest_gap_ms for r in runs]
            rows.append({
                "token_ms": rate, "phrase_break_ms": ms, "replies": len(runs),
                "first_audio_p50": round(statistics.median(first)), "first_audio_p90": round(pct(first, 90)),
                "gap_p50": round(statistics.median(gaps)), "gap_p90": round(pct(gaps, 90)), "gap_max": round(max(gaps)),
                f"gap_over_{GAP_MS}": sum(g > GAP_MS for g in gaps),
                "cut_replies": sum(len(r.pieces) > n for r, n in zip(runs, unbroken, strict=True)),
                "pieces_mean": round(statistics.mean(len(r.pieces) for r in runs), 2),
            })
    return rows


def add_phrase_break_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("replies", nargs="*", type=Path, help="replies.json (python -m lab replies) or v2v.json files")
    parser.add_argument("--half", choices=("tuning", "heldout", "all"), default="heldout",
                        help="which half of a replies.json to replay")
    parser.add_argument("--token-ms", default="30,42,72", help="ms per model token, comma-separated")
    parser.add_argument("--break-ms", default="0,200,300,400,600", help="phrase_break_ms values (0: off)")
    parser.add_argument("--synth-fixed-ms", type=float, default=Voice.synth_fixed_ms)
    parser.add_argument("--synth-ms-per-char", type=float, default=Voice.synth_ms_per_char)
    parser.add_argument("--audio-fixed-s", type=float, default=Voice.audio_fixed_s)
    parser.add_argument("--audio-s-per-char", type=float, default=Voice.audio_s_per_char)
    parser.add_argument("--show", type=int, default=0, metavar="MS",
                        help="also print the replies this setting cuts differently from none, with their pieces")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for phrase_breaks.json")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as Markdown to FILE under a line naming this command, the commit "
                        "and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")


def run_phrase_breaks(args: argparse.Namespace) -> int:
    from assistant.bench.figures import markdown_table, provenance, write_markdown

    origin = provenance()
    if not args.replies:
        raise SystemExit("give the replies: replies.json from python -m lab replies, or v2v.json from bench v2v")
    replies = load_replies(args.replies, args.half)
    if not replies:
        raise SystemExit("no replies in the files given")
    try:
        rates = [float(x) for x in args.token_ms.split(",") if x.strip()]
        settings = [int(x) for x in args.break_ms.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"--token-ms and --break-ms take comma-separated numbers: {exc}") from None
    if not rates or min(rates) <= 0 or not settings or min(settings) < 0:
        raise SystemExit("--token-ms must be positive and --break-ms at least 0")
    voice = Voice(args.synth_fixed_ms, args.synth_ms_per_char, args.audio_fixed_s, args.audio_s_per_char)
    rows = sweep(replies, rates, settings, voice)
    table = markdown_table(rows)
    print(f"{len(replies)} replies ({args.half}), one token every {', '.join(map(str, rates))} ms")
    print(table)
    if args.show:
        shown = collections.Counter(
            " | ".join(cut) for text in replies
            if (cut := replay(text, rates[-1], voice_chat(args.show), voice).pieces)
            != replay(text, rates[-1], voice_chat(0), voice).pieces)
        print(f"\nthe replies phrase_break_ms {args.show} cuts at {rates[-1]:g} ms a token (pieces joined by |), "
              "how often:")
        for text, n in shown.most_common():
            print(f"{n:4d}  {text}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "phrase_breaks.json").write_text(json.dumps({"half": args.half, "voice": dataclasses.asdict(voice),
                                                        "rows": rows}, indent=1))
    print(f"\nwrote {out / 'phrase_breaks.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, table, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0
