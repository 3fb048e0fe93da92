"""Per-turn trace: the wall-clock moment each stage of one turn happened, and the parts of the server's
voice-to-voice that the listener waited for, named.

All marks are ``time.time()`` seconds (wall clock, so the page and the bench client can line them up with
their own clocks on the same machine); durations are reported in milliseconds.

**The wait at the end of a turn.** From the user's speech end to the moment the turn is both decided and
transcribed, several things may be waited for at once: the silence the turn-taking rule requires, an ASR
pass (queued for a worker, then computing), the end-of-turn model, and the decision itself. They overlap, so
the wait is split along its **critical path**: starting from the moment it ended, each stretch is given to
what was being waited for then — the last piece of evidence back to when it began computing, its wait for a
worker before that, and before it was even asked, the silence that had to pass first. So the parts add up
exactly, and each names what would have to be faster for the turn to end sooner:

- ``endpoint_ms``: silence the turn-taking required (VAD, the pause before the evidence was asked);
- ``worker_wait_ms``: the critical ASR pass (or model call) waiting for a free worker;
- ``asr_ms``: ASR compute on the critical path (a pass that began before the pause counts from the pause);
- ``end_of_turn_ms``: the end-of-turn model's call, when its answer was the last the decision waited for;
- ``decide_ms``: the last evidence in → the turn committed (idle time in the decision; ~0).

After that: ``llm_first_text_ms``, ``chunker_ms``, ``tts_first_audio_ms``, ``confirm_wait_ms`` (a reply ready before
an unsure end was confirmed by more silence, ``turn.confirm_ms``), ``playout_ms``. The parts
(:data:`PARTS`) sum to ``server_v2v_ms``: the test suite checks it on every turn it plays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# The stages of a turn, in the order they happen. The page, the bench and /metrics use these names.
STAGES: tuple[str, ...] = (
    "speech_end",  # the user's speech really ended (VAD end minus its silence hangover)
    "vad_end",  # turn-taking decided the turn is over (committed)
    "asr_done",  # final transcript ready
    "first_text",  # first reply text delta from the responder
    "first_tts_text",  # first text chunk handed to TTS
    "first_audio",  # first PCM chunk out of TTS
    "confirmed",  # the reply may be heard: at commit, or once the silence confirmed an unsure end (turn.confirm_ms)
    "first_frame_sent",  # first non-silent reply frame handed to the peer's outgoing track
    "reply_done",  # last reply frame sent (or the turn ended)
)

# The parts of the wait from speech end to "decided and transcribed" (see the module docstring), in order.
WAIT_PARTS: tuple[str, ...] = ("endpoint_ms", "worker_wait_ms", "asr_ms", "end_of_turn_ms", "decide_ms")
# The stages after it: name -> (from mark, to mark), on the effective marks; "ready" is the end of the wait.
AFTER_WAIT: dict[str, tuple[str, str]] = {
    "llm_first_text_ms": ("ready", "first_text"),
    "chunker_ms": ("first_text", "first_tts_text"),
    "tts_first_audio_ms": ("first_tts_text", "first_audio"),
    "confirm_wait_ms": ("first_audio", "confirmed"),
    "playout_ms": ("confirmed", "first_frame_sent"),
}
# Every part of the server's voice-to-voice, in the order they happen: they add up to server_v2v_ms.
PARTS: tuple[str, ...] = (*WAIT_PARTS, *AFTER_WAIT)
# Every duration a turn reports (turn_metrics, /metrics, the bench): the parts, their total, the reply.
DURATIONS: tuple[str, ...] = (*PARTS, "server_v2v_ms", "reply_ms")
# Idle gaps between evidence and decision, and decision and speech (diagnostics), each ≥ 0: name -> label.
# A speculative turn's first text for TTS is often ready before its commit; that lead is not a gap, so it has
# a column of its own instead of making commit_to_tts_text_ms negative.
GAP_LABELS: dict[str, str] = {
    "evidence_to_commit_ms": "last evidence in → turn committed (idle in the decision)",
    "commit_to_tts_text_ms": "turn committed (and transcribed) → first text handed to TTS (0 if it was ready)",
    "tts_text_before_commit_ms": "first text for TTS ready this long before the commit (speculation ran ahead)",
}
GAPS: tuple[str, ...] = tuple(GAP_LABELS)

# How the page (which reads it from ``GET /api/stages``) and the bench plots draw the parts that add up to
# the server's voice-to-voice: duration name → (colour, label), in the order they happen.
STAGE_STYLE: dict[str, tuple[str, str]] = {
    "endpoint_ms": ("#8b5cf6", "endpoint silence"),
    "worker_wait_ms": ("#a8a29e", "worker wait"),
    "asr_ms": ("#f59e0b", "ASR"),
    "end_of_turn_ms": ("#14b8a6", "end-of-turn model"),
    "decide_ms": ("#84cc16", "decision"),
    "llm_first_text_ms": ("#10b981", "first text"),
    "chunker_ms": ("#64748b", "chunker"),
    "tts_first_audio_ms": ("#3b82f6", "TTS first audio"),
    "confirm_wait_ms": ("#f472b6", "held until sure"),
    "playout_ms": ("#ec4899", "queue to first frame"),
}
assert tuple(STAGE_STYLE) == PARTS


def stage_legend() -> list[dict[str, str]]:
    """The stages as the page draws them: ``[{"name", "color", "label"}, ...]`` in order."""
    return [{"name": name, "color": color, "label": label} for name, (color, label) in STAGE_STYLE.items()]


def gap_legend() -> list[dict[str, str]]:
    """The idle gaps as the page lists them: ``[{"name", "label"}, ...]`` in :data:`GAPS` order."""
    return [{"name": name, "label": label} for name, label in GAP_LABELS.items()]


@dataclass(frozen=True)
class Span:
    """One call for evidence (an ASR pass, the end-of-turn model): asked, taken by a worker, answered (wall s)."""

    asked: float
    started: float
    done: float


@dataclass(frozen=True)
class Ending:
    """How turn-taking decided a turn is over: the snapshot it hands the turn runner at commit.

    ``silence_met`` is when the silence the deciding rule required had passed; ``text`` and ``model`` say
    which answers the decision used (the model's call with its span), so the wait can be split.
    """

    speech_end: float
    decided: float
    silence_met: float
    text: bool = False  # the verdict used the transcript (the turn's own ASR pass)
    model: Span | None = None  # the end-of-turn model's call, when the verdict used its answer
    model_after_text: bool = False  # ... asked once the transcript landed (it is not run beside the ASR pass)
    reason: str = ""


def split_wait(ending: Ending, asr: Span | None, asr_done: float) -> dict[str, float]:
    """The wait from the speech end to "decided and transcribed", in seconds per part of :data:`WAIT_PARTS`,
    along its critical path (module docstring). The parts sum to ``max(decided, asr_done) - speech_end``."""
    s = ending.speech_end
    parts = dict.fromkeys(WAIT_PARTS, 0.0)
    cursor = max(ending.decided, asr_done, s)

    def take(to: float, part: str) -> None:
        """Give ``[to, cursor]`` (clamped to the wait) to ``part`` and move the cursor back to it."""
        nonlocal cursor
        to = min(max(to, s), cursor)
        parts[part] += cursor - to
        cursor = to

    def call(span: Span, compute: str) -> None:
        take(span.started, compute)
        take(span.asked, "worker_wait_ms")

    committed = max(ending.decided, s)
    if asr_done > committed and asr is not None:  # the transcript came after the decision: ASR was last
        call(asr, "asr_ms")
        if cursor <= committed:  # asked before the decision (a speculative pass): the pause came before it
            take(s, "endpoint_ms")
            return parts
        take(committed, "worker_wait_ms")  # asked at commit: the runner's start, then the decision below
    elif asr_done > committed:  # the transcript came later and no pass ran (given words)
        take(committed, "asr_ms")
    # The decision: idle after the last evidence it used, then that evidence back to when it was asked.
    evidence = [(ending.silence_met, "silence")]
    if ending.text and asr is not None:
        evidence.append((asr.done, "text"))
    if ending.model is not None:
        evidence.append((ending.model.done, "model"))
    last_at, last = max(evidence)
    take(last_at, "decide_ms")
    if last == "text" and asr is not None:
        call(asr, "asr_ms")
    elif last == "model" and ending.model is not None:
        call(ending.model, "end_of_turn_ms")
        if ending.model_after_text and asr is not None:  # the call waited for the transcript: the pass before it
            take(asr.done, "decide_ms")
            call(asr, "asr_ms")
    take(s, "endpoint_ms")
    return parts


@dataclass
class TurnTrace:
    turn: int
    marks: dict[str, float] = field(default_factory=dict)
    ending: Ending | None = None  # how the turn was decided (set at commit)
    asr: Span | None = None  # the ASR pass that gave the turn its transcript (None: words given)

    def mark(self, stage: str, at: float | None = None) -> float:
        """Record ``stage`` once (the first time wins) and return its time."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        if stage not in self.marks:
            self.marks[stage] = time.time() if at is None else at
        return self.marks[stage]

    def has(self, stage: str) -> bool:
        return stage in self.marks

    def effective_marks(self) -> dict[str, float]:
        """Marks as the turn experienced them: a stage done before the one it follows (a speculative
        turn's ASR, finished before the endpoint) counts as done when its predecessor was."""
        out: dict[str, float] = {}
        latest = float("-inf")
        for stage in STAGES:
            if stage in self.marks:
                latest = max(latest, self.marks[stage])
                out[stage] = latest
        return out

    def durations_ms(self) -> dict[str, float]:
        """Each part of :data:`DURATIONS` that the marks so far allow, in ms (0.1 ms steps: the parts are
        rounded on a common grid, so they add up to ``server_v2v_ms`` exactly)."""
        marks = self.effective_marks()
        if "speech_end" not in marks or "vad_end" not in marks:
            return {}
        s = marks["speech_end"]
        ending = self.ending or Ending(speech_end=s, decided=marks["vad_end"], silence_met=marks["vad_end"])
        ready = marks.get("asr_done", marks["vad_end"])
        wait = split_wait(ending, self.asr, ready)
        # Cumulative boundaries in tenths of a ms from the speech end: each part is a difference of two.
        bounds: list[tuple[str, float]] = []
        at = s
        for name in WAIT_PARTS:
            at += wait[name]
            bounds.append((name, at))
        points = {**marks, "ready": at}
        if "confirmed" not in points and "first_audio" in points:  # never held (a trace from before the mark)
            points["confirmed"] = points["first_audio"]
        for name, (a, b) in AFTER_WAIT.items():
            if a in points and b in points:
                bounds.append((name, max(points[b], at)))
                at = max(points[b], at)
            else:
                break
        out: dict[str, float] = {}
        prev = 0
        for name, t in bounds:
            tenths = round((t - s) * 10_000)
            out[name] = (tenths - prev) / 10
            prev = tenths
        if "first_frame_sent" in marks and "playout_ms" in out:
            out["server_v2v_ms"] = prev / 10
        if "first_frame_sent" in marks and "reply_done" in marks:
            out["reply_ms"] = round((marks["reply_done"] - marks["first_frame_sent"]) * 1000, 1)
        return out

    def gaps_ms(self) -> dict[str, float]:
        """The gaps :data:`GAPS` names, each ≥ 0: last evidence → commit; commit (with its transcript) → the
        first text handed to TTS; and, when that text was handed over before the commit (a speculative turn
        runs ahead), by how much. One of the last two is always 0."""
        marks, out = self.marks, {}
        if self.ending is not None:
            evidence = [self.ending.silence_met]
            if self.ending.text and self.asr is not None:
                evidence.append(self.asr.done)
            if self.ending.model is not None:
                evidence.append(self.ending.model.done)
            out["evidence_to_commit_ms"] = _ms(self.ending.decided - max(evidence))
        if "vad_end" in marks and "first_tts_text" in marks:
            ready = max(marks["vad_end"], marks.get("asr_done", marks["vad_end"]))
            out["commit_to_tts_text_ms"] = _ms(marks["first_tts_text"] - ready)
            out["tts_text_before_commit_ms"] = _ms(ready - marks["first_tts_text"])
        return out

    def as_event(self) -> dict[str, Any]:
        """The ``turn_metrics`` event body: absolute marks (epoch ms), durations and gaps (ms)."""
        return {
            "turn": self.turn,
            "timestamps_ms": {k: round(v * 1000.0, 1) for k, v in self.effective_marks().items()},
            "durations_ms": self.durations_ms(),
            "gaps_ms": self.gaps_ms(),
        }


def _ms(seconds: float) -> float:
    """A gap in ms (0.1 ms steps), 0 when the interval is empty or reversed."""
    return round(max(0.0, seconds) * 1000, 1)
