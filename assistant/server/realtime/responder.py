"""The session's responder as the Realtime API sees it: the instructions are its system prompt, the conversation's
items its history, and tools go through to a responder that takes them.

The turn runner calls it like any responder (text in, text deltas out), so a Realtime turn is an ordinary turn.
What it adds is read from the protocol at call time (:class:`ReplyContext`): the session's instructions (or the
response's own), the items (so a deleted item is forgotten and a cut reply remembered as heard), the tools and
the response's sampling limits. A tool call is not text: its pieces and the whole call are kept with the reply
that made it (:class:`Reply`) until a response claims that reply, and from then on go to the response as they
come. Kept, not sent at once, because a reply may be written for a speculative turn that is then dropped: nothing
of such a turn may reach the client. And a call waits for its turn's end to be sure (``ReplyOptions.sure``): a
turn committed on an unsure end is still dropped if the speaker goes on, and the client would have run the call
(its words come again, whole, in the next turn, as a skill that acts waits: respond/skills/base.py).
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
    ToolCallDelta,
    Usage,
    closing,
    reply_stream,
    takes_options,
)
from assistant.server.realtime.settings import ToolChoice

log = logging.getLogger(__name__)


REPLIES_KEPT = 4  # replies written but not yet claimed: a committed turn and the speculations before it

ToolEvent = ToolCallDelta | ToolCall
ToolListener = Callable[[ToolEvent], None]


@dataclass
class Reply:
    """One call of the responder: the words it answered, the tool calls it made, and what it cost."""

    text: str
    calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None  # the responder's own count, when it gave one
    prompt_chars: int = 0  # what it was given (for an estimate when it gave no count)
    listener: ToolListener | None = None  # the response that claimed it
    held: list[ToolEvent] = field(default_factory=list)  # tool events before a response claimed it

    def tool_event(self, event: ToolEvent) -> None:
        if isinstance(event, ToolCall):
            self.calls.append(event)
        if self.listener is not None:
            self.listener(event)
        else:
            self.held.append(event)

    def claim(self, listener: ToolListener) -> None:
        """The response this reply belongs to: what it held goes there now, the rest as it comes."""
        self.listener = listener
        held, self.held = self.held, []
        for event in held:
            listener(event)


@dataclass
class ReplyContext:
    """What the next reply is written from; the protocol fills it before it starts a turn."""

    instructions: str = ""
    history: Callable[[bool], list[Message]] = lambda tools: []
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    continuation: bool = False  # no new user words: the model goes on from the conversation
    only: Callable[[bool], list[Message]] | None = None  # a response with its own input: its context instead
    max_tokens: int | None = None
    temperature: float | None = None
    server_replies: bool = True  # a turn the server detected gets a reply (turn_detection.create_response)
    client_text: str | None = None  # the words of the response the client asked for (always replied to)
    replies: list[Reply] = field(default_factory=list)
    _claims: dict[str, ToolListener] = field(default_factory=dict)

    def add(self, reply: Reply) -> None:
        self.replies.append(reply)
        del self.replies[:-REPLIES_KEPT]
        listener = self._claims.pop(reply.text, None)
        if listener is not None:
            reply.claim(listener)

    def claim(self, text: str, listener: ToolListener) -> Reply | None:
        """The latest unclaimed reply to ``text`` goes to ``listener``; if none is written yet, the next one will."""
        found = next((r for r in reversed(self.replies) if r.text == text and r.listener is None), None)
        if found is None:
            self._claims = {text: listener}  # one response at a time: an older claim is void
            return None
        self._claims.clear()
        found.claim(listener)
        return found

    def reply_to(self, text: str) -> Reply | None:
        """The reply a response to ``text`` claimed (or would have), for its usage."""
        return next((r for r in reversed(self.replies) if r.text == text), None)

    def forget(self) -> None:
        self.replies.clear()
        self._claims.clear()


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
        ctx.add(reply)
        if not ctx.server_replies and text != ctx.client_text:
            return  # a turn the server detected, with create_response off: transcribed, not answered
        options = options if options is not None else ReplyOptions()
        if ctx.max_tokens is not None:
            options.max_tokens = ctx.max_tokens
        if ctx.temperature is not None:
            options.temperature = ctx.temperature
        system = [Message("system", ctx.instructions)] if ctx.instructions else []
        context = ctx.only if ctx.only is not None else ctx.history
        try:
            if isinstance(self.inner, MessagesResponder):
                messages = [*system, *context(True)]
                if not ctx.continuation:
                    messages.append(Message("user", text))
                reply.prompt_chars = sum(len(m.content) for m in messages)
                tools = ctx.tools if ctx.tool_choice != "none" else []
                method = self.inner.respond_messages
                stream = (method(messages, tools, ctx.tool_choice, options=options)  # type: ignore[call-arg]
                          if takes_options(method) else method(messages, tools, ctx.tool_choice))
                async with closing(stream):
                    async for out in stream:
                        if isinstance(out, ToolCall | ToolCallDelta):
                            if options.sure is not None and not options.sure.is_set():
                                await options.sure.wait()  # the client acts on a call: only a sure turn's
                            reply.tool_event(out)
                            options.note_tool(out)  # the turn's telemetry: when the model wrote each call
                        elif out:
                            yield out
                return
            messages = [*system, *context(False)]
            reply.prompt_chars = sum(len(m.content) for m in messages) + len(text)
            async with closing(reply_stream(self.inner, text, messages, options)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            reply.usage = options.usage

    async def aclose(self) -> None:
        """The inner responder is shared by every session: it is not ours to close."""
