"""Is the user done? The end-of-turn policy: the evidence at a pause weighed, by :func:`decide`.

One vocabulary across the family: the **evidence** at a pause (:class:`Evidence`) is the transcript's word
(:func:`judge` → :class:`TurnEnd`, :func:`cue` → :class:`Cue`) and the end-of-turn model's probability
(``vad/end_of_turn.py``, Smart Turn v3.2, behind the :class:`EndOfTurnModel` protocol); :func:`decide` turns
them into a :class:`Decision` with the policy ``turn.policy`` names. ``python -m lab eot`` replays the same
:func:`decide` on recorded evidence (docs/end_of_turn.md: the corpus, the curves, the operating point).

**The transcript rule.** Silence alone cannot tell "What is the weather like today?" (done) from "I would like
to order …" (thinking). The speculative transcript can: terminal punctuation on a sentence that does not end
in a word that usually continues it means done; a trailing conjunction, article, preposition, filler or a
verb that wants an object means the user is most likely still going; a number may be half said ("My number
is 555 [pause] 2134"); a fragment of one or two words ("Hello?") is where Whisper's punctuation is least
reliable.

**The falling policy** (``turn.policy = "falling"``, the default). The score is the model's latest probability
plus the transcript cue's weight (``turn.cue_*``); the turn ends once the score reaches a threshold that falls
as the silence grows, from ``falling_from`` at the speculative pause to ``falling_to`` at ``falling_over_ms``,
then on, more slowly, to ``falling_late_to`` at ``falling_late_ms`` (an unsure turn the transcript does not veto
ends well before the cap), and at ``max_silence_ms`` whatever the evidence. The model hears the pause again at
each silence of ``end_of_turn_recheck_ms`` (one run of ~40-50 ms of one Zen 5 core each, ~115 on an older
EPYC; the marks passed while the transcript was being made are heard once it lands, at the latest of them: a run
beside the ASR pass slows it, and the decision waits for the transcript anyway). A model very sure on its own
(``model_alone``) ends the turn whatever the threshold, as soon as the transcript has landed and unless it
vetoes (``model_alone_veto``, e.g. a trailing "and"): the veto is free, since the reply is made from that
transcript and nothing of it could be heard sooner. With the model off or failed, ``model_off_prob`` stands
in for its answer. A turn is thus never cut at once by one
confident but wrong signal, and never waits a fixed "unsure" time when the evidence only needs a little more
silence to be believed. Every number is chosen on the tuning half of the corpus (``TurnConfig``'s help texts).

**The flat policy** (``turn.policy = "flat"``, before issue 34), kept for comparison: :func:`weigh` once.
At a pause of ``turn.speculative_pause_ms`` the speculative turn starts (its transcript is the
text evidence) and the end-of-turn model hears the audio so far. Each signal has its switch:
``turn.smart_endpoint`` (text), ``turn.end_of_turn_model`` (audio). What they say sets how much more silence
ends the turn:

| text \\ audio    | sure (p ≥ sure) | leaning (p ≥ threshold) | not complete | audio off          |
|-----------------|-----------------|-------------------------|--------------|--------------------|
| a continuation  | incomplete      | incomplete              | incomplete   | incomplete         |
| finished        | now             | unsure                  | unsure       | complete           |
| neither         | now             | unsure                  | max          | vad.end_silence_ms |
| text off        | now             | now                     | max          | vad.end_silence_ms |

(incomplete, unsure, complete, max: ``turn.incomplete_endpoint_ms``, ``unsure_endpoint_ms``,
``complete_endpoint_ms``, ``max_silence_ms`` of silence in all; sure, threshold: ``turn.end_of_turn_sure``,
``end_of_turn_threshold``.) With the transcript asked too, only a sure model ends the turn at once: when the ASR
answers within a mid-sentence pause (a fast ASR does), a sentence Whisper closed with "?" or "." ("Can you book
a table for it?", "Please add eggs, milk.") and a model at 0.6-0.8 on a synthetic voice would otherwise cut the
user off. Measured on the pause files over WebRTC, the model says up to 0.8 at their mid-sentence pauses after
such a text and 0.85-0.98 at the finished sentences it recognises; a finished text the model is not sure of
waits ``unsure_endpoint_ms`` (800 ms), past the longest such pause (672 ms), and a text that trails off the
longer ``incomplete_endpoint_ms``.

While an answer the switches ask for is still coming, the turn is held open (up to ``max_silence_ms``):
the speculative ASR is the turn's own ASR, so waiting for it costs the reply nothing, and a busy machine
(slow ASR) then never cuts a sentence off only because the evidence came late. The moment the last answer
arrives the verdict is taken again (turn-taking hears each answer as it lands, not on the next audio chunk).

A text that ends on a preposition, an article, a conjunction or a verb waiting for its object is never
complete, whatever the audio says (the model was trained on human speech; on generated voices it calls
mid-sentence pauses complete). When the two disagree the turn waits ``unsure_endpoint_ms``. When the
transcript was asked for but failed (its ASR raised), the model alone does not end the turn either: the
fixed silence does, as with no evidence at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

import numpy as np

from assistant.config import TurnConfig
from assistant.tts.text import is_cjk

# Words after which an English sentence usually goes on (Whisper often puts a period or "?" after them anyway).
CONTINUES = frozenset([
    "a", "an", "the", "and", "or", "but", "so", "because", "if", "when", "while", "although", "though", "than",
    "then", "to", "of", "for", "with", "in", "on", "at", "from", "by", "about", "into", "onto", "over", "under",
    "after", "before", "like", "as", "my", "your", "his", "her", "our", "their", "its", "this", "that", "these",
    "those", "some", "any", "every", "each", "um", "uh", "er", "erm", "hmm", "well", "is", "are", "was", "were",
    "am", "be", "been", "being", "want", "wants", "need", "needs", "get", "gets", "have", "has", "order", "buy",
    "make", "take", "give", "tell", "show", "find", "book", "call", "set", "play", "would", "could", "should",
    "can", "will", "shall", "may", "might", "must", "do", "does", "did",
    # prepositions that seldom end a sentence ("What is the distance between?" is Whisper's "?"; some may: MAY_END)
    "between", "through", "across", "against", "toward", "towards", "among", "amongst", "beneath", "beside",
    "besides", "within", "without", "via", "upon", "during", "throughout", "versus",
])
# Of those, the words a finished sentence may still end on, with its final punctuation: a stranded preposition or
# particle ("What are you looking for?", "Turn the lights on."), an auxiliary ("Yes, I do."), a demonstrative
# ("What is that?"), a verb whose object went before ("What do you want?"). Such a text is held as
# Cue.TRAILING (``turn.trailing_hold_ms``), not vetoed to the cap: tiny.en writes "I'd like to order." and "How do I
# get to?" at mid-turn pauses too, so it waits longer than a plain finished text, but not two seconds. The rest
# of CONTINUES (articles, conjunctions, possessives, fillers, "between") end no finished sentence.
MAY_END = frozenset([
    "then", "to", "of", "for", "with", "in", "on", "at", "from", "by", "about", "into", "over", "under", "after",
    "before", "like", "this", "that", "these", "those", "some", "any", "each", "well", "so", "when", "while",
    "though", "her", "his", "is", "are", "was", "were", "am", "be", "been", "being", "want", "wants", "need",
    "needs", "get", "gets", "have", "has", "order", "buy", "make", "take", "give", "tell", "show", "find", "book",
    "call", "set", "play", "would", "could", "should", "can", "will", "shall", "may", "might", "must", "do",
    "does", "did", "through", "without", "within", "besides",
])
# "like" after a subject or "would" is the verb of a wish, whose object is still to come ("I'd like. [pause] a
# latte"): no finished sentence, as "What's the weather like?" is.
WISH = re.compile(r"\b(?:i|you|we|they|he|she|would)(?:'d)?\s+like\W*$", re.IGNORECASE)
# Sentences finished whatever their last word (and PARTICLE_ON, below): a question whose wh-word is the object of
# the preposition left at its end ("What are you looking for?", "Who am I speaking to?", "What's the weather
# like?"; not "in": tiny.en writes "What's the weather in?" at the pause of "What's the weather in, uh, Paris?"),
# and "so" standing for a clause ("I think so.", "I'm afraid so.").
STRANDED = re.compile(r"(?:^|[.?!]\s+)(?:what|who|whom|which)\b[^.?!]*\b(?:for|to|from|about|of|with|like|on|at)"
                      r"\s*[.?!]$", re.IGNORECASE)
# "on" as the particle of a device's verb after its object ("Turn the lights on.", "Can you switch it back on?"),
# where it is no preposition waiting for one (the corpus's pauses are "Turn on the [pause] lights …").
PARTICLE_ON = re.compile(r"\b(?:turn|switch|leave|keep)\s+(?:it|them|this|that|everything|(?:the|my|your|our|all the|"
                         r"that|this)\s+[\w'-]+(?:\s+[\w'-]+)?)\s+(?:back\s+)?on\s*[.?!]$", re.IGNORECASE)
SO_CLAUSE = re.compile(r"\b(?:think|hope|guess|believe|suppose|afraid|say|said|told you) so\s*[.?!]$", re.IGNORECASE)
TERMINAL = ".?!。？！"
# Japanese endings that go on: particles and fillers a phrase stops on mid-turn ("明日の", "東京で", "えーと").
JA_CONTINUES = ("の", "を", "に", "が", "は", "と", "で", "も", "へ", "から", "けど", "けれど", "って", "えーと",
                "えっと", "あの", "その")
ENDS_ON_DIGIT = re.compile(r"\d[\d,.]*[.?!。？！]?\s*$")
WORD = re.compile(r"[\w']+")
# The end of a transcript the number rules read (a number and the words that name it fit well within it): their
# patterns, anchored at the end, cost the square of a long run of digits, spaces and dashes that fails at its end
# (1.7 s for 6,000 characters on the event loop); bounded, the worst of 300 random long texts took 8 ms.
NUMBER_TAIL_CHARS = 200
ASKED_TAIL_CHARS = 300  # ... and of the assistant's last words, where its question is


def _end(text: str) -> str:
    """The transcript's last :data:`NUMBER_TAIL_CHARS`, which the number rules read."""
    return text[-NUMBER_TAIL_CHARS:]


class TurnEnd(Enum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    UNKNOWN = "unknown"


class Cue(Enum):
    """How complete a transcript looks, for the falling-threshold policy (each has its weight in TurnConfig)."""

    COMPLETE = "complete"  # terminal punctuation, no trailing continuation word
    CONTINUES = "continues"  # a trailing conjunction, article, preposition, filler, comma or ellipsis
    OPEN = "open"  # no terminal punctuation and nothing that continues (or no words at all)
    NUMBER = "number"  # ends on a number: a phone number, a code or a time may be only half said
    SHORT = "short"  # fewer than SHORT_TURN_WORDS words ("Hello?"): Whisper's punctuation is least reliable
    DOUBTFUL = "doubtful"  # a pronoun object the ASR was unsure of ("for | it?"), after words that go on
    TRAILING = "trailing"  # final punctuation after a word that usually goes on but may end it ("looking for?")


# A number that reads as finished, a time ("at 10:30", "at 1030.", "at eight.") or an amount ("$12."), is no
# half-said digit string: only the latter (a phone number or a code being read out) holds the turn as Cue.NUMBER.
# Not ":00": Whisper writes a lone spoken hour as "7:00" ("Set an alarm for seven [pause] fifteen..." is heard
# "Set an alarm for 7:00." at the pause), so only minutes that were said make a time finished.
CLOCK_TIME = re.compile(r"\b\d{1,2}:(?!00)\d{2}\s*[.?!]?\s*$")
AMOUNT = re.compile(r"[$£€¥]\s?\d[\d,.]*[.?!]?\s*$")
# A time of day written as its two spoken numbers ("Set an alarm for 8 15", "… for 10, 15."), in a sentence about
# a time: an hour, then minutes said (not a lone hour, which minutes may follow).
SPOKEN_TIME = re.compile(r"\b(?:alarm|wake|remind|reminder|meeting|appointment|schedule|reservation|call)\b[^.?!]*"
                         r"\b(?:for|at|until|till|by)\s+(?:1[0-2]|0?[1-9])[\s,.]+(?!00)[0-5]\d\s*[.?!]?\s*$",
                         re.IGNORECASE)
TIME_WORDS = frozenset(["at"])  # "at 1030." (a time of day); "for 10" / "to 100" may go on ("for 10 minutes")
# A transcript of fewer words than this is a fragment (Cue.SHORT): "Hello, [pause] what is the weather like
# today?" is the commonest pause a turn must survive.
SHORT_TURN_WORDS = 3
NUMBER_WORDS = frozenset([
    "zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty", "forty",
    "fifty", "sixty", "seventy", "eighty", "ninety", "hundred", "thousand", "million",
])


def word_count(text: str) -> int:
    """Words in a transcript; CJK text (no spaces) counts a word per two characters."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    other = "".join(" " if is_cjk(ch) else ch for ch in text)
    return len(WORD.findall(other)) + (cjk + 1) // 2


def cue(text: str, last_word_p: float | None = None, doubtful_below: float = 0.0, whole_digits: int = 0,
        asked: str = "", phone_plan: str = "") -> Cue:
    """The transcript's evidence: how complete it looks (final punctuation, a trailing conjunction, a number).

    ``last_word_p``: how sure the ASR was of the last word (None: not known). A pronoun object written with less
    than ``doubtful_below`` after words that go on is :attr:`Cue.DOUBTFUL` (:func:`doubtful_tail`): at a pause
    after "for", tiny.en writes a made-up object ("Can you book a table for it?", "it" at 0.40-0.51 as the pass is
    cut later into the pause, tests/test_asr.py) that reads finished. A digit string of ``whole_digits`` or more
    (0: none) is no :attr:`Cue.NUMBER` (``turn.number_whole_digits``); nor is an answer to what the assistant
    ``asked`` that is whole by that question (:func:`expected_digits`: "What is your four-digit PIN?" → "1234."),
    nor a phone number whole by ``phone_plan`` (:func:`whole_phone_number`: "My number is 555-2134.")."""
    words = WORD.findall(text.lower())
    if not words:
        return Cue.OPEN
    if judge(text) is TurnEnd.INCOMPLETE:
        return Cue.TRAILING if may_end(text) else Cue.CONTINUES
    expected = expected_digits(asked)
    if expected is not None and answers_with_number(text, expected):
        return Cue.COMPLETE  # "1234." to "What is your PIN?": a whole answer, however short
    if whole_phone_number(text, phone_plan, asked):
        return Cue.COMPLETE  # "555-2134." to "What is your phone number?", or "My number is 555-2134"
    if word_count(text) < SHORT_TURN_WORDS:
        return Cue.SHORT
    if last_word_p is not None and last_word_p < doubtful_below and doubtful_tail(text):
        return Cue.DOUBTFUL
    if ends_on_number(text, words):
        if whole_by_length(text, whole_digits, expected):
            return Cue.COMPLETE  # "My number is 555-213-4490": Whisper often writes no full stop after digits
        if not finished_number(text, words, whole_digits, expected):
            return Cue.NUMBER
    return Cue.COMPLETE if judge(text) is TurnEnd.COMPLETE else Cue.OPEN


def may_end(text: str) -> bool:
    """Whether a text that reads unfinished (:func:`judge`) may still be a finished sentence: it ends with final
    punctuation ("." "?" "!", no ellipsis) on a word of :data:`MAY_END` ("What are you looking for?", "Yes, I do."),
    not on a wish's "like" ("I'd like.")."""
    t = text.strip()
    if not t or t[-1] not in ".?!" or t.endswith(("...", "…")) or WISH.search(t):
        return False
    words = WORD.findall(t.lower())
    return bool(words) and words[-1] in MAY_END and t[:-1].rstrip()[-1:].isalnum()


LAST_WORD = re.compile(r"[\w']+\W*$")
# The objects Whisper makes up at a pause after a word that goes on ("…a table for it?", "…a meeting with you."):
# short pronouns, which the audio before the pause predicts without hearing them. Not "here"/"there" ("…get to
# the hospital from here?" ends turns).
MADE_UP_OBJECTS = frozenset(["it", "that", "this", "them", "you", "me", "him", "her", "us", "one", "these", "those"])


def doubtful_tail(text: str) -> bool:
    """Whether the text ends on a pronoun object after words that go on ("… a table for" | "it?"): the text reads
    unfinished without it. Only for text with spaces between words (a CJK text's last "word" is no word)."""
    t = text.strip()
    if not t or is_cjk(t[-1]):
        return False
    words = WORD.findall(t.lower())
    if not words or words[-1] not in MADE_UP_OBJECTS:
        return False
    rest = LAST_WORD.sub("", t).rstrip()
    return bool(rest) and judge(rest) is TurnEnd.INCOMPLETE


def last_word_probability(words: Sequence[tuple[str, float]]) -> float | None:
    """The ASR's probability of the transcript's last word (punctuation apart), from its (word, probability)
    pairs; None when it gave none."""
    for word, p in reversed(words):
        if any(ch.isalnum() for ch in word):
            return p
    return None


def _is_number(word: str) -> bool:
    return word.isdigit() or word in NUMBER_WORDS


# Digit runs apart from the words around them ("555-213-449" → 555 213 449; "電話番号は706" → 電話番号は 706).
NUMBER_TOKEN = re.compile(r"\d+|[^\W\d_]+")


def trailing_numbers(text: str) -> list[str]:
    """The run of numbers a transcript ends on, in order: digit runs and number words ("My number is five five
    five 2134." → five, five, five, 2134); empty when it ends on none."""
    tokens = NUMBER_TOKEN.findall(text.lower())
    i = len(tokens)
    while i > 0 and (tokens[i - 1].isdigit() or tokens[i - 1] in NUMBER_WORDS):
        i -= 1
    return tokens[i:]


def digits_said(text: str) -> int:
    """How many digits the transcript ends on: the digits of its trailing run of numbers, a number word counting
    one ("My number is 555-213-449" → 9, "... two nine nine." → 3, "at 1030." → 4)."""
    return sum(len(tok) if tok.isdigit() else 1 for tok in trailing_numbers(text))


def ends_on_number(text: str, words: list[str] | None = None) -> bool:
    """The transcript ends on a number word or a digit (a full stop may follow): the turns the number rules judge
    (``words``: its :data:`WORD` tokens, lower-cased, when the caller has them)."""
    words = WORD.findall(text.lower()) if words is None else words
    return bool(words) and (words[-1] in NUMBER_WORDS or ENDS_ON_DIGIT.search(_end(text)) is not None)


# What the assistant's question says of the number it wants: "a 4-digit code", "your four digit PIN" (so many digits),
# a PIN or a ZIP code (4, 5), and questions a count answers ("How many tickets?", "How old…": any number).
DIGITS_ASKED = re.compile(r"\b(\d{1,2}|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)[- ]digits?\b",
                          re.IGNORECASE)
NAMED_LENGTHS = ((re.compile(r"\bpin\b", re.IGNORECASE), 4), (re.compile(r"\bzip(?: code)?\b", re.IGNORECASE), 5))
COUNT_ASKED = re.compile(r"\bhow (?:many|much|old)\b", re.IGNORECASE)  # not "how long": "10" … "minutes"
WORD_NUMBERS = {w: i for i, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                            "nine", "ten", "eleven", "twelve"])}


# What the speaker says the number is, and the digits that make one whole: a flight, room, table or order number
# (3: "Flight 1390."), a PIN (4), a ZIP code (5), a one-time code (6: read in two groups of three, "123 [pause]
# 456", so not 3). A phone number keeps turn.number_whole_digits (read in groups: "555 [pause] 213 [pause] 449").
NUMBER_NAMES = (
    (re.compile(r"\b(?:flight|room|table|order|gate|seat|platform|bus|train|line|extension)(?: number)?"
                r"(?: is| was|'s)?\s+(?:number\s+)?[\d\s-]+\W*$", re.IGNORECASE), 3),
    (re.compile(r"\bpin(?: code| number)?(?: is|'s)?\s+[\d\s-]+\W*$", re.IGNORECASE), 4),
    (re.compile(r"\b(?:zip|postal)(?: code)?(?: is|'s)?\s+[\d\s-]+\W*$", re.IGNORECASE), 5),
    (re.compile(r"\b(?:code|passcode|verification code|confirmation code)(?: is|'s)?\s+[\d\s-]+\W*$",
                re.IGNORECASE), 6),
)


def named_digits(text: str) -> int | None:
    """The digits that make the number a transcript ends on whole, by what the speaker called it ("my flight number
    is 1390." → 3, "the code is 123 456." → 6; :data:`NUMBER_NAMES`), or None when it names none of those."""
    end = _end(text)
    for pattern, length in NUMBER_NAMES:
        if pattern.search(end):
            return length
    return None


# A phone number by what the speaker called it ("My number is", "my cell's", "call me at") or by what the assistant
# asked for ("What's your phone number?"): whole when its digits make a whole number of the phone plan
# (turn.phone_plan). Whisper writes the digits of "five five five, two one three four" as "555-2134".
DIGIT_WORDS = {"oh": "0", **{w: str(n) for w, n in WORD_NUMBERS.items() if n < 10}}
_DIGITS_TAIL = r"(?:[\s,.()+-]|\d|\b(?:zero|oh|one|two|three|four|five|six|seven|eight|nine)\b)+\W*$"
PHONE_SAID = re.compile(
    r"(?:\b(?:my|our|his|her|their|the|your)\s+(?:(?:phone|cell|cellphone|mobile|home|work|office|callback|contact|"
    r"telephone)\s+)?number(?:'s|\s+is|\s+was)?|\b(?:phone|cell|mobile|telephone)(?:'s|\s+is)"
    r"|\b(?:call|reach|text|ring)\s+(?:me|us)\s+(?:back\s+)?(?:at|on))" + _DIGITS_TAIL, re.IGNORECASE)
PHONE_ASKED = re.compile(r"\b(?:phone|cell|cellphone|mobile|callback|telephone|contact) number\b"
                         r"|\bnumber (?:to|where|at which|on which) (?:we|i)? ?(?:can )?(?:reach|call|text)"
                         r"|\byour number\b", re.IGNORECASE)


def trailing_digits(text: str) -> str | None:
    """The digits of the digit string a transcript ends on, number words read as digits ("My number is five five
    five 2134." → "5552134"); None when it ends on none, or on a number word that is no one digit ("twenty")."""
    tokens = trailing_numbers(text)
    if not tokens or not all(tok.isdigit() or tok in DIGIT_WORDS for tok in tokens):
        return None
    return "".join(DIGIT_WORDS.get(tok, tok) for tok in tokens)


def nanp_whole(digits: str) -> bool:
    """Whether ``digits`` are a whole North American number: a local one (NXX-XXXX), one with its area code
    (NXX-NXX-XXXX) or that with the 1 before it; N is 2-9 (no exchange and no area code begins with 0 or 1, so a
    number from elsewhere, most of which begin with a trunk 0, and "1-800-555" are not whole here)."""
    n = "23456789"
    if len(digits) == 7:
        return digits[0] in n
    if len(digits) == 10:
        return digits[0] in n and digits[3] in n
    return len(digits) == 11 and digits[0] == "1" and digits[1] in n and digits[4] in n


PHONE_PLAN_RULES = {"nanp": nanp_whole}  # config.turn.PHONE_PLANS


def whole_phone_number(text: str, plan: str, asked: str = "") -> bool:
    """The transcript ends on a phone number (by the speaker's words, :data:`PHONE_SAID`, or by the question,
    :data:`PHONE_ASKED`) whose digits make a whole number of the phone ``plan`` (``turn.phone_plan``; "": none).
    A North American caller's "My number is 555-2134." is whole at seven digits; "555-213" is not."""
    whole = PHONE_PLAN_RULES.get(plan)
    if whole is None:
        return False
    digits = trailing_digits(text)
    if digits is None or not whole(digits):
        return False
    return bool(PHONE_SAID.search(_end(text)) or (asked and PHONE_ASKED.search(asked[-ASKED_TAIL_CHARS:])))


def expected_digits(asked: str) -> int | None:
    """How many digits make the number the assistant's last words asked for a whole answer: the length a question
    names ("your 6-digit code", "four digit PIN", a PIN: 4, a ZIP code: 5), 1 for a question a count answers ("How
    many tickets?"), None when it asked for no number (or said nothing)."""
    if not asked:
        return None
    tail = asked[-ASKED_TAIL_CHARS:]
    if m := DIGITS_ASKED.search(tail):
        n = m.group(1).lower()
        return int(n) if n.isdigit() else WORD_NUMBERS[n]
    for pattern, length in NAMED_LENGTHS:
        if pattern.search(tail):
            return length
    return 1 if COUNT_ASKED.search(tail) else None


def answers_with_number(text: str, expected: int) -> bool:
    """The whole transcript is a number of at least ``expected`` digits (a number word counts one), with final
    punctuation: the answer to a question that asked for it ("4521.", "Three.")."""
    t = text.strip()
    tokens = NUMBER_TOKEN.findall(t.lower())
    return (bool(tokens) and t[-1:] in ".?!。？！" and all(tok.isdigit() or tok in NUMBER_WORDS for tok in tokens)
            and digits_said(t) >= expected)


def whole_by_length(text: str, whole_digits: int = 0, expected: int | None = None) -> bool:
    """The number a transcript ends on is whole by its digits alone, whatever its punctuation: at least
    ``whole_digits`` (a phone number or a code), as many as the question asked for when it named a length
    (``expected`` above 1: a PIN, a ZIP code, "your 6-digit code"; a count's answer may go on, "3 [pause] adults"),
    or as many as what the speaker named needs (:func:`named_digits`). Whisper leaves out the full stop after a
    digit string more often than after words (the pause files' "My number is 555-213-449" at its end), and such a
    number read :attr:`Cue.OPEN` waited for the audio model alone, to the cap."""
    n = digits_said(text)
    if whole_digits and n >= whole_digits:
        return True
    if expected is not None and expected > 1 and n >= expected:
        return True
    named = named_digits(text)
    return named is not None and n >= named


def finished_number(text: str, words: list[str] | None = None, whole_digits: int = 0,
                    expected: int | None = None) -> bool:
    """A transcript ending on a number that reads as finished: a clock time ("10:30", "an alarm for 8 15"), an
    amount ("$12."), a time after "at" ("at 1030.", "at eight.") or, with ``whole_digits``, a digit string at
    least that long (a whole phone number: "My number is 555-213-449"), or with ``expected``
    (:func:`expected_digits`), as many digits as the question asked for, or as many as what the speaker named needs
    (:func:`named_digits`: "My flight number is 1390."). A shorter bare digit string ("My number is 555-213") may
    be half said."""
    end = _end(text)
    if CLOCK_TIME.search(end) or AMOUNT.search(end) or SPOKEN_TIME.search(end):
        return True
    if whole_by_length(text, whole_digits, expected):
        return True
    if expected is not None and digits_said(text) >= expected:  # a count, as asked for ("How many?" → "3")
        return True
    words = WORD.findall(text.lower()) if words is None else words
    i = len(words)
    while i > 0 and _is_number(words[i - 1]):
        i -= 1
    return 0 < i < len(words) and words[i - 1] in TIME_WORDS


def judge(text: str) -> TurnEnd:
    """Guess from a transcript whether the utterance is finished."""
    t = text.strip()
    if not t:
        return TurnEnd.UNKNOWN
    if t.endswith(("...", "…", ",", "-", "—", ":", "、", "，", "：")):
        return TurnEnd.INCOMPLETE
    if STRANDED.search(t) or SO_CLAUSE.search(t) or PARTICLE_ON.search(t):
        return TurnEnd.COMPLETE
    words = WORD.findall(t.lower())
    if words and words[-1] in CONTINUES:
        return TurnEnd.INCOMPLETE
    if is_cjk(t[-1]) and t.endswith(JA_CONTINUES):  # Japanese that stops on a particle or a filler
        return TurnEnd.INCOMPLETE
    if t[-1] in "?!？！":
        return TurnEnd.COMPLETE
    if t[-1] in TERMINAL:
        # A one-word "Yes." or "Thanks." is as complete as it gets; longer ones too unless they trail off.
        return TurnEnd.COMPLETE
    return TurnEnd.UNKNOWN


# How much audio before the point where the VAD heard the speech come back the end-of-turn model hears too: the
# endpointer hears an onset ~150-250 ms after it (its speech windows), and the word's start belongs to the speech.
RESUME_LEAD_MS = 300


def since_pause(audio: np.ndarray, resumed: int | None, sample_rate: int = 16_000) -> np.ndarray:
    """What the end-of-turn model hears (``turn.end_of_turn_since_pause``): ``audio`` from ``RESUME_LEAD_MS``
    before ``resumed`` (samples into ``audio`` where the speech came back after the utterance's latest pause;
    None or before the start: the whole of it)."""
    if resumed is None:
        return audio
    return audio[max(0, resumed - RESUME_LEAD_MS * sample_rate // 1000):]


class EndOfTurnModel(Protocol):
    """The audio end-of-turn model as the pipeline sees it (``vad/end_of_turn.SmartTurnBatcher``)."""

    async def probability(self, audio: np.ndarray) -> float:
        """Probability (0…1) that the speech in ``audio`` (16 kHz float32, the turn so far) is a finished turn."""
        ...


@dataclass(frozen=True)
class Verdict:
    """What to do at this pause: end the turn now, wait ``end_silence_ms`` of silence in all, or (pending)
    keep the endpointer's current setting until the evidence is in."""

    commit: bool = False
    end_silence_ms: int | None = None
    pending: bool = False
    reason: str = ""


PENDING = Verdict(pending=True, reason="pending")


@dataclass
class Evidence:
    """What is known at a pause: the transcript's answer (``text``/``cue``, None until the ASR answers) and
    the model's answers so far, ``probs`` as (silence in ms when the model heard the audio, probability).
    ``use_text``/``use_audio``: which answers are coming at all (a signal that failed is not waited for)."""

    use_text: bool
    use_audio: bool
    text: TurnEnd | None = None
    cue: Cue | None = None
    words: int = 0
    probs: list[tuple[int, float]] = field(default_factory=list)

    @property
    def prob(self) -> float | None:
        """The model's latest answer."""
        return self.probs[-1][1] if self.probs else None


@dataclass(frozen=True)
class Decision:
    """At this much silence: end the turn now, or let ``end_silence_ms`` of silence end it (None: the
    endpointer's own ``vad.end_silence_ms``)."""

    end_now: bool
    end_silence_ms: int | None = None
    reason: str = ""
    needed_ms: int | None = None  # ending now: the silence the decision needed (None: none past the first ask)
    sure: bool = False  # ending now on evidence sure enough for the reply to be heard at once (turn.confirm_sure)


def falling_threshold(cfg: TurnConfig, pause_ms: int, late: bool = True) -> float:
    """The score that ends the turn after ``pause_ms`` of silence: ``falling_from`` at the speculative pause,
    down in a straight line to ``falling_to`` at ``falling_over_ms``; then the late stage, down in a straight
    line to ``falling_late_to`` at ``falling_late_ms`` (none when ``falling_late_ms`` is not past
    ``falling_over_ms``, or ``late`` is False: a cue in ``falling_late_veto``); flat after."""
    if late and late_stage(cfg) and pause_ms > cfg.falling_over_ms:
        g = min(1.0, (pause_ms - cfg.falling_over_ms) / (cfg.falling_late_ms - cfg.falling_over_ms))
        return cfg.falling_to + (cfg.falling_late_to - cfg.falling_to) * g
    span = max(1, cfg.falling_over_ms - cfg.speculative_pause_ms)
    f = min(1.0, max(0.0, (pause_ms - cfg.speculative_pause_ms) / span))
    return cfg.falling_from + (cfg.falling_to - cfg.falling_from) * f


def late_stage(cfg: TurnConfig) -> bool:
    """Whether the threshold keeps falling after ``falling_over_ms``: ``falling_late_ms`` past it and
    ``falling_late_to`` below ``falling_to`` (it never rises)."""
    return cfg.falling_late_ms > cfg.falling_over_ms and cfg.falling_late_to < cfg.falling_to


def late_allowed(cfg: TurnConfig, ev: Evidence) -> bool:
    """The late stage applies to this evidence: the transcript (when asked) is in and its cue does not veto it
    (``falling_late_veto``: a trailing "and", a half-said digit string, a fragment hold to ``max_silence_ms``)."""
    return not ev.use_text or (ev.cue is not None and ev.cue.value not in cfg.falling_late_veto)


def cue_at(cfg: TurnConfig, ev: Evidence, pause_ms: int) -> Cue | None:
    """The transcript's cue in force after ``pause_ms`` of silence: a held cue (:func:`hold_ms`) is judged as any
    other text (by its punctuation) once the silence reaches its hold: someone reading out a number pauses
    between its groups, and someone who stopped on "to" goes on, not that long."""
    if ev.cue is not None and 0 < hold_ms(cfg, ev.cue) <= pause_ms:
        return released(ev.cue, ev.text)
    return ev.cue


def hold_ms(cfg: TurnConfig, c: Cue) -> int:
    """How long a cue holds the turn before the text is judged by its punctuation: ``number_hold_ms`` for a
    number that may be half said, ``trailing_hold_ms`` for a trailing word; 0 (never released) for the rest."""
    if c is Cue.NUMBER:
        return cfg.number_hold_ms
    if c is Cue.TRAILING:
        return cfg.trailing_hold_ms
    return 0


def released(c: Cue, text: TurnEnd | None) -> Cue:
    """A cue once its hold is over: :attr:`Cue.NUMBER` becomes what the text's punctuation says (as :func:`cue`
    judges a text that ends on no number), :attr:`Cue.TRAILING` (final punctuation by definition) complete; any
    other cue stays."""
    if c is Cue.TRAILING:
        return Cue.COMPLETE
    if c is not Cue.NUMBER:
        return c
    return Cue.COMPLETE if text is TurnEnd.COMPLETE else Cue.OPEN


def cue_weight(cfg: TurnConfig, c: Cue) -> float:
    """What the transcript adds to the model's probability (``turn.cue_*``)."""
    return {
        Cue.COMPLETE: cfg.cue_complete, Cue.CONTINUES: cfg.cue_continues, Cue.OPEN: cfg.cue_open,
        Cue.NUMBER: cfg.cue_number, Cue.SHORT: cfg.cue_short, Cue.DOUBTFUL: cfg.cue_doubtful,
        Cue.TRAILING: cfg.cue_trailing,
    }[c]


def decide(cfg: TurnConfig, ev: Evidence, pause_ms: int, fixed_ms: int) -> Decision:
    """The end-of-turn policy at ``pause_ms`` of silence (``turn.policy``); ``fixed_ms`` is the endpointer's own
    silence (``vad.end_silence_ms``). The turn ends now (``end_now``), or once the silence reaches
    ``end_silence_ms`` (or ``fixed_ms`` when None), unless a later call decides otherwise. Turn-taking calls it
    on every chunk of a pause and whenever an answer lands; ``bench eot`` replays it on recorded evidence, so
    both run this same code."""
    if cfg.policy == "falling":
        return _falling(cfg, ev, pause_ms, fixed_ms)
    return _flat(cfg, ev, pause_ms, fixed_ms)


def _falling(cfg: TurnConfig, ev: Evidence, pause_ms: int, fixed_ms: int) -> Decision:
    """Score = the model's latest probability + the transcript cue's weight; the turn ends once the score
    reaches a threshold that falls as the silence grows (the model hears the pause again at
    ``end_of_turn_recheck_ms``), and at ``max_silence_ms`` whatever the evidence."""
    if not ev.use_text and not ev.use_audio:
        return Decision(end_now=False, reason="no_evidence")
    if pause_ms >= cfg.max_silence_ms:
        return Decision(end_now=True, reason="max_silence", needed_ms=cfg.max_silence_ms)
    if (ev.use_text and ev.cue is None) or (ev.use_audio and ev.prob is None):
        if cfg.wait_for_evidence:
            return Decision(end_now=False, end_silence_ms=cfg.max_silence_ms, reason="pending")
        return Decision(end_now=False, reason="pending")
    # A held cue's hold is over (cue_at): a decision it frees needed that hold's silence at least.
    held = ev.cue
    cue_now = cue_at(cfg, ev, pause_ms) if ev.use_text else ev.cue
    freed = cue_now is not held
    ev = replace(ev, cue=cue_now) if freed else ev
    floor = hold_ms(cfg, held) if freed and held is not None else 0
    p = ev.prob if ev.use_audio and ev.prob is not None else cfg.model_off_prob
    score = p + (cue_weight(cfg, ev.cue) if ev.use_text and ev.cue is not None else 0.0)
    sure = not freed and score >= cfg.confirm_sure
    if model_alone(cfg, ev):
        needed = min(pause_ms, max(cfg.speculative_pause_ms, next(ms for ms, q in ev.probs if q >= cfg.model_alone)))
        return Decision(end_now=True, reason="model_alone", needed_ms=max(needed, floor), sure=sure)
    if score >= falling_threshold(cfg, pause_ms, late_allowed(cfg, ev)):
        needed = silence_needed(cfg, ev, pause_ms)
        return Decision(end_now=True, reason=f"score_{ev.cue.value if ev.use_text and ev.cue else 'audio'}"
                        + (f"_after_{held.value}" if freed and held is not None else ""),
                        needed_ms=max(needed, floor), sure=sure)
    if freed and held is Cue.NUMBER and cue_now is Cue.COMPLETE:
        # Held for number_hold_ms and written finished ("The code is 3 1564."): judged by its punctuation, as the
        # hold promises, however unsure the model (after a digit string it rarely hears an end: such turns waited
        # for the cap).
        return Decision(end_now=True, reason="complete_after_number", needed_ms=floor)
    return Decision(end_now=False, end_silence_ms=cfg.max_silence_ms, reason="waiting")


def model_alone(cfg: TurnConfig, ev: Evidence) -> bool:
    """The model alone ends the turn: its latest answer is at least ``model_alone`` and the transcript, once
    landed, does not veto it (its cue is not in ``model_alone_veto``). Waiting for the transcript's veto costs
    nothing heard: the reply is made from the transcript, so no audio of it exists before the transcript does."""
    if not ev.use_audio or ev.prob is None or ev.prob < cfg.model_alone:
        return False
    return not ev.use_text or (ev.cue is not None and ev.cue.value not in cfg.model_alone_veto)


def silence_needed(cfg: TurnConfig, ev: Evidence, pause_ms: int) -> int:
    """The falling policy: the least silence at which the threshold had fallen to this evidence's score (at most
    ``pause_ms``), for the trace's split of the wait (the rest is waiting for the evidence itself)."""
    p = ev.prob if ev.use_audio and ev.prob is not None else cfg.model_off_prob
    score = p + (cue_weight(cfg, ev.cue) if ev.use_text and ev.cue is not None else 0.0)
    if score >= cfg.falling_from:
        return min(pause_ms, cfg.speculative_pause_ms)
    if score < cfg.falling_to and late_stage(cfg) and late_allowed(cfg, ev):  # met in the late stage
        g = (cfg.falling_to - score) / (cfg.falling_to - cfg.falling_late_to)
        needed = cfg.falling_over_ms + g * (cfg.falling_late_ms - cfg.falling_over_ms)
    elif cfg.falling_from == cfg.falling_to:
        return min(pause_ms, cfg.speculative_pause_ms)
    else:
        f = (cfg.falling_from - score) / (cfg.falling_from - cfg.falling_to)
        needed = cfg.speculative_pause_ms + f * (cfg.falling_over_ms - cfg.speculative_pause_ms)
    return int(min(pause_ms, max(cfg.speculative_pause_ms, math.ceil(needed))))


def _flat(cfg: TurnConfig, ev: Evidence, pause_ms: int, fixed_ms: int) -> Decision:
    """The flat policy (before the falling threshold): :func:`weigh` once, a fixed wait per verdict."""
    verdict = weigh(cfg, ev.text, ev.prob, use_text=ev.use_text, use_audio=ev.use_audio)
    if verdict.commit and ev.use_text and ev.text is not None and ev.words < SHORT_TURN_WORDS:
        verdict = Verdict(reason="short")  # the fixed silence ends it (SHORT_TURN_WORDS)
    end_ms = verdict.end_silence_ms
    if verdict.pending and cfg.wait_for_evidence:  # hold the turn open until the evidence is in
        end_ms = cfg.max_silence_ms
    if verdict.commit or (end_ms is not None and end_ms <= fixed_ms and pause_ms >= end_ms):
        return Decision(end_now=True, reason=verdict.reason or "silence",
                        needed_ms=None if verdict.commit else end_ms, sure=verdict.commit)
    setting = end_ms if end_ms is not None and end_ms > fixed_ms else None
    return Decision(end_now=False, end_silence_ms=setting, reason=verdict.reason)


def confirm_hold_ms(cfg: TurnConfig, sure: bool) -> int:
    """The silence after the speech end that a decided turn's reply waits for before it is heard (the made reply
    is dropped unheard if the speaker goes on first): ``turn.confirm_ms`` after an unsure end; after a sure one
    ``turn.confirm_sure_ms``, never longer than ``confirm_ms`` (a deployment that shortens the hold shortens both);
    none when ``confirm_ms`` is 0. The one rule the conversation and the lab's replay both apply."""
    if cfg.confirm_ms <= 0:
        return 0
    return max(0, min(cfg.confirm_sure_ms, cfg.confirm_ms) if sure else cfg.confirm_ms)


def weigh(
    cfg: TurnConfig,
    text: TurnEnd | None,
    audio_prob: float | None,
    *,
    use_text: bool | None = None,
    use_audio: bool | None = None,
) -> Verdict:
    """Weigh the evidence the switches ask for; ``None`` means that signal has not answered yet.

    ``use_text`` / ``use_audio`` (default: the switches) say which answers are coming at all: a signal
    that failed (its ASR or model raised) is not waited for.
    """
    use_text = cfg.smart_endpoint if use_text is None else use_text
    use_audio = cfg.end_of_turn_model if use_audio is None else use_audio
    if (use_text and text is None) or (use_audio and audio_prob is None):
        if use_text and text is TurnEnd.INCOMPLETE:  # the veto needs no second opinion
            return Verdict(end_silence_ms=cfg.incomplete_endpoint_ms, reason="text_incomplete")
        return PENDING
    text = text if use_text else None
    audio_complete = None if not use_audio or audio_prob is None else audio_prob >= cfg.end_of_turn_threshold
    if text is TurnEnd.INCOMPLETE:
        return Verdict(end_silence_ms=cfg.incomplete_endpoint_ms, reason="text_incomplete")
    if audio_complete is True and text is not None and audio_prob is not None and audio_prob < cfg.end_of_turn_sure:
        return Verdict(end_silence_ms=cfg.unsure_endpoint_ms, reason="audio_unsure")
    if audio_complete is True:
        return Verdict(commit=True, reason="audio_complete" if text is None else "complete")
    if text is TurnEnd.COMPLETE:
        if audio_complete is False:
            return Verdict(end_silence_ms=cfg.unsure_endpoint_ms, reason="disagree")
        return Verdict(end_silence_ms=cfg.complete_endpoint_ms, reason="text_complete")
    if audio_complete is False:
        return Verdict(end_silence_ms=cfg.max_silence_ms, reason="audio_incomplete")
    return Verdict(reason="no_evidence")
