"""Fixtures shared by the CosyVoice2 tests: one torch thread (as the goldens were made), the golden tensors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from cv_fixtures import need_fixtures


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return torch.load(need_fixtures() / "golden.pt", weights_only=True)
