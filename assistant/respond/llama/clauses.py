"""Where a reply's clauses end, and the limit that makes a reply cut by ``max_tokens`` end at one."""

from __future__ import annotations

HOLD_TOKENS = 24  # near max_tokens, text after the last clause mark waits this many tokens for the clause's end
# Whole clauses of at least this many characters (~1.5 s of speech, the speech path's runway,
# chunker.reply_runway_chars) are out: the reply may sit out steps for others' first clauses (engine.voiced) and
# its caller still hears no gap.
VOICED_CHARS = 24

# A clause ends at one of these (CJK ones need no space after them).
CLAUSE_MARKS = ".!?…;:,"
CJK_CLAUSE_MARKS = "。！？；：，、"
CLOSERS = "\"'”’)]}」』）》"


def clause_end(text: str) -> int:
    """The end (an index into ``text``) of its last complete clause: after a clause mark (and any closing quote
    or bracket) followed by a space, or after a CJK mark; 0 if there is none. A mark at the very end counts
    only as the reply's last character (see :func:`ends_clause`)."""
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch in CJK_CLAUSE_MARKS:
            j = i + 1
            while j < len(text) and text[j] in CLOSERS:
                j += 1
            return j
        if ch.isspace() and i > 0:
            j = i
            while j > 0 and text[j - 1] in CLOSERS:
                j -= 1
            if j > 0 and text[j - 1] in CLAUSE_MARKS:
                return i
    return 0


def ends_clause(text: str) -> bool:
    """True if ``text`` (the whole reply so far) ends with a clause mark (closers and spaces aside)."""
    body = text.rstrip().rstrip(CLOSERS)
    return bool(body) and (body[-1] in CLAUSE_MARKS or body[-1] in CJK_CLAUSE_MARKS)


def clauses_length(text: str) -> int:
    """How much of ``text`` (a reply so far) is whole clauses, the part the speech path can voice now."""
    return len(text.rstrip()) if ends_clause(text) else clause_end(text)


class ClauseLimit:
    """Holds back, near ``max_tokens``, the text after the last clause mark; the reply so ends at a clause.

    ``feed(delta, n)`` (``n`` tokens made so far) returns the text that may be said now; ``finish(cut)`` what
    is left to say when the reply ends (``cut``: it was stopped by the limit, so an unfinished clause is dropped).
    """

    def __init__(self, max_tokens: int) -> None:
        self.hold_from = max(0, max_tokens - HOLD_TOKENS)
        self.held = ""
        self.said = False
        self.dropped = ""

    def feed(self, delta: str, n_tokens: int) -> str:
        if n_tokens <= self.hold_from and not self.held:
            self.said = self.said or bool(delta.strip())
            return delta
        self.held += delta
        cut = clause_end(self.held)
        out, self.held = self.held[:cut], self.held[cut:]
        self.said = self.said or bool(out.strip())
        return out

    def finish(self, cut: bool) -> str:
        held, self.held = self.held, ""
        if not cut or ends_clause(held) or not self.said:
            return held  # the reply's own end; or a limit so small that nothing else would be said
        self.dropped = held
        return ""

