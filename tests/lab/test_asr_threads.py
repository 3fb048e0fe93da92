"""The ASR-threads study: one real run through the product's engine (tiny.en) on two held-out clips, and its flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.__main__ import build_parser
from lab.asr_threads import run_threads, threads_markdown


def test_bad_counts_are_refused(tmp_path: Path) -> None:
    for flags in (["--clips", "1"], ["--rounds", "0"], ["--threads", "0"]):
        args = build_parser("asr-threads").parse_args(["asr-threads", *flags, "--out", str(tmp_path)])
        with pytest.raises(SystemExit):
            run_threads(args)


@pytest.mark.slow
def test_a_run_times_each_thread_count_alone_and_two_at_once(tmp_path: Path) -> None:
    args = build_parser("asr-threads").parse_args(
        ["asr-threads", "--clips", "2", "--rounds", "1", "--threads", "1", "2", "--out", str(tmp_path)])
    assert run_threads(args) == 0
    report = json.loads((tmp_path / "asr_threads.json").read_text())
    assert report["model"] == "tiny.en" and [r["threads"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert 0 < row["alone_ms"] < 30_000 and row["cpu_ms"] > 0 and row["two_at_once_ms"] > 0
        assert len(report["seconds"][str(row["threads"])]["pairs"]) == 2  # every clip was heard beside the next
    table = threads_markdown(report["model"], 2, 1, report["rows"])
    assert "| 1 |" in table and "| 2 |" in table and "`tiny.en`" in table
