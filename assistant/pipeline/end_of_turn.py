"""Is the user done? The end-of-turn policy: the transcript rule, and the evidence at a pause weighed.

One vocabulary across the family: the **evidence** at a pause is the transcript's word (:func:`judge` →
:class:`TurnEnd`) and the end-of-turn model's probability (``vad/end_of_turn.py``, Smart Turn v3.2, behind
the :class:`EndOfTurnModel` protocol); :func:`weigh` turns them into a :class:`Verdict`.

**The transcript rule.** Silence alone cannot tell "What is the weather like today?" (done) from "I would like
to order …" (thinking). The speculative transcript can: terminal punctuation on a sentence that does not end
in a word that usually continues it means done; a trailing conjunction, article, preposition, filler or a
verb that wants an object means the user is most likely still going.

**Weighing.** At a pause of ``turn.speculative_pause_ms`` the speculative turn starts (its transcript is the
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

import re
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from assistant.config import TurnConfig

# Words after which an English sentence usually goes on (Whisper often puts a period or "?" after them anyway).
CONTINUES = frozenset([
    "a", "an", "the", "and", "or", "but", "so", "because", "if", "when", "while", "although", "though", "than",
    "then", "to", "of", "for", "with", "in", "on", "at", "from", "by", "about", "into", "onto", "over", "under",
    "after", "before", "like", "as", "my", "your", "his", "her", "our", "their", "its", "this", "that", "these",
    "those", "some", "any", "every", "each", "um", "uh", "er", "erm", "hmm", "well", "is", "are", "was", "were",
    "am", "be", "been", "being", "want", "wants", "need", "needs", "get", "gets", "have", "has", "order", "buy",
    "make", "take", "give", "tell", "show", "find", "book", "call", "set", "play", "would", "could", "should",
    "can", "will", "shall", "may", "might", "must", "do", "does", "did",
    # prepositions that never end a sentence either ("What is the distance between?" is Whisper's "?")
    "between", "through", "across", "against", "toward", "towards", "among", "amongst", "beneath", "beside",
    "besides", "within", "without", "via", "upon", "during", "throughout", "versus",
])
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
