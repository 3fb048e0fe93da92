"""``python -m lab features --endpointing``: real variants, each served in process and measured by the v2v client.

Two endpointing variants on one whole sentence and one mid-sentence pause file: the tables count what the turns
did (nothing here asserts a time; the figures are the benchmark's to print).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.latency_features import (
    ENDPOINTING,
    PAUSE_FILES,
    format_endpointing,
    format_table,
    run_variants,
)
from tests.conftest import test_config

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow]


async def test_endpointing_variants_are_measured_and_tabled(shared_audio: Path, tmp_path: Path) -> None:
    sentence = shared_audio / "en_timer.wav"
    pause = PAUSE_FILES / "alarm.wav"
    chosen = {name: ENDPOINTING[name] for name in ("fixed silence", "model + transcript")}
    results = await run_variants(test_config(), chosen, [sentence, pause], 1, tmp_path)  # type: ignore[arg-type]

    assert [r.name for r in results] == list(chosen)
    for r in results:
        assert [t["file"] for t in r.turns] == ["en_timer.wav", "alarm.wav"], r.turns
        whole = r.turns[0]
        assert whole["status"] == "ok" and whole["columns"]["v2v_ms"] > 0, whole
        # The client's figure includes the server's: a client-side latency below the server's cannot be true.
        assert whole["columns"]["v2v_ms"] >= whole["columns"]["server_v2v_ms"], whole
        assert r.turns[1]["speech_ends"] >= 1, r.turns[1]
        assert all(v >= 0 for v in whole["gaps"].values()), whole["gaps"]

    for folder in ("fixed-silence", "model-transcript"):
        assert (tmp_path / folder / "v2v.json").is_file()

    table = format_endpointing(results, {pause.name}).splitlines()
    assert len(table) == 2 + len(results)
    for row, r in zip(table[2:], results, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == r.name
        one_turn = f"{int(r.turns[1]['speech_ends'] == 1)}/1"
        assert cells[-3] == one_turn, (row, r.turns[1])

    plain = format_table(results).splitlines()
    assert plain[2].endswith("| 1.00 |")  # the baseline against itself
    json.dumps([r.__dict__ for r in results])  # what the command writes must serialise
