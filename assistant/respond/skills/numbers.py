"""Numbers as people say them, and as the assistant says them back: English number words ("twenty-five", "two
and a half", "a hundred"), Chinese and Japanese numerals (二十五, 三千五百), digits ("1,500", "2.5"); answers
written with digits, rounded for the ear."""

from __future__ import annotations

import math
import re

ONES = {"zero": 0, "oh": 0, "one": 1, "a": 1, "an": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
        "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
        "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19}
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
        "ninety": 90}
SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
FRACTIONS = {"half": 0.5, "quarter": 0.25, "third": 1 / 3}
NUMBER_WORDS = frozenset({*ONES, *TENS, *SCALES, "and", "point", "dozen"}) - {"a", "an", "oh"}

CJK_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "兩": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
              "八": 8, "九": 9}
CJK_UNITS = {"十": 10, "百": 100, "千": 1_000, "万": 10_000, "萬": 10_000, "亿": 100_000_000, "億": 100_000_000}
CJK_NUMBER = "[0-9０-９零〇一二两兩三四五六七八九十百千万萬亿億.．点點]+"
_FULLWIDTH = str.maketrans("０１２３４５６７８９．，", "0123456789.,")

# One number said in English: digits ("1,500.5"), or words ("a hundred and five", "two and a half").
_EN_WORD = (r"(?:zero|oh|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
            r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
            r"thousand|million|billion|dozen|point|and)\b")
EN_NUMBER = (rf"(?:\d[\d,]*(?:\.\d+)?|(?:an? (?=(?:hundred|thousand|million|billion|dozen)\b))?"
             rf"(?:{_EN_WORD}[\s-]*)+(?:and an? (?:half|quarter)\b)?)")


def parse_english(text: str) -> float | None:
    """An English number said in digits or words ("two hundred and five", "1,500", "three point five", "two and
    a half", "a dozen"), or None."""
    t = text.strip().lower().replace("-", " ")
    if not t:
        return None
    if re.fullmatch(r"\d[\d,]*(?:\.\d+)?", t):
        return float(t.replace(",", ""))
    words = t.split()
    half = 0.0
    if len(words) >= 3 and words[-2] in ("a", "an") and words[-1] in FRACTIONS and words[-3] == "and":
        half, words = FRACTIONS[words[-1]], words[:-3]  # "two and a half"
    elif len(words) == 2 and words[0] in ("a", "an", "one") and words[1] in FRACTIONS:
        return FRACTIONS[words[1]]  # "a half", "a quarter"
    if words and words[-1] in ("half", "quarter") and len(words) == 1:
        return FRACTIONS[words[0]]
    total, current, seen = 0.0, 0.0, False
    decimals: list[int] | None = None
    for i, w in enumerate(words):
        if decimals is not None:
            if w in ONES and ONES[w] < 10:
                decimals.append(ONES[w])
                continue
            return None
        if re.fullmatch(r"\d+(?:\.\d+)?", w):
            current += float(w)
        elif w in ("a", "an"):
            if i + 1 >= len(words) or words[i + 1] not in (*SCALES, "dozen"):
                return None
            current += 1
        elif w in ONES:
            current += ONES[w]
        elif w in TENS:
            current += TENS[w]
        elif w == "dozen":
            current = (current or 1) * 12
        elif w in SCALES:
            scale = SCALES[w]
            if scale == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * scale
                current = 0.0
        elif w == "and":
            if not seen:
                return None
            continue
        elif w == "point":
            decimals = []
            continue
        else:
            return None
        seen = True
    if not seen:
        return None
    value = total + current
    if decimals:
        value += float("0." + "".join(map(str, decimals)))
    return value + half


def parse_cjk(text: str) -> float | None:
    """A Chinese or Japanese numeral (三千五百, 二十五, 十, 3.5, ３), or None."""
    t = text.strip().translate(_FULLWIDTH).replace("点", ".").replace("點", ".")
    if not t:
        return None
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return float(t)
    if "." in t:
        whole, _, frac = t.partition(".")
        w = parse_cjk(whole) if whole else 0.0
        digits = [CJK_DIGITS.get(c) for c in frac]
        if w is None or not digits or any(d is None for d in digits):
            return None
        return w + float("0." + "".join(str(d) for d in digits))
    total, section, digit = 0, 0, None
    for c in t:
        if c.isdigit():
            digit = (digit or 0) * 10 + int(c)
        elif c in CJK_DIGITS:
            digit = CJK_DIGITS[c]
        elif c in CJK_UNITS:
            unit = CJK_UNITS[c]
            if unit >= 10_000:
                total += (section + (digit or 0)) * unit
                section = 0
            else:
                section += (digit if digit is not None else 1) * unit
            digit = None
        else:
            return None
    return float(total + section + (digit or 0))


def parse_number(text: str) -> float | None:
    """A number in English, Chinese/Japanese numerals or digits, or None."""
    value = parse_english(text)
    return value if value is not None else parse_cjk(text)


def say_number(value: float) -> str:
    """``value`` as the answer writes it: an integer plainly ("1500"), else at most four significant digits
    ("0.3333", "3.142", "1234.6"); a huge or tiny one in plain words of its size."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError("not a finite number")
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    magnitude = math.floor(math.log10(abs(value)))
    digits = max(0, 3 - magnitude)
    text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


def is_exact(value: float) -> bool:
    """Whether :func:`say_number` writes ``value`` exactly (no rounding)."""
    return say_number(value) == (str(int(value)) if value == int(value) else repr(value))


__all__ = ["CJK_NUMBER", "EN_NUMBER", "NUMBER_WORDS", "is_exact", "parse_cjk", "parse_english", "parse_number",
           "say_number"]
