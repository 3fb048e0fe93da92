"""``python -m lab phone-plan``: what ``turn.phone_plan`` trades on the end-of-turn evidence.

Each plan (``config.turn.PHONE_PLANS``) replayed with the shipped defaults otherwise on ``python -m lab eot``'s
cached evidence: the false cut-offs, the false starts a caller would hear (``lab.confirm``'s replay, the answers
as measured), and the turns that end on a number, heard how long after their end; then every pause whose cue the
plan changes, and how it ends. The question the replay cannot ask is left out: the corpus asks for no number.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config import TurnConfig, VADConfig
from assistant.config.turn import PHONE_PLANS
from assistant.pipeline.end_of_turn import ends_on_number
from lab.confirm import ONSET_MS, hear
from lab.confirm import tally as heard_tally
from lab.eot import ClipEvidence, Pause, Turns, flatten, load_cache, load_evidence, score_replay

SLOW_MS = 1100  # a number end heard later than this misses issue 58's 1.2 s once the reply's own ~100 ms is added


@dataclass(frozen=True)
class Row:
    """One plan on one set of turns."""

    plan: str
    turns: int
    cutoffs: float  # share of turns cut at a mid-turn pause (afterthoughts apart), as lab eot counts them
    false_starts: int  # turns with a reply heard at a mid-turn pause
    number_ends: int
    number_heard_mean_ms: float | None
    number_heard_slow: int  # ... heard later than SLOW_MS

    def cells(self, name: str) -> list[str]:
        mean = "-" if self.number_heard_mean_ms is None else f"{self.number_heard_mean_ms:.0f} ms"
        return [name, self.plan or "none", str(self.turns), f"{self.cutoffs * 100:.1f} %", str(self.false_starts),
                str(self.number_ends), mean, str(self.number_heard_slow)]


def measure(turns: Turns, plan: str, fixed_ms: int) -> Row:
    cfg = replace(TurnConfig(), phone_plan=plan)
    heard = [p.offset_ms + h.heard for p in turns.pauses if p.is_end and ends_on_number(p.text)
             for h in [hear(cfg, p, fixed_ms)] if h.heard is not None]
    return Row(plan, len(turns.clips), score_replay(cfg, turns, fixed_ms).fcr,
               heard_tally(cfg, turns, fixed_ms, "measured").false_starts, len(heard),
               float(np.mean(heard)) if heard else None, sum(1 for t in heard if t > SLOW_MS))


def changes(clips: list[ClipEvidence], plan: str, fixed_ms: int) -> list[dict[str, Any]]:
    """The pauses whose cue ``plan`` changes from none's, each with when it is decided and heard under both."""
    none_cfg, plan_cfg = TurnConfig(), replace(TurnConfig(), phone_plan=plan)
    before, after = flatten(clips, phone_plan=""), flatten(clips, phone_plan=plan)
    out = []
    for a, b in zip(before.pauses, after.pauses, strict=True):
        if a.cue is b.cue:
            continue
        ha, hb = hear(none_cfg, a, fixed_ms), hear(plan_cfg, b, fixed_ms)
        out.append({"file": Path(before.clips[a.clip].file).name, "text": a.text, "end": a.is_end,
                    "pause_ms": a.silence_ms, "cue": f"{a.cue.value} → {b.cue.value}",
                    "heard_ms": f"{_ms(ha.heard)} → {_ms(hb.heard)}", "heard_at_pause": _heard_at(b, hb.heard)})
    return out


def _ms(t: int | None) -> str:
    return "never" if t is None else str(t)


def _heard_at(p: Pause, heard: int | None) -> bool:
    return not p.is_end and p.silence_ms is not None and heard is not None and heard < p.silence_ms + ONSET_MS


def evidence_sets(out: Path) -> dict[str, list[ClipEvidence]]:
    """The cached evidence of ``python -m lab eot --out OUT``: both corpus halves, the ``--also`` files and the
    human set (those present)."""
    halves = load_evidence(out)
    sets = {"tuning half": halves["tune"], "held-out half": halves["heldout"]}
    for name, file in (("pause files", "also.jsonl"), ("human set", "human.jsonl")):
        if clips := list(load_cache(out / "evidence" / file).values()):
            sets[name] = clips
    if not sets["tuning half"] or not sets["held-out half"]:
        raise SystemExit(f"lab phone-plan: no corpus evidence in {out}/evidence (run python -m lab eot first)")
    return sets


def markdown(rows: list[tuple[str, Row]], changed: dict[str, list[dict[str, Any]]]) -> str:
    from assistant.bench.figures import markdown_table

    head = ["set", "phone_plan", "turns", "false cut-offs", "false starts heard", "number ends",
            "heard after (mean)", f"heard after {SLOW_MS} ms"]
    lines = ["Each plan with the shipped defaults otherwise, replayed on the end-of-turn evidence:", "",
             markdown_table([dict(zip(head, r.cells(name), strict=True)) for name, r in rows]), ""]
    for name, items in changed.items():
        lines.append(f"Pauses whose cue a plan changes, {name}:" if items else f"No cue a plan changes, {name}.")
        if items:
            lines += ["", markdown_table([{"file": i["file"], "text": i["text"],
                                           "pause": "end" if i["end"] else f"{i['pause_ms']} ms", "cue": i["cue"],
                                           "heard at (ms of silence)": i["heard_ms"],
                                           "false start": "heard" if i["heard_at_pause"] else ""}
                                          for i in items])]
        lines.append("")
    return "\n".join(lines)


def add_phone_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench-out/eot"),
                        help="python -m lab eot's --out, whose evidence/ this reads (default: %(default)s)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables under a provenance line, and refresh the docs that include FILE")


def run_phone_plan(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    fixed = VADConfig().end_silence_ms
    sets = evidence_sets(Path(args.out))
    rows = [(name, measure(flatten(clips, phone_plan=plan), plan, fixed)) for name, clips in sets.items()
            for plan in PHONE_PLANS[::-1]]
    changed = {name: [c for plan in PHONE_PLANS if plan for c in changes(clips, plan, fixed)]
               for name, clips in sets.items()}
    text = markdown(rows, changed)
    print(text)
    if args.markdown is not None:
        docs = write_markdown(args.markdown, text, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))
    return 0
