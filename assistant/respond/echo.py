"""The default responder: says back what it heard, so the whole loop runs with no model or server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from assistant.config import RespondConfig
from assistant.respond.base import Message


def words_as_deltas(text: str) -> list[str]:
    """Split ``text`` into word deltas (``"a b"`` → ``["a", " b"]``) that join back to it exactly."""
    parts = text.split(" ")
    return [p if i == 0 else " " + p for i, p in enumerate(parts)]


class EchoResponder:
    """Replies ``"You said: <text>"``, streamed word by word with no artificial delay."""

    name = "echo"

    def __init__(self, cfg: RespondConfig | None = None, *, prefix: str = "You said: ",
                 empty_reply: str = "I did not catch that.") -> None:
        self.prefix = prefix
        self.empty_reply = empty_reply

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        said = " ".join(text.split())
        reply = f"{self.prefix}{said}" if said else self.empty_reply
        for delta in words_as_deltas(reply):
            yield delta

    async def aclose(self) -> None:
        """Nothing to release; present so every responder can be closed the same way."""
