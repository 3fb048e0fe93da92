"""The skills a server runs (``respond.skills``): found by the intent step, offered as tools, and run bounded.

:meth:`Skills.route` is the intent step: the first skill whose ``intent`` recognizes the words (in the turn's
language) wins, or none, and the model answers. :meth:`Skills.run` runs one, whoever asked (the intent step or a
model's tool call): at most ``respond.skill_timeout_s``, its answer cut to :data:`MAX_ANSWER_CHARS`; a coroutine
runs on the event loop, a plain function in a worker thread, so neither blocks the calls. Its failure is said, not
raised: "Sorry, I couldn't do that" (a :class:`SkillError` says its own reason). A skill that acts waits for its
turn's end to be sure first, and is undone if its turn never counts (``base.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from assistant.loading import load_named
from assistant.respond.skills.base import Asked, CallContext, Skill, SkillError, acts, pick, tool_schema

log = logging.getLogger(__name__)

# respond.skills names → what makes them (a skill, or a list of skills), imported only when named.
BUILTIN = {
    "clock": "assistant.respond.skills.clock:ClockSkill",
    "calculator": "assistant.respond.skills.calculator:CalculatorSkill",
    "units": "assistant.respond.skills.units:UnitsSkill",
    "timers": "assistant.respond.skills.timers:timer_skills",
}
DEFAULT = ("clock", "calculator", "units", "timers")
MAX_ANSWER_CHARS = 600  # a skill's answer, as said (a voice answer, not a page)
MAX_ARGUMENT_CHARS = 4096  # a model's JSON arguments for one call
_POLITE_END = re.compile(r"(?:[,\s]+(?:please|thanks|thank you|for me))+\s*([?.!]*)$", re.I)


@dataclass(frozen=True)
class Routed:
    """The intent step's finding: which skill, with which arguments."""

    skill: str
    arguments: dict[str, Any]


class Skills:
    """The server's skills, in the order ``respond.skills`` names them."""

    def __init__(self, skills: Iterable[Skill], *, timeout_s: float = 2.0) -> None:
        self.skills: dict[str, Skill] = {}
        for skill in skills:
            name = getattr(skill, "name", None)
            if not isinstance(name, str) or not name.replace("_", "").isalnum() or len(name) > 64:
                raise ValueError(f"skill {skill!r}: its name must be letters, digits and _ (at most 64)")
            if name in self.skills:
                raise ValueError(f"two skills are named {name!r}")
            if not callable(getattr(skill, "run", None)) or not isinstance(getattr(skill, "parameters", None), dict):
                raise ValueError(f"skill {name!r} needs run(asked) and a parameters schema (a dict)")
            self.skills[name] = skill
        self.timeout_s = timeout_s

    def __bool__(self) -> bool:
        return bool(self.skills)

    def __contains__(self, name: object) -> bool:
        return name in self.skills

    def available(self, call: CallContext) -> list[Skill]:
        """The skills this call can run (timers only on a call that has them)."""
        return [s for s in self.skills.values() if call.timers is not None or not getattr(s, "needs_timers", False)]

    def tools(self, call: CallContext) -> list[dict[str, Any]]:
        """The call's skills as function tools (the Realtime API's flat shape)."""
        return [tool_schema(s) for s in self.available(call)]

    def route(self, text: str, language: str, call: CallContext) -> Routed | None:
        """The intent step: the skill ``text`` clearly asks for, with its arguments, or None (the model answers).
        The skills see the words without a polite ending ("…, please?")."""
        lang = (language or "en").split("-")[0].lower()
        if lang == "en":
            text = _POLITE_END.sub(r"\1", text.strip())
        for skill in self.available(call):
            intent = getattr(skill, "intent", None)
            if intent is None:
                continue
            try:
                arguments = intent(text, lang)
            except Exception:  # a plug-in's intent that fails: the model answers
                log.exception("skill_intent_failed skill=%s", skill.name)
                continue
            if arguments is not None:
                return Routed(skill.name, dict(arguments))
        return None

    async def run(self, name: str, arguments: dict[str, Any] | str, language: str, call: CallContext, *,
                  sure: asyncio.Event | None = None, kept: asyncio.Future[str] | None = None) -> str:
        """Run skill ``name``; what to say (its answer, or why it could not). ``sure``: set once the turn's end is
        sure (a skill that acts waits for it); ``kept``: the turn's place in the history, cancelled if it never
        gets one (what the skill did is then undone). None for either: the turn is sure and counts."""
        lang = Asked({}, language, call).lang()
        skill = self.skills.get(name)
        args = _parse_arguments(arguments) if isinstance(arguments, str) else arguments
        if skill is None or args is None:
            log.warning("skill_refused skill=%s reason=%s", name[:64], "unknown" if skill is None else "arguments")
            return _failed(lang)
        if acts(skill) and sure is not None and not sure.is_set():
            t_wait = time.perf_counter()
            await sure.wait()  # a turn that is dropped first is cancelled here: the skill never runs
            log.info("skill_waited skill=%s ms=%.0f", name, (time.perf_counter() - t_wait) * 1000)
        t0 = time.perf_counter()
        outcome = "ok"
        asked = Asked(args, language, call)
        run = _Run()

        def ended() -> None:  # the skill's thread is done, maybe long after its caller was told it took too long
            run.in_thread = False
            if run.given_up and asked.undos:
                _undo(name, asked.undos)

        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await _call(skill, asked, run, ended)
            said = _bounded(str(answer))
        except SkillError as exc:
            outcome, said = "refused", _bounded(str(exc)) or _failed(lang)
        except TimeoutError:
            # The caller hears that it took too long, so what the skill did is undone: now for a coroutine (cut off
            # where it was), when it returns for a plain function (its thread cannot be stopped and goes on).
            run.given_up = True
            if not run.in_thread and asked.undos:
                _undo(name, asked.undos)
            outcome, said = "timeout", pick(lang, {"en": "Sorry, that took too long.", "zh": "抱歉，时间太长了。",
                                                   "ja": "すみません、時間がかかりすぎました。",
                                                   "ko": "죄송합니다. 너무 오래 걸렸습니다."})
        except Exception:
            log.exception("skill_failed skill=%s", name)
            outcome, said = "failed", _failed(lang)
        log.info("skill_ran skill=%s outcome=%s ms=%.1f", name, outcome, (time.perf_counter() - t0) * 1000)
        if outcome != "timeout" and asked.undos and kept is not None:
            kept.add_done_callback(lambda done: _undo(name, asked.undos) if done.cancelled() else None)
        return said


def _undo(name: str, undos: list[Callable[[], None]]) -> None:
    """A skill's turn never counted: what it did, undone (the latest first)."""
    for undo in reversed(undos):
        try:
            undo()
        except Exception:
            log.exception("skill_undo_failed skill=%s", name)
    log.info("skill_undone skill=%s", name)


@dataclass
class _Run:
    """Where one run of a skill stands: on a worker thread still, and whether its caller gave up on it."""

    in_thread: bool = False
    given_up: bool = False


async def _call(skill: Skill, asked: Asked, run: _Run, ended: Callable[[], None]) -> Any:
    if inspect.iscoroutinefunction(skill.run):
        return await skill.run(asked)
    # A plain function may block (a plug-in's I/O): a worker thread, cut off by the caller's timeout (it finishes
    # there, unheard, and ``ended`` is called on the loop when it does).
    loop = asyncio.get_running_loop()

    def work() -> Any:
        try:
            return skill.run(asked)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is left to undo for
                loop.call_soon_threadsafe(ended)

    run.in_thread = True
    result = await asyncio.to_thread(work)
    return await result if inspect.isawaitable(result) else result


def _parse_arguments(text: str) -> dict[str, Any] | None:
    if len(text) > MAX_ARGUMENT_CHARS:
        return None
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _bounded(text: str) -> str:
    """At most :data:`MAX_ANSWER_CHARS`, cut at a sentence's end where there is one."""
    text = " ".join(text.split())
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    cut = text[:MAX_ANSWER_CHARS]
    end = max(cut.rfind(". "), cut.rfind("。"), cut.rfind("! "), cut.rfind("? "))
    return cut[: end + 1] if end > 0 else cut


def _failed(lang: str) -> str:
    return pick(lang, {"en": "Sorry, I couldn't do that.", "zh": "抱歉，我做不到。",
                       "ja": "すみません、できませんでした。", "ko": "죄송합니다. 할 수 없었습니다."})


def load_skills(names: Sequence[str], *, timeout_s: float = 2.0) -> Skills:
    """The skills ``names`` lists: built-in names (:data:`BUILTIN`) or ``package.module:Class`` plug-ins (a class or
    a function, called with no arguments, that makes a skill or a list of them). ``ValueError`` with the reason."""
    made: list[Skill] = []
    for spec in names:
        factory = load_named(spec, BUILTIN, kind="skill")
        try:
            out = factory()
        except TypeError as exc:
            raise ValueError(f"skill {spec!r}: cannot make it with no arguments: {exc}") from exc
        made.extend(out if isinstance(out, list | tuple) else [out])
    skills = Skills(made, timeout_s=timeout_s)
    log.info("skills_loaded names=%s", ",".join(skills.skills) or "-")
    return skills


__all__ = ["BUILTIN", "DEFAULT", "MAX_ANSWER_CHARS", "Routed", "Skills", "load_skills"]
