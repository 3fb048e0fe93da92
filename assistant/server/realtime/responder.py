"""The session's responder as the Realtime API sees it: the instructions are its system prompt, the conversation's
items its history, and tools go through to a responder that takes them.

The turn runner calls it like any responder (text in, text deltas out), so a Realtime turn is an ordinary turn.
What it adds is read from the protocol at call time (:class:`ReplyContext`): the session's instructions (or the
response's own), the items (so a deleted item is forgotten and a cut reply remembered as heard), and the tools.
A tool call is not text: it is kept with the reply that made it (:class:`Reply`), and the protocol sends it to
the client as a function call item when that reply's turn ends. Kept, not sent at once, because a reply may be
written for a speculative turn that is then dropped: nothing of such a turn may reach the client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from assistant.respond.base import (
    Message,
    MessagesResponder,
    ReplyOptions,
    Responder,
    ToolCall,
    reply_stream,
    takes_options,
)

log = logging.getLogger(__name__)


REPLIES_KEPT = 4  # replies written but not yet claimed: a committed turn and the speculations before it


@dataclass
class Reply:
    """One call of the responder: the words it answered and the tool calls it made."""

    text: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ReplyContext:
    """What the next reply is written from; the protocol fills it before it starts a turn."""

    instructions: str = ""
    history: Callable[[bool], list[Message]] = lambda tools: []
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "auto"
    temperature: float | None = None  # the session's (or the response's own); None: the responder's default
    max_tokens: int | None = None
    continuation: bool = False  # no new user words: the model goes on (after a tool's output)
    replies: list[Reply] = field(default_factory=list)

    def take_calls(self, text: str) -> list[ToolCall]:
        """The tool calls of the latest reply to ``text`` (the turn that was committed); forgets them all."""
        found = next((r for r in reversed(self.replies) if r.text == text), None)
        self.replies.clear()
        return found.calls if found is not None else []


class RealtimeResponder:
    """Wraps the configured responder for one Realtime session (see the module docstring)."""

    def __init__(self, inner: Responder, context: ReplyContext) -> None:
        self.inner = inner
        self.context = context
        self.name = getattr(inner, "name", "responder")

    @property
    def takes_tools(self) -> bool:
        return isinstance(self.inner, MessagesResponder)

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        ctx = self.context
        reply = Reply(text)
        ctx.replies.append(reply)
        del ctx.replies[:-REPLIES_KEPT]
        system = [Message("system", ctx.instructions)] if ctx.instructions else []
        options = options if options is not None else ReplyOptions()
        if ctx.temperature is not None:  # the session's (or this response's) sampling asks reach the model
            options.temperature = ctx.temperature
        if ctx.max_tokens is not None:
            options.max_tokens = ctx.max_tokens
        if isinstance(self.inner, MessagesResponder):
            messages = [*system, *ctx.history(True)]
            if not ctx.continuation:
                messages.append(Message("user", text))
            tools = ctx.tools if ctx.tool_choice != "none" else []
            # Only the sampling asks on this path (the conversation's messages are the client's, as before).
            asks = ReplyOptions(temperature=options.temperature, max_tokens=options.max_tokens)
            stream = (self.inner.respond_messages(messages, tools, ctx.tool_choice, options=asks)  # type: ignore[call-arg]
                      if takes_options(self.inner.respond_messages)
                      else self.inner.respond_messages(messages, tools, ctx.tool_choice))
            async for out in stream:
                if isinstance(out, ToolCall):
                    reply.calls.append(out)
                elif out:
                    yield out
            return
        async for delta in reply_stream(self.inner, text, [*system, *ctx.history(False)], options):
            yield delta

    async def aclose(self) -> None:
        """The inner responder is shared by every session: it is not ours to close."""
