"""The conversation of one session: the turn-taking policy and the turn runner, wired together.

    inbound AudioChunks → TurnTaking (VAD events, end of turn, barge-in, speculation, partials)
                                │ start · commit · drop · pause · resume · interrupt
                                ▼
                          TurnRunner (ASR → responder → speech path → reply sink)

The only place that knows both halves; each takes only the config sections it needs. Turns start at the end
of the user's speech; a client that decides turns itself (the Realtime API's commit and ``response.create``)
starts them with :meth:`Conversation.respond_to`, on the same runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from assistant.audio import AudioChunk
from assistant.config import Config, TurnConfig, VADConfig
from assistant.pipeline.events import EventChannel
from assistant.pipeline.reply import ReplySink
from assistant.pipeline.trace import Ending
from assistant.pipeline.turn import TurnDeps
from assistant.pipeline.turn_runner import TurnRunner
from assistant.pipeline.turn_taking import TurnTaking
from assistant.respond.history import ConversationHistory
from assistant.vad.endpoint import Endpointer

__all__ = ["Conversation", "TurnDeps"]

log = logging.getLogger(__name__)

MAX_ANNOUNCEMENTS = 16  # things the assistant has to say of its own accord (timers that rang), waiting their turn
FREE_RECHECK_S = 1.0  # an announcement waiting for a pause looks again at least this often (events wake it sooner)


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
        self.events = events
        self.session_id = session_id
        self._announcements: deque[tuple[str, str | None]] = deque()
        self._announcer: asyncio.Task[None] | None = None

    def feed(self, chunk: AudioChunk | np.ndarray) -> None:
        """16 kHz mono float32 audio as it arrives (an ``AudioChunk``; a bare array is taken as real time)."""
        self.policy.feed(chunk)

    # --- what a client that takes turns itself asks for ------------------------------------------------
    def respond_to(self, *, text: str | None = None, audio: np.ndarray | None = None) -> None:
        """Start a turn now: on the user's words (no ASR) or on 16 kHz audio (transcribed), not on an end of
        speech. A reply in progress is cancelled first, as a new turn of speech would."""
        if text is None and audio is None:
            raise ValueError("respond_to needs text or audio")
        self.runner.interrupt("new_turn")
        clip = audio if audio is not None else np.zeros(0, dtype=np.float32)
        turn = self.runner.start(clip, self.policy.clock.samples, speculative=False, heard=text)
        now = time.time()  # the request is the turn's end: the trace counts from it, and nothing was waited for
        self.runner.commit(turn, Ending(speech_end=now, decided=now, silence_met=now, reason="client"))

    def announce(self, text: str, language: str | None = None) -> None:
        """Say ``text`` of the assistant's own accord (a timer that rang) once the conversation has a pause: the user
        not speaking, no reply being prepared or played. It goes through the speech path as a reply does, and the
        user can talk over it (barge-in) as over any reply."""
        if len(self._announcements) >= MAX_ANNOUNCEMENTS:
            log.warning("announcement_dropped session=%s waiting=%d", self.session_id, len(self._announcements))
            return
        self._announcements.append((text, language))
        if self._announcer is None or self._announcer.done():
            self._announcer = asyncio.get_running_loop().create_task(
                self._announce_when_free(), name=f"announce-{self.session_id}")

    async def _announce_when_free(self) -> None:
        while self._announcements:
            await self._until_free()
            text, language = self._announcements.popleft()
            turn = self.runner.start(np.zeros(0, dtype=np.float32), self.policy.clock.samples, speculative=False,
                                     say=text, language=language)
            now = time.time()
            self.runner.commit(turn, Ending(speech_end=now, decided=now, silence_met=now, reason="announcement"))
            if turn.task is not None:
                await asyncio.wait([turn.task])

    async def _until_free(self) -> None:
        """Until the user is not speaking and no reply is being prepared or played (woken by the conversation's
        events and the current turn's end; looked at again every ``FREE_RECHECK_S`` in case neither comes)."""
        changed = asyncio.Event()
        unsubscribe = self.events.subscribe(lambda _: changed.set())
        try:
            while self.speaking or self.responding:
                changed.clear()
                event = asyncio.ensure_future(changed.wait())
                waits: set[asyncio.Future[Any]] = {event}
                current = self.runner.current
                if current is not None and current.task is not None:
                    waits.add(current.task)  # waited on, never cancelled here (asyncio.wait leaves it be)
                try:
                    await asyncio.wait(waits, timeout=FREE_RECHECK_S, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    event.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await event
        finally:
            unsubscribe()

    def end_utterance(self) -> bool:
        """End the user's utterance in progress now (its turn follows as after any end of speech); False when
        the user is not speaking."""
        return self.policy.end_utterance("client")

    def drop_utterance(self) -> None:
        """Forget the user's utterance in progress: it will not become a turn."""
        self.policy.drop_utterance()

    @property
    def speaking(self) -> bool:
        """The user is speaking (an utterance is in progress)."""
        return self.policy.endpointer.speaking

    @property
    def responding(self) -> bool:
        """A reply is being prepared or played."""
        return self.runner.busy

    def cancel(self, reason: str) -> bool:
        """Cancel the reply in progress (the ``interrupted`` event says so); False when there was none."""
        if not self.runner.busy:
            return False
        self.runner.interrupt(reason)
        return True

    @property
    def voice(self) -> str | None:
        """The voice the next reply speaks with (None: the engine's default)."""
        return self.runner.request.voice

    @property
    def language(self) -> str | None:
        """The language this conversation's turns are heard in: a code, ``auto``, or None (``asr.language``)."""
        return self.runner.language

    def set_language(self, language: str | None) -> None:
        """Hear the next turns in ``language`` (a code the ASR hears, ``auto``, or None for ``asr.language``);
        the caller has checked it against the ASR's languages."""
        self.runner.language = language

    def set_voice(self, voice: str | None, speed: float = 1.0) -> None:
        """Speak the next replies with ``voice`` (None: the engine's default) at ``speed``."""
        self.runner.request = replace(self.runner.request, voice=voice, speed=speed)

    def tune(self, *, vad: VADConfig | None = None, turn: TurnConfig | None = None) -> None:
        """New VAD or turn-taking settings for this conversation alone, from its next utterance on."""
        if vad is not None:
            self.policy.endpointer.set_config(vad)
            self.policy.end_silence_ms = vad.end_silence_ms
        if turn is not None:
            self.policy.cfg = turn

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
        self._announcements.clear()
        if self._announcer is not None and not self._announcer.done():
            self._announcer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._announcer
        await self.policy.close()
