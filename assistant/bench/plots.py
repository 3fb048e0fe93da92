"""Voice-to-voice bench plots (matplotlib, Agg backend: no display needed).

One PNG: for every concurrency level a stacked bar per turn (stage by stage, with the client's v2v as a
marker on top), and, when several levels ran, latency against concurrency (p50 and p90). Runs compared
(``--compare``) go on one figure of their own (:func:`plot_compare`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: renders to files on machines with no display

import matplotlib.pyplot as plt

from assistant.bench.report import STAGE_COLUMNS, BenchResult, LevelResult, summarize, summarize_level
from assistant.pipeline.trace import STAGE_STYLE

log = logging.getLogger(__name__)

MAX_BARS = 60  # more turns than this and the bars become unreadable: plot the first ones
STAGE_COLORS = {  # the server's stages as the page draws them, then what only the client sees
    **{name: color for name, (color, _) in STAGE_STYLE.items()},
    "downlink_ms": "#17becf",
    "onset_ms": "#e377c2",
    "unaccounted_ms": "#d62728",
}


def _plot_turns(ax: plt.Axes, level: LevelResult) -> None:
    turns = [t for t in level.turns if t.columns.get("v2v_ms") is not None][:MAX_BARS]
    labels = [f"s{t.session}·t{t.index}" for t in turns]
    x = list(range(len(turns)))
    pos_base = [0.0] * len(turns)
    neg_base = [0.0] * len(turns)
    for name in (*STAGE_COLUMNS, "unaccounted_ms"):
        vals = [t.columns.get(name) or 0.0 for t in turns]
        bottoms = [neg_base[i] if v < 0 else pos_base[i] for i, v in enumerate(vals)]
        ax.bar(x, vals, bottom=bottoms, color=STAGE_COLORS[name], label=name.removesuffix("_ms"), width=0.7)
        for i, v in enumerate(vals):
            if v < 0:
                neg_base[i] += v
            else:
                pos_base[i] += v
    ax.scatter(x, [t.columns.get("v2v_ms") or 0.0 for t in turns], marker="_", s=300, color="black", zorder=3,
               label="v2v (client)")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(x, labels, rotation=90 if len(x) > 12 else 0, fontsize=7)
    ax.set_xlim(-0.75, max(len(x), 6) - 0.25)  # a few turns: keep bars narrow
    ax.set_ylabel("ms")
    dropped = sum(1 for t in level.turns if t.status != "ok")
    ax.set_title(f"{level.sessions} session(s): per turn, stage by stage ({dropped} not ok)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _plot_concurrency(ax: plt.Axes, levels: list[LevelResult]) -> None:
    ks = [lv.sessions for lv in levels]
    for col, style in (("v2v_ms", "-"), ("server_v2v_ms", "--")):
        for q, marker in (("p50", "o"), ("p90", "^")):
            ys = [summarize_level(lv)["columns"][col][q] for lv in levels]
            ax.plot(ks, [y if y is not None else float("nan") for y in ys], style, marker=marker,
                    label=f"{col.removesuffix('_ms')} {q}")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("ms")
    ax.set_xticks(ks)
    ax.set_title("latency vs concurrency", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)


def plot_result(result: BenchResult, path: Path) -> Path:
    """Draw every level's per-turn stacked bars (and the concurrency curve if >1 level) into ``path``."""
    levels = result.levels
    rows = len(levels) + (1 if len(levels) > 1 else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(12, 3.8 * rows), squeeze=False)
    for ax, level in zip(axes[:, 0], levels, strict=False):
        _plot_turns(ax, level)
    if len(levels) > 1:
        _plot_concurrency(axes[-1, 0], levels)
    fig.suptitle(f"voice-to-voice: {result.url}  (audible ≥ {result.threshold_dbfs:g} dBFS peak)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("bench.v2v png=%s", path)
    return path


COMPARED = ("v2v_ms", "first_audio_ms", "server_v2v_ms")  # the columns drawn side by side, where a run has them


def plot_compare(results: list[BenchResult], names: list[str], path: Path) -> Path:
    """Runs on one figure: each run's v2v as a cumulative distribution (every turn heard, all levels), and the p50
    (bar) and p90 (tick) of the client's v2v, its first reply audio and the server's own v2v, run by run."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for name, result in zip(names, results, strict=True):
        values = sorted(float(v) for lv in result.levels for t in lv.turns
                        if t.status == "ok" and (v := t.columns.get("v2v_ms")) is not None)
        if values:
            left.step(values, [(k + 1) / len(values) for k in range(len(values))], where="post",
                      label=f"{name}: {result.protocol} ({result.server})")
    left.set_xlabel("v2v_ms (client: speech end → first audible reply)")
    left.set_ylabel("share of turns")
    left.set_ylim(0, 1.02)
    left.grid(alpha=0.3)
    left.legend(fontsize=7, loc="lower right")
    left.set_title("voice to voice, every turn heard", fontsize=9)
    width = 0.8 / max(1, len(results))
    for k, (name, result) in enumerate(zip(names, results, strict=True)):
        stats = [summarize(t.columns.get(c) for lv in result.levels for t in lv.turns if t.status == "ok")
                 for c in COMPARED]
        xs = [i + (k - (len(results) - 1) / 2) * width for i in range(len(COMPARED))]
        p50 = [s["p50"] if s["p50"] is not None else float("nan") for s in stats]
        p90 = [s["p90"] if s["p90"] is not None else float("nan") for s in stats]
        right.bar(xs, p50, width=width * 0.9, label=f"{name} p50")
        right.scatter(xs, p90, marker="_", s=200, color="black", zorder=3, label="p90" if k == 0 else None)
    right.set_xticks(range(len(COMPARED)), [c.removesuffix("_ms") for c in COMPARED], fontsize=8)
    right.set_ylabel("ms")
    right.grid(alpha=0.3, axis="y")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    right.set_title("p50 (bars) and p90 (ticks); a missing bar: not measured on that server", fontsize=9)
    fig.suptitle("runs compared: " + ", ".join(f"{n} = {r.protocol} {r.url}" for n, r in zip(names, results,
                                                                                          strict=True)), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("bench.v2v compare_png=%s", path)
    return path
