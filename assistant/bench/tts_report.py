"""The tables and the plot of ``assistant bench tts`` (`tts.py` measures; this formats what it saved)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SPLIT = ("front_end_ms", "admit_wait_ms", "prefill_ms", "decode_ms_per_token", "prefix_ms", "first_flow_ms",
         "first_vocoder_ms", "first_queue_ms")


def _split_row(label: str, r: dict) -> str:
    cells = [label, f"{r['first_packet_ms']:.0f}"] + [f"{r.get(k, 0.0):.1f}" for k in SPLIT]
    cells += [f"{r.get('tokens_at_first_packet', 0):.0f}", f"{r.get('llm_wall_ms', 0):.0f}",
              f"{r.get('llm_decode_ms', 0):.0f}", f"{r.get('stream_mb', 0):.0f}"]
    return "| " + " | ".join(cells) + " |"


def _per_text(result: dict, schedules: list[str], main: str) -> list[str]:
    lines = ["First packet / total time per text (ms; one stream; warm = registered voice, cold = a new voice)", ""]
    head = "| text | chars | tokens | " + " | ".join(f"{s} first | {s} total" for s in schedules)
    head += f" | {main} cold first |"
    ratio = "official/fast" if {"official", "fast"} <= set(schedules) else ""
    lines += [head + (f" {ratio} first (warm) | {ratio} first (cold) |" if ratio else ""),
              "|" + "---|" * (4 + 2 * len(schedules) + (2 if ratio else 0))]
    for row in result["per_text"]:
        cells = [row["text"], str(row["chars"]), str(row["speech_tokens"])]
        for s in schedules:
            cells += [f"{row[s]['first_packet_ms']:.0f}", f"{row[s]['total_ms']:.0f}"]
        cold = row.get(f"{main}_cold")
        cells.append(f"{cold['first_packet_ms']:.0f}" if cold else "-")
        if ratio:
            off = row["official"]["first_packet_ms"]
            cells.append(f"{off / row['fast']['first_packet_ms']:.2f}x")
            cells.append(f"{off / cold['first_packet_ms']:.2f}x" if cold else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _split(result: dict, schedules: list[str], main: str) -> list[str]:
    lines = ["", "Where the first packet goes (ms; decode per token in ms; LLM wall vs decode over the whole "
             "request; flow buffers per stream in MB)", "",
             "| request | first packet | front end | slot wait | LLM prefill | decode/token | stream setup | "
             "1st chunk flow | 1st chunk vocoder | chunk queue | tokens at 1st | LLM wall | LLM decode | stream MB |",
             "|" + "---|" * 14]
    if "first_after_start" in result:
        r = result["first_after_start"]
        lines.append(_split_row(f"first after start ({r['schedule']}, {r['text']})", r))
    for row in result["per_text"]:
        for s in schedules:
            lines.append(_split_row(f"{row['text']} {s} warm", row[s]))
        if f"{main}_cold" in row:
            lines.append(_split_row(f"{row['text']} {main} cold", row[f"{main}_cold"]))
    return lines


def _engine(result: dict) -> list[str]:
    lines = []
    path = result.get("decode_path") or {}
    stats = result.get("engine_stats") or {}
    final = stats["decode_path"] if isinstance(stats.get("decode_path"), dict) else path
    if path:
        cap = path.get("capture_s")
        lines += ["", f"decode path: {final.get('path')}" + (f", capture {float(cap):.2f} s at warm-up"
                                                            if cap not in (None, "None") else "")
                  + f", graph replays {final.get('replays', '-')}, static steps run directly "
                  f"{final.get('direct_steps', '-')}" + (f" (error: {path['error']})" if path.get("error") else "")]
    if stats:
        def ms(key: str) -> str:
            v = stats.get(key)
            return "-" if v in (None, "None") else f"{float(v):.1f}"

        lines += [f"decode step: {ms('decode_step_ms_alone')} ms alone, {ms('decode_step_ms_beside_chunks')} ms "
                  f"while chunk work ran; flow/vocoder calls {stats.get('flow_batches', '-')}, mean batch "
                  f"{float(stats.get('mean_flow_batch', 0)):.2f}, largest {stats.get('max_flow_batch', '-')}; "
                  f"voice prefixes built beside streams {stats.get('prefixes_built', '-')}; decode held "
                  f"{ms('decode_held_s')} s while first chunks ran (first packets first)"]
    if "first_after_start" in result and path.get("capture_s") not in (None, "None"):
        lines.append(f"first request after start {result['first_after_start']['first_packet_ms']:.0f} ms "
                     "(before the capture; the capture is not in any request)")
    return lines


def _sweep(result: dict) -> list[str]:
    lines = ["", "Concurrency sweep (N requests started together; first packet p50 / p90 ms; continuity: share of "
             "streams that never ran dry; mean gap per stream; mean per-stream RTF; aggregate RTF = wall / all "
             "audio; flow MB per stream; GPU peak MB)", "",
             "| schedule | voice | streams | p50 | p90 | continuity | gap ms | RTF | aggregate RTF | MB/stream "
             "| GPU MB |",
             "|" + "---|" * 11]
    for r in result["sweep"]:
        gpu = f"{r['gpu_peak_mb']:.0f}" if r.get("gpu_peak_mb") is not None else "-"
        lines.append(f"| {r['schedule']} | {r.get('voice', 'warm')} | {r['streams']} | "
                     f"{r['first_packet_p50_ms']:.0f} | {r['first_packet_p90_ms']:.0f} | "
                     f"{r.get('continuity', float('nan')):.0%} | "
                     f"{r.get('gap_ms_mean', float('nan')):.0f} | {r['rtf_mean']:.2f} | {r['aggregate_rtf']:.3f} | "
                     f"{r.get('stream_mb', 0):.0f} | {gpu} |")
    split = [r for r in result["sweep"] if r.get("split")]
    if split:
        lines += ["", "Where the sweep's first packets go (ms, mean over the streams; flow and vocoder times of a "
                  "batched chunk are its whole batch's)", "",
                  "| schedule | voice | streams | slot wait | LLM prefill | decode/token | tokens at 1st | "
                  "1st chunk flow | 1st chunk vocoder | chunk queue |", "|" + "---|" * 10]
        for r in split:
            sp = r["split"]
            lines.append(f"| {r['schedule']} | {r.get('voice', 'warm')} | {r['streams']} | "
                         + " | ".join(f"{sp.get(k, 0.0):.1f}" for k in ("admit_wait_ms", "prefill_ms",
                                                                           "decode_ms_per_token"))
                         + f" | {sp.get('tokens_at_first_packet', 0.0):.0f} | "
                         + " | ".join(f"{sp.get(k, 0.0):.1f}" for k in ("first_flow_ms", "first_vocoder_ms",
                                                                           "first_queue_ms")) + " |")
    by = {(r["schedule"], r.get("voice", "warm"), r["streams"]): r for r in result["sweep"]}
    for (s, v, n), r in by.items():
        one = by.get((s, v, 1))
        if one is not None and n > 1:
            p50 = r["first_packet_p50_ms"] / one["first_packet_p50_ms"]
            lines.append(f"{s} {v} x{n} against x1: first packet p50 {p50:.2f}x, "
                         f"aggregate RTF {r['aggregate_rtf'] / one['aggregate_rtf']:.2f}x")
    return lines


def tables(result: dict, schedules: list[str]) -> str:
    main = "fast" if "fast" in schedules else schedules[0]
    lines = _per_text(result, schedules, main) + _split(result, schedules, main) + _engine(result) + _sweep(result)
    cache = (result.get("engine_stats") or {}).get("prompt_cache")
    if isinstance(cache, dict):
        lines += ["", f"prompt cache: {cache['entries']} entries, {cache['bytes'] / 2**20:.0f} MB, "
                  f"hits {cache['hits']}, misses {cache['misses']}, evictions {cache['evictions']}"]
    if result.get("op_counts"):
        lines += ["", "Ops dispatched by a fast-schedule chunk (warm voice; torch profiler: top-level aten ops, CUDA "
                  "kernel and graph launches): the first chunk eager and static (its graphs), a later chunk with "
                  "the streams attended in turn (loop) and over the flow arena", "",
                  "| chunk | path | streams together | aten ops | per stream | kernel launches | per stream | "
                  "graph launches |", "|" + "---|" * 8]
        for r in result["op_counts"]:
            lines.append(f"| {r.get('chunk', 'first')} | {r.get('path', 'eager')} | {r['streams']} | {r['aten_ops']} | "
                         f"{r['aten_ops_per_stream']:.0f} | {r['kernel_launches']} | "
                         f"{r['kernel_launches_per_stream']:.0f} | {r.get('graph_launches', 0)} |")
    if result.get("steps_quality"):
        lines += ["", "First chunk with fewer Euler steps (mel vs 10 steps)", "",
                  "| steps | mean abs | max abs | mel std | flow ms |", "|---|---|---|---|---|"]
        for q in result["steps_quality"]:
            lines.append(f"| {q['steps']} | {q['mean_abs']:.3f} | {q['max_abs']:.3f} | {q['ref_std']:.3f} | "
                         f"{q['first_chunk_flow_ms']:.1f} |")
    if result.get("fidelity"):
        from assistant.tts.cosyvoice.fidelity import table

        lines += ["", "Fidelity: the fast schedule against the official one on the same tokens, by region", "",
                  table(result["fidelity"])]
    return "\n".join(lines)


def plot(result: dict, schedules: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in schedules:
        xs = [r["chars"] for r in result["per_text"]]
        order = np.argsort(xs)
        a.plot(np.asarray(xs)[order], np.asarray([r[s]["first_packet_ms"] for r in result["per_text"]])[order],
               "o-", label=f"{s} first packet")
        for voice in ("warm", "cold"):
            rows: list[Any] = [r for r in result["sweep"] if r["schedule"] == s and r.get("voice", "warm") == voice]
            if rows:
                b.plot([r["streams"] for r in rows], [r["first_packet_p50_ms"] for r in rows], "o-",
                       label=f"{s} {voice} p50")
                b.plot([r["streams"] for r in rows], [r["first_packet_p90_ms"] for r in rows], "x--",
                       label=f"{s} {voice} p90")
    a.set(xlabel="characters", ylabel="ms", title="first packet vs text length")
    b.set(xlabel="concurrent streams", ylabel="ms", title="first packet vs concurrency", xscale="log", yscale="log")
    for ax in (a, b):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["plot", "tables"]
