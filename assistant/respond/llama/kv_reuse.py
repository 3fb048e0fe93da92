"""How much of a new prompt a slot's KV cache already holds: the common prefix, then chunks further on that
can be shifted into place (as llama-server's ``--cache-reuse`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_REUSE_CHUNK = 16  # cached tokens further on that may be shifted into place (llama-server's --cache-reuse)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class ReusePlan:
    """How much of a prompt a slot's cache already holds: ``n_past`` prompt tokens need no evaluation; their
    KV is the common prefix plus the ``shifts`` (cache start, length, position delta) moved into place."""

    n_past: int
    shifts: tuple[tuple[int, int, int], ...] = ()


def plan_reuse(cache: Sequence[int], prompt: Sequence[int], *, can_shift: bool,
               min_chunk: int = MIN_REUSE_CHUNK) -> ReusePlan:
    """The common prefix, then (if the model's positions can be shifted) matching chunks of at least
    ``min_chunk`` tokens further on, greedily, as llama-server's cache reuse does. At least the prompt's last
    token is always left to evaluate (its logits start the reply)."""
    limit = len(prompt) - 1
    head = min(common_prefix(cache, prompt), limit)
    shifts: list[tuple[int, int, int]] = []
    if can_shift and min_chunk > 0:
        head_c, head_p = head, head
        while head_c < len(cache) and head_p < limit:
            n = 0
            while head_c + n < len(cache) and head_p + n < limit and cache[head_c + n] == prompt[head_p + n]:
                n += 1
            if n >= min_chunk:
                shifts.append((head_c, n, head_p - head_c))
                head_c += n
                head_p += n
            else:
                head_c += 1
        head = head_p
    return ReusePlan(head, tuple(shifts))

