"""Skills: what people ask a voice assistant most, answered exactly, whatever model answers the rest.

    base.py        what a skill is (a tool: name, description, JSON schema, run), a call's context, SkillError
    clock.py       get_time: the time and the date, in the user's time zone or a city's
    calculator.py  calculate: arithmetic said in words ("two plus three", "三加五等于几")
    units.py       convert_units: length, mass, volume, time, speed, temperature
    timers.py      set_timer, cancel_timer, list_timers: a call's timers, reminders and alarms, said when due
    numbers.py     numbers as people say them (English words, Chinese and Japanese numerals)
    registry.py    the server's skills (respond.skills): the intent step, their tools, a bounded run
    responder.py   a call's responder with the skills in front of it (intent step) or beside it (tools)

A skill of your own is a class with ``name``, ``description``, ``parameters`` (a JSON schema) and ``run(asked)``
(and, for the intent step, ``intent(text, language)``), named in ``respond.skills`` as ``package.module:Class``,
the way a responder plug-in is named in ``respond.engine``. docs/skills.md has an example.
"""

from __future__ import annotations

from assistant.respond.skills.base import Asked, CallContext, Skill, SkillError, tool_schema
from assistant.respond.skills.registry import BUILTIN, DEFAULT, Routed, Skills, load_skills
from assistant.respond.skills.responder import with_skills

__all__ = ["BUILTIN", "DEFAULT", "Asked", "CallContext", "Routed", "Skill", "SkillError", "Skills", "load_skills",
           "tool_schema", "with_skills"]
