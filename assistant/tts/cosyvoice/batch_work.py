"""Model work that can run batched across streams, and the two ways to run it: alone or grouped.

A stream's chunk is written as a generator (`WorkSteps`): plain per-stream code that ``yield``s each
expensive piece of model work it needs (a flow solve, a vocoder decode: subclasses of `Work`) and reads the
piece's ``result`` when it resumes. Run alone (`run_alone`), every piece runs by itself, in order: that is
the per-stream path and the reference the batched path is tested against. The chunk scheduler instead
advances several streams' generators to their next piece, runs pieces of equal `batch_key` as one batch
(`run_grouped`), and resumes each: the same per-stream code, one model call for many streams.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable, Sequence
from typing import Self, TypeVar

import torch

T = TypeVar("T")


class Work:
    """One piece of model work a stream's generator asks for; ``result`` is set before it resumes."""

    result: torch.Tensor          # set by run_batch, before the generator that yielded the piece resumes
    batch_seconds: float = 0.0   # wall time of the batch this piece ran in (shared by its batch-mates)
    batch_size: int = 0

    def batch_key(self, buckets: Sequence[int] = ()) -> Hashable:
        """Pieces with equal keys can run as one batch (``buckets``: lengths a piece may be padded up to)."""
        raise NotImplementedError

    @classmethod
    def run_batch(cls, items: list[Self]) -> None:
        """Run ``items`` (equal keys) as one model call and set each one's ``result``."""
        raise NotImplementedError


WorkSteps = Generator[Work, None, T]


def bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds n (n itself when none does)."""
    return min((b for b in buckets if b >= n), default=n)


def run_grouped(items: Sequence[Work], buckets: Sequence[int] = ()) -> list[list[Work]]:
    """Run pieces of work, one model call per group of equal keys (in first-seen order); returns the groups."""
    groups: dict[Hashable, list[Work]] = {}
    for item in items:
        groups.setdefault((type(item), item.batch_key(buckets)), []).append(item)
    for group in groups.values():
        t0 = time.perf_counter()
        type(group[0]).run_batch(group)
        dt = time.perf_counter() - t0
        for item in group:
            item.batch_seconds, item.batch_size = dt, len(group)
    return list(groups.values())


@torch.inference_mode()
def run_alone(steps: WorkSteps[T]) -> T:
    """Drive a generator to its end, running each piece of work by itself (inference mode)."""
    try:
        item = next(steps)
        while True:
            run_grouped([item])
            item = steps.send(None)
    except StopIteration as stop:
        return stop.value


@torch.inference_mode()
def run_together(all_steps: Sequence[WorkSteps[T]], buckets: Sequence[int] = ()) -> list[T]:
    """Drive several generators in lockstep: each round runs every pending piece, grouped by key; returns
    their results in order (the scheduler adds deadlines to this; tests and the bench use it as is)."""
    results: dict[int, T] = {}
    pending: dict[int, Work] = {}

    def advance(i: int, first: bool) -> None:
        try:
            pending[i] = next(all_steps[i]) if first else all_steps[i].send(None)
        except StopIteration as stop:
            results[i] = stop.value

    for i in range(len(all_steps)):
        advance(i, True)
    while pending:
        items = dict(pending)
        pending.clear()
        run_grouped(list(items.values()), buckets)
        for i in items:
            advance(i, False)
    return [results[i] for i in range(len(all_steps))]


__all__ = ["Work", "WorkSteps", "bucket", "run_alone", "run_grouped", "run_together"]
