"""Unit conversions, exactly: length, mass, volume (US cooking measures), time, speed and temperature. "How many
minutes are in an hour?", "5 miles in kilometres", "100 fahrenheit in celsius", "一小时有多少分钟", "1時間は何分",
"1시간은 몇 분"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from assistant.respond.skills.base import Asked, SkillError, pick
from assistant.respond.skills.numbers import CJK_NUMBER, EN_NUMBER, parse_cjk, parse_english, say_number

DAY_S = 86_400.0
YEAR_S = 365 * DAY_S  # the calendar year people mean ("366 in a leap year" is said beside it)


@dataclass(frozen=True)
class Unit:
    key: str
    dimension: str
    factor: float  # base units per one of this (temperature: see _to_base)
    one: str  # English, one of it
    many: str  # English, several
    zh: str
    ja: str
    ko: str


def _u(key: str, dimension: str, factor: float, one: str, many: str, zh: str, ja: str, ko: str) -> Unit:
    return Unit(key, dimension, factor, one, many, zh, ja, ko)


UNITS: dict[str, Unit] = {u.key: u for u in (
    _u("mm", "length", 0.001, "millimetre", "millimetres", "毫米", "ミリメートル", "밀리미터"),
    _u("cm", "length", 0.01, "centimetre", "centimetres", "厘米", "センチメートル", "센티미터"),
    _u("m", "length", 1.0, "metre", "metres", "米", "メートル", "미터"),
    _u("km", "length", 1000.0, "kilometre", "kilometres", "公里", "キロメートル", "킬로미터"),
    _u("in", "length", 0.0254, "inch", "inches", "英寸", "インチ", "인치"),
    _u("ft", "length", 0.3048, "foot", "feet", "英尺", "フィート", "피트"),
    _u("yd", "length", 0.9144, "yard", "yards", "码", "ヤード", "야드"),
    _u("mi", "length", 1609.344, "mile", "miles", "英里", "マイル", "마일"),
    _u("mg", "mass", 1e-6, "milligram", "milligrams", "毫克", "ミリグラム", "밀리그램"),
    _u("g", "mass", 0.001, "gram", "grams", "克", "グラム", "그램"),
    _u("kg", "mass", 1.0, "kilogram", "kilograms", "公斤", "キログラム", "킬로그램"),
    _u("t", "mass", 1000.0, "tonne", "tonnes", "吨", "トン", "톤"),
    _u("oz", "mass", 0.028349523125, "ounce", "ounces", "盎司", "オンス", "온스"),
    _u("lb", "mass", 0.45359237, "pound", "pounds", "磅", "ポンド", "파운드"),
    _u("st", "mass", 6.35029318, "stone", "stone", "英石", "ストーン", "스톤"),
    _u("ml", "volume", 0.001, "millilitre", "millilitres", "毫升", "ミリリットル", "밀리리터"),
    _u("l", "volume", 1.0, "litre", "litres", "升", "リットル", "리터"),
    _u("tsp", "volume", 0.00492892159375, "teaspoon", "teaspoons", "茶匙", "小さじ", "티스푼"),
    _u("tbsp", "volume", 0.01478676478125, "tablespoon", "tablespoons", "汤匙", "大さじ", "테이블스푼"),
    _u("floz", "volume", 0.0295735295625, "fluid ounce", "fluid ounces", "液量盎司", "液量オンス", "액량 온스"),
    _u("cup", "volume", 0.2365882365, "cup", "cups", "杯", "カップ", "컵"),
    _u("pt", "volume", 0.473176473, "pint", "pints", "品脱", "パイント", "파인트"),
    _u("qt", "volume", 0.946352946, "quart", "quarts", "夸脱", "クォート", "쿼트"),
    _u("gal", "volume", 3.785411784, "gallon", "gallons", "加仑", "ガロン", "갤런"),
    _u("s", "time", 1.0, "second", "seconds", "秒", "秒", "초"),
    _u("min", "time", 60.0, "minute", "minutes", "分钟", "分", "분"),
    _u("h", "time", 3600.0, "hour", "hours", "小时", "時間", "시간"),
    _u("d", "time", DAY_S, "day", "days", "天", "日", "일"),
    _u("wk", "time", 7 * DAY_S, "week", "weeks", "周", "週間", "주"),
    _u("mo", "time", YEAR_S / 12, "month", "months", "个月", "か月", "개월"),
    _u("yr", "time", YEAR_S, "year", "years", "年", "年", "년"),
    _u("decade", "time", 10 * YEAR_S, "decade", "decades", "十年", "十年", "십 년"),
    _u("century", "time", 100 * YEAR_S, "century", "centuries", "世纪", "世紀", "세기"),
    _u("kmh", "speed", 1 / 3.6, "kilometre per hour", "kilometres per hour", "公里每小时", "キロメートル毎時",
       "시속 킬로미터"),
    _u("mph", "speed", 0.44704, "mile per hour", "miles per hour", "英里每小时", "マイル毎時", "시속 마일"),
    _u("mps", "speed", 1.0, "metre per second", "metres per second", "米每秒", "メートル毎秒", "초속 미터"),
    _u("knot", "speed", 0.514444, "knot", "knots", "节", "ノット", "노트"),
    _u("c", "temperature", 1.0, "degree Celsius", "degrees Celsius", "摄氏度", "摂氏", "섭씨"),
    _u("f", "temperature", 1.0, "degree Fahrenheit", "degrees Fahrenheit", "华氏度", "華氏", "화씨"),
    _u("k", "temperature", 1.0, "kelvin", "kelvin", "开尔文", "ケルビン", "켈빈"),
)}

# What people call each unit → its key. English names take a plural "s" too; a bare letter ("m", "c") only in
# conversions ("5 m in feet"), never as the thing asked about in "how many …".
NAMES: dict[str, dict[str, str]] = {
    "en": {
        "millimetre": "mm", "millimeter": "mm", "mm": "mm", "centimetre": "cm", "centimeter": "cm", "cm": "cm",
        "metre": "m", "meter": "m", "kilometre": "km", "kilometer": "km", "km": "km", "kilometres": "km",
        "inch": "in", "inches": "in", "foot": "ft", "feet": "ft", "ft": "ft", "yard": "yd", "mile": "mi",
        "milligram": "mg", "mg": "mg", "gram": "g", "kilogram": "kg", "kilo": "kg", "kg": "kg", "tonne": "t",
        "metric ton": "t", "ounce": "oz", "oz": "oz", "pound": "lb", "lb": "lb", "lbs": "lb", "stone": "st",
        "millilitre": "ml", "milliliter": "ml", "ml": "ml", "litre": "l", "liter": "l", "teaspoon": "tsp",
        "tsp": "tsp", "tablespoon": "tbsp", "tbsp": "tbsp", "fluid ounce": "floz", "fl oz": "floz", "cup": "cup",
        "pint": "pt", "quart": "qt", "gallon": "gal", "second": "s", "minute": "min", "hour": "h", "day": "d",
        "week": "wk", "fortnight": "fortnight", "month": "mo", "year": "yr", "decade": "decade",
        "century": "century", "centuries": "century", "kilometres per hour": "kmh", "kilometers per hour": "kmh",
        "kilometre per hour": "kmh", "kilometer per hour": "kmh", "km/h": "kmh", "kph": "kmh",
        "miles per hour": "mph", "mile per hour": "mph", "mph": "mph", "metres per second": "mps",
        "meters per second": "mps", "m/s": "mps", "knot": "knot", "celsius": "c", "centigrade": "c",
        "degrees celsius": "c", "degree celsius": "c", "fahrenheit": "f", "degrees fahrenheit": "f",
        "degree fahrenheit": "f", "kelvin": "k",
    },
    "zh": {"毫米": "mm", "厘米": "cm", "公分": "cm", "米": "m", "公里": "km", "千米": "km", "英寸": "in", "英尺": "ft",
           "码": "yd", "英里": "mi", "毫克": "mg", "克": "g", "千克": "kg", "公斤": "kg", "吨": "t", "盎司": "oz",
           "磅": "lb", "毫升": "ml", "升": "l", "公升": "l", "杯": "cup", "加仑": "gal", "秒": "s", "秒钟": "s",
           "分钟": "min", "分": "min", "小时": "h", "钟头": "h", "天": "d", "日": "d", "周": "wk", "星期": "wk",
           "礼拜": "wk", "月": "mo", "个月": "mo", "年": "yr", "世纪": "century", "摄氏度": "c", "华氏度": "f"},
    "ja": {"ミリメートル": "mm", "ミリ": "mm", "センチメートル": "cm", "センチ": "cm", "メートル": "m",
           "キロメートル": "km", "インチ": "in", "フィート": "ft", "ヤード": "yd", "マイル": "mi",
           "ミリグラム": "mg", "グラム": "g", "キログラム": "kg", "トン": "t", "オンス": "oz", "ポンド": "lb",
           "ミリリットル": "ml", "リットル": "l", "カップ": "cup", "ガロン": "gal", "秒": "s", "分": "min",
           "時間": "h", "日": "d", "週間": "wk", "週": "wk", "か月": "mo", "ヶ月": "mo", "カ月": "mo", "ヵ月": "mo",
           "年": "yr", "世紀": "century", "摂氏": "c", "華氏": "f"},
    "ko": {"밀리미터": "mm", "센티미터": "cm", "센티": "cm", "미터": "m", "킬로미터": "km", "인치": "in",
           "피트": "ft", "야드": "yd", "마일": "mi", "밀리그램": "mg", "그램": "g", "킬로그램": "kg", "톤": "t",
           "온스": "oz", "파운드": "lb", "밀리리터": "ml", "리터": "l", "컵": "cup", "갤런": "gal", "초": "s",
           "분": "min", "시간": "h", "일": "d", "주": "wk", "주일": "wk", "개월": "mo", "달": "mo", "년": "yr",
           "세기": "century", "섭씨": "c", "화씨": "f"},
}
UNITS["fortnight"] = _u("fortnight", "time", 14 * DAY_S, "fortnight", "fortnights", "两周", "二週間", "2주")


def _alternation(names: list[str], plural: bool) -> str:
    ordered = sorted(names, key=len, reverse=True)
    suffix = r"(?:e?s)?" if plural else ""
    return "(?:" + "|".join(re.escape(n) + (suffix if plural and n[-1].isalpha() and len(n) > 2 else "")
                            for n in ordered) + ")"


_EN_UNIT = _alternation(list(NAMES["en"]), plural=True)
_EN_DEG = r"(?:degrees? )?"
_EN_HOW_MANY = re.compile(
    rf"\bhow many (?P<to>{_EN_UNIT}) (?:are |is )?(?:there )?(?:in|per|make up|make) (?:(?P<n>{EN_NUMBER}) )?"
    rf"(?:an? |one )?(?P<from>{_EN_UNIT})\s*[?.!]*$", re.I)
_EN_CONVERT = re.compile(
    rf"^(?:.*?\b(?:convert|what(?:'s| is| are)|how much (?:is|are)|how many (?P<to2>{_EN_UNIT}) (?:is|are|in)|"
    rf"change|turn)\s+)?(?P<n>{EN_NUMBER}|-?\d+(?:\.\d+)?) ?{_EN_DEG}(?P<from>{_EN_UNIT})"
    rf"(?: (?:(?:is|are) )?(?:in|to|into|as|in to) {_EN_DEG}(?P<to>{_EN_UNIT}))?\s*[?.!]*$", re.I)
_ZH_UNIT, _JA_UNIT, _KO_UNIT = (_alternation(list(NAMES[lang]), False) for lang in ("zh", "ja", "ko"))
_CJK_ASK = {
    "zh": re.compile(rf"(?P<n>{CJK_NUMBER})?个?(?P<from>{_ZH_UNIT})(?:里|中)?"
                     rf"(?:有|是|等于|等於|合|换算成|换算为|换成)(?:多少|几)个?(?P<to>{_ZH_UNIT})"),
    "ja": re.compile(rf"(?P<n>{CJK_NUMBER})?(?P<from>{_JA_UNIT})(?:は|って)(?:何|なん)(?P<to>{_JA_UNIT})"),
    "ko": re.compile(rf"(?:(?P<day>하루)|(?P<n>{CJK_NUMBER}|한)?\s*(?P<from>{_KO_UNIT}))\s*"
                     rf"(?:은|는|이|가|에는|동안)?\s*(?:몇|얼마나\s*많은)\s*(?P<to>{_KO_UNIT})"),
}


def unit_key(name: str, language: str = "en") -> str | None:
    """The key of the unit ``name`` calls (a key itself, or a name in ``language`` or English), or None."""
    n = " ".join(name.strip().lower().split())
    if n in UNITS:
        return n
    for lang in (language, "en"):
        table = NAMES.get(lang, {})
        if n in table:
            return table[n]
        for cut in ("es", "s"):
            if lang == "en" and n.endswith(cut) and n[: -len(cut)] in table:
                return table[n[: -len(cut)]]
    return None


def _english_value(said: str | None) -> float | None:
    """The number before a unit ("an hour", "two hours", "1.5 miles"); none said is one."""
    n = (said or "").strip().lower()
    return 1.0 if n in ("", "a", "an", "one") else parse_english(n)


def _to_base(value: float, unit: Unit) -> float:
    if unit.dimension != "temperature":
        return value * unit.factor
    return {"c": value, "f": (value - 32) * 5 / 9, "k": value - 273.15}[unit.key]


def _from_base(value: float, unit: Unit) -> float:
    if unit.dimension != "temperature":
        return value / unit.factor
    return {"c": value, "f": value * 9 / 5 + 32, "k": value + 273.15}[unit.key]


def convert(value: float, source: str, target: str) -> float:
    """``value`` in unit ``source`` as unit ``target`` (keys); ValueError across dimensions."""
    a, b = UNITS[source], UNITS[target]
    if a.dimension != b.dimension:
        raise ValueError(f"cannot convert {a.many} to {b.many}")
    return _from_base(_to_base(value, a), b)


def _name(unit: Unit, value: float, lang: str) -> str:
    if lang == "en":
        return unit.one if value == 1 else unit.many
    return getattr(unit, lang)


def _topic(word: str) -> str:
    """Korean topic particle for a word: 은 after a final consonant, else 는."""
    last = word[-1] if word else ""
    return "은" if "가" <= last <= "힣" and (ord(last) - 0xAC00) % 28 else "는"


class UnitsSkill:
    """``convert_units``: a value in one unit as another of the same kind."""

    name = "convert_units"
    acts = False  # it only answers
    description = ("Convert a value between units of length, mass, volume (US cooking measures), time, speed or "
                   "temperature, exactly. Use it for 'how many X in a Y' and any conversion.")
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "from_unit": {"type": "string", "description": "e.g. mile, kg, cup, hour, fahrenheit"},
            "to_unit": {"type": "string"},
            "ask": {"type": "string", "enum": ["how_many", "convert"],
                    "description": "how_many: the user asked how many to_unit are in one from_unit"},
        },
        "required": ["value", "from_unit", "to_unit"],
    }

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        t = " ".join(text.replace("’", "'").split())
        if language == "en":
            m = _EN_HOW_MANY.search(t)
            if m is not None:
                found = self._arguments(_english_value(m["n"]), m["from"], m["to"], "en")
                return {**found, "ask": "how_many"} if found else None
            m = _EN_CONVERT.search(t)
            if m is not None and (m["to"] or m["to2"]):
                return self._arguments(_english_value(m["n"]), m["from"], m["to"] or m["to2"], "en")
            return None
        pattern = _CJK_ASK.get(language)
        m = pattern.search(t) if pattern is not None else None
        if m is None:
            return None
        if m.groupdict().get("day"):  # 하루: one day
            return self._arguments(1.0, "d", m["to"], language)
        n = m["n"]
        value = 1.0 if not n or n == "한" else parse_cjk(n)
        return self._arguments(value, m["from"], m["to"], language)

    @staticmethod
    def _arguments(value: float | None, source: str, target: str, language: str) -> dict[str, Any] | None:
        a, b = unit_key(source, language), unit_key(target, language)
        if value is None or a is None or b is None or a == b or UNITS[a].dimension != UNITS[b].dimension:
            return None
        return {"value": value, "from_unit": a, "to_unit": b}

    async def run(self, asked: Asked) -> str:
        lang = asked.lang()
        args = asked.arguments
        try:
            value = float(args.get("value", 1))
        except (TypeError, ValueError):
            raise SkillError("value must be a number") from None
        a = unit_key(str(args.get("from_unit", "")), lang)
        b = unit_key(str(args.get("to_unit", "")), lang)
        if a is None or b is None:
            raise SkillError(pick(lang, {"en": "I don't know that unit.", "zh": "我不认识这个单位。",
                                         "ja": "その単位はわかりません。", "ko": "그 단위는 모릅니다."}))
        try:
            result = convert(value, a, b)
        except ValueError:
            raise SkillError(pick(lang, {"en": f"I can't convert {UNITS[a].many} to {UNITS[b].many}.",
                                         "zh": "这两个单位不能换算。", "ja": "その単位同士は換算できません。",
                                         "ko": "그 단위끼리는 바꿀 수 없습니다."})) from None
        said, was = say_number(result), say_number(value)
        about = float(said) != result
        src, dst = UNITS[a], UNITS[b]
        leap = " (366 in a leap year)" if (a, b) == ("yr", "d") and value == 1 else ""
        if lang == "en":
            if value == 1 and args.get("ask") == "how_many":  # "how many minutes are in an hour?"
                article = "an" if src.one[0] in "aeiou" or src.one.startswith("hour") else "a"
                verb = "is" if said == "1" else "are"
                return (f"There {verb} {'about ' if about else ''}{said} {_name(dst, result, lang)} in {article} "
                        f"{src.one}{leap}.")
            near = "about " if about else ""
            return f"{was} {_name(src, value, lang)} is {near}{said} {_name(dst, result, lang)}{leap}."
        near = {"zh": "约", "ja": "約", "ko": "약 "}[lang] if about else ""
        a_said, b_said = f"{was}{_name(src, value, lang)}", f"{near}{said}{_name(dst, result, lang)}"
        if lang == "ko":
            a_said, b_said = f"{was}{src.ko}", f"{near}{said}{dst.ko}"
            return f"{a_said}{_topic(a_said)} {b_said}입니다."
        return pick(lang, {"zh": f"{a_said}等于{b_said}。", "ja": f"{a_said}は{b_said}です。"})


__all__ = ["NAMES", "UNITS", "UnitsSkill", "convert", "unit_key"]
