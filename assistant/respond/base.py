"""The Responder protocol: a user turn and the history in, an async stream of text deltas out.

A responder that can call tools (``MessagesResponder``: the OpenAI-compatible one) also takes the whole message
list with tool definitions, and yields :class:`ToolCall` among its text deltas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A function the model asks the client to run: its call id, name and JSON arguments."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message that calls tools
    call_id: str = ""  # a tool message: the call it answers


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


@runtime_checkable
class MessagesResponder(Protocol):
    """A responder that takes the whole conversation and tools (function definitions, OpenAI's shape)."""

    name: str

    def respond_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                         tool_choice: Any = "auto") -> AsyncIterator[str | ToolCall]:
        """Yield text deltas and, once each is complete, the tool calls the model makes."""
        ...
