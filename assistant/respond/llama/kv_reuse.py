"""How much of a new prompt a slot's KV cache already holds: the common prefix, then chunks further on that
can be shifted into place (as llama-server's ``--cache-reuse`` does); and which free slot a new prompt takes.

**Which slot** (:func:`slot_cost`). Taking the slot that holds most of the prompt is right for a conversation's own
slot and wrong everywhere else: every conversation's prompt starts with the same system prompt and examples, so a
new one matched another conversation's slot by one token more than an idle slot's (the first word of the user's
turn: "Can I get …" twice) and threw that conversation's history away; its next turn then did the same to a third.
With four sessions on four slots, 10-13 of 160 turns evaluated their whole history again (up to 260 tokens, ~1.5 s
on one core) and the others queued behind them (first text up to 9.5 s; docs/latency.md). A choice now costs the
tokens the prompt evaluates plus the tokens of another conversation it throws away (evaluated again on that one's
next turn), unless that conversation has been idle for ``KEEP_S``; among equal costs, the slot used longest ago."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_REUSE_CHUNK = 16  # cached tokens further on that may be shifted into place (llama-server's --cache-reuse)
# A slot's conversation idle this long is taken to be over: its cache is worth nothing to keep (a voice session's
# turns come seconds apart; one silent for five minutes has most likely hung up).
KEEP_S = 300.0


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


def slot_cost(plan: ReusePlan, prompt_len: int, cache_len: int, idle_s: float, *, keep_s: float = KEEP_S) -> int:
    """What giving a prompt of ``prompt_len`` tokens this slot costs, in tokens to evaluate: the prompt's own that
    the slot lacks (``plan``), and the slot's cached tokens the prompt does not reuse (another conversation's,
    which it evaluates again on its next turn), unless the slot has been idle ``keep_s`` or longer."""
    lost = max(0, cache_len - plan.n_past) if idle_s < keep_s else 0
    return max(0, prompt_len - plan.n_past) + lost
