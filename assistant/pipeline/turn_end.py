"""Is the user done? A transcript-based guess that shortens or lengthens the end-of-speech wait.

Silence alone cannot tell "What is the weather like today?" (done) from "I would like to order …"
(thinking). The speculative transcript can: terminal punctuation on a sentence that does not end in a word
that usually continues it means done; a trailing conjunction, article, preposition, filler or a verb that
wants an object means the user is most likely still going.
"""

from __future__ import annotations

import re
from enum import Enum

# Words after which an English sentence usually goes on (Whisper often puts a period after them anyway).
CONTINUES = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "so",
        "because",
        "if",
        "when",
        "while",
        "although",
        "though",
        "than",
        "then",
        "to",
        "of",
        "for",
        "with",
        "in",
        "on",
        "at",
        "from",
        "by",
        "about",
        "into",
        "onto",
        "over",
        "under",
        "after",
        "before",
        "like",
        "as",
        "my",
        "your",
        "his",
        "her",
        "our",
        "their",
        "its",
        "this",
        "that",
        "these",
        "those",
        "some",
        "any",
        "every",
        "each",
        "um",
        "uh",
        "er",
        "erm",
        "hmm",
        "well",
        "is",
        "are",
        "was",
        "were",
        "am",
        "be",
        "been",
        "being",
        "want",
        "wants",
        "need",
        "needs",
        "get",
        "gets",
        "have",
        "has",
        "order",
        "buy",
        "make",
        "take",
        "give",
        "tell",
        "show",
        "find",
        "book",
        "call",
        "set",
        "play",
        "would",
        "could",
        "should",
        "can",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "do",
        "does",
        "did",
    ]
)
TERMINAL = ".?!。？！"
WORD = re.compile(r"[\w']+")


class TurnEnd(Enum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    UNKNOWN = "unknown"


def judge(text: str) -> TurnEnd:
    """Guess from a transcript whether the utterance is finished."""
    t = text.strip()
    if not t:
        return TurnEnd.UNKNOWN
    if t.endswith(("...", "…", ",", "-", "—", ":")):
        return TurnEnd.INCOMPLETE
    words = WORD.findall(t.lower())
    if words and words[-1] in CONTINUES:
        return TurnEnd.INCOMPLETE
    if t[-1] in "?!？！":
        return TurnEnd.COMPLETE
    if t[-1] in TERMINAL:
        # A one-word "Yes." or "Thanks." is as complete as it gets; longer ones too unless they trail off.
        return TurnEnd.COMPLETE
    return TurnEnd.UNKNOWN
