"""The time and the date, in the user's time zone (the page sends it; else the server's), or in a city's ("what
time is it in Tokyo": a city that names an IANA zone)."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from assistant.config.respond import known_timezones
from assistant.respond.rules import TABLES
from assistant.respond.skills.base import Asked, SkillError, pick

WHAT = ("time", "date")

_EN_TIME = re.compile(r"\b(?:what(?:'s| is) the (?:current |exact )?time|what time (?:is it|it is)|"
                      r"(?:tell|give) me the (?:current |exact )?time|(?:do you )?(?:know|have|got) the time)"
                      r"(?: (?:now|right now))?(?: in (?P<place>[a-z][a-z .'-]{1,40}))?\s*[?.!]*$", re.I)
_EN_DATE = re.compile(r"\b(?:what(?:'s| is) (?:the date|today's date|the date today|today)|what day is (?:it|today)"
                      r"(?: today)?|what date is (?:it|today)|which day is (?:it|today)|"
                      r"(?:tell|give) me (?:the|today's) date|today's date)\s*[?.!]*$", re.I)
_OTHER = {
    "zh": (re.compile(r"(?:现在|目前)(?:是)?(?:几点|什么时间|什么时候)|几点了|现在时间"),
           re.compile(r"今天(?:是)?(?:几号|几月几号|星期几|礼拜几|什么日子|哪天)|今天的日期")),
    "ja": (re.compile(r"(?:今|いま)[、は]?(?:何時|なんじ)|何時ですか[？?]?$|現在の時刻"),
           re.compile(r"今日は?(?:何日|何曜日|なんにち|なんようび)|今日の日付")),
    "ko": (re.compile(r"지금\s*몇\s*시|몇\s*시(?:예요|에요|야|인가요)"),
           re.compile(r"오늘\s*(?:며칠|무슨\s*요일|날짜)")),
}


@functools.cache
def _cities() -> dict[str, str]:
    """City (lower case, spaces) → its IANA zone, from the zone names this machine knows."""
    out: dict[str, str] = {}
    for key in known_timezones():
        if "/" in key and not key.startswith(("Etc/", "SystemV/")):
            out.setdefault(key.rsplit("/", 1)[1].replace("_", " ").lower(), key)
    return out


def zone_for(place: str) -> ZoneInfo | None:
    """The zone a place names: an IANA key ("Asia/Tokyo") or a city in one ("Tokyo", "new york"); None if none."""
    p = " ".join(place.strip().strip("?.!").split())
    if not p:
        return None
    if p in known_timezones():
        return ZoneInfo(p)
    key = _cities().get(p.lower().removeprefix("the "))
    return ZoneInfo(key) if key else None


class ClockSkill:
    """``get_time``: the time or the date now, where the user is or in a city."""

    name = "get_time"
    acts = False  # it only answers
    description = ("The current time or today's date, where the user is (or in a city). Use it for any question "
                   "about the time, the date or the day of the week.")
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "what": {"type": "string", "enum": list(WHAT), "description": "time, or date (with the weekday)"},
            "place": {"type": "string", "description": "a city or IANA time zone; empty: where the user is"},
        },
        "required": ["what"],
    }

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        if language == "en":
            if m := _EN_TIME.search(text):
                return {"what": "time", **({"place": m["place"]} if m["place"] else {})}
            if _EN_DATE.search(text):
                return {"what": "date"}
            return None
        patterns = _OTHER.get(language)
        if patterns is None:
            return None
        if patterns[0].search(text):
            return {"what": "time"}
        if patterns[1].search(text):
            return {"what": "date"}
        return None

    async def run(self, asked: Asked) -> str:
        what = asked.arguments.get("what", "time")
        if what not in WHAT:
            raise SkillError(f"what must be one of {', '.join(WHAT)}")
        lang = asked.lang()
        place = str(asked.arguments.get("place") or "").strip()
        now = asked.call.now()
        where = ""
        if place:
            zone = zone_for(place)
            if zone is None:
                raise SkillError(pick(lang, {"en": f"I don't know the time zone of {place[:40]}.",
                                             "zh": "我不知道那个地方的时区。",
                                             "ja": "その場所のタイムゾーンがわかりません。",
                                             "ko": "그곳의 시간대를 모릅니다."}))
            now = now.astimezone(zone)
            where = place.strip().title()
        table = TABLES[lang]
        if what == "time":
            said = table.time(now)
            if lang == "en":
                return f"In {where}, it's {said}." if where else f"It's {said}."
            return pick(lang, {"zh": f"现在是{said}。", "ja": f"今は{said}です。", "ko": f"지금은 {said}입니다."})
        weekday = table.weekdays[now.weekday()] if table.weekdays else now.strftime("%A")
        date = table.date(now)
        if lang == "en":
            return f"In {where}, it's {weekday}, {date}." if where else f"Today is {weekday}, {date}."
        return pick(lang, {"zh": f"今天是{date}，{weekday}。", "ja": f"今日は{date}、{weekday}です。",
                           "ko": f"오늘은 {date} {weekday}입니다."})


__all__ = ["ClockSkill", "zone_for"]
