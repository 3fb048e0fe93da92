"""What a skill is: a tool with a name, a description and a JSON schema for its arguments, that answers exactly
what a small model gets wrong (the time, a sum, a conversion, a timer).

A model that calls tools calls it by name with JSON arguments; for a model that cannot, the intent step
(``intent.py``) finds it in the user's words with the skill's own :meth:`Skill.intent`. Either way the skill
runs once, bounded in time and in the size of its answer (``runner.py``), and its answer is what the assistant
says, in the turn's language.

A call's skills share its :class:`CallContext`: the user's time zone (the page sends it) and the call's timers
(``timers.py``), so nothing one call sets reaches another.

A skill that **acts** (sets or cancels a timer, or a plug-in's that sends or books something: every skill that does
not say ``acts = False``) runs only once its turn's end is sure: a speculative turn starts at a pause the speaker
may go on from, and an act done there would be done twice (the words are heard again, whole, in the next turn).
And where its turn still never counts (dropped just after its reply began, or failed), what the skill registered
with :meth:`Asked.on_undo` undoes it. So does a run cut off by ``respond.skill_timeout_s``, whose caller is told it
took too long: at once for a coroutine, and for a plain function when its worker thread returns (a thread cannot be
stopped: a plug-in's blocking call that finishes late acts, then is undone). A skill that only answers (the time, a
sum) runs at once, speculation or not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from zoneinfo import ZoneInfo

LANGUAGES = ("en", "zh", "ja", "ko")  # the languages the skills answer in (the ASR's defaults); others: English


class SkillError(Exception):
    """A skill could not do what was asked; ``str()`` is what the assistant says (in the turn's language)."""


class Timers(Protocol):
    """A call's timers as the skills use them (``timers.CallTimers``)."""

    max_seconds: float

    @property
    def timers(self) -> list[Any]: ...

    def add(self, kind: str, seconds: float, *, label: str = "", language: str = "en", at: str = "") -> Any: ...

    def cancel(self, which: str = "") -> list[Any]: ...

    def withdraw(self, timer: Any) -> None: ...

    def restore(self, timers: list[Any]) -> None: ...


@dataclass
class CallContext:
    """One call's side of the skills: its time zone, its timers (None: this kind of call has none), a clock."""

    timezone: ZoneInfo | None = None  # None: the server's own
    timers: Timers | None = None
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))

    def now(self) -> dt.datetime:
        """Now, in the user's time zone."""
        return self.clock().astimezone(self.timezone)


@dataclass(frozen=True)
class Asked:
    """One run of a skill: its arguments, the language to answer in, and the call it runs in."""

    arguments: dict[str, Any]
    language: str
    call: CallContext
    undos: list[Callable[[], None]] = field(default_factory=list, compare=False, repr=False)

    def on_undo(self, undo: Callable[[], None]) -> None:
        """``undo`` reverses what this run did, should its turn never count (see the module's docstring)."""
        self.undos.append(undo)

    def lang(self) -> str:
        """The answer's language among :data:`LANGUAGES` (English for any other)."""
        code = (self.language or "en").split("-")[0].lower()
        return code if code in LANGUAGES else "en"


@runtime_checkable
class Skill(Protocol):
    """A tool the assistant runs itself. ``name`` is the tool's name (letters, digits, ``_``), ``description``
    says when to use it, ``parameters`` is the JSON schema of its arguments (OpenAI's function shape).

    ``run`` answers; as a coroutine it runs on the event loop (it must not block), as a plain function in a worker
    thread. Both are cut off after ``respond.skill_timeout_s``. Raise :class:`SkillError` to say why not.

    Optional: ``intent(text, language) -> dict | None``: the arguments when ``text`` is clearly a request for this
    skill (the intent step in front of a model that cannot call tools; keep it to fast regular expressions),
    ``needs_timers = True`` for a skill that only works on a call that has timers, and ``acts = False`` for one
    that changes nothing (it then runs at once, even on a turn not yet sure; see the module's docstring).
    """

    name: str
    description: str
    parameters: dict[str, Any]

    def run(self, asked: Asked) -> Any: ...


def acts(skill: Skill) -> bool:
    """Whether ``skill`` changes something (waits for its turn to be sure); True unless it says otherwise."""
    return bool(getattr(skill, "acts", True))


def tool_schema(skill: Skill) -> dict[str, Any]:
    """The skill as a function tool, in the Realtime API's flat shape (the ``openai`` responder's input)."""
    return {"type": "function", "name": skill.name, "description": skill.description,
            "parameters": skill.parameters}


def pick(language: str, texts: dict[str, str]) -> str:
    """The text for ``language`` (English when there is none)."""
    return texts[language] if language in texts else texts["en"]


__all__ = ["LANGUAGES", "Asked", "CallContext", "Skill", "SkillError", "Timers", "acts", "pick", "tool_schema"]
