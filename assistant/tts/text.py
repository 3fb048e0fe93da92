"""Where sentences end, and which characters are CJK: the one source for the chunker, the TTS service and
the CosyVoice front end.

Sentence ends, in order of priority at each position of a text:
  * a newline;
  * CJK ``。！？；`` anywhere (``!``/``?`` count as CJK marks right after CJK text);
  * ``. ! ? …`` (runs such as ``?!`` or ``...`` and closing quotes/brackets included) followed by whitespace
    or CJK, except after abbreviations (``Mr.``, ``e.g.``, ``U.S.``), initials (``J. K.``), a list number at
    the start (``1. ``), or when the next word starts in lower case (``approx. five``); ``3.5`` never breaks
    because no space follows the dot;
  * optionally (the chunker's first clause) a clause mark ``, ; : —`` followed by a space, or CJK ``，、：``,
    once the text before it is long enough to say (:func:`spoken_length`: a CJK letter counts as two).
A long clause with no mark yet may also be cut before a joining word (:func:`phrase_break`: ``and``, ``with``,
``because``, ...), for a voice that speaks only whole pieces while its listener has little speech ahead.
A ``.`` at the very end of text still arriving is undecided (``3.`` may become ``3.5``): :func:`find_break`
says so by returning ``None`` unless told the text is complete.
"""

from __future__ import annotations

import re

SENTENCE_END = ".!?…"
CJK_SENTENCE_END = "。！？；!?"  # fullwidth and ASCII marks right after CJK text
CLAUSE_MARKS = ",;:"
# Of those, the marks that end a clause even as the text's last character when a letter is before them ("I'm sorry,"
# as the model writes it): no number goes on from there ("3,000" has a digit before its comma, and "https:" is why
# ":" is not one), so the first piece need not wait for the next token's space, one model step.
LETTER_CLAUSE_MARKS = ",;"
CJK_CLAUSE_MARKS = "，、：；"
DASHES = "—–"
CLOSERS = "\"'”’)]}」』）》"
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "approx", "no", "nos", "fig",
    "inc", "ltd", "co", "corp", "dept", "est", "gen", "gov", "sgt", "capt", "col", "lt", "rev", "hon",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "vol", "ch",
    "pp", "ca", "cf", "al", "ave", "blvd", "rd", "min", "max", "tel", "ft", "oz", "lb", "lbs",
})

# English words that open a phrase a listener hears as a natural place to pause before ("a coffee | with sugar",
# "messages | or calls", "today | because it rains"): a voice-chat reply's long clause may be cut before one. Words
# that bind tightly to what precedes ("of", "to", "so", "than", "for") are left out.
PHRASE_WORDS = frozenset({
    "and", "but", "or", "nor", "with", "without", "because", "which", "who", "whose", "when", "where", "while",
    "if", "unless", "until", "although", "though", "after", "before", "since",
})
# The text before a phrase break is at least this long (~0.8 s of speech): no one- or two-word pieces.
PHRASE_MIN_CHARS = 12
_PHRASE_WORD = re.compile(r"(?<=\S) +([A-Za-z]+)(?= )")

_HAN = re.compile(r"[\u4e00-\u9fff]")
_DECIMAL = re.compile(r"^[$€£¥]?\d[\d,]*\.\d+%?$")  # "3.50." ends a sentence; "U.S." does not


# --- CJK ---------------------------------------------------------------------------------------------------


def is_cjk(ch: str) -> bool:
    """One character of CJK script or punctuation: kana, Han (with extension A and compatibility forms),
    Hangul syllables, fullwidth forms, CJK symbols and punctuation. Such text has no spaces between words."""
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF
            or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF or 0x3000 <= o <= 0x303F)


def has_cjk(text: str) -> bool:
    """Any CJK character in ``text`` (see :func:`is_cjk`)."""
    return any(is_cjk(c) for c in text)


def spoken_length(text: str) -> int:
    """``text``'s length as time to say it, in Latin letters: a CJK letter (a syllable, or a mora or two) counts
    as two, since Mandarin is spoken at ~5 characters a second and Japanese at ~7, English at ~14."""
    return len(text) + sum(1 for c in text if is_cjk(c) and c.isalnum())


def starts_cjk(text: str) -> bool:
    """The first character is CJK: pieces that join without a space."""
    return bool(text) and is_cjk(text[0])


def contains_chinese(text: str) -> bool:
    """Any Han ideograph (U+4E00-U+9FFF): CosyVoice's test for its Chinese text path, kept as the reference
    has it (kana-only Japanese and Korean take the other path)."""
    return bool(_HAN.search(text))


# --- sentence ends -----------------------------------------------------------------------------------------


def find_break(buf: str, *, final: bool, clause_min_chars: int | None = None) -> int | None:
    """End index (exclusive) of the first complete sentence in ``buf``, or ``None``.

    ``final``: no more text will follow (a trailing ``.`` ends a sentence). ``clause_min_chars``: also break at
    a clause mark once the text before it is that long (:func:`spoken_length`; the chunker's early first clause).
    """
    n = len(buf)
    i = 0
    while i < n:
        c = buf[i]
        if c == "\n":
            if buf[:i].strip():
                return i + 1
        elif c in CJK_SENTENCE_END and (c not in "!?" or (i > 0 and is_cjk(buf[i - 1]))):
            j = skip_closers(buf, i + 1, SENTENCE_END + CJK_SENTENCE_END)
            return j if j < n or final else None  # wait: "。" may become "。」" or "。。", as "." waits for "3.5"
        elif c in SENTENCE_END:
            j = skip_closers(buf, i + 1, SENTENCE_END)
            if j >= n:
                return j if final else None  # wait: "3." may become "3.5", "?" may become "?!"
            if (buf[j].isspace() or is_cjk(buf[j])) and (
                "." not in buf[i:j] or _period_ends_sentence(buf, i, j, final)
            ):
                return j
            i = j
            continue
        elif clause_min_chars is not None and is_clause_break(buf, i):
            j = skip_closers(buf, i + 1, "")
            if spoken_length(buf[:j].strip()) >= clause_min_chars:
                return j
        i += 1
    return None


def phrase_break(buf: str) -> int | None:
    """Where a clause with no mark yet may be cut: the space before the last whole word of :data:`PHRASE_WORDS`
    with at least :data:`PHRASE_MIN_CHARS` before it; ``None`` if the text holds CJK, ends a sentence already (a
    reply handed over whole), or has no such word. Only whole words count (a space after them), so "with" is never
    the start of "without"."""
    if has_cjk(buf) or buf.rstrip().rstrip(CLOSERS)[-1:] in tuple(SENTENCE_END):
        return None
    cut = None
    for m in _PHRASE_WORD.finditer(buf):
        if m.group(1).lower() in PHRASE_WORDS and len(buf[: m.start()].strip()) >= PHRASE_MIN_CHARS:
            cut = m.start()
    return cut


def split_sentences(text: str) -> list[str]:
    """A whole text → its sentences, as raw slices: ``"".join(result) == text`` (whitespace between
    sentences stays at the start of the next one; callers strip or keep it)."""
    out: list[str] = []
    rest = text
    while rest:
        end = find_break(rest, final=True)
        if end is None:
            out.append(rest)
            break
        out.append(rest[:end])
        rest = rest[end:]
    return out


def join_short(pieces: list[str], min_chars: int) -> list[str]:
    """Strip each piece and glue one shorter than ``min_chars`` to the next (the last to the one before);
    CJK pieces join without a blank. Pieces with nothing to say (no letter or digit) are dropped."""
    out: list[str] = []
    carry = ""
    for raw in pieces:
        piece = raw.strip()
        carry = f"{carry} {piece}".strip() if carry and not starts_cjk(piece) else carry + piece
        if len(carry) >= min_chars:
            out.append(carry)
            carry = ""
    if carry:
        if out and len(carry) < min_chars:
            out[-1] = f"{out[-1]} {carry}" if not starts_cjk(carry) else out[-1] + carry
        else:
            out.append(carry)
    return [s for s in out if any(c.isalnum() for c in s)]


def skip_closers(buf: str, j: int, marks: str) -> int:
    """Extend past repeated marks (``?!``, ``...``) and closing quotes/brackets."""
    while j < len(buf) and (buf[j] in marks or buf[j] in CLOSERS):
        j += 1
    return j


def is_clause_break(buf: str, i: int) -> bool:
    """``buf[i]`` ends a clause: ``, ; :`` before a space (not ``3,000`` or ``10:30``), ``,`` or ``;`` after a letter
    at the end of ``buf`` (:data:`LETTER_CLAUSE_MARKS`), a CJK clause mark, a dash between words (not ``1–2``)."""
    c = buf[i]
    if c in CJK_CLAUSE_MARKS:
        return True
    nxt = buf[i + 1] if i + 1 < len(buf) else ""
    if c in CLAUSE_MARKS:
        return nxt.isspace() if nxt else ends_on_letter_clause_mark(buf)  # not "3,000", "10:30"; at the end: "3," waits
    if c in DASHES:  # "word — word" or "word—word"; not "1–2"
        return c == "—" or (i > 0 and buf[i - 1] == " " and nxt == " ")
    return False


def ends_on_letter_clause_mark(buf: str) -> bool:
    """``buf`` ends on a comma or semicolon right after a letter (:data:`LETTER_CLAUSE_MARKS`: "I'm sorry,"): a
    clause's end however the text goes on."""
    return len(buf) >= 2 and buf[-1] in LETTER_CLAUSE_MARKS and buf[-2].isalpha()


def _period_ends_sentence(buf: str, i: int, j: int, final: bool) -> bool:
    """Whether the ``.`` run at ``buf[i:j]`` (followed by whitespace) ends a sentence."""
    if buf[i:j].startswith(("..", "…")):
        token = ""
    else:
        m = re.search(r"(\S+)$", buf[:i])
        token = m.group(1).lstrip("\"'“‘([{") if m else ""
    low = token.lower()
    if low in ABBREVIATIONS or ("." in token and not _DECIMAL.match(token)):  # Mr. / e.g. / U.S. / a.m.
        return False
    if len(token) == 1 and token.isalpha() and token.isupper() and token != "I":  # initials: J. K.
        return False
    if token.isdigit() and len(token) <= 3 and not buf[: i - len(token)].strip():  # "1. Buy milk"
        return False
    k = j
    while k < len(buf) and buf[k].isspace():
        k += 1
    if k >= len(buf):
        return final  # need the next word to tell "approx. five" from "end. Next"
    return not buf[k].islower()


__all__ = [
    "ABBREVIATIONS",
    "CJK_CLAUSE_MARKS",
    "CJK_SENTENCE_END",
    "CLAUSE_MARKS",
    "CLOSERS",
    "DASHES",
    "SENTENCE_END",
    "contains_chinese",
    "ends_on_letter_clause_mark",
    "find_break",
    "has_cjk",
    "is_cjk",
    "is_clause_break",
    "join_short",
    "phrase_break",
    "split_sentences",
    "starts_cjk",
]
