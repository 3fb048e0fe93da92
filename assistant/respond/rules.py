"""A tiny offline responder: a table of regex → reply templates (greetings, time, date) and a fallback, in
English, Mandarin, Japanese and Korean: a turn is answered from the table of its language (``options.language``,
the one the ASR heard; for typed words, what their script says), English when there is none for it.

Templates may use ``{time}``, ``{date}``, ``{weekday}``, ``{text}`` (what the user said) and ``{1}``, ``{2}``,
... or ``{name}`` for the pattern's groups. Only these plain names are substituted, so a template can never
reach into Python objects the way ``str.format`` could. Times and dates are written the way the language
writes them (``下午3点25分``, ``午後3時25分``), so each voice reads them in its own language.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from assistant import languages
from assistant.config import RespondConfig
from assistant.respond.base import Message, ReplyOptions
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


@dataclass(frozen=True)
class Table:
    """One language's rules, fallback, empty reply, and how it writes a time and a date."""

    rules: tuple[tuple[str, str], ...]
    fallback: str
    empty: str
    time: Callable[[dt.datetime], str]
    date: Callable[[dt.datetime], str]
    weekdays: tuple[str, ...] = ()  # Monday first; empty: the English names


def _en_time(now: dt.datetime) -> str:
    return now.strftime("%I:%M %p").lstrip("0")


def _cjk_time(am: str, pm: str, hour: str, minute: str, suffix: str = "") -> Callable[[dt.datetime], str]:
    def fmt(now: dt.datetime) -> str:
        h = now.hour % 12 or 12
        minutes = f"{now.minute}{minute}" if now.minute else ""  # "下午5点", not "下午5点0分"
        return f"{am if now.hour < 12 else pm}{h}{hour.rstrip() if not minutes else hour}{minutes}{suffix}"
    return fmt


TABLES: dict[str, Table] = {
    "en": Table(DEFAULT_RULES, DEFAULT_FALLBACK, EMPTY_REPLY, _en_time,
                lambda now: f"{now.strftime('%B')} {now.day}, {now.year}"),
    "zh": Table(
        (
            (r"几点|什么时间|现在时间", "现在是{time}。"),
            (r"几号|日期|星期几|礼拜几|今天是什么日子", "今天是{date}，{weekday}。"),
            (r"你好吗|最近怎么样", "我很好，谢谢关心。"),
            (r"^\s*(你好|您好|早上好|晚上好|下午好|嗨)", "你好！有什么可以帮你的吗？"),
            (r"你是谁|你叫什么", "我是运行在这台电脑上的语音助手。"),
            (r"谢谢|多谢", "不客气。"),
            (r"再见|拜拜", "再见，下次再聊！"),
        ),
        "我听到你说：{text}。我可以告诉你时间或日期。", "我没有听清楚。",
        _cjk_time("上午", "下午", "点", "分"), lambda now: f"{now.year}年{now.month}月{now.day}日",
        ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
    ),
    "ja": Table(
        (
            (r"何時|なんじ|時間を教えて|今の時間", "今は{time}です。"),
            (r"何日|何曜日|日付", "今日は{date}、{weekday}です。"),
            (r"お元気ですか|元気ですか|調子はどう", "元気です。ありがとうございます。"),
            (r"^\s*(こんにちは|おはよう|こんばんは|もしもし|やあ)", "こんにちは！何かお手伝いできることはありますか？"),
            (r"お名前|あなたは誰|誰ですか", "私はこのコンピューターで動いている音声アシスタントです。"),
            (r"ありがとう", "どういたしまして。"),
            (r"さようなら|またね|バイバイ", "さようなら。またお話ししましょう！"),
        ),
        "「{text}」と聞こえました。時刻や日付をお伝えできます。", "よく聞き取れませんでした。",
        _cjk_time("午前", "午後", "時", "分"), lambda now: f"{now.year}年{now.month}月{now.day}日",
        ("月曜日", "火曜日", "水曜日", "木曜日", "金曜日", "土曜日", "日曜日"),
    ),
    "ko": Table(
        (
            (r"몇 시|지금 시간|시간 알려", "지금은 {time}입니다."),
            (r"며칠|무슨 요일|날짜", "오늘은 {date} {weekday}입니다."),
            (r"잘 지내|어떻게 지내", "잘 지내요. 물어봐 주셔서 고마워요."),
            (r"^\s*(안녕|여보세요)", "안녕하세요! 무엇을 도와드릴까요?"),
            (r"누구|이름이 뭐", "저는 이 컴퓨터에서 실행되는 음성 비서입니다."),
            (r"고마워|감사", "천만에요."),
            (r"잘 가|다음에 봐", "안녕히 가세요. 또 이야기해요!"),
        ),
        "{text}라고 들었어요. 시간이나 날짜를 알려 드릴 수 있어요.", "잘 못 알아들었어요.",
        _cjk_time("오전 ", "오후 ", "시 ", "분"), lambda now: f"{now.year}년 {now.month}월 {now.day}일",
        ("월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일"),
    ),
}

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def render(template: str, values: dict[str, str]) -> str:
    """Substitute ``{name}`` placeholders from ``values``; unknown names stay as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


class RulesResponder:
    """First matching rule of the turn's language wins (case-insensitive); no match → its fallback template.

    Options (``[respond.options]``): ``rules`` — a list of ``[pattern, template]`` pairs tried before the
    built-in English ones (and for every language, before its own); ``builtin_rules`` (default true);
    ``fallback`` (English); ``timezone`` (IANA name, default local).
    """

    name = "rules"

    def __init__(self, cfg: RespondConfig | None = None, *, now: Callable[[], dt.datetime] | None = None,
                 **options: Any) -> None:
        opts: dict[str, Any] = {**(cfg.options if cfg else {}), **options}
        own: list[tuple[str, str]] = []
        for item in opts.get("rules", []):
            pair_ok = isinstance(item, list | tuple) and len(item) == 2
            if not (pair_ok and all(isinstance(s, str) for s in item)):
                raise ValueError(f"rules responder: each rule must be [pattern, template], got {item!r}")
            own.append((item[0], item[1]))
        builtin = opts.get("builtin_rules", True)
        try:
            self.tables = {
                lang: [(re.compile(p, re.IGNORECASE), t) for p, t in (*own, *(table.rules if builtin else ()))]
                for lang, table in TABLES.items()
            }
        except re.error as exc:
            raise ValueError(f"rules responder: bad pattern: {exc}") from exc
        self.rules = self.tables["en"]
        self.fallback: str = str(opts.get("fallback", DEFAULT_FALLBACK))
        tz_name = opts.get("timezone")
        self._tz = ZoneInfo(tz_name) if tz_name else None
        self._now = now or (lambda: dt.datetime.now(self._tz).astimezone(self._tz))

    def reply_for(self, text: str, language: str | None = None) -> str:
        """The whole reply for one user turn (the streaming wrapper splits it into words), in ``language`` (None:
        what the text's script says, else English)."""
        lang = language if language in TABLES else (languages.script_language(text) or "en")
        lang = lang if lang in TABLES else "en"
        table = TABLES[lang]
        said = " ".join(text.split()).strip()
        if not said:
            return table.empty
        now = self._now()
        values = {
            "text": said.rstrip(".!?。！？"),
            "time": table.time(now),
            "date": table.date(now),
            "weekday": table.weekdays[now.weekday()] if table.weekdays else now.strftime("%A"),
        }
        for pattern, template in self.tables[lang]:
            m = pattern.search(said)
            if m:
                groups = {str(i): g or "" for i, g in enumerate(m.groups(), start=1)}
                groups.update({k: v or "" for k, v in m.groupdict().items()})
                log.debug("rules.match language=%s pattern=%s", lang, pattern.pattern)
                return render(template, {**values, **groups})
        return render(self.fallback if lang == "en" else table.fallback, values)

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        for delta in words_as_deltas(self.reply_for(text, options.language if options is not None else None)):
            yield delta

    async def aclose(self) -> None:
        """Nothing to release."""
