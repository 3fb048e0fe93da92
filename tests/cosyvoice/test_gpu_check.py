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
@pytest.mark.timeout(600)
def test_cpu_mode_runs_offline_without_the_projects_other_dependencies(tmp_path: Path) -> None:
    need_fixtures()
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "550",
           "PYTHONPATH": str(ROOT / "tests/cosyvoice/offline_site"), "GPU_CHECK_BLOCKED": ABSENT_ON_GPU_MACHINE,
           "PIP_NO_INDEX": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(out), "--device", "cpu",
                           "--budget-s", "500"], cwd=tmp_path, env=env, capture_output=True, text=True)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    doc = json.loads((out / "gpu_check.json").read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert list(stages) == ["env", "parity", "graphs", "first_packet_graphs_on", "first_packet_graphs_off", "bf16",
                            "frontend"]
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
    # the static paths were checked against their eager twins, each check a row
    graphs = {r["what"].split(":")[0]: r for r in stages["graphs"]["rows"]}
    assert len(graphs) == 7 and all(r["ok"] == "yes" for r in graphs.values())
    assert stages["graphs"]["facts"]["tiny_first_chunk_path"] == "static step (cpu, capture skipped)"
    # the first packets, graphs on (the static paths traced) and off, at 1 and 2 streams, in the summary's shape
    summary = json.loads((out / "gpu_first_packet.json").read_text())
    assert set(summary) == {"commit", "gpu", "graphs_on", "graphs_off"} and summary["gpu"] is None
    for label in ("graphs_on", "graphs_off"):
        assert set(summary[label]) == {"1", "2"}
        for row in summary[label].values():
            assert set(row) == {"p50_ms", "p90_ms", "underruns"} and row["p50_ms"] > 0 and row["underruns"] >= 0
    on = stages["first_packet_graphs_on"]["facts"]
    assert on["first_chunk_path"] == "static step (cpu, capture skipped)" and on["first_chunk_flow_direct"] >= 2
    assert stages["first_packet_graphs_off"]["facts"]["first_chunk_path"] == "eager"
    assert "graphs" in (out / "gpu_first_packet.md").read_text()


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
    from lab import gpu_check, gpu_first_packet

    for module in (gpu_check, gpu_first_packet):
        monkeypatch.setattr(module, "shared_candidates", lambda: [tmp_path / "a", tmp_path / "b"])
        monkeypatch.setattr(module, "shared_dir", lambda must_hold="": None)
    stage = Stage("env")
    gpu_check.stage_env(stage, "cpu")
    assert stage.status == "fail" and "SHARED DATA NOT FOUND" in stage.notes[0]
    assert str(tmp_path / "b") in stage.notes[0]
    with pytest.raises(FileNotFoundError, match="ASSISTANT_SHARED"):
        gpu_check._tiny("cpu", "float32")
