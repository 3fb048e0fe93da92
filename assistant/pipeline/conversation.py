"""The conversation of one session: the turn-taking policy and the turn runner, wired together.

    inbound AudioChunks → TurnTaking (VAD events, end of turn, barge-in, speculation, partials)
                                │ start · commit · drop · pause · resume · interrupt
                                ▼
                          TurnRunner (ASR → responder → speech path → reply sink)

The only place that knows both halves; each takes only the config sections it needs.
"""

from __future__ import annotations

import numpy as np

from assistant.audio import AudioChunk
from assistant.config import Config
from assistant.pipeline.events import EventChannel
from assistant.pipeline.reply import ReplySink
from assistant.pipeline.turn import TurnDeps
from assistant.pipeline.turn_runner import TurnRunner
from assistant.pipeline.turn_taking import TurnTaking
from assistant.respond.history import ConversationHistory
from assistant.vad.endpoint import Endpointer

__all__ = ["Conversation", "TurnDeps"]


class Conversation:
    def __init__(
        self,
        cfg: Config,
        endpointer: Endpointer,
        deps: TurnDeps,
        track: ReplySink,
        events: EventChannel,
        session_id: str = "",
    ) -> None:
        self.runner = TurnRunner(
            cfg.respond, cfg.tts, cfg.chunker, cfg.turn, cfg.log, deps, track, events, session_id
        )
        self.policy = TurnTaking(cfg.turn, cfg.asr, cfg.vad, endpointer, self.runner, deps, events, session_id)

    def feed(self, chunk: AudioChunk | np.ndarray) -> None:
        """16 kHz mono float32 audio as it arrives (an ``AudioChunk``; a bare array is taken as real time)."""
        self.policy.feed(chunk)

    @property
    def turns(self) -> int:
        return self.runner.turns

    @property
    def history(self) -> ConversationHistory:
        return self.runner.history

    @property
    def speculations(self) -> dict[str, int]:
        return self.policy.speculations

    @property
    def last_audio_wall(self) -> float:
        return self.policy.last_audio_wall

    @property
    def last_activity_wall(self) -> float:
        return max(self.policy.last_activity_wall, self.runner.last_activity_wall)

    async def close(self) -> None:
        await self.policy.close()
