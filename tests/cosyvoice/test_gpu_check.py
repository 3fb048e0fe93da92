"""The prepared GPU check in its CPU mode, as the GPU machine would run it: scripts/gpu_check.sh on a Python
where aiortc, av, soxr, soundfile, wetext, faster-whisper, piper and matplotlib cannot be imported.

Keeps the script, its stages and its call into ``bench tts`` from rotting between GPU runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cv_fixtures import need_fixtures

from lab.gpu_check import Stage, markdown_table

ROOT = Path(__file__).resolve().parents[2]
ABSENT_ON_GPU_MACHINE = "aiortc,av,soxr,soundfile,wetext,faster_whisper,piper,matplotlib"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_mode_runs_offline_without_the_projects_other_dependencies(tmp_path: Path) -> None:
    need_fixtures()
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "850",
           "PYTHONPATH": str(ROOT / "tests/cosyvoice/offline_site"), "GPU_CHECK_BLOCKED": ABSENT_ON_GPU_MACHINE,
           "PIP_NO_INDEX": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(out), "--device", "cpu",
                           "--budget-s", "800"], cwd=tmp_path, env=env, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    doc = json.loads((out / "gpu_check.json").read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["env", "parity", "bf16", "frontend", "bench_tiny_cpu"]
    assert {n: s["status"] for n, s in stages.items()} == dict.fromkeys(stages, "pass"), \
        {n: s["notes"] for n, s in stages.items()}
    assert proc.returncode == 0
    # each stage was written on its own, and the markdown holds every table
    assert all((out / f"{n}.json").is_file() for n in stages)
    md = (out / "gpu_check.md").read_text()
    assert "e2e.chunk2 (official schedule)" in md and "flow_nonstream.mel" in md
    # wetext really was absent: normalisation skipped, texts with digits not compared, the rest match
    front = stages["frontend"]
    assert front["facts"]["wetext"].startswith("no")
    assert sum(r["ok"] == "yes" for r in front["rows"]) == 6
    assert stages["env"]["facts"]["missing_modules"].split(", ")[:3] == ["wetext", "soxr", "soundfile"]
    # the bench ran through its public entry and gave a first packet
    sweep = [r for r in stages["bench_tiny_cpu"]["rows"] if "first_packet_p50_ms" in r]
    assert sweep and all(r["first_packet_p50_ms"] > 0 for r in sweep)
    assert {r["voice"] for r in sweep} == {"warm", "cold"} and all(0 <= r["continuity"] <= 1 for r in sweep)
    facts = stages["bench_tiny_cpu"]["facts"]
    assert facts["decode_path.path"] == "eager (cpu)" and facts["first_after_start.first_packet_ms"] > 0
    assert facts["engine_stats.decode_path.path"] == "eager (cpu)" and facts["first_chunk_ops_per_stream.x1"] > 0
    assert (out / "bench_tiny_cpu/tts_bench.json").is_file() and (out / "bench_tiny_cpu.log").is_file()


def test_stage_and_table_helpers() -> None:
    s = Stage("x")
    s.check({"what": "a", "max_abs": 1e-6}, True)
    s.check({"what": "b", "value": "3/4"}, None)
    assert s.status == "pass"
    s.check({"what": "c"}, False)
    assert s.status == "fail"
    table = markdown_table(s.rows)
    assert table.splitlines()[0] == "| what | max_abs | ok | value |"
    assert "| c |  | NO |  |" in table


def test_shared_data_is_found_from_the_env_then_the_tree_then_beside_it(tmp_path: Path, monkeypatch) -> None:
    from assistant.bench import shared_data

    tree = tmp_path / "tree"
    monkeypatch.setattr(shared_data, "TREE", tree)
    monkeypatch.delenv(shared_data.ENV, raising=False)
    assert shared_data.shared_candidates() == [tree / "shared", tmp_path / "shared"]
    assert shared_data.shared_dir() is None
    (tmp_path / "shared/fixtures").mkdir(parents=True)
    assert shared_data.shared_dir("fixtures") == tmp_path / "shared"
    (tree / "shared/fixtures").mkdir(parents=True)
    assert shared_data.shared_dir("fixtures") == tree / "shared"
    env = tmp_path / "elsewhere"
    (env / "fixtures").mkdir(parents=True)
    monkeypatch.setenv(shared_data.ENV, str(env))
    assert shared_data.shared_dir("fixtures") == env
    assert shared_data.shared_dir("texts") is None          # nothing holds it
    assert shared_data.shared_path("texts/x.json") == env / "texts/x.json"


def test_env_stage_fails_loudly_without_the_fixtures(tmp_path: Path, monkeypatch) -> None:
    from lab import gpu_check

    monkeypatch.setattr(gpu_check, "shared_candidates", lambda: [tmp_path / "a", tmp_path / "b"])
    monkeypatch.setattr(gpu_check, "shared_dir", lambda must_hold="": None)
    stage = Stage("env")
    gpu_check.stage_env(stage, "cpu")
    assert stage.status == "fail" and "SHARED DATA NOT FOUND" in stage.notes[0]
    assert str(tmp_path / "b") in stage.notes[0]
    with pytest.raises(FileNotFoundError, match="ASSISTANT_SHARED"):
        gpu_check._tiny("cpu", "float32")
