"""Figures that say where they come from (assistant/bench/figures.py): every figures block in the docs is its
file, every file carries the command, commit and machine that made it, and a bench's --markdown refreshes the
docs that include it."""

from __future__ import annotations

from pathlib import Path

from assistant.bench import figures
from assistant.bench.report import BenchResult, LevelResult, TurnResult, format_markdown


def test_every_figures_block_in_the_docs_is_its_file_with_its_provenance() -> None:
    assert figures.check() == []


def test_provenance_names_the_command_the_commit_and_the_machine() -> None:
    line = figures.provenance(["/x/bin/assistant", "bench", "v2v", "--sessions", "1,4"])
    assert line.startswith("_Measured with `assistant bench v2v --sessions 1,4` at commit `")
    assert "CPU cores" in line and "GiB RAM" in line and "load average" in line and " UTC, on " in line
    assert figures.command(["scripts/connect_time.py", "--runs", "5"]).endswith("connect_time.py --runs 5")


def test_write_markdown_refreshes_the_blocks_that_include_the_file(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    stale = "<!-- figures: docs/figures/x.md -->\nold figures\n<!-- /figures -->\n"
    other = "<!-- figures: docs/figures/y.md -->\nleft alone\n<!-- /figures -->\n"
    (tmp_path / "README.md").write_text("# Title\n\nBefore.\n\n" + stale + "\nAfter.\n")
    (tmp_path / "docs" / "a.md").write_text(stale + other + "```\n" + stale + "```\n")  # an example in a fence
    changed = figures.write_markdown(tmp_path / "docs/figures/x.md", "| a |\n|---|\n| 1 |", "_Measured with `x`._",
                                     tree=tmp_path)
    assert sorted(p.name for p in changed) == ["README.md", "a.md"]
    written = (tmp_path / "docs/figures/x.md").read_text()
    assert written == f"{figures.GENERATED}\n_Measured with `x`._\n\n| a |\n|---|\n| 1 |\n"
    readme = (tmp_path / "README.md").read_text()
    block = "<!-- figures: docs/figures/x.md -->\n" + written + "<!-- /figures -->\n"
    assert readme == "# Title\n\nBefore.\n\n" + block + "\nAfter.\n"
    assert "left alone" in (tmp_path / "docs/a.md").read_text()
    assert (tmp_path / "docs/a.md").read_text().endswith("```\n" + stale + "```\n")  # the example is left as it is
    problems = figures.check(tmp_path)  # y.md does not exist; x.md's blocks match it
    assert problems == ["docs/a.md: block docs/figures/y.md: the file does not exist"]
    (tmp_path / "README.md").write_text(readme.replace("| 1 |", "| 2 |"))  # edited by hand
    assert "README.md: block docs/figures/x.md: differs from the file" in figures.check(tmp_path)[0]


def test_v2v_markdown_has_every_column_per_level() -> None:
    def turn(i: int, v2v: float) -> TurnResult:
        return TurnResult(session=0, index=i, file="en_weather.wav", columns={"v2v_ms": v2v, "asr_ms": 0.4})

    result = BenchResult(url="http://127.0.0.1:1", same_host=True, threshold_dbfs=-40.0, window_ms=10,
                         levels=[LevelResult(1, [turn(0, 500.0), turn(1, 700.0)]), LevelResult(4, [turn(0, 900.0)])])
    md = format_markdown(result)
    lines = md.splitlines()
    assert lines[0].startswith("| column | 1 session p50 | 1 session p90 | 1 session max | 4 sessions p50 |")
    assert "| `v2v_ms` | 600 | 680 | 700 | 900 | 900 | 900 |" in lines
    assert "| `asr_ms` | 0.4 | 0.4 | 0.4 | 0.4 | 0.4 | 0.4 |" in lines
    assert "1 session: 2 turns, 2 heard, 0 dropped, 0 errors; 4 sessions: 1 turns" in md


def test_provenance_never_carries_a_secret() -> None:
    from assistant.bench.figures import command

    line = command(["assistant", "bench", "v2v", "--token", "s3cret", "--twilio-auth-token=abc", "--turns", "8"])
    assert "s3cret" not in line and "abc" not in line
    assert line == "assistant bench v2v --token REDACTED --twilio-auth-token=REDACTED --turns 8"
