"""The Responder protocol: a user turn and the history in, an async stream of text deltas out.

A responder that can call tools (``MessagesResponder``: the OpenAI-compatible one) also takes the whole message
list with tool definitions, and yields :class:`ToolCall` among its text deltas (and, as the model writes a call,
its :class:`ToolCallDelta` pieces).

Per reply, a responder may also take :class:`ReplyOptions` (the turn's language, sampling limits a client asked
for) as the keyword ``options``, and report what the reply cost in ``options.usage``. A plug-in whose
``respond(text, history)`` takes no options keeps working: :func:`reply_stream` passes them only to responders
that accept them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A function the model asks the client to run: its call id, name and JSON arguments."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call as the model writes it, before the call is complete: ``index`` tells the calls of
    one reply apart; ``call_id`` and ``name`` are known from the first piece; ``arguments`` is this piece's part
    of the JSON arguments. The complete :class:`ToolCall` follows once the call is whole."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message that calls tools
    call_id: str = ""  # a tool message: the call it answers


@dataclass(frozen=True)
class Usage:
    """What one reply cost in tokens: counted by the model's tokenizer (``exact``), or estimated."""

    input_tokens: int
    output_tokens: int
    exact: bool = False


# The longest a finished reply waits to hear what the conversation kept of it (``ReplyOptions.kept``): its playout and
# a barge-in fit well within it; past it the responder takes the turn as dropped.
KEPT_WAIT_S = 600.0


async def kept_text(kept: asyncio.Future[str]) -> str | None:
    """What the conversation kept of a reply (``ReplyOptions.kept``), once it says; None when it dropped the turn or
    said nothing within ``KEPT_WAIT_S``."""
    done, _ = await asyncio.wait([kept], timeout=KEPT_WAIT_S)
    return None if not done or kept.cancelled() or kept.exception() is not None else kept.result()


@dataclass
class ReplyOptions:
    """What one reply is asked for beyond the words, and (filled by the responder) what it cost.

    ``None`` means "as configured" (``[respond]``). ``language`` is the language the user spoke this turn (a code
    as the ASR gives it, e.g. ``en``, ``zh``, ``ja``); a responder that writes free text answers in it.
    """

    language: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    session: str = ""  # the call it is for: a responder in another process joins its trace (telemetry/carry.py)
    # What of this reply the conversation keeps (its history's assistant message, all of it or the part heard
    # before a barge-in), once known; cancelled when the turn is dropped (a speculation the user talked over). A
    # responder that gets the next prompt ready after a reply waits for it. None: kept as said, now.
    kept: asyncio.Future[str] | None = None
    # Set once the turn's end is sure (its reply may be heard); a skill that acts waits for it (skills/base.py).
    # None: sure now.
    sure: asyncio.Event | None = None
    usage: Usage | None = None  # set by the responder when the reply ends (or is cancelled)
    fallback: str | None = None  # set by the responder: another responder answered, and why (the page shows it)
    skill: str = ""  # set by the responder: the skill that answered (respond/skills/), "" for the model's own words
    tool_calls: list[ToolCallTiming] = field(default_factory=list)  # noted by :meth:`note_tool` (telemetry)
    _tools_begun: dict[str, float] = field(default_factory=dict, repr=False)

    def note_tool(self, event: ToolCall | ToolCallDelta) -> None:
        """A tool call's piece or the whole call as the model wrote it: when it began and ended, for the turn's
        telemetry (a responder that yields tool calls notes them here; nothing else reads it)."""
        now = time.time()
        if isinstance(event, ToolCallDelta):
            self._tools_begun.setdefault(event.call_id, now)
        else:
            begun = self._tools_begun.pop(event.call_id, now)
            self.tool_calls.append(ToolCallTiming(event.call_id, event.name, event.arguments, begun, now))


@dataclass(frozen=True)
class ToolCallTiming:
    """One tool call the model wrote: its call id, name, arguments, and its first and last piece (wall s)."""

    call_id: str
    name: str
    arguments: str
    begun: float
    done: float


@runtime_checkable
class Responder(Protocol):
    name: str

    def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        """Yield the reply as text deltas, as soon as each exists.

        ``history`` holds earlier turns of this session (oldest first), not the current ``text``.
        Raise :class:`ResponderError` for a failure the user should hear about. A responder may take a third,
        keyword argument ``options: ReplyOptions`` (see the module docstring).
        """
        ...


class ResponderError(RuntimeError):
    """A reply could not be produced (server down, timeout, bad answer); ``str()`` is user-safe."""

    user_safe = True  # its message may be said to the user (and crosses an engine's process boundary as such)


@runtime_checkable
class MessagesResponder(Protocol):
    """A responder that takes the whole conversation and tools (function definitions, OpenAI's shape)."""

    name: str

    def respond_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                         tool_choice: Any = "auto") -> AsyncIterator[str | ToolCall | ToolCallDelta]:
        """Yield text deltas and, once each is complete, the tool calls the model makes; a responder that streams
        a call's arguments may yield :class:`ToolCallDelta` pieces before it (callers that want only whole calls
        skip them). Like ``respond``, it may take ``options: ReplyOptions`` as a keyword."""
        ...


def takes_options(method: Any) -> bool:
    """True if ``method`` (a ``respond`` or ``respond_messages``) accepts the ``options`` keyword."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "options" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def reply_stream(responder: Responder, text: str, history: Sequence[Message],
                 options: ReplyOptions | None = None) -> AsyncIterator[str]:
    """``responder.respond(text, history)``, with ``options`` when the responder takes them."""
    if options is not None and takes_options(responder.respond):
        return responder.respond(text, history, options=options)  # type: ignore[call-arg]
    return responder.respond(text, history)


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    """``stream``, closed on leaving the block (its ``aclose()``, where it has one): a reply given up (barge-in, a
    dropped speculative turn, a cancelled task) frees the responder's slot now, not when it is collected."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
