"""The words after a pause: when a pass over the whole turn loses them, a pass over the tail hears them.

Whisper decoding a turn without timestamps sometimes ends its text at a pause inside the turn: "What is the
distance between? [pause] Paris and Berlin?" is heard "What is the distance between?" (tiny.en on
tests/data/pauses/distance.wav), so the turn looks unfinished (the policy waits ``turn.max_silence_ms``) and the
reply answers another question. The pause itself had a pass already (its speculative turn, dropped when the
speech came back), which heard the words up to it. So when the whole turn's pass brings no word the pause's pass
did not have, although speech went on after the pause, the tail after the pause is heard by a pass of its own and
joined to the pause's words (:func:`lost_tail`, :func:`join_tail`). Whisper's timestamped decode hears the tail
too, but on every turn, slower, and with a made-up "for it." at pauses after "for" (docs/end_of_turn.md, Hearing
the tail); this costs a second pass only on the turns that lost their tail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from assistant.asr.base import Transcript

WORD = re.compile(r"[\w']+")
# Speech the VAD heard after the pause, below which the tail is not worth a pass of its own (a breath or a click
# the VAD took for speech adds no word a listener would miss).
MIN_TAIL_SPEECH_MS = 250


@dataclass(frozen=True)
class HeardBefore:
    """What a pass at an earlier pause of the same utterance heard: its transcript, the samples of the turn's
    audio it covered (the tail starts there), and how much speech came after the pause (VAD clock, ms)."""

    transcript: Transcript
    samples: int
    tail_speech_ms: int = 0

    def tail_worth_a_pass(self) -> bool:
        return bool(self.transcript.text.strip()) and self.tail_speech_ms >= MIN_TAIL_SPEECH_MS


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def lost_tail(whole: str, before: str) -> bool:
    """Whether a pass over the whole turn (``whole``) heard nothing past the earlier pause's words (``before``):
    its words are those words or fewer of them, from the start."""
    w, b = words(whole), words(before)
    return bool(b) and len(w) <= len(b) and w == b[: len(w)]


def join_tail(before: Transcript, tail: Transcript) -> Transcript:
    """The pause's transcript and the tail's, as one: the tail's words (and the probabilities of its last words,
    which the end-of-turn cue reads) after the pause's. A tail that heard nothing leaves the pause's transcript."""
    first, rest = before.text.strip(), tail.text.strip()
    if not words(rest):
        return before
    if first.endswith(("...", "…")):
        first = first.rstrip(".… ")
    return Transcript(
        text=f"{first} {rest}" if first else rest,
        language=before.language or tail.language,
        language_probability=before.language_probability if before.language else tail.language_probability,
        words=(*before.words, *tail.words),
        timing=tail.timing,
    )
