"""Tiny responder plug-ins used by tests/test_respond.py (loaded as ``tests.plugins:Class``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from assistant.respond.base import Message


class Shout:
    """Replies with the user's text in capitals, plus an optional suffix from ``[respond.options]``."""

    name = "shout"

    def __init__(self, suffix: str = "!") -> None:
        self.suffix = suffix

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        for word in text.upper().split():
            yield word + " "
        yield self.suffix


class NotAResponder:
    """Has no ``respond``: loading it must fail with a clear error."""

    def __init__(self) -> None:
        self.name = "broken"
