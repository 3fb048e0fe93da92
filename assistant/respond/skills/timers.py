"""Timers, reminders and alarms within a call: "set a timer for ten minutes", "remind me to call my sister at
five", "set an alarm for seven a.m.", "how long is left on my timer?", "cancel the timer"; in Chinese, Japanese
and Korean too ("设一个十分钟的计时器", "5分のタイマー", "10분 타이머").

A call's timers are its own (:class:`CallTimers`): at most ``respond.max_timers`` at once, each at most
``respond.max_timer_s`` long. When one ends, the call is told (``on_due``): the assistant says so on that call,
through the same speech path as a reply. A call that ends cancels its timers (:meth:`CallTimers.close`); nothing
of them reaches another call. A time of day beyond that bound ("tomorrow morning", an alarm fifteen hours away)
is refused plainly: the timers live as long as the call.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from assistant.respond.skills.base import Asked, CallContext, SkillError, pick
from assistant.respond.skills.numbers import CJK_NUMBER, EN_NUMBER, parse_cjk, parse_english

log = logging.getLogger(__name__)

KINDS = ("timer", "reminder", "alarm")
MAX_LABEL_CHARS = 120  # what a reminder is about, as said back


@dataclass
class Timer:
    """One timer of a call: what it is, how long, when it ends (wall s), in which language it was set."""

    id: int
    kind: str
    seconds: float
    due: float
    label: str = ""  # a reminder's "call your sister", a timer's "eggs"
    language: str = "en"
    at: str = ""  # an alarm's time of day as set ("7:00 AM")
    handle: asyncio.TimerHandle | None = field(default=None, repr=False)

    def left(self, now: float | None = None) -> float:
        return max(0.0, self.due - (time.time() if now is None else now))

    def as_event(self) -> dict[str, Any]:
        """What the page shows of it."""
        return {"id": self.id, "kind": self.kind, "label": self.label or self.at or say_duration(self.seconds, "en"),
                "seconds": round(self.seconds, 1), "due_ms": round(self.due * 1000)}


class CallTimers:
    """One call's timers (see the module's docstring). ``on_due(timer, text)``: a timer ended, ``text`` is what
    to say; ``on_change(action, timer, timers)``: set, cancelled or done, with the timers left (the page)."""

    def __init__(self, *, max_timers: int, max_seconds: float,
                 on_due: Callable[[Timer, str], None],
                 on_change: Callable[[str, Timer, list[Timer]], None] | None = None) -> None:
        if max_timers < 0 or max_seconds <= 0:
            raise ValueError("max_timers >= 0 and max_seconds > 0 are required")
        self.max_timers = max_timers
        self.max_seconds = max_seconds
        self.on_due = on_due
        self.on_change = on_change
        self._timers: dict[int, Timer] = {}
        self._ids = itertools.count(1)
        self.closed = False

    @property
    def timers(self) -> list[Timer]:
        """The running timers, the soonest first."""
        return sorted(self._timers.values(), key=lambda t: t.due)

    def add(self, kind: str, seconds: float, *, label: str = "", language: str = "en", at: str = "") -> Timer:
        """Start a timer; :class:`SkillError` (said to the user) when the call has its fill or it is too long."""
        lang = language if language in ("en", "zh", "ja", "ko") else "en"
        if self.closed:
            raise SkillError(pick(lang, {"en": "This call is ending.", "zh": "通话正在结束。",
                                         "ja": "通話が終わるところです。", "ko": "통화가 끝나고 있습니다."}))
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        if len(self._timers) >= self.max_timers:
            raise SkillError(pick(lang, {
                "en": f"Sorry, I can't keep more than {self.max_timers} timers on one call.",
                "zh": f"抱歉，一次通话最多只能设{self.max_timers}个计时器。",
                "ja": f"すみません、一つの通話で設定できるタイマーは{self.max_timers}個までです。",
                "ko": f"죄송합니다. 한 통화에 타이머는 {self.max_timers}개까지만 설정할 수 있습니다."}))
        if seconds > self.max_seconds:
            raise SkillError(too_far(lang, self.max_seconds))
        if seconds < 1:
            raise SkillError(pick(lang, {"en": "A timer needs at least one second.", "zh": "计时器至少要一秒。",
                                         "ja": "タイマーは1秒以上にしてください。",
                                         "ko": "타이머는 최소 1초여야 합니다."}))
        timer = Timer(next(self._ids), kind, float(seconds), time.time() + seconds, label[:MAX_LABEL_CHARS], lang, at)
        timer.handle = asyncio.get_running_loop().call_later(seconds, self._ring, timer.id)
        self._timers[timer.id] = timer
        log.info("timer_set id=%d kind=%s seconds=%.0f timers=%d", timer.id, kind, seconds, len(self._timers))
        self._changed("set", timer)
        return timer

    def cancel(self, which: str = "") -> list[Timer]:
        """Cancel the timers ``which`` names: "" or "all" every one, else those whose kind or label says it
        (the newest if none does); the ones cancelled."""
        w = which.strip().lower()
        timers = self.timers
        if w not in ("", "all"):
            named = [t for t in timers if w in (t.kind, str(t.id)) or (t.label and w in t.label.lower())]
            timers = named or timers[-1:]
        for timer in timers:
            self._drop(timer)
            self._changed("cancelled", timer)
        return timers

    def withdraw(self, timer: Timer) -> None:
        """Take back ``timer``, set by a turn that never counted (skills/base.py): it will not ring."""
        if self._timers.get(timer.id) is not timer:
            return
        self._drop(timer)
        log.info("timer_withdrawn id=%d kind=%s timers=%d", timer.id, timer.kind, len(self._timers))
        self._changed("cancelled", timer)

    def restore(self, timers: list[Timer]) -> None:
        """Run ``timers`` again, cancelled by a turn that never counted, to their old end (one whose end has
        passed meanwhile rings now)."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        for timer in timers:
            if timer.id in self._timers:
                continue
            timer.handle = loop.call_later(max(0.0, timer.left()), self._ring, timer.id)
            self._timers[timer.id] = timer
            log.info("timer_restored id=%d kind=%s timers=%d", timer.id, timer.kind, len(self._timers))
            self._changed("set", timer)

    def close(self) -> None:
        """The call ended: every timer is cancelled, none will ring (no event: the call is gone)."""
        self.closed = True
        for timer in list(self._timers.values()):
            self._drop(timer)
        log.debug("timers_closed")

    def _drop(self, timer: Timer) -> None:
        if timer.handle is not None:
            timer.handle.cancel()
        self._timers.pop(timer.id, None)

    def _ring(self, timer_id: int) -> None:
        timer = self._timers.pop(timer_id, None)
        if timer is None or self.closed:
            return
        log.info("timer_done id=%d kind=%s seconds=%.0f", timer.id, timer.kind, timer.seconds)
        self._changed("done", timer)
        try:
            self.on_due(timer, announcement(timer))
        except Exception:  # the call's speech failed to take it: the page still showed it done
            log.exception("timer_announce_failed id=%d", timer.id)

    def _changed(self, action: str, timer: Timer) -> None:
        if self.on_change is not None:
            try:
                self.on_change(action, timer, self.timers)
            except Exception:
                log.exception("timer_listener_failed action=%s", action)


# --- saying durations and times ---------------------------------------------------------------------------------
def say_duration(seconds: float, lang: str) -> str:
    """``seconds`` as people say it: "10 minutes", "1 hour and 30 minutes", "10分钟", "1時間30分", "1시간 30분"."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if lang == "en":
        parts = [f"{n} {word}{'' if n == 1 else 's'}" for n, word in ((h, "hour"), (m, "minute"), (sec, "second"))
                 if n]
        if not parts:
            return "0 seconds"
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    units = {"zh": ("小时", "分钟", "秒"), "ja": ("時間", "分", "秒"), "ko": ("시간", "분", "초")}[lang]
    parts = [f"{n}{u}" for n, u in zip((h, m, sec), units, strict=True) if n]
    return (" " if lang == "ko" else "").join(parts) or f"0{units[2]}"


def as_adjective(length: str) -> str:
    """An English length before a noun: "10 minutes" → "10 minute" (a 10 minute timer)."""
    return length.replace("hours", "hour").replace("minutes", "minute").replace("seconds", "second")


def say_clock(when: dt.datetime, lang: str) -> str:
    from assistant.respond.rules import TABLES

    return TABLES[lang].time(when)


def too_far(lang: str, max_seconds: float) -> str:
    limit = say_duration(max_seconds, lang)
    return pick(lang, {
        "en": f"Sorry, I can't set it that far ahead: my timers and reminders only last while this call does, up "
              f"to {limit}.",
        "zh": f"抱歉，我不能设那么久：计时器和提醒只在这次通话中有效，最长{limit}。",
        "ja": f"すみません、そんなに先には設定できません。タイマーとリマインダーはこの通話の間だけ、最長{limit}です。",
        "ko": f"죄송합니다. 그렇게 멀리는 설정할 수 없습니다. 타이머와 알림은 이 통화 동안만, "
              f"최대 {limit}까지 유지됩니다."})


def announcement(timer: Timer) -> str:
    """What the assistant says when ``timer`` ends, in the language it was set in."""
    lang, label = timer.language, timer.label
    if timer.kind == "reminder":
        return pick(lang, {"en": f"Here's your reminder: {label}.", "zh": f"提醒你：{label}。",
                           "ja": f"リマインダーです：{label}。", "ko": f"알림입니다: {label}."})
    if timer.kind == "alarm":
        return pick(lang, {"en": f"It's {timer.at}. This is your alarm.", "zh": f"现在是{timer.at}，闹钟时间到了。",
                           "ja": f"{timer.at}です。アラームの時間です。", "ko": f"{timer.at}입니다. 알람 시간입니다."})
    length = say_duration(timer.seconds, lang)
    if lang == "en":
        about = f" for {label}" if label else ""
        return f"Your {as_adjective(length)} timer{about} is done."
    return pick(lang, {"zh": f"{length}的计时器时间到了。", "ja": f"{length}のタイマーが終わりました。",
                       "ko": f"{length} 타이머가 끝났습니다."})


def yours(text: str) -> str:
    """A request's words said back to the one who asked ("call my sister" → "call your sister")."""
    swaps = {"my": "your", "me": "you", "myself": "yourself", "i": "you", "i'm": "you're", "mine": "yours",
             "i've": "you've", "i'll": "you'll", "am": "are"}
    return re.sub(r"[\w']+", lambda m: _keep_case(m[0], swaps.get(m[0].lower(), m[0])), text)


def _keep_case(word: str, new: str) -> str:
    return new if word == new or not word[:1].isupper() or word.lower() == "i" else new[:1].upper() + new[1:]


# --- hearing durations and times --------------------------------------------------------------------------------
_EN_UNIT_S = {"second": 1, "sec": 1, "minute": 60, "min": 60, "hour": 3600, "hr": 3600}
_EN_DURATION = (rf"(?:(?:an? )?(?:half an hour|hour and a half|minute and a half)|(?:{EN_NUMBER}|\d+(?:\.\d+)?)\s*"
                rf"(?:seconds?|secs?|minutes?|mins?|hours?|hrs?)(?:\s*(?:and\s+)?(?:a half|(?:{EN_NUMBER}|\d+)\s*"
                rf"(?:seconds?|secs?|minutes?|mins?)))?)")


def english_duration(text: str) -> float | None:
    """Seconds in an English duration ("ten minutes", "an hour and a half", "1 hour 30 minutes"), or None."""
    t = " ".join(text.lower().replace("-", " ").split())
    fixed = {"half an hour": 1800, "a half hour": 1800, "an hour and a half": 5400, "hour and a half": 5400,
             "a minute and a half": 90, "minute and a half": 90}
    if t in fixed:
        return float(fixed[t])
    total, found = 0.0, False
    for m in re.finditer(rf"({EN_NUMBER}|\d+(?:\.\d+)?)\s*(seconds?|secs?|minutes?|mins?|hours?|hrs?)(\s+and a half)?",
                         t):
        said = m.group(1).strip()
        n = 1.0 if said in ("a", "an") else parse_english(said)
        if n is None:
            return None
        unit = _EN_UNIT_S[re.sub(r"s$", "", m.group(2))]
        total += (n + (0.5 if m.group(3) else 0)) * unit
        found = True
    return total if found else None


_CJK_UNIT_S = {"秒": 1, "秒钟": 1, "分钟": 60, "分": 60, "小时": 3600, "个小时": 3600, "钟头": 3600, "時間": 3600,
               "초": 1, "분": 60, "시간": 3600}
_KO_NATIVE = {"한": 1, "두": 2, "세": 3, "네": 4, "다섯": 5, "여섯": 6, "일곱": 7, "여덟": 8, "아홉": 9, "열": 10}
_KO_COUNT = "한|두|세|네|다섯|여섯|일곱|여덟|아홉|열"
_CJK_TIME_UNIT = "秒钟|秒|分钟|分|个小时|小时|钟头|時間|초|분|시간"
_CJK_DURATION = (rf"(?:{CJK_NUMBER}|{_KO_COUNT})\s*(?:个)?\s*(?:{_CJK_TIME_UNIT})"
                 rf"(?:半)?(?:\s*(?:{CJK_NUMBER})\s*(?:秒钟|秒|分钟|分|초|분))?|半个?小时|半時間")


def cjk_duration(text: str) -> float | None:
    """Seconds in a Chinese, Japanese or Korean duration ("十分钟", "1時間半", "두 시간 30분"), or None."""
    t = text.strip()
    if t in ("半小时", "半个小时", "半時間"):
        return 1800.0
    total, found = 0.0, False
    for m in re.finditer(rf"({CJK_NUMBER}|{_KO_COUNT})\s*(?:个)?\s*({_CJK_TIME_UNIT})(半)?", t):
        n = float(_KO_NATIVE[m.group(1)]) if m.group(1) in _KO_NATIVE else parse_cjk(m.group(1))
        if n is None:
            return None
        unit = _CJK_UNIT_S[m.group(2)]
        total += (n + (0.5 if m.group(3) else 0)) * unit
        found = True
    return total if found else None


_EN_HOUR = rf"(?!half\b|an?\b|quarter\b)(?:{EN_NUMBER}|\d{{1,2}})"
_EN_MINUTE = rf"(?::(?P<m>\d{{2}})| (?P<mw>(?!an?\b|half\b|quarter\b){EN_NUMBER}))?"
_EN_HALF = r"(?P<ampm>a\.? ?m\.?|p\.? ?m\.?|o'?clock|in the morning|in the afternoon|in the evening|at night|tonight)?"
_EN_CLOCK = re.compile(rf"\bat half past (?P<hh>{_EN_HOUR})\b|\bat (?P<noon>noon|midday|midnight)\b|"
                       rf"\bat (?P<h>{_EN_HOUR}){_EN_MINUTE}\s*{_EN_HALF}(?=\W|$)", re.I)
_EN_ALARM_CLOCK = re.compile(rf"\b(?:for|at) (?P<h>{_EN_HOUR}){_EN_MINUTE}\s*{_EN_HALF}(?=\W|$)", re.I)


def clock_time(m: re.Match[str]) -> tuple[int, int, str | None] | None:
    """(hour, minute, "am"/"pm"/None) from an English time of day match, or None."""
    groups = m.groupdict()
    if groups.get("noon"):
        return (0, 0, "am") if groups["noon"].lower() == "midnight" else (12, 0, "pm")
    if groups.get("hh"):
        h = parse_english(groups["hh"].strip())
        return (int(h), 30, None) if h is not None and h == int(h) and 1 <= h <= 12 else None
    h = parse_english(groups["h"].strip())
    minute = int(groups["m"]) if groups.get("m") else (parse_english(groups["mw"].strip()) if groups.get("mw") else 0)
    if h is None or minute is None or h != int(h) or not 0 <= h <= 23 or not 0 <= minute <= 59:
        return None
    ampm = (groups.get("ampm") or "").lower().replace(".", "").replace(" ", "")
    half = "am" if ampm in ("am", "inthemorning") else "pm" if ampm in (
        "pm", "intheafternoon", "intheevening", "atnight", "tonight") else None
    return int(h), int(minute), half


def next_time(now: dt.datetime, hour: int, minute: int, half: str | None) -> dt.datetime:
    """The next moment after ``now`` that is ``hour:minute`` (a 12-hour hour with no am/pm: the sooner of both)."""
    candidates = []
    if half is None and hour <= 12:
        hours = [hour % 12, hour % 12 + 12]
    elif half == "am" and hour <= 12:
        hours = [hour % 12]
    elif half == "pm" and hour <= 12:
        hours = [hour % 12 + 12]
    else:
        hours = [hour]
    for h in hours:
        at = now.replace(hour=h, minute=minute, second=0, microsecond=0)
        candidates.append(at if at > now else at + dt.timedelta(days=1))
    return min(candidates)


# --- the skills -------------------------------------------------------------------------------------------------
_EN_TIMER = re.compile(rf"\b(?:(?P<d1>{_EN_DURATION})\s*timer\b|timer (?:for |of |on )?(?P<d2>{_EN_DURATION})|"
                       rf"(?:count ?down|countdown) (?:from |for )?(?P<d3>{_EN_DURATION}))", re.I)
_EN_TIMER_BARE = re.compile(r"^(?:(?:please|can you|could you|would you)\s+)*(?:set|start|make|create|put on)\s+"
                            r"(?:a|an|the|me a)?\s*timer\b(?:\s+for\s+(?P<label>[\w' ]{1,60}?))?\s*(?:please)?[.!?]*$",
                            re.I)
_EN_REMIND = re.compile(r"\bremind me\b(?P<rest>.*)$|\b(?:set|make|create) (?:a |me a )?reminder\b(?P<rest2>.*)$",
                        re.I)
_EN_ALARM = re.compile(r"\b(?:set (?:an |my |the )?alarm|alarm|wake me(?: up)?)\b(?P<rest>.*)$", re.I)
_EN_BEYOND = re.compile(r"\b(?:tomorrow|next (?:week|month|year|monday|tuesday|wednesday|thursday|friday|saturday|"
                        r"sunday)|on (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|in (?:a|one|two|"
                        r"\d+) (?:days?|weeks?|months?|years?)|every (?:day|morning|week))\b", re.I)
_EN_CANCEL = re.compile(r"\b(?:cancel|stop|delete|remove|clear|turn off|never ?mind|forget)\b.*\b(?P<what>timers?|"
                        r"reminders?|alarms?)\b", re.I)
_EN_LIST = re.compile(r"\b(?:how (?:much time|long) (?:is |'s )?(?:left|remaining)|time left|what timers|"
                      r"which timers|any timers|my timers|check (?:the |my )?timer|how(?:'s| is) (?:the|my) timer|"
                      r"what reminders)\b", re.I)

_OTHER_TIMER = {"zh": re.compile(r"计时|定时|倒计时"), "ja": re.compile(r"タイマー"), "ko": re.compile(r"타이머")}
_OTHER_REMIND = {
    "zh": re.compile(rf"(?P<d>{_CJK_DURATION})(?:之?后|以后)提醒我(?P<label>.*)$|"
                     rf"提醒我(?P<label2>.*?)(?P<d2>{_CJK_DURATION})(?:之?后|以后)"),
    "ja": re.compile(rf"(?P<d>{_CJK_DURATION})後に(?P<label>.+?)(?:を|って|と|ことを)?"
                     r"(?:教えて|知らせて|リマインドして|思い出させて)"),
    "ko": re.compile(rf"(?P<d>{_CJK_DURATION})\s*(?:후에|뒤에)\s*(?P<label>.+?)\s*(?:라고|하라고|을|를)?\s*"
                     r"(?:알려|리마인드|말해)"),
}
_OTHER_CANCEL = {"zh": re.compile(r"(?:取消|停止|关掉|关闭|删除).*(?:计时|定时|提醒|闹钟)"),
                 "ja": re.compile(r"(?:タイマー|リマインダー|アラーム).*(?:キャンセル|止めて|消して|とめて)"),
                 "ko": re.compile(r"(?:타이머|알림|알람).*(?:취소|꺼|멈춰|삭제)")}
_OTHER_LIST = {"zh": re.compile(r"(?:计时|定时).*(?:还剩|还有多久|剩下)"), "ja": re.compile(r"タイマー.*(?:あと|残り)"),
               "ko": re.compile(r"타이머.*(?:남았|남은)")}

_TIMER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": list(KINDS), "description": "timer (a length of time), reminder (says "
                 "the label when due) or alarm (at a time of day)"},
        "seconds": {"type": "number", "description": "how long from now (timer, reminder)"},
        "at": {"type": "string", "description": "a time of day HH:MM, 24-hour, in the user's time zone (alarm, "
               "reminder)"},
        "label": {"type": "string", "description": "what to remind the user of, in their words as said back to "
                  "them ('call your sister'), or what the timer is for"},
    },
    "required": ["kind"],
}


def _timers(asked: Asked) -> CallContext:
    if asked.call.timers is None:
        raise SkillError(pick(asked.lang(), {"en": "Sorry, I can't set timers on this kind of call.",
                                             "zh": "抱歉，这种通话不能设置计时器。",
                                             "ja": "すみません、この通話ではタイマーを使えません。",
                                             "ko": "죄송합니다. 이 통화에서는 타이머를 쓸 수 없습니다."}))
    return asked.call


class TimerSkill:
    """``set_timer``: a timer, a reminder or an alarm on this call (see the module's docstring)."""

    name = "set_timer"
    description = ("Set a timer, a reminder or an alarm on this call; when it ends the assistant says so on the call. "
                   "It lasts only while the call does.")
    parameters: ClassVar[dict[str, Any]] = _TIMER_PARAMETERS
    needs_timers = True

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        if language == "en":
            return _english_intent(text)
        if (m := _OTHER_REMIND[language].search(text) if language in _OTHER_REMIND else None) is not None:
            seconds = cjk_duration(m["d"] or m["d2"] or "")
            label = (m["label"] if m["label"] is not None else m.groupdict().get("label2")) or ""
            if seconds is not None:
                return {"kind": "reminder", "seconds": seconds, "label": label.strip(" 。，、,.")}
        pattern = _OTHER_TIMER.get(language)
        if pattern is None or not pattern.search(text) or _OTHER_CANCEL[language].search(text) or \
                _OTHER_LIST[language].search(text):
            return None
        found = re.search(_CJK_DURATION, text)
        seconds = cjk_duration(found.group(0)) if found else None
        return {"kind": "timer", **({"seconds": seconds} if seconds else {})}

    async def run(self, asked: Asked) -> str:
        call = _timers(asked)
        assert call.timers is not None
        lang = asked.lang()
        args = resolve_clock(asked.arguments, call)
        kind = str(args.get("kind") or "timer")
        if kind not in KINDS:
            raise SkillError(f"kind must be one of {', '.join(KINDS)}")
        if args.get("beyond"):
            raise SkillError(too_far(lang, call.timers.max_seconds))
        label = " ".join(str(args.get("label") or "").split())[:MAX_LABEL_CHARS]
        at = ""
        seconds: float | None = None
        if args.get("at"):
            m = re.fullmatch(r"(\d{1,2}):(\d{2})", str(args["at"]).strip())
            if m is None or int(m[1]) > 23 or int(m[2]) > 59:
                raise SkillError("at must be HH:MM, 24-hour")
            now = call.now()
            when = next_time(now, int(m[1]), int(m[2]), "am" if int(m[1]) < 12 else "pm")
            seconds, at = (when - now).total_seconds(), say_clock(when, lang)
        elif args.get("seconds") is not None:
            try:
                seconds = float(args["seconds"])
            except (TypeError, ValueError):
                raise SkillError("seconds must be a number") from None
        if seconds is not None and kind == "alarm" and not at:
            at = say_clock(call.now() + dt.timedelta(seconds=seconds), lang)
        if seconds is None:
            return pick(lang, {
                "en": "For how long? Say, for example, set a timer for five minutes." if kind == "timer" else
                      "When should I remind you? Say, for example, in twenty minutes, or at five o'clock.",
                "zh": "要多长时间？比如：设一个五分钟的计时器。",
                "ja": "何分にしますか？例えば「5分のタイマー」と言ってください。",
                "ko": "얼마 동안 할까요? 예를 들어 5분 타이머라고 말해 주세요."})
        timers = call.timers
        timer = timers.add(kind, seconds, label=label, language=lang, at=at)
        asked.on_undo(lambda: timers.withdraw(timer))
        length = say_duration(timer.seconds, lang)
        if kind == "alarm":
            return pick(lang, {"en": f"Alarm set for {at}, in {length}.", "zh": f"闹钟设在{at}，还有{length}。",
                               "ja": f"{at}にアラームをセットしました。あと{length}です。",
                               "ko": f"{at}에 알람을 맞췄습니다. {length} 남았습니다."})
        if kind == "reminder":
            due = f"at {at}" if at else f"in {length}"
            return pick(lang, {"en": f"OK, I'll remind you to {label} {due}." if label else
                               f"OK, I'll remind you {due}.",
                               "zh": f"好的，{length}后提醒你{label}。", "ja": f"{length}後にお知らせします。",
                               "ko": f"{length} 후에 알려 드리겠습니다."})
        return pick(lang, {"en": f"Timer set for {length}.", "zh": f"好的，已设定{length}的计时器。",
                           "ja": f"{length}のタイマーをセットしました。", "ko": f"{length} 타이머를 설정했습니다."})


def _english_intent(text: str) -> dict[str, Any] | None:
    t = " ".join(text.replace("’", "'").split())
    if _EN_CANCEL.search(t) or _EN_LIST.search(t):
        return None
    if m := _EN_REMIND.search(t):
        rest = (m["rest"] if m["rest"] is not None else m["rest2"] or "").strip(" .!?")
        return _reminder(rest)
    if m := _EN_ALARM.search(t):
        rest = m["rest"].strip(" .!?")
        if _EN_BEYOND.search(rest):
            return {"kind": "alarm", "beyond": True}
        clock = _EN_ALARM_CLOCK.search(rest)
        found = clock_time(clock) if clock else None
        duration = re.search(rf"\bin ({_EN_DURATION})", rest, re.I)
        if found is not None:
            return {"kind": "alarm", "clock": list(found)}
        if duration is not None and (seconds := english_duration(duration.group(1))) is not None:
            return {"kind": "alarm", "seconds": seconds}
        return None
    if m := _EN_TIMER.search(t):
        seconds = english_duration(m["d1"] or m["d2"] or m["d3"])
        return {"kind": "timer", "seconds": seconds} if seconds is not None else None
    if m := _EN_TIMER_BARE.search(t):
        return {"kind": "timer", **({"label": m["label"].strip()} if m["label"] else {})}
    return None


def _reminder(rest: str) -> dict[str, Any]:
    """The arguments of "remind me …": what (the label, said back), and in how long or at what time."""
    beyond = bool(_EN_BEYOND.search(rest))
    seconds: float | None = None
    clock: tuple[int, int, str | None] | None = None
    label = rest
    if m := re.search(rf"\bin ({_EN_DURATION})", rest, re.I):
        seconds = english_duration(m.group(1))
        label = (rest[:m.start()] + rest[m.end():]).strip()
    elif m := _EN_CLOCK.search(rest):
        clock = clock_time(m)
        label = (rest[:m.start()] + rest[m.end():]).strip()
    label = _EN_BEYOND.sub("", label)
    label = re.sub(r"^(?:to|that|about|of)\s+", "", " ".join(label.split()), flags=re.I).strip(" ,.")
    label = re.sub(r"\b(?:this (?:morning|afternoon|evening)|tonight|later|please)\b", "", label, flags=re.I)
    out: dict[str, Any] = {"kind": "reminder", "label": yours(" ".join(label.split()))}
    if beyond:
        out["beyond"] = True
    elif seconds is not None:
        out["seconds"] = seconds
    elif clock is not None:
        out["clock"] = list(clock)
    return out


class CancelTimerSkill:
    """``cancel_timer``: cancel this call's timers (all, or those a word names)."""

    name = "cancel_timer"
    description = "Cancel the call's timers, reminders or alarms: all of them, or those a word names."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"which": {"type": "string", "description": "all (default), timer, reminder, alarm, or a "
                                 "word of a label"}},
    }
    needs_timers = True

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        if language == "en":
            m = _EN_CANCEL.search(text)
            if m is None:
                return None
            what = m["what"].lower().rstrip("s")
            return {"which": "all" if m["what"].lower().endswith("s") or re.search(r"\ball\b", text, re.I) else what}
        pattern = _OTHER_CANCEL.get(language)
        return {"which": "all"} if pattern is not None and pattern.search(text) else None

    async def run(self, asked: Asked) -> str:
        call = _timers(asked)
        assert call.timers is not None
        lang = asked.lang()
        timers = call.timers
        cancelled = timers.cancel(str(asked.arguments.get("which") or ""))
        asked.on_undo(lambda: timers.restore(cancelled))
        if not cancelled:
            return pick(lang, {"en": "You have no timers.", "zh": "你没有计时器。", "ja": "タイマーはありません。",
                               "ko": "설정된 타이머가 없습니다."})
        if len(cancelled) == 1:
            what = _what(cancelled[0], lang)
            return pick(lang, {"en": f"Cancelled your {what}.", "zh": f"已取消{what}。",
                               "ja": f"{what}を取り消しました。", "ko": f"{what}를 취소했습니다."})
        n = len(cancelled)
        return pick(lang, {"en": f"Cancelled {n} timers.", "zh": f"已取消{n}个计时器。",
                           "ja": f"{n}個のタイマーを取り消しました。", "ko": f"타이머 {n}개를 취소했습니다."})


class ListTimersSkill:
    """``list_timers``: this call's timers and the time each has left."""

    name = "list_timers"
    description = "The call's timers, reminders and alarms, and how long each has left."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    needs_timers = True
    acts = False

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        if language == "en":
            return {} if _EN_LIST.search(text) and not _EN_CANCEL.search(text) else None
        pattern = _OTHER_LIST.get(language)
        return {} if pattern is not None and pattern.search(text) else None

    async def run(self, asked: Asked) -> str:
        call = _timers(asked)
        assert call.timers is not None
        lang = asked.lang()
        timers = call.timers.timers
        if not timers:
            return pick(lang, {"en": "You have no timers.", "zh": "你没有计时器。", "ja": "タイマーはありません。",
                               "ko": "설정된 타이머가 없습니다."})
        now = time.time()
        parts = [f"{_what(t, lang)}: {say_duration(t.left(now), lang)}" for t in timers[:5]]
        return pick(lang, {"en": "Time left on your " + "; ".join(parts) + ".",
                           "zh": "剩余时间：" + "；".join(parts) + "。", "ja": "残り時間：" + "、".join(parts) + "。",
                           "ko": "남은 시간: " + ", ".join(parts) + "."})


def _what(timer: Timer, lang: str) -> str:
    length = say_duration(timer.seconds, lang)
    if lang != "en":
        return pick(lang, {"zh": f"{length}计时器", "ja": f"{length}のタイマー", "ko": f"{length} 타이머"}) \
            if timer.kind == "timer" else pick(lang, {"zh": "提醒", "ja": "リマインダー", "ko": "알림"})
    if timer.kind == "reminder":
        return f"reminder to {timer.label}" if timer.label else "reminder"
    if timer.kind == "alarm":
        return f"alarm for {timer.at}"
    return f"{as_adjective(length)} timer" + (f" for {timer.label}" if timer.label else "")


def timer_skills() -> list[TimerSkill | CancelTimerSkill | ListTimersSkill]:
    """``respond.skills = ["timers"]``: setting, cancelling and listing a call's timers."""
    return [TimerSkill(), CancelTimerSkill(), ListTimersSkill()]


def resolve_clock(arguments: dict[str, Any], call: CallContext) -> dict[str, Any]:
    """The intent step's ``clock`` (hour, minute, am/pm as heard) as ``at`` (24-hour HH:MM), the next such time in
    the user's time zone."""
    clock = arguments.get("clock")
    if not clock:
        return arguments
    hour, minute, half = clock
    when = next_time(call.now(), int(hour), int(minute), half)
    out = {k: v for k, v in arguments.items() if k != "clock"}
    out["at"] = f"{when.hour:02d}:{when.minute:02d}"
    return out


__all__ = ["KINDS", "CallTimers", "CancelTimerSkill", "ListTimersSkill", "Timer", "TimerSkill", "announcement",
           "cjk_duration", "english_duration", "resolve_clock", "say_duration", "timer_skills", "yours"]
