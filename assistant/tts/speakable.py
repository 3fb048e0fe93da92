"""Text for the ear: what a reply says once Markdown, URLs and symbols are turned into words a voice reads well.

Every responder's text passes here on its way to the TTS (the chunker shapes each piece it releases, so the
echo, rules, OpenAI and embedded responders are shaped alike). The chunker breaks at every newline, so Markdown's
line syntax (headings, list items, quotes, table rows, code fences) arrives at the start of a piece, and inline
syntax (``**bold**``, ``[text](url)``) split across deltas is whole by the time a piece is released.

What it does, per piece:
  * code fences: the fence lines and everything between them are dropped (code read aloud helps no one); the
    state is kept across pieces (:class:`Speakable`), reset at the end of a reply;
  * headings, list items (``-``, ``*``, ``•``, ``1.``, ``1)``), quotes: the marker is dropped and the line ends
    with a full stop when it had no end mark, so a list is spoken as sentences; tables: cells joined by commas,
    rule and separator lines dropped;
  * emphasis, strike-through, inline code ticks, HTML tags and images dropped, links keep their text;
  * URLs said as their host (``www.`` dropped; ``example dot com`` in English), e-mail's ``@`` said;
  * symbols and units after numbers said in the piece's language (``50%`` → ``50 percent``, ``百分之50``,
    ``50パーセント``, ``50퍼센트``; ``5 km``, ``°C``, ``5-10`` → ``5 to 10``, ``3 × 4``, ``&``, ``+``, ``=``),
    and only in a language with a table here: no English word is put into Japanese (or French) text; a phone
    number (``555-1234``, ``(555) 123-4567``, ``202-599-863``) and a long digit string (``2025998630``, a code's
    ``482913``) digit by digit, not as a range or a count in the billions;
  * emoji and other pictographs dropped.
The language is the turn's (the TTS request's) when known, else the piece's script (kana: ja, Hangul: ko, Han:
zh), else English only for a piece with no other hint. Numbers themselves stay digits: the voices (Piper's
espeak-ng, Kokoro's and CosyVoice's front ends) read digits, decimals and ``10:30`` in their language.
"""

from __future__ import annotations

import re
import unicodedata

from assistant import languages
from assistant.tts.text import has_cjk

# --- words for symbols, per language (only these get words; others keep digits and drop the symbol) ----------
# "{n}" is the number the symbol follows (or leads); "{u}" a unit word.
WORDS: dict[str, dict[str, str]] = {
    "en": {"percent": "{n} percent", "and": "and", "plus": "plus", "equals": "equals", "times": "times",
           "to": "to", "at": "at", "dot": "dot", "degC": "{n} degrees Celsius", "degF": "{n} degrees Fahrenheit",
           "deg": "{n} degrees", "about": "about", "per": "per", "or": "or"},
    "fr": {"percent": "{n} pour cent", "and": "et", "plus": "plus", "equals": "égale", "times": "fois",
           "to": "à", "at": "arobase", "dot": "point", "degC": "{n} degrés Celsius",
           "degF": "{n} degrés Fahrenheit", "deg": "{n} degrés", "about": "environ", "per": "par", "or": "ou"},
    "de": {"percent": "{n} Prozent", "and": "und", "plus": "plus", "equals": "gleich", "times": "mal",
           "to": "bis", "at": "at", "dot": "Punkt", "degC": "{n} Grad Celsius", "degF": "{n} Grad Fahrenheit",
           "deg": "{n} Grad", "about": "etwa", "per": "pro", "or": "oder"},
    "es": {"percent": "{n} por ciento", "and": "y", "plus": "más", "equals": "igual a", "times": "por",
           "to": "a", "at": "arroba", "dot": "punto", "degC": "{n} grados Celsius",
           "degF": "{n} grados Fahrenheit", "deg": "{n} grados", "about": "unos", "per": "por", "or": "o"},
    "zh": {"percent": "百分之{n}", "and": "和", "plus": "加", "equals": "等于", "times": "乘以", "to": "到",
           "at": "艾特", "dot": "点", "degC": "{n}摄氏度", "degF": "{n}华氏度", "deg": "{n}度", "about": "大约",
           "per": "每", "or": "或"},
    "ja": {"percent": "{n}パーセント", "and": "と", "plus": "たす", "equals": "は", "times": "かける",
           "to": "から", "at": "アット", "dot": "ドット", "degC": "{n}度", "degF": "華氏{n}度", "deg": "{n}度",
           "about": "約", "per": "毎", "or": "または"},
    "ko": {"percent": "{n}퍼센트", "and": "와", "plus": "더하기", "equals": "는", "times": "곱하기",
           "to": "에서", "at": "골뱅이", "dot": "닷", "degC": "섭씨 {n}도", "degF": "화씨 {n}도", "deg": "{n}도",
           "about": "약", "per": "당", "or": "또는"},
}
# Units after a number, English singular/plural; CJK forms. Other languages keep the abbreviation (their voices
# read it, and a wrong word is worse than a short one).
UNITS: dict[str, tuple[str, str, str, str, str]] = {
    # unit: (en singular, en plural, zh, ja, ko)
    "km/h": ("kilometer per hour", "kilometers per hour", "公里每小时", "キロメートル毎時", "킬로미터 매시"),
    "mph": ("mile per hour", "miles per hour", "英里每小时", "マイル毎時", "마일 매시"),
    "km": ("kilometer", "kilometers", "公里", "キロメートル", "킬로미터"),
    "cm": ("centimeter", "centimeters", "厘米", "センチメートル", "센티미터"),
    "mm": ("millimeter", "millimeters", "毫米", "ミリメートル", "밀리미터"),
    "kg": ("kilogram", "kilograms", "公斤", "キログラム", "킬로그램"),
    "mg": ("milligram", "milligrams", "毫克", "ミリグラム", "밀리그램"),
    "g": ("gram", "grams", "克", "グラム", "그램"),
    "ml": ("milliliter", "milliliters", "毫升", "ミリリットル", "밀리리터"),
    "lb": ("pound", "pounds", "磅", "ポンド", "파운드"),
    "lbs": ("pound", "pounds", "磅", "ポンド", "파운드"),
    "oz": ("ounce", "ounces", "盎司", "オンス", "온스"),
    "min": ("minute", "minutes", "分钟", "分", "분"),
    "hrs": ("hour", "hours", "小时", "時間", "시간"),
    "sec": ("second", "seconds", "秒", "秒", "초"),
    "GB": ("gigabyte", "gigabytes", "GB", "ギガバイト", "기가바이트"),
    "MB": ("megabyte", "megabytes", "MB", "メガバイト", "메가바이트"),
}
_UNIT_COLUMN = {"zh": 2, "ja": 3, "ko": 4}
FRACTIONS_EN = {"1/2": "one half", "1/3": "one third", "2/3": "two thirds", "1/4": "one quarter",
                "3/4": "three quarters"}
END_MARKS = ".!?…。！？:;：；,，"

_FENCE = re.compile(r"^\s*(```|~~~)")
_RULE = re.compile(r"^\s*([-*_=])(\s*\1){2,}\s*$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_HEADING = re.compile(r"^\s*#{1,6}\s+")
_LIST = re.compile(r"^\s*(?:(?:[-*+•‣◦▪]|\d{1,3}[.)])\s+)+(?=\S)")  # "1. 1. Make tea": a small model nests them
# A line of list markers and nothing else ("1. 1. 1."): nothing to say. One number and its dot ("3.", a heading
# "# 3.") is the number, said whether or not a space follows it: the chunker may cut a piece before or after it.
_ONLY_MARKERS = re.compile(r"^\s*(?:(?:[-*+•‣◦▪]|\d{1,3}[.)])\s*){2,}$|^\s*[-*+•‣◦▪]\s*$")
_QUOTE = re.compile(r"^\s*(?:>\s*)+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_HTML = re.compile(r"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
_URL = re.compile(r"(?:https?://|(?<![A-Za-z0-9])www\.)[^\s<>()\"']+", re.IGNORECASE)
_EMAIL = re.compile(r"\b([\w.+-]+)@([\w-]+(?:\.[\w-]+)+)\b")
_EMPHASIS = re.compile(r"\*\*|__|~~|`+|(?<![\w*])\*(?=\S)|(?<=\S)\*(?![\w*])|(?<![\w_])_(?=\S)|(?<=\S)_(?![\w_])")
_STRAY_STAR = re.compile(r"\*+")
_NUM = r"(?<![\d.,])\d+(?:[.,]\d+)?"  # a whole number: not the tail of another (CJK letters may touch it)
_PERCENT = re.compile(rf"({_NUM})\s?%")
_DEGREES = re.compile(rf"(-?{_NUM})\s?°(?:\s?([CF])(?![A-Za-z]))?")
# A phone number: digit groups joined by hyphens ("555-1234", "555-123-4567", "1-800-555-1234", "+1-555-123-4567",
# "(555) 123-4567"); said digit by digit, group by group, never as a range or as numbers in the thousands.
_PHONE = re.compile(r"(?<![\d.,/+\-A-Za-z])(?:\+\d{1,3}[\s-]|\d{1,3}-)?(?:\(\d{3}\)\s?|\d{3}-)(?:\d{3}-)?\d{4}"
                    r"(?![\dA-Za-z-]|[.,]\d)")
# Three digit groups or more joined by hyphens ("202-599-863", "03-1234-5678"): an identifier read out, never a
# range or a sum, so said as a phone number is; not an ISO date ("2024-01-15": the voices read dates).
_DIGIT_GROUPS = re.compile(r"(?<![\d.,/+\-A-Za-z])\d{1,4}(?:-\d{1,4}){2,}(?![\dA-Za-z-]|[.,]\d)")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# A digit string a voice would read as a count ("2025998630": "two billion twenty five million ..."; "Your code is
# 482913": "four hundred eighty two thousand ..."): seven digits or more with no separator, or five or more after
# the name of a code or a number; said digit by digit, in groups. Not money, not a decimal's digits, not a round
# count ("1000000"), not a number with thousands separators (a count, as models write counts).
_DIGIT_RUN = re.compile(r"(?<![\d.,$£€¥₩A-Za-z_])\d{7,}(?![\dA-Za-z_]|[.,]\d)")  # CJK letters may touch it
_NAMED_RUN = re.compile(r"\b(?:code|pin|number|zip|order|reference|confirmation|account|ticket|booking|tracking|"
                        r"extension|id)(?:\s+(?:is|was|number|code))?:?\s+#?(?<![\d$£€¥₩])(\d{5,})(?![\dA-Za-z_]|[.,]\d)",
                        re.IGNORECASE)
_RANGE = re.compile(rf"(?<!\d[-–/])({_NUM})\s?[-–—]\s?({_NUM})(?![\d.,]*\d)(?!\s*[-–—]\s?\d)")
_TIMES = re.compile(rf"({_NUM})\s?[×xX*]\s?({_NUM})(?![\d.,]*\d)")
_PLUS = re.compile(rf"({_NUM})\s?\+\s?({_NUM})(?![\d.,]*\d)")
_EQUALS = re.compile(r"\s=\s")
_APPROX = re.compile(rf"(?<!\S)[~≈]\s?({_NUM})")
_AMP = re.compile(r"\s&\s|(?<=[A-Za-z])&(?=[A-Za-z])")
_SLASH_WORDS = re.compile(r"\b([A-Za-z]+)/([A-Za-z]+)\b")
_FRACTION = re.compile(r"(?<![\d/])([123])/([234])(?![\d/])")
_AMPM = re.compile(r"\b(\d{1,2}(?::\d{2})?)\s?([AaPp])\.?[Mm]\.?(?![A-Za-z])")
_SPACE_BEFORE_MARK = re.compile(r"\s+([.!?,;:])(?=\s|$)")
_ARROW = re.compile(r"\s*(?:->|→|=>)\s*")
_NUM_UNIT = re.compile(rf"({_NUM})\s?(" + r"|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
                       + r")(?![A-Za-z/])")


def language_of(text: str, language: str | None = None) -> str:
    """The language to speak ``text`` in: the turn's code when given (``zh-CN`` → ``zh``), else the script's, else
    English."""
    if language:
        return language.split("-")[0].lower()
    return languages.script_language(text) or "en"


class Speakable:
    """Shapes one reply's pieces for the ear; keeps whether a code block is open between pieces.

    ``language``: the reply's language when the turn knows it (else each piece's script decides)."""

    def __init__(self, language: str | None = None) -> None:
        self.language = language
        self.in_code = False

    def reset(self) -> None:
        self.in_code = False

    def __call__(self, piece: str) -> str:
        lines = [self._line(line) for line in piece.split("\n")]
        kept = [s for s in lines if s]
        return ("" if has_cjk(piece) else " ").join(kept).strip()

    def _line(self, line: str) -> str:
        if _FENCE.match(line):
            self.in_code = not self.in_code
            return ""
        if self.in_code or _RULE.match(line) or _TABLE_SEP.match(line):
            return ""
        structured = False
        if "|" in line and line.strip().startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            line = ", ".join(c for c in cells if c)
            structured = True
        line = line.rstrip()
        for pattern in (_HEADING, _QUOTE, _LIST):
            if _ONLY_MARKERS.match(line):
                return ""
            line, n = pattern.subn("", line, count=1)
            structured = structured or bool(n)
        text = shape_inline(line, language_of(line, self.language))
        if structured and text and text[-1] not in END_MARKS and any(c.isalnum() for c in text):
            text += "。" if has_cjk(text) else "."
        return text


def shape_inline(text: str, lang: str) -> str:
    """One line's inline Markdown, URLs, symbols and units, said in ``lang`` (see the module's notes)."""
    words = WORDS.get(lang)
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _HTML.sub(" ", text)
    text = _URL.sub(lambda m: _say_url(m.group(0), words), text)
    if words is not None:
        said = words  # (not Optional inside the lambdas)
        text = _EMAIL.sub(lambda m: f"{m.group(1)} {said['at']} {_say_host(m.group(2), said)}", text)
        # "3 * 4" before the emphasis marks go
        text = _TIMES.sub(lambda m: _join(lang, m.group(1), said["times"], m.group(2)), text)
    text = _EMPHASIS.sub("", text)
    text = _STRAY_STAR.sub(" ", text)
    if words is not None:
        text = _symbols(text, lang, words)
    text = _drop_pictographs(text)
    if has_cjk(text):
        return re.sub(r"[ \t]+", " ", text).strip()
    return _SPACE_BEFORE_MARK.sub(r"\1", " ".join(text.split()))


def speakable(text: str, language: str | None = None) -> str:
    """A whole text shaped for the ear (a fresh :class:`Speakable`; lines joined)."""
    return Speakable(language)(text)


# --- helpers -------------------------------------------------------------------------------------------------
def _join(lang: str, *parts: str) -> str:
    sep = "" if lang in ("zh", "ja") else " "
    return sep.join(parts)


def _say_host(host: str, words: dict[str, str] | None) -> str:
    host = host.lower()
    if host.startswith("www."):
        host = host[4:]
    if words is None:
        return host
    return f" {words['dot']} ".join(host.split("."))


def _say_url(url: str, words: dict[str, str] | None) -> str:
    rest = re.sub(r"^(?:https?://)", "", url, flags=re.IGNORECASE)
    host = re.split(r"[/?#:]", rest, maxsplit=1)[0].rstrip(".,;")
    tail = url[len(url.rstrip(".,;!?")):]  # the sentence's own end mark stays
    return _say_host(host, words) + tail


def _drop_pictographs(text: str) -> str:
    return "".join(c for c in text if not ((unicodedata.category(c) == "So" and c != "°") or 0xFE00 <= ord(c) <= 0xFE0F
                                           or ord(c) == 0x200D))


def _say_phone(number: str, lang: str, words: dict[str, str]) -> str:
    """``555-1234`` → ``5 5 5, 1 2 3 4``; a leading ``+`` is said. Two round groups (``100-1000``) are a range."""
    groups = re.findall(r"\d+", number)
    if len(groups) == 2 and number[0] != "(" and all(int(g) % 100 == 0 for g in groups):
        return number
    said = _say_groups(groups, lang)
    return f"{words['plus']} {said}" if number.startswith("+") else said


def _digit_groups(digits: str, lang: str) -> list[str]:
    """A digit string in the groups it is read in: up to five in one (a ZIP code), else threes from the left, the
    end in fours where threes would leave a digit or two over (7: 3-4, 8: 4-4, 10: 3-3-4, 11: 3-4-4, as China's
    mobile numbers are read), and eleven digits from a 1 in English as North America's 1-3-3-4."""
    n = len(digits)
    if n <= 5:
        return [digits]
    if n == 11 and lang == "en" and digits[0] == "1":
        return [digits[0], digits[1:4], digits[4:7], digits[7:]]
    head = n - 4 * (n % 3)  # a digit over: one group of four at the end; two over: two
    return [digits[i:i + 3] for i in range(0, head, 3)] + [digits[i:i + 4] for i in range(head, n, 4)]


def _say_digits(digits: str, lang: str) -> str:
    """``2025998630`` → ``2 0 2, 5 9 9, 8 6 3 0`` (a round count, ``1000000``, stays as it is)."""
    if digits.endswith("0000"):  # not int(): past 4,300 digits it raises
        return digits
    return _say_groups(_digit_groups(digits, lang), lang)


def _say_groups(groups: list[str], lang: str) -> str:
    """Digit groups said digit by digit, a pause (a comma) between groups: ``["555", "1234"]`` → ``5 5 5, 1 2 3 4``."""
    return ("，" if lang in ("zh", "ja") else ", ").join(" ".join(g) for g in groups)


def _unit_word(unit: str, number: str, lang: str) -> str:
    forms = UNITS[unit]
    if lang == "en":
        return forms[0] if number in ("1", "1.0") else forms[1]
    col = _UNIT_COLUMN.get(lang)
    return forms[col] if col is not None else unit


def _symbols(text: str, lang: str, words: dict[str, str]) -> str:
    cjk = lang in ("zh", "ja")
    sp = "" if cjk else " "
    text = _PERCENT.sub(lambda m: words["percent"].format(n=m.group(1)), text)
    text = _DEGREES.sub(lambda m: words[{"C": "degC", "F": "degF"}.get(m.group(2) or "", "deg")].format(
        n=m.group(1)), text)
    if lang == "en":
        text = _AMPM.sub(lambda m: f"{m.group(1)} {m.group(2).lower()}.m.", text)
        text = _FRACTION.sub(lambda m: FRACTIONS_EN[m.group(0)], text)
    if lang in ("en", "zh", "ja", "ko"):
        text = _NUM_UNIT.sub(lambda m: f"{m.group(1)}{sp if lang != 'ko' else ' '}"
                             f"{_unit_word(m.group(2), m.group(1), lang)}", text)
    text = _PHONE.sub(lambda m: _say_phone(m.group(0), lang, words), text)
    text = _DIGIT_GROUPS.sub(lambda m: m.group(0) if _ISO_DATE.fullmatch(m.group(0))
                             else _say_phone(m.group(0), lang, words), text)
    text = _NAMED_RUN.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)] + _say_digits(m.group(1), lang), text)
    text = _DIGIT_RUN.sub(lambda m: _say_digits(m.group(0), lang), text)
    text = _RANGE.sub(lambda m: _join(lang, m.group(1), words["to"], m.group(2)), text)
    text = _PLUS.sub(lambda m: _join(lang, m.group(1), words["plus"], m.group(2)), text)
    text = _EQUALS.sub(f"{sp}{words['equals']}{sp}" if cjk else f" {words['equals']} ", text)
    text = _APPROX.sub(lambda m: _join(lang, words["about"], m.group(1)), text)
    text = _AMP.sub(f"{sp}{words['and']}{sp}" if cjk else f" {words['and']} ", text)
    text = _ARROW.sub(f"{sp}{words['to']}{sp}" if cjk else f" {words['to']} ", text)
    if not cjk:
        text = _SLASH_WORDS.sub(lambda m: f"{m.group(1)} {words['or']}" if m.group(0).lower() == "and/or"
                                else f"{m.group(1)} {words['or']} {m.group(2)}", text)
    return text


__all__ = ["FRACTIONS_EN", "UNITS", "WORDS", "Speakable", "language_of", "shape_inline", "speakable"]
