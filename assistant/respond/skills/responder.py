"""A call's responder with its skills: in front of a model that cannot call tools (the intent step), beside one
that can (tools).

One per call (the skills need the call's timers and time zone), around the responder every call shares:

- **the intent step** (``respond.intents = auto``: in front of the embedded model, wherever it runs; ``always``:
  in front of any responder, a plug-in's or ``echo`` too): the turn's words go to :meth:`Skills.route` first;
  what is clearly a skill is answered by it, exactly, and the model is not asked. Anything else goes to the model
  as before.
- **tools** (a responder that takes the whole conversation and tools, ``MessagesResponder``: the ``openai`` one):
  the skills are offered as function tools; a call the model makes to one is run here (bounded) and its result
  handed back to the model, which answers with it (at most :data:`MAX_TOOL_ROUNDS` rounds). A Realtime client's
  own tools sit beside them, never replaced: the client's calls go out to the client as before, and a skill the
  client names itself is the client's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from assistant import languages
from assistant.config.respond import INTENTS
from assistant.respond.base import (
    Message,
    MessagesResponder,
    ReplyOptions,
    Responder,
    ToolCall,
    ToolCallDelta,
    closing,
    reply_stream,
    takes_options,
)
from assistant.respond.skills.base import CallContext
from assistant.respond.skills.registry import Skills

log = logging.getLogger(__name__)

MAX_TOOL_ROUNDS = 3  # model → skill → model … (a model that keeps calling tools is cut off here)
SMALL_MODELS = ("llama",)  # responders the intent step stands in front of with respond.intents = auto


class SkillfulResponder:
    """``inner`` with the skills in front of it (see the module's docstring)."""

    def __init__(self, inner: Responder, skills: Skills, call: CallContext, *, intents: str = "auto",
                 language: str = "en") -> None:
        if intents not in INTENTS:
            raise ValueError(f"respond.intents must be one of {', '.join(INTENTS)}, got {intents!r}")
        self.inner = inner
        self.skills = skills
        self.call = call
        self.name = getattr(inner, "name", "responder")
        self.language = language
        self.takes_tools = isinstance(inner, MessagesResponder)
        self.intents = intents == "always" or (intents == "auto" and not self.takes_tools
                                               and self.name in SMALL_MODELS)

    def _language(self, text: str, options: ReplyOptions) -> str:
        return options.language or languages.script_language(text) or self.language

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        opts = options if options is not None else ReplyOptions()
        language = self._language(text, opts)
        if self.intents:
            routed = self.skills.route(text, language, self.call)
            if routed is not None:
                opts.skill = routed.skill
                yield await self.skills.run(routed.skill, routed.arguments, language, self.call, sure=opts.sure,
                                            kept=opts.kept)
                return
        if self.takes_tools:
            async for out in self._with_tools([*history, Message("user", text)], [], "auto", opts, language):
                if isinstance(out, str):
                    yield out
            return
        async with closing(reply_stream(self.inner, text, history, opts)) as stream:
            async for delta in stream:
                yield delta

    async def _with_tools(self, messages: list[Message], client_tools: Sequence[dict[str, Any]], tool_choice: Any,
                          options: ReplyOptions, language: str) -> AsyncIterator[str | ToolCall | ToolCallDelta]:
        """The model with the client's tools and the skills (those the client does not name itself); skill calls
        run here and go back to the model."""
        inner: Any = self.inner
        theirs = {t.get("name") for t in client_tools if isinstance(t, dict)}
        mine = [t for t in self.skills.tools(self.call) if t["name"] not in theirs]
        ours = {t["name"] for t in mine}
        offered = [*client_tools, *mine] if tool_choice != "none" else []
        for rounds in range(MAX_TOOL_ROUNDS + 1):
            choice = tool_choice if rounds == 0 else "auto"
            method = inner.respond_messages
            stream = (method(messages, offered, choice, options=options) if takes_options(method)
                      else method(messages, offered, choice))
            text, calls, theirs_called = "", [], 0
            async with closing(stream):
                async for out in stream:
                    if isinstance(out, ToolCallDelta):
                        if out.name not in ours:
                            yield out
                    elif isinstance(out, ToolCall):
                        if out.name in ours:
                            calls.append(out)
                        else:
                            theirs_called += 1
                            yield out
                    elif out:
                        text += out
                        yield out
            if not calls:
                return
            if theirs_called or rounds == MAX_TOOL_ROUNDS:  # the client's calls come first; or the model loops
                log.info("skill_calls_dropped calls=%d reason=%s", len(calls),
                         "client_tool_called" if theirs_called else "too_many_rounds")
                return
            results = [await self.skills.run(c.name, c.arguments, language, self.call, sure=options.sure,
                                             kept=options.kept) for c in calls]
            options.skill = calls[-1].name
            messages = [*messages, Message("assistant", text, tool_calls=tuple(calls)),
                        *(Message("tool", r, call_id=c.call_id) for c, r in zip(calls, results, strict=True))]

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.inner, "describe", None)
        return dict(describe()) if describe is not None else {"engine": self.name, "model": ""}

    async def aclose(self) -> None:
        """The inner responder is shared by every call: it is not this call's to close."""


class SkillfulMessagesResponder(SkillfulResponder):
    """The same around a responder that calls tools: it takes the whole conversation and the client's tools too
    (the Realtime API's function calling), with the skills beside them."""

    async def respond_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                               tool_choice: Any = "auto", options: ReplyOptions | None = None,
                               ) -> AsyncIterator[str | ToolCall | ToolCallDelta]:
        opts = options if options is not None else ReplyOptions()
        last = next((m.content for m in reversed(messages) if m.role == "user"), "")
        language = self._language(last, opts)
        async for out in self._with_tools(list(messages), list(tools), tool_choice, opts, language):
            yield out


def with_skills(inner: Responder, skills: Skills | None, call: CallContext, *, intents: str = "auto",
                language: str = "en") -> Responder:
    """``inner`` with ``skills`` for one call, or ``inner`` itself when there are none (or the intent step is off
    and it calls no tools)."""
    tools = isinstance(inner, MessagesResponder)
    if not skills or (not tools and (intents == "off" or (intents == "auto" and inner.name not in SMALL_MODELS))):
        return inner
    cls = SkillfulMessagesResponder if isinstance(inner, MessagesResponder) else SkillfulResponder
    return cls(inner, skills, call, intents=intents, language=language)


__all__ = ["INTENTS", "MAX_TOOL_ROUNDS", "SkillfulMessagesResponder", "SkillfulResponder", "with_skills"]
