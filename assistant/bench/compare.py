"""Runs side by side: ``assistant bench v2v --compare A.json B.json …``, and the end of a run of several protocols.

The same statistics as one run's table (p50 and p90 of every column, per concurrency level), run by run, with
each later run's p50 as a ratio of the first's (``B/A``: above 1, B took longer; none where the first's p50 is
under 10 ms, where a ratio would only be noise). A column a run could not measure
(a server that is not ours sends no stage marks) shows as ``—``, and the run's line above the table says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import ascii_uppercase

from assistant.bench.report import COLUMNS, BenchResult, LevelResult, summarize_level
from assistant.pipeline.trace import GAPS

STATS = ("p50", "p90")
RATIO_FLOOR_MS = 10.0  # a ratio of p50s under this says more about the clocks' ms than about latency: none drawn
NAME_WIDTH = 32


def letters(results: Sequence[BenchResult]) -> list[str]:
    """A, B, C … for the runs (AA, AB … past Z)."""
    out = []
    for k in range(len(results)):
        out.append(ascii_uppercase[k] if k < 26 else ascii_uppercase[k // 26 - 1] + ascii_uppercase[k % 26])
    return out


def _heard(level: LevelResult) -> str:
    s = summarize_level(level)
    return f"{s['ok']}/{s['turns']}"


def legend(results: Sequence[BenchResult]) -> list[str]:
    """One line per run: its letter, protocol, URL, kind of server, turns heard, where it was read from, what it
    left out."""
    lines = []
    for letter, r in zip(letters(results), results, strict=True):
        heard = ", ".join(f"{lv.sessions} session{'s' if lv.sessions != 1 else ''}: {_heard(lv)} heard"
                          for lv in r.levels)
        where = f" ({r.json_path})" if r.json_path else ""
        lines.append(f"{letter} = {r.protocol} {r.url} [{r.server}] {heard}{where}")
        if r.left_out:
            lines.append(f"    left out: {r.left_out}")
    return lines


def _levels(results: Sequence[BenchResult]) -> list[int]:
    seen: list[int] = []
    for r in results:
        seen += [lv.sessions for lv in r.levels if lv.sessions not in seen]
    return seen


def _rows(results: Sequence[BenchResult], sessions: int) -> list[tuple[str, list[dict[str, float | None]]]]:
    """(row name, each run's statistics of it) for every column or gap some run measured at this level."""
    summaries = []
    for r in results:
        level = next((lv for lv in r.levels if lv.sessions == sessions), None)
        summaries.append(summarize_level(level) if level is not None else None)
    rows: list[tuple[str, list[dict[str, float | None]]]] = []
    empty: dict[str, float | None] = {"n": 0, "p50": None, "p90": None}
    for kind, names, prefix in (("columns", tuple(COLUMNS), ""), ("gaps", GAPS, "gap: ")):
        for name in names:
            stats = [s[kind][name] if s is not None else empty for s in summaries]
            if any(st["n"] for st in stats):
                rows.append((prefix + name, stats))
    return rows


def ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``, or None when either is missing or the base is under :data:`RATIO_FLOOR_MS`."""
    if value is None or base is None or base < RATIO_FLOOR_MS:
        return None
    return value / base


def _num(v: float | None, width: int = 8) -> str:
    return ("—" if v is None else f"{v:.0f}").rjust(width)


def _times(v: float | None, width: int = 7) -> str:
    return ("—" if v is None else f"{v:.2f}").rjust(width)


def compare_text(results: Sequence[BenchResult]) -> str:
    """The runs side by side for the terminal (ms; ratios of p50 to the first run's)."""
    names = letters(results)
    lines = ["== runs compared (ms; B/A: the p50 of B over the p50 of A)", *legend(results), ""]
    for sessions in _levels(results):
        head = f"  {'sessions=' + str(sessions):<{NAME_WIDTH}}"
        head += "".join(f"{n + ' ' + st:>8}" for n in names for st in STATS)
        head += "".join(f"{n + '/' + names[0]:>7}" for n in names[1:])
        lines.append(head)
        for name, stats in _rows(results, sessions):
            row = f"  {name:<{NAME_WIDTH}}" + "".join(_num(st[q]) for st in stats for q in STATS)
            row += "".join(_times(ratio(st["p50"], stats[0]["p50"])) for st in stats[1:])
            lines.append(row)
        lines.append("")
    return "\n".join(lines).rstrip()


def compare_markdown(results: Sequence[BenchResult]) -> str:
    """The same as Markdown, for ``--markdown FILE``."""
    names = letters(results)
    out = ["| run | protocol | server | URL | turns heard |", "|---|---|---|---|---|"]
    for name, r in zip(names, results, strict=True):
        heard = "; ".join(f"{lv.sessions}: {_heard(lv)}" for lv in r.levels)
        out.append(f"| {name} | {r.protocol} | {r.server} | {r.url} | {heard} |")
    for sessions in _levels(results):
        head = [f"{sessions} session{'s' if sessions != 1 else ''}"]
        head += [f"{n} {st}" for n in names for st in STATS] + [f"{n}/{names[0]}" for n in names[1:]]
        out += ["", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        for name, stats in _rows(results, sessions):
            cells = [_num(st[q], 0) for st in stats for q in STATS]
            cells += [_times(ratio(st["p50"], stats[0]["p50"]), 0) for st in stats[1:]]
            out.append("| " + " | ".join([f"`{name}`", *cells]) + " |")
    notes = [f"{n}: {r.left_out}" for n, r in zip(names, results, strict=True) if r.left_out]
    out += ["", f"ms; the ratios are of the p50s, each run's over the first's (none under {RATIO_FLOOR_MS:g} ms)."]
    if notes:
        out += ["", "Left out: " + " ".join(notes)]
    return "\n".join(out)


__all__ = ["compare_markdown", "compare_text", "legend", "letters", "ratio"]
