"""Per-turn trace: the wall-clock moment each stage of one turn happened, and the durations between them.

All marks are ``time.time()`` seconds (wall clock, so the page and the bench client can line them up with
their own clocks on the same machine); durations are reported in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# The stages of a turn, in the order they happen. The page, the bench and /metrics use these names.
STAGES: tuple[str, ...] = (
    "speech_end",  # the user's speech really ended (VAD end minus its silence hangover)
    "vad_end",  # the endpointer decided the turn is over
    "asr_done",  # final transcript ready
    "first_text",  # first reply text delta from the responder
    "first_tts_text",  # first text chunk handed to TTS
    "first_audio",  # first PCM chunk out of TTS
    "first_frame_sent",  # first non-silent reply frame handed to the peer's outgoing track
    "reply_done",  # last reply frame sent (or the turn ended)
)

# Durations reported per turn: name -> (from mark, to mark).
DURATIONS: dict[str, tuple[str, str]] = {
    "endpoint_ms": ("speech_end", "vad_end"),
    "asr_ms": ("vad_end", "asr_done"),
    "llm_first_text_ms": ("asr_done", "first_text"),
    "chunker_ms": ("first_text", "first_tts_text"),
    "tts_first_audio_ms": ("first_tts_text", "first_audio"),
    "playout_ms": ("first_audio", "first_frame_sent"),
    "server_v2v_ms": ("speech_end", "first_frame_sent"),
    "reply_ms": ("first_frame_sent", "reply_done"),
}

# How the page (which reads it from ``GET /api/stages``) and the bench plots draw the stages that add up
# to the server's voice-to-voice: duration name → (colour, label), in the order they happen.
STAGE_STYLE: dict[str, tuple[str, str]] = {
    "endpoint_ms": ("#8b5cf6", "endpoint wait"),
    "asr_ms": ("#f59e0b", "ASR"),
    "llm_first_text_ms": ("#10b981", "first text"),
    "chunker_ms": ("#64748b", "chunker"),
    "tts_first_audio_ms": ("#3b82f6", "TTS first audio"),
    "playout_ms": ("#ec4899", "queue to first frame"),
}


def stage_legend() -> list[dict[str, str]]:
    """The stages as the page draws them: ``[{"name", "color", "label"}, ...]`` in order."""
    return [{"name": name, "color": color, "label": label} for name, (color, label) in STAGE_STYLE.items()]


@dataclass
class TurnTrace:
    turn: int
    marks: dict[str, float] = field(default_factory=dict)

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
        marks = self.effective_marks()
        out: dict[str, float] = {}
        for name, (a, b) in DURATIONS.items():
            if a in marks and b in marks:
                out[name] = round((marks[b] - marks[a]) * 1000.0, 1)
        return out

    def as_event(self) -> dict:
        """The ``turn_metrics`` event body: absolute marks (epoch ms) and durations (ms)."""
        return {
            "turn": self.turn,
            "timestamps_ms": {k: round(v * 1000.0, 1) for k, v in self.effective_marks().items()},
            "durations_ms": self.durations_ms(),
        }
