"""The responder every call shares, which a better one replaces between turns (``respond.model_path = auto``).

Each reply is asked of the responder that is current when it starts, and ends on it; :meth:`SwappableResponder.swap`
makes a new one current for every reply after, and closes the old one once its last reply has ended. A call never
hears a reply start on one model and end on another, and never waits for the swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from assistant.respond.base import Message, ReplyOptions, Responder, closing, reply_stream

log = logging.getLogger(__name__)


class SwappableResponder:
    """``current`` answers; :meth:`swap` puts another in its place (see the module's docstring). ``why`` says why
    the current one answers (the page, ``/readyz``)."""

    def __init__(self, current: Responder, why: str) -> None:
        self.current = current
        self.name = str(getattr(current, "name", "responder"))
        self.why = why
        self.swaps = 0
        self._active: dict[int, int] = {}  # id(responder) → replies running on it
        self._retiring: dict[int, Responder] = {}  # swapped out, waiting for their last reply to end
        self._closing: set[asyncio.Task[None]] = set()

    def __getattr__(self, attr: str) -> Any:
        # What the current responder offers besides replies (health, host, stats, …): asked of it.
        if attr.startswith("_") or attr in ("current", "name", "why", "swaps"):
            raise AttributeError(attr)
        return getattr(self.current, attr)

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        responder = self.current
        key = id(responder)
        self._active[key] = self._active.get(key, 0) + 1
        try:
            async with closing(reply_stream(responder, text, history, options)) as stream:
                async for delta in stream:
                    yield delta
        finally:
            self._active[key] -= 1
            if not self._active[key]:
                del self._active[key]
                if key in self._retiring:
                    self._retire(self._retiring.pop(key))

    def swap(self, new: Responder, why: str) -> None:
        """From the next reply on, ``new`` answers; the old one is closed once its last reply has ended."""
        old, self.current, self.why = self.current, new, why
        self.name = str(getattr(new, "name", "responder"))
        self.swaps += 1
        log.info("respond.swapped old=%s new=%s why=%s", getattr(old, "name", "?"), getattr(new, "name", "?"), why)
        if self._active.get(id(old)):
            self._retiring[id(old)] = old
        else:
            self._retire(old)

    def _retire(self, old: Responder) -> None:
        aclose = getattr(old, "aclose", None)
        if aclose is None:
            return
        task = asyncio.get_running_loop().create_task(aclose(), name="respond-retire")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.current, "describe", None)
        info = dict(describe()) if describe is not None else {"engine": self.name, "model": ""}
        return {**info, "why": self.why}

    async def warmup(self) -> None:
        warmup = getattr(self.current, "warmup", None)
        if warmup is not None:
            await warmup()

    async def aclose(self) -> None:
        """Close the current responder and any still retiring."""
        for responder in [self.current, *self._retiring.values()]:
            aclose = getattr(responder, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        self._retiring.clear()
        for task in list(self._closing):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


__all__ = ["SwappableResponder"]
