"""The ASR protocols: 16 kHz mono float32 audio in, text out.

- :class:`ASREngine`: an engine, synchronous and CPU/GPU bound (``asr/whisper.py``);
- :class:`Transcriber`: its async face the pipeline uses, shared by every session: ``asr/runner.ASRRunner``
  runs an engine on worker threads (``asr.workers``) so the event loop, and with it every session's audio,
  never waits on it; ``serve_ray/client.RemoteASR`` calls the Ray Serve deployment.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str = ""
    # How sure the engine is of ``language`` (0-1): detected (asr.language = auto) or 1.0 when it was given.
    language_probability: float = 0.0
    # (start_s, end_s, text) per segment, relative to the audio given.
    segments: list[tuple[float, float, str]] = field(default_factory=list)
    # Time the engine itself spent, seconds.
    compute_s: float = 0.0
    # (word, probability) per word the decoder wrote, punctuation as words of its own, where the engine knows them
    # (faster-whisper's fitted window): how sure it was of each; the end-of-turn cue doubts a made-up last word.
    words: tuple[tuple[str, float], ...] = ()
    # When the pass was asked for, taken by a worker and answered (wall clock; set by the Transcriber).
    timing: PassTiming | None = None


@dataclass(frozen=True)
class PassTiming:
    asked: float
    started: float
    done: float
    # On a remote replica (the Ray hop): when the request arrived there and when the replica was done (its clock),
    # so the hop's two legs are asked → arrived and done → this pass's done.
    remote: tuple[float, float] | None = None


class PassKind(IntEnum):
    """What a pass is for, in the order a busy :class:`Transcriber` serves them."""

    FINAL = 0  # the transcript of a turn the user has finished (committed)
    SPECULATIVE = 1  # the transcript of the audio up to a pause that may be the end
    PARTIAL = 2  # a hypothesis while the user speaks (shown, never waited for)


@runtime_checkable
class ASREngine(Protocol):
    name: str
    # What a pass may be asked for (``language=``): these codes, and ``auto`` (detection among them) when
    # ``detects``. An engine without them is taken to hear what ``asr.languages`` says (``hearing``).

    def transcribe(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None
    ) -> Transcript:
        """Transcribe ``audio`` (float32, mono, 16 kHz, −1…1). Blocking."""
        ...

    def warmup(self) -> None:
        """Run once at start so the first user turn pays no load or JIT cost."""
        ...


@runtime_checkable
class Transcriber(Protocol):
    """The async ASR every session shares. ``session`` names the caller, so a busy transcriber can serve
    sessions fairly; ``kind`` says what the pass is for (:class:`PassKind`)."""

    @property
    def busy(self) -> bool:
        """True when a new pass would wait for a worker."""
        ...

    @property
    def languages(self) -> tuple[str, ...]:
        """The language codes a pass may be asked for (and, with ``auto``, detected among)."""
        ...

    @property
    def detects(self) -> bool:
        """Whether a pass may ask for ``auto`` (a multilingual model)."""
        ...

    async def transcribe(
        self,
        audio: np.ndarray,
        *,
        language: str | None = None,
        prompt: str | None = None,
        session: str = "",
        kind: PassKind = PassKind.FINAL,
    ) -> Transcript:
        """Transcript of ``audio``; raises TimeoutError after ``asr.timeout_s``. Cancelling the call drops
        a pass that has not started."""
        ...

    async def transcribe_partial(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None, session: str = ""
    ) -> Transcript | None:
        """A partial hypothesis while the user speaks; None (skipped) when it would wait for a worker."""
        ...


class PassStopped(Exception):
    """An engine stopped a pass its caller had given up on (:func:`stop_requested`); nobody reads its answer."""


_pass = threading.local()


def stop_requested() -> bool:
    """Whether the caller of the pass this thread runs has given up on it (a speculation the speaker talked over, a
    turn dropped, a timeout): an engine asks between its costly steps (Whisper: before its encoder, before its
    decoder) and raises :class:`PassStopped`. Only :class:`~assistant.asr.runner.ASRRunner`'s threads can say yes;
    elsewhere it is False."""
    event: threading.Event | None = getattr(_pass, "stop", None)
    return event is not None and event.is_set()


@contextlib.contextmanager
def stoppable(stop: threading.Event) -> Iterator[None]:
    """Within it, :func:`stop_requested` on this thread reads ``stop``."""
    _pass.stop = stop
    try:
        yield
    finally:
        _pass.stop = None


class ASRModelMissing(RuntimeError):
    """The configured model is not on disk; the message says what to do."""
