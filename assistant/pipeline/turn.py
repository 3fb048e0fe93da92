"""One turn as the turn runner holds it, what a turn needs, and how a stage's failure is told.

The turn's state has two owners, each the only writer of its half:

- **turn-taking** (``pipeline/turn_taking.py``) keeps the evidence at a pause (speech marks, the pause, the
  model's and the transcript's answers) in its own ``Pause``; at commit it hands the runner a frozen
  :class:`~assistant.pipeline.trace.Ending`;
- **the turn runner** (``pipeline/turn_runner.py``) keeps everything else here, in :class:`Turn`: the user's
  audio and words, the trace, the commit gate, the reply's progress (``pipeline/reply.py``).

Turn-taking reads a turn only through :attr:`Turn.heard` (a future: the ASR's answer as it lands) and tells
the runner what to do through the runner's methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from assistant.asr.base import Transcriber, Transcript
from assistant.asr.tail import HeardBefore
from assistant.pipeline.end_of_turn import EndOfTurnModel
from assistant.pipeline.reply import ReplyProgress
from assistant.pipeline.trace import TurnTrace
from assistant.respond.base import Responder, ToolCallTiming, Usage
from assistant.tts.base import TTSEngine

T = TypeVar("T")


class StageError(RuntimeError):
    """A turn failed in one stage; ``message`` is safe to show (and say) to the user."""

    def __init__(self, stage: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message
        self.cause = cause


async def stage(name: str, message: str, coro: Awaitable[T]) -> T:
    """Await one stage's work, turning any failure into a :class:`StageError` for that stage."""
    try:
        return await coro
    except asyncio.CancelledError:
        raise
    except TimeoutError as exc:
        raise StageError(name, "that took too long", exc) from exc
    except Exception as exc:
        raise StageError(name, message, exc) from exc


@dataclass
class BargeIn:
    """The user spoke over the reply (wall s): why, whether the reply was only held, and what of it was heard."""

    at: float
    reason: str
    paused: bool
    heard: str


@dataclass
class TurnNotes:
    """What a turn did besides its trace's marks, noted as it goes for telemetry to read once the turn has ended
    (``assistant/telemetry/``); nothing on the turn's way reads it. Times are wall seconds."""

    asr_kind: str = ""  # the turn's own ASR pass: "speculative" or "final" ("" for given words)
    asr_remote: tuple[float, float] | None = None  # its pass on a Ray replica: arrived there, done there
    asr_tail: bool = False  # the pass lost the words after a pause: a second pass heard them (asr/tail.py)
    respond_started: float | None = None  # the responder was asked
    respond_done: float | None = None  # its last delta (only when it finished)
    usage: Usage | None = None  # what the reply cost, as the responder counted it
    tool_calls: list[ToolCallTiming] = field(default_factory=list)  # the tool calls the model wrote
    tts_engine: str = ""
    tts_voice: str = ""
    tts_language: str = ""
    tts_done: float | None = None  # the last audio of the reply synthesized
    barge_ins: list[BargeIn] = field(default_factory=list)
    ended: float | None = None  # the turn's task ended (its reply done, cut, or failed)


@dataclass
class TurnDeps:
    """What a turn needs besides the conversation's own state (shared, process-wide engines)."""

    asr: Transcriber
    tts: TTSEngine
    responder: Responder
    voice: str | None = None  # TTS voice id for this session (None: the engine's default)
    on_turn_done: Callable[[TurnTrace], None] | None = None
    on_error: Callable[[str], None] | None = None
    on_interrupted: Callable[[], None] | None = None
    end_of_turn: EndOfTurnModel | None = None  # the audio end-of-turn model (None: none)
    on_turn_end: Callable[[Turn], None] | None = None  # every committed turn, once it ended (telemetry)


class Turn:
    """One user utterance and its reply, as the turn runner runs it (the runner is its only writer).

    Until committed, events are held back and reply audio waits; a turn that is never committed leaves no
    trace the user can see or hear. The reply's text waits as its audio does, until the turn is confirmed: a
    turn committed on an unsure end and dropped when the speaker goes on was never read either.
    """

    def __init__(self, number: int, audio: np.ndarray, audio_end: int, gen: int, speculative: bool) -> None:
        self.number = number
        self.trace = TurnTrace(number)
        self.audio = audio
        self.audio_end = audio_end  # stream sample where this turn's speech ends
        self.gen = gen  # the reply sink generation this turn writes in
        self.speculative = speculative
        self.committed = asyncio.Event()
        # The reply may be heard: set at commit, or later when the end was unsure and more silence confirmed it
        # (turn.confirm_ms); a turn dropped before that was never heard.
        self.confirmed = asyncio.Event()
        self.held_events: list[tuple[str, dict[str, Any]]] = []  # in order, until they may go out (runner._release)
        # What of the reply the history keeps, once it does (the responder gets the next prompt ready from it);
        # cancelled when the turn ends without entering the history (dropped, discarded, failed).
        self.kept: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        # The ASR's answer (None: it failed), for turn-taking to weigh as it lands; set once, by the runner.
        self.heard: asyncio.Future[Transcript | None] = asyncio.get_running_loop().create_future()
        # A pass at an earlier pause of the same utterance: the tail after it is heard on its own when the turn's
        # pass loses it (asr/tail.py); given by turn-taking when it starts the turn.
        self.before: HeardBefore | None = None
        self.transcript: str | None = None  # the user's words
        self.language: str | None = None  # the language the reply is in (the user's, as heard or typed)
        self.failed: str | None = None  # the stage that failed (the turn then waits to say so if committed)
        self.announcement: str | None = None  # a turn of the assistant's own (a timer that rang): what it says
        self.reply = ReplyProgress()
        self.notes = TurnNotes()

    @property
    def active(self) -> bool:
        return self.task is not None and not self.task.done()

    def cancel(self) -> None:
        self.held_events.clear()  # what was never shown never will be
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if not self.heard.done():
            self.heard.cancel()
