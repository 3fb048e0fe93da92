"""Is the user done? The evidence at a pause, weighed: the transcript rule and the audio end-of-turn model.

At a pause of ``turn.speculative_pause_ms`` the speculative turn starts (its transcript is the text
evidence, judged by ``pipeline/turn_end.judge``) and the end-of-turn model (``vad/smart_turn.py``) hears
the audio so far. Each signal has its switch: ``turn.smart_endpoint`` (text), ``turn.end_of_turn_model``
(audio). What they say sets how much more silence ends the turn:

| text \\ audio          | complete (p ≥ threshold) | not complete          | audio off            |
|-----------------------|--------------------------|-----------------------|----------------------|
| ends on a continuation | incomplete_endpoint_ms   | incomplete_endpoint_ms | incomplete_endpoint_ms |
| a finished sentence   | now                      | incomplete_endpoint_ms | complete_endpoint_ms |
| neither / text off    | now                      | max_silence_ms        | (vad.end_silence_ms) |

While an answer the switches ask for is still coming, the turn is held open (up to ``max_silence_ms``):
the speculative ASR is the turn's own ASR, so waiting for it costs the reply nothing, and a busy machine
(slow ASR) then never cuts a sentence off only because the evidence came late.

A text that ends on a preposition, an article, a conjunction or a verb waiting for its object is never
complete, whatever the audio says (the model was trained on human speech; on generated voices it calls
mid-sentence pauses complete). When the two disagree the turn waits as for an unfinished sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config import TurnConfig
from assistant.pipeline.turn_end import TurnEnd


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
    if audio_complete is True:
        return Verdict(commit=True, reason="audio_complete" if text is None else "complete")
    if text is TurnEnd.COMPLETE:
        if audio_complete is False:
            return Verdict(end_silence_ms=cfg.incomplete_endpoint_ms, reason="disagree")
        return Verdict(end_silence_ms=cfg.complete_endpoint_ms, reason="text_complete")
    if audio_complete is False:
        return Verdict(end_silence_ms=cfg.max_silence_ms, reason="audio_incomplete")
    return Verdict(reason="no_evidence")
