"""The reply's way out and its progress: the sink it is written to, what of it was made, what was heard.

The turn runner alone writes a reply's progress (:class:`ReplyProgress`); turn-taking never sees it. When a
reply is cut, :func:`played_text` maps the frames the listener heard back to the text they carried.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from assistant.audio import FRAME_MS


class ReplySink(Protocol):
    """Where a session's reply audio goes (the peer's outgoing track, ``rtc/outbound.ReplyTrack``).

    Writes carry the sink's ``generation``; :meth:`interrupt` bumps it, and writers of an older generation
    get False and stop, so a cancelled reply can never be heard. The sink never calls the pipeline: the
    moment the first audible frame goes out comes back as a future (:meth:`expect_reply`).
    """

    sample_rate: int

    @property
    def generation(self) -> int: ...

    def expect_reply(self) -> asyncio.Future[float]:
        """A future the next audible frame handed to the listener resolves with its wall time."""
        ...

    async def write(self, pcm: np.ndarray, generation: int | None = None) -> bool:
        """Queue int16 samples at ``sample_rate``; False if interrupted since ``generation``."""
        ...

    async def flush(self, generation: int | None = None) -> bool:
        """Wait until everything queued has been played out."""
        ...

    def interrupt(self) -> int:
        """Drop what is queued now; returns the number of ``FRAME_MS`` frames dropped."""
        ...

    def pause(self) -> None:
        """Hold what is queued (silence goes out meanwhile); writers wait."""

    def resume(self) -> None:
        """Play on from where :meth:`pause` held."""

    @property
    def audible_frames_sent(self) -> int:
        """Queued (reply) frames handed to the listener so far: how much of a reply was heard."""
        ...


@dataclass
class ReplyProgress:
    """One reply as it is made and played: its text so far, each piece's place in the audio, the audio made,
    and where in the sink's count of played frames it began."""

    text: str = ""
    # (samples made before this piece, piece): what was said, mapped to the audio.
    spoken: list[tuple[int, str]] = field(default_factory=list)
    samples_made: int = 0
    frames_base: int | None = None  # the sink's audible_frames_sent when this reply first wrote
    speaking: bool = False  # its first audible frame went out

    def heard(self, sink: ReplySink) -> str:
        """The part of the reply the listener heard so far (see :func:`played_text`)."""
        if self.frames_base is None:
            return ""
        frames = sink.audible_frames_sent - self.frames_base
        return played_text(self.spoken, self.samples_made, frames * sink.sample_rate * FRAME_MS // 1000)


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
