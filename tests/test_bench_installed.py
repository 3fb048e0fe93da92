"""``assistant bench v2v`` from a plain install: the package built and installed by pip into a folder of its own (no
``shared/`` beside it, ``$ASSISTANT_SHARED`` unset, run from another folder), against a real server started from
that install, completes with every turn measured, in English and Japanese, on its own speech.

This is what a user who ran ``pip install assistant`` gets; the wheel's package data is what carries the speech.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from assistant.bench.processes import start_assistant, stop, wait_ready
from assistant.bench.shared_data import ENV as SHARED_ENV

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
BENCH_TIMEOUT_S = 480


def install(into: Path, work: Path) -> Path:
    """The package as pip installs it from a source tree holding only what a release holds, into ``into``."""
    src = work / "src"
    shutil.copytree(ROOT / "assistant", src / "assistant", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(into), str(src)], check=True, timeout=BUILD_TIMEOUT_S, cwd=work)
    return into


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bench_runs_from_a_plain_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = install(tmp_path / "site", tmp_path)
    assert sorted(p.name for p in (site / "assistant" / "bench" / "data").iterdir()) == sorted(
        p.name for p in (ROOT / "assistant" / "bench" / "data").iterdir())  # the wheel carried the speech
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv(SHARED_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the install, not this checkout (the children inherit it)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    where = subprocess.run([sys.executable, "-c", "import assistant.bench.speech as s; print(s.DATA)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), where

    flags = ["--respond.engine", "echo", "--asr.language", "auto"]  # the page (assistant/web/) is package data
    server = start_assistant("served", "serve", flags, tmp_path / "logs", cwd=elsewhere)
    try:
        wait_ready([server])
        with urllib.request.urlopen(f"{server.url}/") as page:  # the page came with the package
            assert page.status == 200 and b"<html" in page.read().lower()
        run = subprocess.run([sys.executable, "-m", "assistant", "bench", "v2v", "--url", server.url, "--loopback-ice",
                              "--language", "en,ja", "--out", "out", "--no-plot"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    finally:
        stop([server])
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{server.tail()}"
    data = json.loads((elsewhere / "out" / "v2v.json").read_text())
    assert data["server"] == "assistant" and data["left_out"] == ""
    turns = data["levels"][0]["turns"]
    names = [t["file"] for t in turns]
    assert len(names) == 8 and sum(n.startswith("en_coffee_") for n in names) == 5
    assert sum(n.startswith("ja_") for n in names) == 3
    for t in turns:
        assert t["status"] == "ok", (t["file"], t["status"], t["reason"])
        assert t["columns"]["v2v_ms"] > 0 and t["columns"]["server_v2v_ms"] > 0, t["columns"]
    ja_cache = list((tmp_path / "cache" / "assistant" / "bench-speech").glob("ja-*/ja_timer.wav"))
    assert len(ja_cache) == 1  # made once, in the user's cache
    assert "turn 8/8" in run.stderr
