"""Cut a stream of reply text into pieces a TTS engine can speak: the first clause as early as possible
(time to first audio), then whole sentences (natural prosody), never longer than ``max_chars``.

Rules, in order of priority at each position:
  * a newline ends a chunk (lists, paragraphs);
  * a sentence end — ``. ! ? …`` followed by whitespace, or CJK ``。！？；`` (no space needed) — ends a chunk,
    except after abbreviations (``Mr.``, ``e.g.``, ``U.S.``), initials (``J. K.``), a list number at the
    start of a chunk (``1. ``), or when the next word starts in lower case (``approx. five``);
    a number like ``3.5`` never breaks because no space follows the dot;
  * before the first chunk only: a clause break (``, ; : —`` followed by a space, or CJK ``，、：``) ends it
    once the clause has ``first_min_chars`` characters;
  * a chunk longer than ``max_chars`` is cut at its last space (or CJK clause mark) before the limit.
A trailing ``.`` is held until the next character arrives, since ``3.`` may become ``3.5``; :meth:`flush`
releases everything at the end of the reply.
"""

from __future__ import annotations

import re

from assistant.config import ChunkerConfig

SENTENCE_END = ".!?…"
CJK_SENTENCE_END = "。！？；!?"  # fullwidth and ASCII marks right after CJK text
CLAUSE_MARKS = ",;:"
CJK_CLAUSE_MARKS = "，、：；"
DASHES = "—–"
CLOSERS = "\"'”’)]}」』）》"
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "approx", "no", "nos", "fig",
    "inc", "ltd", "co", "corp", "dept", "est", "gen", "gov", "sgt", "capt", "col", "lt", "rev", "hon",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "vol", "ch",
    "pp", "ca", "cf", "al", "ave", "blvd", "rd", "min", "max", "tel", "ft", "oz", "lb", "lbs",
})
HARD_LIMIT_FACTOR = 2  # text with no space at all (a URL, CJK with no marks) is cut hard at 2 × max_chars

_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_LINE_PREFIX = re.compile(r"^\s*(?:#{1,6}\s+|[-*+•]\s+|>\s*)")
_MD_EMPHASIS = re.compile(r"(\*\*|__|\*|`+|~~)")


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF
            or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF or 0x3000 <= o <= 0x303F)


def speakable(text: str) -> str:
    """Strip the Markdown an LLM likes to emit (``**bold**``, ``# heading``, ``- item``, links, ticks)."""
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_LINE_PREFIX.sub("", text)
    text = _MD_EMPHASIS.sub("", text)
    return " ".join(text.split()) if not any(_is_cjk(c) for c in text) else text.strip()


class TextChunker:
    """Incremental chunker for one reply: ``push(delta)`` as text streams in, ``flush()`` at the end.

    After :meth:`flush` the chunker is ready for the next reply (the first-clause rule applies again).
    """

    def __init__(self, cfg: ChunkerConfig | None = None, *, first_min_chars: int | None = None,
                 max_chars: int | None = None, strip_markdown: bool = True) -> None:
        cfg = cfg or ChunkerConfig()
        self.first_min_chars = cfg.first_min_chars if first_min_chars is None else first_min_chars
        self.max_chars = max(8, cfg.max_chars if max_chars is None else max_chars)
        self.strip_markdown = strip_markdown
        self._buf = ""
        self._sent_first = False

    def reset(self) -> None:
        """Drop pending text (barge-in) and start a new reply."""
        self._buf = ""
        self._sent_first = False

    @property
    def pending(self) -> str:
        """Text received but not yet released."""
        return self._buf

    def push(self, delta: str) -> list[str]:
        """Add a text delta; return the chunks that are now complete (often none)."""
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of the reply: return every remaining chunk and reset for the next reply."""
        out = self._drain(final=True)
        rest = self._emit(self._buf)
        if rest:
            out.append(rest)
        self.reset()
        return out

    # --- internals -----------------------------------------------------------------------------------

    def _drain(self, *, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            end = self._find_break(self._buf, final)
            if end is None:
                end = self._forced_break(self._buf)
            if end is None:
                return out
            piece, self._buf = self._buf[:end], self._buf[end:].lstrip()
            chunk = self._emit(piece)
            if chunk:
                out.append(chunk)
                self._sent_first = True

    def _emit(self, piece: str) -> str:
        text = speakable(piece) if self.strip_markdown else piece.strip()
        # Nothing to say (only punctuation or markup): drop it rather than send TTS an empty request.
        return text if any(c.isalnum() for c in text) else ""

    def _find_break(self, buf: str, final: bool) -> int | None:
        """End index (exclusive) of the first complete chunk in ``buf``, or ``None``."""
        n = len(buf)
        i = 0
        while i < n:
            c = buf[i]
            if c == "\n":
                if buf[:i].strip():
                    return i + 1
            elif c in CJK_SENTENCE_END and (c not in "!?" or (i > 0 and _is_cjk(buf[i - 1]))):
                j = self._skip_closers(buf, i + 1, SENTENCE_END + CJK_SENTENCE_END)
                return j
            elif c in SENTENCE_END:
                j = self._skip_closers(buf, i + 1, SENTENCE_END)
                if j >= n:
                    return j if final else None  # wait: "3." may become "3.5", "?" may become "?!"
                if buf[j].isspace() or _is_cjk(buf[j]):
                    if "." not in buf[i:j] or self._period_ends_sentence(buf, i, j, final):
                        return j
                    i = j
                    continue
                i = j
                continue
            elif not self._sent_first and self._is_clause_break(buf, i):
                j = self._skip_closers(buf, i + 1, "")
                if len(buf[:j].strip()) >= self.first_min_chars:
                    return j
            i += 1
        return None

    @staticmethod
    def _skip_closers(buf: str, j: int, marks: str) -> int:
        """Extend past repeated marks (``?!``, ``...``) and closing quotes/brackets."""
        while j < len(buf) and (buf[j] in marks or buf[j] in CLOSERS):
            j += 1
        return j

    @staticmethod
    def _is_clause_break(buf: str, i: int) -> bool:
        c = buf[i]
        if c in CJK_CLAUSE_MARKS:
            return True
        nxt = buf[i + 1] if i + 1 < len(buf) else ""
        if c in CLAUSE_MARKS:
            return nxt.isspace()  # "3,000" and "10:30" are not breaks; "," at the very end waits
        if c in DASHES:  # "word — word" or "word—word"; not "1–2"
            return c == "—" or (i > 0 and buf[i - 1] == " " and nxt == " ")
        return False

    def _period_ends_sentence(self, buf: str, i: int, j: int, final: bool) -> bool:
        """Whether the ``.`` run at ``buf[i:j]`` (followed by whitespace) ends a sentence."""
        if buf[i:j].startswith(("..", "…")):
            token = ""
        else:
            m = re.search(r"(\S+)$", buf[:i])
            token = m.group(1).lstrip("\"'“‘([{") if m else ""
        low = token.lower()
        if low in ABBREVIATIONS or "." in token:  # Mr. / etc. / e.g. / U.S. / a.m.
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

    def _forced_break(self, buf: str) -> int | None:
        """A cut for text with no sentence end within ``max_chars``.

        Preference: the last clause mark past a third of the limit, else the last space, else a CJK
        character boundary, else the first space after the limit; a hard cut only at twice the limit.
        """
        limit = self.max_chars
        if len(buf) <= limit:
            return None
        for k in range(limit, limit // 3, -1):
            if self._is_clause_break(buf, k - 1) and buf[k - 1] not in DASHES:
                return k
        space = max(buf.rfind(" ", 0, limit + 1), buf.rfind("\t", 0, limit + 1))
        if space > 0:
            return space + 1
        for k in range(limit, 0, -1):
            if _is_cjk(buf[k - 1]) or _is_cjk(buf[k]):
                return k
        space = buf.find(" ", limit)
        if space > 0:
            return space + 1
        if len(buf) >= HARD_LIMIT_FACTOR * limit:
            return limit
        return None
