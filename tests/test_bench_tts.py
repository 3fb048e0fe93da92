"""`assistant bench tts` on the tiny CosyVoice2 fixture: a tiny sweep writes its JSON, table and PNG."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "cosyvoice"))
from cv_fixtures import need_fixtures, need_part_b


def test_bench_tts_tiny_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need_part_b()
    tiny = need_fixtures()
    torch.set_num_threads(1)
    from assistant.bench.tts import add_tts_bench_arguments, run_tts_bench

    parser = argparse.ArgumentParser()
    add_tts_bench_arguments(parser)
    args = parser.parse_args([
        "--model-dir", str(tiny), "--streams", "1,2", "--texts", "zh_20", "--tokens-per-char", "1.5",
        "--out", str(tmp_path),
    ])
    assert run_tts_bench(args) == 0
    result = json.loads((tmp_path / "tts_bench.json").read_text(encoding="utf-8"))
    assert (tmp_path / "tts_bench.png").stat().st_size > 1000
    row = result["per_text"][0]
    assert row["text"] == "zh_20" and row["speech_tokens"] == 30
    assert row["fast"]["tokens_at_first_packet"] == 13 and row["official"]["tokens_at_first_packet"] >= 28
    assert {(r["schedule"], r["streams"]) for r in result["sweep"]} == {
        ("official", 1), ("official", 2), ("fast", 1), ("fast", 2)
    }
    assert result["steps_quality"][0]["steps"] == 10
    out = capsys.readouterr().out
    assert "official/fast" in out and "random prompt" in " ".join(result["notes"])
