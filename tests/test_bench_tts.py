"""`assistant bench tts` on the tiny CosyVoice2 fixture: a tiny sweep writes its JSON, table and PNG."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "cosyvoice"))
from cv_fixtures import need_fixtures


def test_bench_tts_tiny_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = need_fixtures()
    torch.set_num_threads(1)
    from assistant.bench.tts import add_tts_bench_arguments, run_tts_bench

    parser = argparse.ArgumentParser()
    add_tts_bench_arguments(parser)
    args = parser.parse_args([
        "--model-dir", str(tiny), "--streams", "1,2", "--texts", "zh_20", "--tokens-per-char", "1.5",
        "--sweep-cold", "--op-counts", "1,2", "--fidelity", "--out", str(tmp_path),
    ])
    assert run_tts_bench(args) == 0
    result = json.loads((tmp_path / "tts_bench.json").read_text(encoding="utf-8"))
    assert (tmp_path / "tts_bench.png").stat().st_size > 1000
    row = result["per_text"][0]
    assert row["text"] == "zh_20" and row["speech_tokens"] == 30
    # decoding runs beside the chunk work, so more than first hop + look-ahead may exist at the first packet
    assert row["fast"]["tokens_at_first_packet"] >= 13 and row["official"]["tokens_at_first_packet"] >= 28
    cold, first = row["fast_cold"], result["first_after_start"]
    assert cold["cold_voice"] == first["cold_voice"] == 1 and row["fast"]["cold_voice"] == 0  # new voices start cold
    for r in (row["fast"], cold, first):
        assert r["prefill_ms"] > 0 and r["first_flow_ms"] > 0 and r["decode_ms_per_token"] > 0
        assert r["llm_wall_ms"] >= r["llm_decode_ms"] > 0
    assert row["fast"]["stream_mb"] > 0 and result["decode_path"]["path"].startswith("eager")
    # the headline schedule first; warm and cold at every level, each with its continuity
    assert [(r["schedule"], r["voice"], r["streams"]) for r in result["sweep"]] == [
        (s, v, n) for s in ("fast", "official") for n in (1, 2) for v in ("warm", "cold")
    ]
    assert all(0.0 <= r["continuity"] <= 1.0 and r["gap_ms_mean"] >= 0 for r in result["sweep"])
    ops = {(r["chunk"], r["path"], r["streams"]): r for r in result["op_counts"]}
    eager, static = ops["first", "eager", 1], ops["first", "static", 1]
    assert eager["aten_ops"] > 100 and ops["first", "eager", 2]["aten_ops_per_stream"] < eager["aten_ops_per_stream"]
    # the static first chunk does a batch's work in one call (each op a kernel of its graph on CUDA); the arena
    # attends a batch at once
    assert static["aten_ops"] < 1.1 * eager["aten_ops"]
    assert ops["first", "static", 2]["aten_ops"] < 1.2 * static["aten_ops"]
    assert ops["later", "arena", 2]["aten_ops"] < ops["later", "loop", 2]["aten_ops"]
    assert [f["warm"] for f in result["fidelity"]] == [True, False]
    assert result["engine_stats"]["decode_step_ms_alone"] is not None
    assert result["steps_quality"][0]["steps"] == 10
    out = capsys.readouterr().out
    assert "official/fast" in out and "random prompt" in " ".join(result["notes"])
    assert "Where the first packet goes" in out and "fast cold" in out and "continuity" in out
    assert "Ops dispatched" in out and "Fidelity" in out
    assert result["engine_stats"]["prompt_cache"]["hits"]["flow"] > 0


def test_bench_tts_arguments_do_not_import_webrtc() -> None:
    """The GPU machine has no aiortc/av: parsing ``bench tts`` must not import them."""
    import subprocess

    code = ("import sys; from assistant.cli import build_parser, _bench_choice; "
            "argv = ['bench', '--log-level', 'INFO', 'tts', '--streams', '1']; "
            "args = build_parser(_bench_choice(argv)).parse_args(argv); assert args.streams == '1'; "
            "bad = [m for m in ('aiortc', 'av', 'soxr', 'soundfile') if m in sys.modules]; assert not bad, bad")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={"PYTHONPATH": str(root)}, timeout=120)


def test_continuity_counts_underruns_and_gaps() -> None:
    from assistant.bench.tts import continuity

    # 1 s chunks arriving every 0.5 s: never dry; then one 2 s late
    assert continuity([0.0, 0.5, 1.0], [1.0, 1.0, 1.0]) == (0, 0.0)
    underruns, gap = continuity([0.0, 0.5, 4.0], [1.0, 1.0, 1.0])
    assert underruns == 1 and abs(gap - 2.0) < 1e-9
