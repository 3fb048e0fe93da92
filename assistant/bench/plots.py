"""Voice-to-voice bench plots (matplotlib, Agg backend: no display needed).

One PNG: for every concurrency level a stacked bar per turn (stage by stage, with the client's v2v as a
marker on top), and, when several levels ran, latency against concurrency (p50 and p90).
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: renders to files on machines with no display

import matplotlib.pyplot as plt

from assistant.bench.report import STAGE_COLUMNS, BenchResult, LevelResult, summarize_level
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
