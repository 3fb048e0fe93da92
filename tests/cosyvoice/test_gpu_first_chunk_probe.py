"""lab/scripts/gpu_first_chunk_probe.py on the CPU with the tiny fixture model: the probe that the first GPU run used
(docs/benchmarks.md, "The first GPU run") keeps working between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cv_fixtures import need_fixtures

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_chunk_probe_runs_each_stage_on_the_cpu(tmp_path: Path) -> None:
    need_fixtures()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "lab/scripts/gpu_first_chunk_probe.py"), str(tmp_path), "cpu",
                           "tiny", "30", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads((tmp_path / "probe.json").read_text())
    assert probe["gil"]["loop_alone"] > 0 and probe["gil"]["gpu_iters"] >= 1
    for streams in (1, 4):
        for hold in (0, 1):
            rows = probe[f"streams{streams}_hold{hold}"]["last"]
            assert len(rows) == streams
            for row in rows:  # a first packet, its flow inside it, and the whole reply after it
                assert 0 < row["first_flow_ms"] <= row["first_packet_ms"] <= row["total_ms"]
    assert probe["profiled_request"]["audio_s"] > 0 and "done" in probe
    assert (tmp_path / "profile.txt").read_text().strip()  # the table, or a line saying that none was recorded
