"""Honest doubt: where the small model is unsure of a factual answer, its own token probabilities say so, and it
says it does not know instead of inventing one.

For a factual question (:func:`is_factual_question`: "what is the capital of …", "how many legs …",
"中国的首都是哪里？"; not a request, not a question about the user or the assistant), the reply's first
sentence is held while the model writes it (:class:`DoubtGate`), each token with the model's log-probability
of it. Its score is the least likely word after the first (a word's tokens' log-probabilities summed; in
Chinese, Japanese or Korean each token its own word): the answer's uncertain words, not the phrasing's first
choice ("The", "A"). Below the language's threshold, the reply is a brief "I'm not sure." in the turn's
language; else the sentence goes on as written.

The thresholds (:data:`THRESHOLDS`) were chosen with ``python -m lab doubt`` on tuning requests only (the tuning
half of ``lab replies`` and ``lab/data/facts_tuning.json``: 103 simple facts), for the bundled SmolLM2-135M, by one
rule: a tenth below the lowest score of a right answer, so that no right answer is lost. In English (59 right, 29
wrong) its right answers' least likely word went down to -2.76 (it phrases freely: "The play's original script was
written by William Shakespeare."), so -2.8, which catches 6 of the 29 wrong ones (most of its wrong answers are
confident: "The capital of Turkey is Istanbul." scores -0.33). In the languages it barely speaks it answered none of
the 15 tuning questions right (it echoes the question, or writes nonsense), and the most confident of those first
sentences scored -0.34: there the rule gives -0.2, so it says it is not sure unless it is nearly certain. A held first
sentence costs the listener little: the speech path waits for the first clause anyway, and a short factual sentence
has no earlier break.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# Language → the least likely word's log-probability below which the small model says it is not sure ("*": any
# language but these). Chosen on the tuning requests only (see the module docstring).
THRESHOLDS: dict[str, float] = {"en": -2.8, "*": -0.2}
MAX_HELD_TOKENS = 32  # a first sentence that runs on this long is judged as it stands

NOT_SURE = {
    "en": "I'm not sure, sorry.", "zh": "抱歉，我不确定。", "ja": "すみません、よくわかりません。",
    "ko": "죄송해요, 잘 모르겠어요.",
    "fr": "Je ne suis pas sûr, désolé.", "es": "No estoy seguro, lo siento.", "de": "Das weiß ich leider nicht sicher.",
}

_EN_QUESTION = re.compile(r"^\s*(?:(?:and|so|ok|okay|hey|please)[, ]+)?(?:what|which|who|whom|whose|where|when|"
                          r"how (?:many|much|old|far|long|big|tall|deep|high|fast|heavy)|in (?:which|what)|"
                          r"name (?:the|a))\b", re.I)
_EN_PERSONAL = re.compile(r"\b(?:i|i'm|i've|me|my|mine|we|us|our|you|you're|your|yours|should|shall|recommend|"
                          r"suggest|best|good|favou?rite|like|think|feel|weather|news|today|tonight|tomorrow|now|"
                          r"time|date)\b|^\s*what(?:'s| is) an? ", re.I)
_OTHER_QUESTION = {
    "zh": (re.compile(r"哪里|哪儿|什么|几|多少|谁|哪个|哪一|哪些|是否"),
           re.compile(r"我|你|您|推荐|建议|应该|今天|现在|天气")),
    "ja": (re.compile(r"どこ|何|なに|なん|誰|だれ|いくつ|どれ|いつ|どの"),
           re.compile(r"私|僕|あなた|おすすめ|今日|今|天気")),
    "ko": (re.compile(r"어디|무엇|뭐|몇|누구|언제|어느|얼마"),
           re.compile(r"나는|내가|저는|제가|당신|추천|오늘|지금|날씨")),
}
_SENTENCE_END = re.compile(r"[.!?…](?=\s)|[。！？]")


def is_factual_question(text: str, language: str) -> bool:
    """Whether ``text`` asks a fact about the world (where a wrong answer is worse than "I'm not sure")."""
    lang = (language or "en").split("-")[0].lower()
    if lang in _OTHER_QUESTION:
        asks, personal = _OTHER_QUESTION[lang]
        return bool(asks.search(text)) and not personal.search(text)
    return bool(_EN_QUESTION.search(text)) and not _EN_PERSONAL.search(text)


def threshold(language: str) -> float:
    return THRESHOLDS.get((language or "en").split("-")[0].lower(), THRESHOLDS["*"])


def not_sure(language: str) -> str:
    return NOT_SURE.get((language or "en").split("-")[0].lower(), NOT_SURE["en"])


def _cjk(text: str) -> bool:
    return any(c >= "\u2e80" for c in text)


def least_likely_word(tokens: list[tuple[str, float]]) -> float:
    """The least likely word after the first (0.0 when there is none). A word is the tokens from a space to the
    next (" 2" + "4": one word, "Pol" + "and": one word); a punctuation mark or a CJK token is a word of its own."""
    words: list[float] = []
    open_word = False  # the last token left a word that the next may go on with
    for text, logprob in tokens:
        if words and open_word and text[:1].isalnum() and not _cjk(text):
            words[-1] += logprob
        else:
            words.append(logprob)
        open_word = (not text.strip() and text != "") or (text[-1:].isalnum() and not _cjk(text))
    scored = words[1:]
    return min(scored) if scored else 0.0


@dataclass
class DoubtGate:
    """Holds a factual answer's first sentence while the model writes it, then lets it go on or says it is not
    sure (see the module docstring). Feed each token's text and log-probability."""

    language: str
    limit: float = field(init=False)
    tokens: list[tuple[str, float]] = field(default_factory=list)
    held: str = ""
    decided: bool = False
    doubted: bool = False
    score: float = 0.0

    def __post_init__(self) -> None:
        self.limit = threshold(self.language)

    def feed(self, text: str, logprob: float | None) -> str:
        """What of the reply may go on now ("" while the first sentence is held)."""
        if self.decided:
            return text
        self.held += text
        if logprob is not None and math.isfinite(logprob):
            self.tokens.append((text, logprob))
        if _SENTENCE_END.search(self.held.strip() + " ") is None and len(self.tokens) < MAX_HELD_TOKENS:
            return ""
        return self.decide()

    def decide(self) -> str:
        """Judge what is held (the reply ended, or its first sentence did): it goes on, or :attr:`doubted`."""
        if self.decided:
            return ""
        self.decided = True
        self.score = least_likely_word(self.tokens)
        self.doubted = bool(self.tokens) and self.score < self.limit
        held, self.held = self.held, ""
        return "" if self.doubted else held


__all__ = ["NOT_SURE", "THRESHOLDS", "DoubtGate", "is_factual_question", "least_likely_word", "not_sure",
           "threshold"]
