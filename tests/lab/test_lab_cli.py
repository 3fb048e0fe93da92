"""The lab's command line (``python -m lab``) and the product's old bench names that now point to it."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from assistant import cli
from lab.__main__ import STUDIES, build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(cli.MOVED_TO_LAB))
def test_a_moved_bench_says_where_it_went(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", name, "--any-flag", "1"]) == 2
    err = capsys.readouterr().err
    assert f"python -m lab {cli.MOVED_TO_LAB[name]}" in err and "[lab]" in err


def test_every_moved_name_is_a_study_of_the_lab() -> None:
    studies = {name for name, *_ in STUDIES}
    assert set(cli.MOVED_TO_LAB.values()) <= studies
    assert not {name for name, *_ in cli.BENCHES} & set(cli.MOVED_TO_LAB)


@pytest.mark.parametrize("study", [s for s in STUDIES], ids=[s[0] for s in STUDIES])
def test_each_study_has_its_flags_and_its_runner(study: tuple[str, str, str, str, str]) -> None:
    name, _, module, adder, runner = study
    mod = importlib.import_module(module)
    assert callable(getattr(mod, adder)) and callable(getattr(mod, runner))
    assert len(inspect.signature(getattr(mod, runner)).parameters) == 1  # runner(args)
    args = build_parser(name).parse_args([name])
    assert args.study == name


def test_python_dash_m_lab_lists_the_studies_from_a_checkout() -> None:
    out = subprocess.run([sys.executable, "-m", "lab", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for name, *_ in STUDIES:
        assert name in out
    assert "gpu-check" in out
