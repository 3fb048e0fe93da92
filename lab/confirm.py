"""``python -m lab confirm``: when a decided end's reply may be heard (``turn.confirm_ms``, ``turn.confirm_sure``,
``turn.confirm_sure_ms``), on ``python -m lab eot``'s cached evidence.

A decision at a pause the speaker had not finished starts a reply the caller hears and then loses: a false start.
``turn.confirm_ms`` holds an unsure end's reply until that much silence since the speech end, a sure end's (its
score reaches ``confirm_sure``) waits ``confirm_sure_ms``. Before this study no score could reach the shipped
``confirm_sure`` (1.5: a probability of at most 1 plus ``cue_complete``'s 0.4), so every reply waited 650 ms of
silence: on engines that have the reply sooner (a GPU, the echo responder) the caller waited for the hold, not for
them.

Every pause is replayed through the pipeline's own ``decide`` (``lab.eot.replay_decision``) in two worlds:

- **instant**: every answer (the transcript, each of Smart Turn's) there at the mark it was asked at, and the
  reply ready at the decision: the fastest machine, where decisions come soonest and holds alone keep a reply
  from being heard at a pause; the worst case for false starts, and the one the choice is made in;
- **as measured**: the answers land after the compute times the evidence recorded (this machine, at the time of
  the run), the reply still ready at the decision.

A reply is heard at the later of the decision and its hold. At a mid-turn pause that is a **false start heard**
when it comes before the speaker's return plus :data:`ONSET_MS` (the VAD's first speech windows, which keep a
held reply unheard: ``Endpointer.onset_pending``); a turn counts once however many of its pauses start one. At
the real end the **heard wait** runs from the labelled end of speech to the heard reply.

The choice: the least mean heard wait (instant) on the tuning turns (the corpus's tuning half, the human set but
:data:`HELD_OUT_HUMAN`, and the ``--also`` files) among the points that hear no more false starts than the hold
alone (none sure) on the **guard** turns, the speech issue 58 names (the human tuning clips and the ``--also`` files:
the guard clips of docs/end_of_turn.md, the shared, pause and trailing files),
instant and as measured, also with the hold :data:`MARGIN_MS` shorter and the threshold one step of the grid
lower. The corpus's synthetic voices are a price, reported, not a veto: on them Smart Turn misses the prosody
that tells a pause after "and" from an end (it says 0.98-0.99 at both) and tiny.en writes an ending at such a
pause, so any reachable ``confirm_sure`` hears some false starts there that people's speech does not. Reported on
the held-out half and the held-out human clips.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config import TurnConfig, VADConfig
from assistant.pipeline.end_of_turn import confirm_hold_ms
from lab.eot import AFTERTHOUGHT, VAD_WINDOW_MS, Pause, Turns, flatten, join, load_evidence, replay_decision
from lab.eot_evidence import load_cache
from lab.human_set import HELD_OUT, held_out

log = logging.getLogger(__name__)

ONSET_MS = 2 * VAD_WINDOW_MS  # a return is seen (onset_pending) within two of the VAD's windows of it
MARGIN_MS = 100  # a chosen hold must hold with this much less silence too (the live silence starts windows apart)
# 1.5: no score reaches it (none sure). Finer near the top, where the score is a finished text and Smart Turn at
# 0.97-0.99: a step of the margin there is one hundredth of the model's probability, not two.
SURE_GRID = (1.1, 1.2, 1.25, 1.3, 1.33, 1.36, 1.37, 1.38, 1.385, 1.39, 1.4, 1.5)
SURE_MS_GRID = (0, 200, 300, 350, 400, 450, 500, 550, 600, 650)
WORLDS = ("instant", "measured")
# The 40 human clips the v2v runs of issue 58 report on (the sessions tuned on the other 80): held out here too.
HELD_OUT_HUMAN = HELD_OUT


@dataclass(frozen=True)
class Heard:
    """How one pause ends under a setting: the decision (silence ms; None: it never came) and when its reply is
    heard (silence ms since the speech end, on the pause's clock)."""

    decided: int | None
    heard: int | None
    sure: bool


def instant(p: Pause) -> Pause:
    """``p`` with every answer there at its mark (the transcript at the speculative pause)."""
    return replace(p, asr_ms=0.0, probs=[[m, q, 0.0] for m, q, _ in p.probs])


def hear(cfg: TurnConfig, p: Pause, fixed_ms: int) -> Heard:
    """When ``cfg`` ends this pause and when its reply is heard (the reply ready at the decision)."""
    t, d = replay_decision(cfg, p, fixed_ms)
    if d is None:
        return Heard(None, None, False)
    return Heard(t, max(t, confirm_hold_ms(cfg, d.sure)), d.sure)


@dataclass(frozen=True)
class Tally:
    turns: int
    false_starts: int  # turns with a reply heard at a mid-turn pause (afterthoughts included)
    false_starts_afterthought: int  # ... of them, at a pause after a finished sentence that went on
    waits: tuple[float, ...]  # at each real end: the labelled end of speech to the heard reply (ms)
    decided: tuple[float, ...]  # ... to the decision
    sure_ends: int

    def row(self) -> dict[str, Any]:
        def pct(xs: Sequence[float], q: float) -> int | None:
            return round(float(np.percentile(xs, q))) if xs else None

        return {"turns": self.turns, "false_starts": self.false_starts,
                "false_starts_afterthought": self.false_starts_afterthought,
                "wait_mean_ms": round(float(np.mean(self.waits))) if self.waits else None,
                "wait_p50_ms": pct(self.waits, 50), "wait_p90_ms": pct(self.waits, 90),
                "decided_p50_ms": pct(self.decided, 50), "sure_ends": self.sure_ends}


def tally(cfg: TurnConfig, turns: Turns, fixed_ms: int, world: str) -> Tally:
    """``cfg`` on ``turns`` in ``world`` (:data:`WORLDS`)."""
    fast = world == "instant"
    started: dict[int, bool] = {}  # clip -> a false start heard (True: only at afterthought pauses)
    waits: list[float] = []
    decided: list[float] = []
    sure_ends = 0
    for p in turns.pauses:
        h = hear(cfg, instant(p) if fast else p, fixed_ms)
        if p.is_end:
            if h.heard is not None and h.decided is not None:
                waits.append(p.offset_ms + h.heard)
                decided.append(p.offset_ms + h.decided)
                sure_ends += h.sure
            continue
        if p.silence_ms is None or h.heard is None or h.heard >= p.silence_ms + ONSET_MS:
            continue
        after = p.labelled == AFTERTHOUGHT
        started[p.clip] = started.get(p.clip, True) and after
    return Tally(len(turns.clips), len(started), sum(started.values()), tuple(waits), tuple(decided), sure_ends)


def with_confirm(cfg: TurnConfig, sure: float, sure_ms: int) -> TurnConfig:
    return replace(cfg, confirm_sure=sure, confirm_sure_ms=sure_ms)


def sweep(tune: Turns, held: dict[str, Turns], fixed_ms: int, base: TurnConfig | None = None,
          guard: Turns | None = None) -> dict[str, Any]:
    """Every point of the grid on the tuning turns, the guard turns and each held-out set, in both worlds; the
    choice (module docstring). ``guard``: the tuning turns whose false starts veto a point (None: all of
    ``tune``)."""
    base = base or TurnConfig()
    hold_alone = with_confirm(base, 1.5, 0)
    vetoing = tune if guard is None else guard

    def starts(cfg: TurnConfig) -> tuple[int, ...]:
        return tuple(tally(cfg, vetoing, fixed_ms, w).false_starts for w in WORLDS)

    limit = starts(hold_alone)
    rows: list[dict[str, Any]] = []
    for i, sure in enumerate(SURE_GRID):
        for sure_ms in SURE_MS_GRID:
            if sure >= 1.5 and sure_ms:
                continue  # unreachable: every hold is confirm_ms
            cfg = with_confirm(base, sure, sure_ms)
            near = [with_confirm(base, sure, max(0, sure_ms - MARGIN_MS))]
            if i > 0:
                near.append(with_confirm(base, SURE_GRID[i - 1], sure_ms))
            worst = max((starts(c) for c in [cfg, *near]), key=sum)
            allowed = all(a <= b for a, b in zip(worst, limit, strict=True))
            row: dict[str, Any] = {"confirm_sure": sure, "confirm_sure_ms": sure_ms, "allowed": allowed,
                                   "near_false_starts": list(worst)}
            for w in WORLDS:
                row[f"tune_{w}"] = tally(cfg, tune, fixed_ms, w).row()
                if guard is not None:
                    row[f"guard_{w}"] = tally(cfg, guard, fixed_ms, w).row()
                for name, turns in held.items():
                    row[f"{name}_{w}"] = tally(cfg, turns, fixed_ms, w).row()
            rows.append(row)
    allowed_rows = [r for r in rows if r["allowed"]]
    chosen = min(allowed_rows, key=lambda r: (r["tune_instant"]["wait_mean_ms"], -r["confirm_sure"],
                                              -r["confirm_sure_ms"]))
    return {"rows": rows, "chosen": {"confirm_sure": chosen["confirm_sure"],
                                     "confirm_sure_ms": chosen["confirm_sure_ms"]},
            "hold_alone_false_starts": list(limit)}


def held_out_human() -> set[str]:
    return held_out(HELD_OUT_HUMAN)


def load_sets(out: Path) -> tuple[Turns, Turns | None, dict[str, Turns]]:
    """The tuning turns, the guard turns among them (the human tuning clips and the ``--also`` files; None when
    the evidence has neither) and the held-out sets, from ``out``/evidence (``python -m lab eot``'s cache)."""
    halves = load_evidence(out)
    human = list(load_cache(out / "evidence" / "human.jsonl").values())
    also = list(load_cache(out / "evidence" / "also.jsonl").values())
    if not halves["tune"] or not halves["heldout"]:
        raise SystemExit(f"lab confirm: no corpus evidence in {out}/evidence (run python -m lab eot first)")
    keep = held_out_human()
    human_tune = [c for c in human if Path(c.file).name not in keep]
    human_held = [c for c in human if Path(c.file).name in keep]
    guard = flatten(human_tune + also) if human_tune or also else None
    tune = flatten(halves["tune"]) if guard is None else join(flatten(halves["tune"]), guard)
    held = {"heldout": flatten(halves["heldout"])}
    if human_held:
        held["human_heldout"] = flatten(human_held)
    return tune, guard, held


SHOWN = ((1.5, 0), *((sure, ms) for sure in (1.385, 1.38, 1.37, 1.36, 1.3) for ms in (0, 400, 500)))  # the table's rows


def markdown(report: dict[str, Any]) -> str:
    """The price of a reachable ``confirm_sure`` as a Markdown table: none sure and a few of the grid's
    (:data:`SHOWN`), each on every set in both worlds."""
    from assistant.bench.figures import markdown_table

    rows = {(r["confirm_sure"], r["confirm_sure_ms"]): r for r in report["rows"]}
    chosen = (report["chosen"]["confirm_sure"], report["chosen"]["confirm_sure_ms"])
    table = []
    for key in [k for k in SHOWN if k in rows]:
        r = rows[key]
        name = "1.5 (none sure)" if key[0] >= 1.5 else f"{key[0]}, {key[1]} ms"
        line = {"confirm_sure, confirm_sure_ms": name + (" (chosen)" if key == chosen else "")
                + ("" if r["allowed"] else " (refused)")}
        for col in [k for k in r if k.endswith(("_instant", "_measured"))]:
            v = r[col]
            line[col.replace("_", " ")] = (f"{v['false_starts']} ({v['false_starts_afterthought']}) / "
                                           f"{v['wait_mean_ms']} / {v['wait_p50_ms']} / {v['sure_ends']}")
        table.append(line)
    return ("Each cell: turns with a false start heard (of them at an afterthought's pause) / heard wait mean / p50 "
            "ms from the labelled end / real ends decided sure. tune: every tuning turn (the corpus's tuning half, "
            "the human tuning clips, the guard clips: shared, pause and trailing files); guard: the human tuning "
            "clips and the guard clips alone. "
            "Refused: hears more false starts on the guard turns than none sure (also with the hold 100 ms shorter "
            "or the threshold a step lower)."
            f"\n\n{markdown_table(table)}")


def add_confirm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("bench-out/eot"),
                        help="python -m lab eot's --out, whose evidence/ this reads (default: %(default)s)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table under a provenance line, and refresh the docs that include FILE")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="every row of the grid as JSON")


def run_confirm(args: argparse.Namespace) -> int:
    import json

    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    tune, guard, held = load_sets(Path(args.out))
    report = sweep(tune, held, VADConfig().end_silence_ms, guard=guard)
    chosen = report["chosen"]
    pick = next(r for r in report["rows"] if (r["confirm_sure"], r["confirm_sure_ms"]) == (chosen["confirm_sure"],
                                                                                          chosen["confirm_sure_ms"]))
    alone = next(r for r in report["rows"] if r["confirm_sure"] >= 1.5)
    print(f"tuning turns: {len(tune.clips)} (guard: {len(guard.clips) if guard else 'all of them'}); held out: "
          + ", ".join(f"{k} {len(v.clips)}" for k, v in held.items()))
    print(f"chosen: confirm_sure={chosen['confirm_sure']} confirm_sure_ms={chosen['confirm_sure_ms']} "
          f"(the hold alone hears {report['hold_alone_false_starts']} false starts on the guard turns, "
          "instant / as measured)")
    for name, r in (("hold alone", alone), ("chosen", pick)):
        for key in [k for k in r if k.endswith(("_instant", "_measured"))]:
            print(f"  {name:10s} {key:26s} {r[key]}")
    text = markdown(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, text, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))
    return 0
