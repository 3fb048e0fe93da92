"""tests/needs.py: under CI a missing prerequisite fails the test that needs it; elsewhere it skips, saying what."""

from __future__ import annotations

from pathlib import Path

import pytest

from assistant.bench import shared_data
from tests import needs


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
                                            ("", pytest.skip.Exception), ("false", pytest.skip.Exception)])
def test_a_missing_prerequisite_fails_under_ci_and_skips_elsewhere(monkeypatch, ci: str, outcome: type) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="chromium not found at /nowhere/chromium"):
        monkeypatch.setattr(needs, "CHROMIUM", "/nowhere/chromium")
        needs.chromium()
    with pytest.raises(outcome, match="no-such-package is not installed"):
        needs.module("no-such-package")


def test_missing_shared_data_names_where_it_looked(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(shared_data.ENV, str(tmp_path / "elsewhere"))
    missing = r"shared test data .* no audio in \S*elsewhere \(\$ASSISTANT_SHARED names that place"
    with pytest.raises(pytest.fail.Exception, match=missing):
        needs.shared("audio")
    (tmp_path / "elsewhere/audio").mkdir(parents=True)
    assert needs.shared("audio") == tmp_path / "elsewhere/audio"


def test_a_broken_package_is_an_error_not_a_skip(monkeypatch, tmp_path: Path) -> None:
    """A package that is there but fails to import (here: it imports something missing) is not "not installed"."""
    (tmp_path / "halfbroken").mkdir()
    (tmp_path / "halfbroken/__init__.py").write_text("import no_such_dependency_of_halfbroken\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_halfbroken"):
        needs.module("halfbroken")


def test_no_test_skips_on_its_own_for_a_missing_package() -> None:
    """``pytest.importorskip`` skips under CI too, which needs.py promises nothing does: needs.module instead."""
    here = Path(__file__).parent
    calls = [f"{p.name}:{n}" for p in sorted(here.rglob("*.py")) if p.name != "needs.py"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "importorskip(" in line and "needs.module" not in line and "calls = " not in line]
    assert not calls, f"pytest.importorskip in {calls}: use tests.needs.module"
