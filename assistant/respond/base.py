"""The Responder protocol: a user turn and the history in, an async stream of text deltas out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@runtime_checkable
class Responder(Protocol):
    name: str

    def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        """Yield the reply as text deltas, as soon as each exists.

        ``history`` holds earlier turns of this session (oldest first), not the current ``text``.
        Raise :class:`ResponderError` for a failure the user should hear about.
        """
        ...


class ResponderError(RuntimeError):
    """A reply could not be produced (server down, timeout, bad answer); ``str()`` is user-safe."""
