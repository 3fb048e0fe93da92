"""The first-piece study: its line fit, and one real run through Piper (the product's engine, its thread pool)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lab.__main__ import build_parser
from lab.first_piece import PIECES, first_piece_markdown, fit_line, run_first_piece


def test_the_fit_recovers_a_line_and_refuses_what_is_not_one() -> None:
    a, b = fit_line([3.0, 10.0, 40.0], [60.0 + 2 * 3, 60.0 + 2 * 10, 60.0 + 2 * 40])
    assert a == pytest.approx(60.0) and b == pytest.approx(2.0)
    with pytest.raises(ValueError):
        fit_line([5.0], [1.0])
    with pytest.raises(ValueError):
        fit_line([5.0, 5.0], [1.0, 2.0])


def test_the_pieces_grow_and_the_table_names_each() -> None:
    assert [len(p) for p in PIECES] == sorted(len(p) for p in PIECES)
    rows: list[dict[str, object]] = [{"piece": p, "chars": len(p), "audio_s": 0.5, "first_chunk_ms": 80.0,
                                      "min_ms": 70.0} for p in PIECES[:2]]
    table = first_piece_markdown(rows, 60.0, 1.5)
    assert "| No, | 3 |" in table and "60 ms + 1.50 ms per character" in table


@pytest.mark.slow
def test_a_run_times_every_piece_through_piper(tmp_path: Path) -> None:
    args = build_parser("first-piece").parse_args(["first-piece", "--repeats", "1", "--out", str(tmp_path)])
    assert asyncio.run(run_first_piece(args)) == 0
    report = json.loads((tmp_path / "first_piece.json").read_text())
    assert report["engine"] == "piper" and [r["chars"] for r in report["rows"]] == [len(p) for p in PIECES]
    longest = report["rows"][-1]
    assert all(0 < r["first_chunk_ms"] < 30_000 for r in report["rows"])
    assert longest["audio_s"] > report["rows"][0]["audio_s"] > 0  # each piece was really spoken
    assert report["fit"]["per_char_ms"] > 0  # a longer piece costs the voice more
