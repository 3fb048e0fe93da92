"""A tiny offline responder: a table of regex → reply templates (greetings, time, date) and a fallback.

Templates may use ``{time}``, ``{date}``, ``{weekday}``, ``{text}`` (what the user said) and ``{1}``, ``{2}``,
... or ``{name}`` for the pattern's groups. Only these plain names are substituted, so a template can never
reach into Python objects the way ``str.format`` could.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from assistant.config import RespondConfig
from assistant.respond.base import Message
from assistant.respond.echo import words_as_deltas

log = logging.getLogger(__name__)

DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    (r"\b(what(?:'s| is) the time|what time is it|tell me the time|current time)\b", "It is {time}."),
    (r"\b(what(?:'s| is) the date|what day is (?:it|today)|today's date|what is today)\b",
     "Today is {weekday}, {date}."),
    (r"^\s*(hi|hello|hey|good (?:morning|afternoon|evening))\b", "Hello! How can I help you?"),
    (r"\bhow are you\b", "I am doing well, thank you for asking."),
    (r"\b(what(?:'s| is) your name|who are you)\b", "I am a voice assistant running on this computer."),
    (r"\b(thanks|thank you)\b", "You are welcome."),
    (r"\b(bye|goodbye|see you)\b", "Goodbye! Talk to you soon."),
)
DEFAULT_FALLBACK = "I heard you say: {text}. I can tell you the time or the date."
EMPTY_REPLY = "I did not catch that."

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render(template: str, values: dict[str, str]) -> str:
    """Substitute ``{name}`` placeholders from ``values``; unknown names stay as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class RulesResponder:
    """First matching rule wins (case-insensitive); no match → the fallback template.

    Options (``[respond.options]``): ``rules`` — a list of ``[pattern, template]`` pairs tried before the
    built-in ones; ``builtin_rules`` (default true); ``fallback``; ``timezone`` (IANA name, default local).
    """

    name = "rules"

    def __init__(self, cfg: RespondConfig | None = None, *, now: Callable[[], dt.datetime] | None = None,
                 **options: Any) -> None:
        opts: dict[str, Any] = {**(cfg.options if cfg else {}), **options}
        table: list[tuple[str, str]] = []
        for item in opts.get("rules", []):
            pair_ok = isinstance(item, list | tuple) and len(item) == 2
            if not (pair_ok and all(isinstance(s, str) for s in item)):
                raise ValueError(f"rules responder: each rule must be [pattern, template], got {item!r}")
            table.append((item[0], item[1]))
        if opts.get("builtin_rules", True):
            table.extend(DEFAULT_RULES)
        try:
            self.rules = [(re.compile(p, re.IGNORECASE), t) for p, t in table]
        except re.error as exc:
            raise ValueError(f"rules responder: bad pattern: {exc}") from exc
        self.fallback: str = str(opts.get("fallback", DEFAULT_FALLBACK))
        tz_name = opts.get("timezone")
        self._tz = ZoneInfo(tz_name) if tz_name else None
        self._now = now or (lambda: dt.datetime.now(self._tz).astimezone(self._tz))

    def reply_for(self, text: str) -> str:
        """The whole reply for one user turn (the streaming wrapper splits it into words)."""
        said = " ".join(text.split()).strip()
        if not said:
            return EMPTY_REPLY
        now = self._now()
        values = {
            "text": said.rstrip(".!?"),
            "time": now.strftime("%I:%M %p").lstrip("0"),
            "date": f"{now.strftime('%B')} {now.day}, {now.year}",
            "weekday": now.strftime("%A"),
        }
        for pattern, template in self.rules:
            m = pattern.search(said)
            if m:
                groups = {str(i): g or "" for i, g in enumerate(m.groups(), start=1)}
                groups.update({k: v or "" for k, v in m.groupdict().items()})
                log.debug("rules.match pattern=%s", pattern.pattern)
                return render(template, {**values, **groups})
        return render(self.fallback, values)

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        for delta in words_as_deltas(self.reply_for(text)):
            yield delta

    async def aclose(self) -> None:
        """Nothing to release."""
