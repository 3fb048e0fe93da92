"""One turn's state, shared by the turn-taking policy (which starts, commits and drops turns) and the turn
runner (which plays them out): the user's audio and words, the reply's trace, its gate, what was heard."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from assistant.pipeline.trace import TurnTrace
from assistant.pipeline.turn_end import TurnEnd
from assistant.respond.base import Responder
from assistant.tts.base import TTSEngine


class StageError(RuntimeError):
    """A turn failed in one stage; ``message`` is safe to show (and say) to the user."""

    def __init__(self, stage: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message
        self.cause = cause


async def stage(name: str, message: str, coro: Any) -> Any:
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
class TurnDeps:
    """What a turn needs besides the conversation's own state (shared, process-wide engines)."""

    asr: Any  # ASRRunner: ``await transcribe(audio) -> Transcript``
    tts: TTSEngine
    responder: Responder
    voice: str | None = None  # TTS voice id for this session (None: the engine's default)
    on_turn_done: Callable[[TurnTrace], None] | None = None
    on_error: Callable[[str], None] | None = None
    on_interrupted: Callable[[], None] | None = None
    end_of_turn: Any = None  # SmartTurnBatcher: ``await probability(audio) -> float`` (None: no audio model)


class Turn:
    """One user utterance and its reply: its trace, task, audio, and (while speculative) its gate.

    Until committed, events are held back and reply audio waits; a turn that is never committed leaves no
    trace the user can see or hear.
    """

    def __init__(self, number: int, audio: np.ndarray, audio_end: int, gen: int, speculative: bool) -> None:
        self.number = number
        self.trace = TurnTrace(number)
        self.audio = audio
        self.audio_end = audio_end  # stream sample where this turn's speech ends
        self.gen = gen  # the reply sink generation this turn writes in
        self.speculative = speculative
        self.committed = asyncio.Event()
        self.held_events: list[tuple[str, dict[str, Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.transcript: str | None = None  # the user's words (set by ASR, or given: ``heard``)
        self.heard: str | None = None  # words already transcribed (a backchannel check): ASR is skipped
        self.verdict: TurnEnd | None = None  # is the transcript a finished sentence? (smart endpoint)
        self.speaking = False  # its reply audio has started
        self.failed: str | None = None  # the stage that failed (the turn then waits to say so if committed)
        self.carried = 0  # samples of an earlier dropped turn's audio at the start of ``audio``
        self.eot_prob: float | None = None  # the end-of-turn model's answer at this pause
        self.eot_task: asyncio.Task[None] | None = None
        self.reply = ""  # the reply's text so far
        # What was said, mapped to audio: (sink samples made before this piece, piece), and samples made.
        self.spoken: list[tuple[int, str]] = []
        self.samples_made = 0
        self.frames_base: int | None = None  # the sink's audible_frames_sent when this turn first wrote

    @property
    def active(self) -> bool:
        return self.task is not None and not self.task.done()

    def cancel(self) -> None:
        for task in (self.task, self.eot_task):
            if task is not None and not task.done():
                task.cancel()


def played_text(spoken: list[tuple[int, str]], made: int, played: int) -> str:
    """The part of a reply that was heard: whole pieces whose audio was played, and of the piece playing
    when it stopped the share of its words its played audio covers (cut back to a whole word)."""
    out: list[str] = []
    for i, (start, piece) in enumerate(spoken):
        end = spoken[i + 1][0] if i + 1 < len(spoken) else made
        if played >= end:
            out.append(piece)
            continue
        if played > start and end > start:
            share = int(len(piece) * (played - start) / (end - start))
            cut = piece[:share]
            if share < len(piece) and not piece[share].isspace():
                cut = re.sub(r"\S*$", "", cut)  # do not keep half a word
            out.append(cut.rstrip())
        break
    text = ""
    for piece in out:  # pieces may or may not carry the space between them
        text += piece if not text or text[-1].isspace() or piece[:1].isspace() else " " + piece
    return text.strip()
