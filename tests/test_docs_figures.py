"""Figures that say where they come from (assistant/bench/figures.py): every figures block in the docs and the
lab's pages is its file, every file carries the command, commit and machine that made it, and a bench's --markdown
refreshes the pages that include it. And the docs stay a map a newcomer can read: every figures file is cited by a
page (docs/figures by the docs, lab/figures by the lab), no page or figure names a path of the machine that made
it, docs/README.md indexes every page, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

from assistant.bench import figures
from assistant.bench.report import BenchResult, LevelResult, TurnResult, format_markdown

TREE = figures.TREE
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # a Markdown link's (or image's) target, without its anchor
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home)/")  # where one machine kept something


def _docs_pages() -> list[Path]:
    return [TREE / "README.md", *sorted((TREE / "docs").glob("*.md"))]


def _lab_pages() -> list[Path]:
    lab = TREE / "lab"
    return sorted(p for p in lab.rglob("*.md") if "figures" not in p.relative_to(lab).parts[:-1])


def _cited(pages: list[Path]) -> set[Path]:
    """The files the pages name: in a figures block (a path from the tree's root) or a link (from the page)."""
    named: set[Path] = set()
    for page in pages:
        text = page.read_text(encoding="utf-8")
        named |= {(TREE / m.group("path")).resolve() for m in figures.BLOCK.finditer(text)
                  if not figures._in_fence(text, m)}
        named |= {(page.parent / target).resolve() for target in LINK.findall(text) if "://" not in target}
    return named


def test_every_figures_block_in_the_docs_is_its_file_with_its_provenance() -> None:
    assert figures.check() == []


def test_provenance_names_the_command_the_commit_and_the_machine() -> None:
    line = figures.provenance(["/x/bin/assistant", "bench", "v2v", "--sessions", "1,4"])
    assert line.startswith("_Measured with `assistant bench v2v --sessions 1,4` at commit `")
    assert "CPU cores" in line and "GiB RAM" in line and "load average" in line and " UTC, on " in line
    assert figures.command(["lab/scripts/connect_time.py", "--runs", "5"]).endswith("connect_time.py --runs 5")


def test_the_command_names_no_path_of_the_machine(tmp_path: Path) -> None:
    """A path inside the tree is written relative to it; any other absolute path by its last component only."""
    tree = tmp_path / "checkout"
    argv = [str(tree / "lab" / "scripts" / "connect_time.py"), "--out", "/tmp/run7/bench", "--markdown",
            str(tree / "docs" / "figures" / "x.md"), f"--audio={tmp_path}/clips/a.wav", "../shared/audio/b.wav",
            "--token", "/home/me/secret"]
    line = figures.command(argv, tree=tree)
    assert line == ("python lab/scripts/connect_time.py --out bench --markdown docs/figures/x.md --audio=a.wav "
                    "../shared/audio/b.wav --token REDACTED")
    assert figures.command(["/usr/local/bin/assistant", "bench", "v2v", "--out", "/work/runs/v2v"]) == \
        "assistant bench v2v --out v2v"
    assert figures.command([str(TREE / "lab" / "__main__.py"), "eot", "--out", str(TREE / "bench-out" / "eot")]) \
        == "python -m lab eot --out bench-out/eot"
    assert not MACHINE_PATH.search(figures.provenance(["assistant", "bench", "tts", "--out", "/root/x/y"]))


def test_every_figures_file_is_cited_by_a_page() -> None:
    """docs/figures holds only what README.md or a docs page shows or links; lab/figures only what a lab page does
    (the figures of the lab's notebooks live with the lab)."""
    for folder, pages in ((TREE / "docs" / "figures", _docs_pages()), (TREE / "lab" / "figures", _lab_pages())):
        cited = _cited(pages)
        uncited = sorted(f.relative_to(TREE).as_posix() for f in folder.glob("*") if f.resolve() not in cited)
        assert not uncited, f"figures no page of theirs cites (cite them or git rm them): {uncited}"


def test_no_page_and_no_figure_carries_a_path_of_the_machine() -> None:
    files = [*_docs_pages(), *_lab_pages(), *sorted((TREE / "docs" / "figures").glob("*.md")),
             *sorted((TREE / "lab" / "figures").glob("*.md"))]
    found = [f"{f.relative_to(TREE)}:{n}: {line.strip()[:120]}" for f in files
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not found, "absolute paths of a machine (write them relative to the tree, or by their last part):\n" + \
        "\n".join(found)


def test_the_docs_index_names_every_page() -> None:
    index = (TREE / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {Path(t).name for t in LINK.findall(index)}
    missing = [p.name for p in sorted((TREE / "docs").glob("*.md")) if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md has no line for: {missing}"


def test_the_readme_is_a_map_of_at_most_150_lines() -> None:
    lines = (TREE / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the subject that grew to a page in docs/"


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
    assert ("1 session: 2 turns, 2 heard, 0 dropped, 0 errors, 0 false starts heard, 0 replies cut; "
            "4 sessions: 1 turns") in md


def test_provenance_never_carries_a_secret() -> None:
    from assistant.bench.figures import command

    line = command(["assistant", "bench", "v2v", "--token", "s3cret", "--twilio-auth-token=abc", "--turns", "8"])
    assert "s3cret" not in line and "abc" not in line
    assert line == "assistant bench v2v --token REDACTED --twilio-auth-token=REDACTED --turns 8"
