"""Waiting on a condition instead of sleeping a fixed time: a test goes on the moment what it waits for is true, and
fails with a message naming it when it never comes. The time limits are guards against a hang, not measurements:
generous, so that no loaded machine reaches them, and free when the condition comes at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

STEP_S = 0.02


async def until(condition: Callable[[], object], what: str, timeout_s: float = 30.0, step_s: float = STEP_S) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for: {what}")
        await asyncio.sleep(step_s)


async def until_async(condition: Callable[[], Awaitable[object]], what: str, timeout_s: float = 30.0,
                      step_s: float = 0.05) -> None:
    """:func:`until` for a condition that must be awaited (an HTTP request, a remote call)."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for: {what}")
        await asyncio.sleep(step_s)


def own_tasks() -> list[asyncio.Task[object]]:
    """Tasks of the app and its sessions (not aiohttp's per-connection request handlers)."""
    return [t for t in asyncio.all_tasks() if not _is_request_handler(t)]


def request_handlers() -> list[asyncio.Task[object]]:
    """aiohttp's per-connection tasks still running (a connection's handling, logging included, is over when its
    task has ended)."""
    return [t for t in asyncio.all_tasks() if _is_request_handler(t)]


def _is_request_handler(task: asyncio.Task[object]) -> bool:
    return "RequestHandler" in repr(task.get_coro())
