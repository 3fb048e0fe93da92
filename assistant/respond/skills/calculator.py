"""Arithmetic, exactly: "what is two plus three", "15 percent of 80", "the square root of 81", "三加五等于几",
"3足す5は", "3 더하기 5는". The words become an expression (``+ - * / ^ %``, parentheses, ``sqrt``), parsed by a
small recursive-descent parser (never ``eval``), with bounded numbers."""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

from assistant.respond.skills.base import Asked, SkillError, pick
from assistant.respond.skills.numbers import CJK_NUMBER, NUMBER_WORDS, parse_cjk, parse_english, say_number

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e15  # numbers (and results) beyond this are refused: not what anyone asks a voice assistant
MAX_EXPONENT = 64

_EN_LEAD = re.compile(r"^(?:(?:hey|ok|okay|so|um|uh|please|quick question)[, ]+)*(?:(?:can|could|would) you "
                      r"(?:please )?)?(?:tell me |calculate |compute |work out |what(?:'s| is| are| does| do)? ?|"
                      r"how much (?:is|are|does|do) |solve )?", re.I)
_EN_TAIL = re.compile(r"\s*(?:,? please)?\s*(?:equal|equals|make|makes|come to|give|give you)?\s*[?.!]*\s*$", re.I)
_EN_WORDS = (
    (r"\bthe square root of\b|\bsquare root of\b", " sqrt "),
    (r"\bmultiplied by\b|\btimes\b|×|\bx\b(?=\s*[\d(])", " * "),
    (r"\bdivided by\b|\bover\b|÷", " / "),
    (r"\bto the power of\b|\braised to(?: the power of)?\b|\bto the\b(?=\s*\d)", " ^ "),
    (r"\bsquared\b", " ^ 2 "), (r"\bcubed\b", " ^ 3 "),
    (r"\bplus\b|\badded to\b", " + "), (r"\bminus\b|\btake away\b", " - "),
    (r"\bper ?cent\b", " % "), (r"(?<=%)\s*of\b", " * "),
    (r"\bhalf of\b", " 0.5 * "), (r"\bdouble\b", " 2 * "), (r"\btriple\b", " 3 * "),
)
_EN_ADD = re.compile(r"^add (.+?) (?:and|to) (.+)$")
_EN_SUBTRACT = re.compile(r"^subtract (.+?) from (.+)$")
_EN_PREFIX = re.compile(r"^(?:the |a )?(?:sum|total) of (.+?) and (.+)$")
# Digits joined by two or more hyphens with no spaces ("555-213-4490", "1-800-555-0199", "2021-11-05"): a phone
# number, a date or a code as the ASR writes it, never a sum ("5 minus 3 minus 1" is written with words or spaces).
_EN_DIGIT_CHAIN = re.compile(r"\d+(?:-\d+){2,}")
# What may be left of a request once it is arithmetic: numbers, operators, parentheses and sqrt. Any other word left
# ("my number is 555 - 213") says it was not a sum.
_LEFT_WORD = re.compile(r"(?!sqrt\b)[^\W\d_]+")

_CJK_TAIL = re.compile(r"(?:等于|等於|是|は|는|은)?(?:几|幾|多少|多少呢|什么|いくつ|何|なん|얼마)?"
                       r"(?:ですか|でしょう|입니까|예요|에요|인가요|야|呢|啊)?[？?。.！!\s]*$")
_CJK_WORDS = (
    (r"加上|加|足す|たす|プラス|더하기", " + "), (r"减去|減去|减|減|引く|ひく|マイナス|빼기", " - "),
    (r"乘以|乘|掛ける|かける|×|곱하기", " * "), (r"除以|割る|わる|÷|나누기", " / "),
    (r"的平方", " ^ 2 "), (r"的立方", " ^ 3 "),
)

_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|sqrt|[-+*/^%()])")
_OPS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by", "^": "to the power of"}
_OPS_OTHER = {
    "zh": {"+": "加", "-": "减", "*": "乘以", "/": "除以", "^": "的次方"},
    "ja": {"+": "足す", "-": "引く", "*": "掛ける", "/": "割る", "^": "の累乗"},
    "ko": {"+": " 더하기 ", "-": " 빼기 ", "*": " 곱하기 ", "/": " 나누기 ", "^": " 제곱 "},
}


class _Parser:
    """expr := term (('+'|'-') term)*; term := power (('*'|'/') power)*; power := unary ('^' power)?;
    unary := '-' unary | postfix; postfix := atom '%'*; atom := number | '(' expr ')' | 'sqrt' atom."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0
        self.operators = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            self.operators += 1
            value = _check(value + self.term() if op == "+" else value - self.term())
        return value

    def term(self) -> float:
        value = self.power()
        while self.peek() in ("*", "/"):
            op = self.take()
            self.operators += 1
            right = self.power()
            if op == "/" and right == 0:
                raise ZeroDivisionError
            value = _check(value * right if op == "*" else value / right)
        return value

    def power(self) -> float:
        base = self.unary()
        if self.peek() == "^":
            self.take()
            self.operators += 1
            exponent = self.power()
            if abs(exponent) > MAX_EXPONENT:
                raise OverflowError
            return _check(math.pow(base, exponent))
        return base

    def unary(self) -> float:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.postfix()

    def postfix(self) -> float:
        value = self.atom()
        while self.peek() == "%":
            self.take()
            self.operators += 1
            value /= 100
        return value

    def atom(self) -> float:
        token = self.peek()
        if token is None:
            raise ValueError("expression ends too soon")
        self.take()
        if token == "(":
            value = self.expr()
            if self.peek() != ")":
                raise ValueError("unclosed parenthesis")
            self.take()
            return value
        if token == "sqrt":
            self.operators += 1
            value = self.atom()
            if value < 0:
                raise ValueError("square root of a negative number")
            return math.sqrt(value)
        if token[0].isdigit():
            return _check(float(token))
        raise ValueError(f"unexpected {token!r}")


def _check(value: float) -> float:
    if math.isnan(value) or abs(value) > MAX_MAGNITUDE:
        raise OverflowError
    return value


def tokens(expression: str) -> list[str] | None:
    """The expression's tokens, or None if anything in it is not arithmetic."""
    text = expression.strip()
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                return None
            break
        out.append(m.group(1))
        pos = m.end()
    return out


def evaluate(expression: str) -> tuple[float, int]:
    """The value of an arithmetic expression and how many operators it has; ValueError if it is not one,
    ZeroDivisionError, OverflowError."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    toks = tokens(expression)
    if not toks:
        raise ValueError("not an arithmetic expression")
    parser = _Parser(toks)
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()!r}")
    return value, parser.operators


def _numbers_to_digits(text: str) -> str:
    """English number words in ``text`` as digits ("two hundred and five plus one" → "205 + 1")."""
    text = re.sub(r"\ban? (?=(?:hundred|thousand|million|billion|dozen)\b)", "one ", text)
    text = re.sub(r"\band an? (half|quarter)\b", lambda m: " point five" if m[1] == "half" else " point two five", text)
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        tail = []
        while run and run[-1] == "and":  # "two and" before an operator word: the "and" is not the number's
            tail.append(run.pop())
        if run:
            value = parse_english(" ".join(run))
            out.append(say_number(value) if value is not None else " ".join(run))
            run.clear()
        out.extend(tail)

    for word in re.findall(r"\d[\d,]*(?:\.\d+)?|[a-z]+|[^\sa-z\d]", text):
        clean = word.replace(",", "") if word[0].isdigit() else word
        if clean[0].isdigit() or (clean in NUMBER_WORDS and (clean != "and" or run)):
            run.append(clean)
        else:
            flush()
            out.append(word)
    flush()
    return " ".join(out)


def english_expression(text: str) -> str | None:
    """The arithmetic an English request asks for ("what's two plus three?" → "2 + 3"), or None."""
    t = " ".join(text.lower().replace("’", "'").split())
    if _EN_DIGIT_CHAIN.search(t):
        return None
    t = _EN_TAIL.sub("", _EN_LEAD.sub("", t, count=1))
    for pattern, (a, b) in ((_EN_ADD, ("{0}", "{1}")), (_EN_SUBTRACT, ("{1}", "{0}")), (_EN_PREFIX, ("{0}", "{1}"))):
        if m := pattern.match(t):
            op = " - " if pattern is _EN_SUBTRACT else " + "
            t = f"({a.format(*m.groups())}){op}({b.format(*m.groups())})"
            break
    for words, repl in _EN_WORDS:
        t = re.sub(words, repl, t)
    return _numbers_to_digits(t)


def cjk_expression(text: str) -> str:
    """The arithmetic a Chinese, Japanese or Korean request asks for ("三加五等于几" → "3 + 5")."""
    t = _CJK_TAIL.sub("", text.strip())
    for pattern, repl in _CJK_WORDS:
        t = re.sub(pattern, repl, t)

    def digits(m: re.Match[str]) -> str:
        value = parse_cjk(m.group(0))
        return f" {say_number(value)} " if value is not None else m.group(0)

    return re.sub(CJK_NUMBER, digits, t)


def spoken(expression: str, lang: str) -> str:
    """The expression as the answer says it ("2 + 3" → "2 plus 3", "15 % * 80" → "15 percent of 80")."""
    toks = tokens(expression) or []
    toks = [("of" if lang == "en" else "×") if t == "*" and i and toks[i - 1] == "%" else t
            for i, t in enumerate(toks)]
    if lang == "en":
        words = {**_OPS, "%": "percent", "sqrt": "the square root of"}
        text = " ".join(words.get(t, t) for t in toks).replace("( ", "(").replace(" )", ")")
        return re.sub(r"to the power of (2|3)$", lambda m: "squared" if m[1] == "2" else "cubed", text)
    ops = _OPS_OTHER.get(lang, {})
    return "".join(ops.get(t, t) for t in toks).replace("sqrt", "√").strip()


class CalculatorSkill:
    """``calculate``: an arithmetic expression's value."""

    name = "calculate"
    acts = False  # it only answers
    description = ("Exact arithmetic: + - * / ^ (power), % (percent), parentheses, sqrt(x). Use it for any "
                   "calculation instead of working it out yourself.")
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2 + 3 * 4, 15 % * 80, sqrt(81)"}},
        "required": ["expression"],
    }

    def intent(self, text: str, language: str) -> dict[str, Any] | None:
        if len(text) > MAX_EXPRESSION_CHARS:
            return None
        expression = english_expression(text) if language not in ("zh", "ja", "ko") else cjk_expression(text)
        if expression is None:
            return None
        try:
            _, operators = evaluate(expression)
        except (ValueError, ZeroDivisionError, OverflowError):
            is_sum = _has_operator(expression) and not _LEFT_WORD.search(expression)
            return {"expression": _tidy(expression)} if is_sum else None
        return {"expression": _tidy(expression)} if operators else None

    async def run(self, asked: Asked) -> str:
        expression = str(asked.arguments.get("expression", ""))
        lang = asked.lang()
        try:
            value, _ = evaluate(expression)
        except ZeroDivisionError:
            raise SkillError(pick(lang, {"en": "You can't divide by zero.", "zh": "不能除以零。",
                                         "ja": "ゼロで割ることはできません。",
                                         "ko": "0으로 나눌 수 없습니다."})) from None
        except OverflowError:
            raise SkillError(pick(lang, {"en": "That number is too big for me.", "zh": "这个数字太大了。",
                                         "ja": "その数は大きすぎます。", "ko": "숫자가 너무 큽니다."})) from None
        except ValueError:
            raise SkillError(pick(lang, {"en": "I couldn't work that sum out.", "zh": "我算不出来。",
                                         "ja": "その計算はできませんでした。",
                                         "ko": "그 계산은 할 수 없었어요."})) from None
        result = say_number(value)
        rounded = float(result) != value
        said = spoken(expression, lang)
        if lang == "en":
            answer = f"{said} is {'about ' if rounded else ''}{result}."
            return answer[:1].upper() + answer[1:]
        return pick(lang, {"zh": f"{said}等于{'约' if rounded else ''}{result}。",
                           "ja": f"{said}は{'約' if rounded else ''}{result}です。",
                           "ko": f"{said}의 답은 {'약 ' if rounded else ''}{result}입니다."})


def _tidy(expression: str) -> str:
    """One space between tokens, no parentheses around a lone number."""
    return re.sub(r"\(\s*(\d+(?:\.\d+)?)\s*\)", r"\1", " ".join(expression.split()))


def _has_operator(expression: str) -> bool:
    """An expression with an operator between two numbers: a sum that fails (÷ 0) is still a sum."""
    return bool(re.search(r"\d\s*[-+*/^]\s*\(?\s*\d", expression))


__all__ = ["CalculatorSkill", "cjk_expression", "english_expression", "evaluate"]
