"""The synthesis path: the bot's text as it arrives → audio at the listener's rate. The one place that does it.

(The user's audio is "speech" everywhere else in the pipeline; this is the bot's voice being made.)

    text deltas ─▶ TextChunker (once) ─▶ engine.synthesize_stream(pieces) ─▶ finite check ─▶ resample ─▶ chunks

Used by the conversation (reply text streamed from the responder, audio for the reply track), by the TTS
service (a whole request's text, audio at the requested rate) and by the apology after a failed turn.

``tts.timeout_s`` is the engine's own time: each wait for a chunk has its own deadline and no timeout spans
a ``yield``, so time a slow consumer holds this generator (a long reply playing out, a slow HTTP client)
neither counts nor lets a timeout cancel the consumer's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np

from assistant.config import ChunkerConfig
from assistant.tts.base import TTSEngine, TTSRequest, with_streaming
from assistant.tts.chunker import TextChunker


class SynthesisTimeout(TimeoutError):
    """The engine took longer than the time budget."""


class SynthesisFailed(RuntimeError):
    """The engine failed or made unusable audio (non-finite samples)."""


class SynthesisPath:
    """One engine, one output rate, one time budget; :meth:`speak` makes one utterance's audio."""

    def __init__(self, engine: TTSEngine, out_rate: int, *, timeout_s: float,
                 chunker: ChunkerConfig | None = None) -> None:
        self.engine = with_streaming(engine)  # plug-ins with only ``synthesize`` speak piece by piece
        self.out_rate = out_rate
        self.timeout_s = timeout_s
        self.chunker = chunker or ChunkerConfig()

    async def speak(
        self,
        text: str | AsyncIterator[str],
        request: TTSRequest,
        *,
        on_piece: Callable[[str], None] | None = None,
    ) -> AsyncIterator[np.ndarray]:
        """Yield float32 mono chunks at ``out_rate`` as the engine makes them.

        ``text`` is a whole text or the deltas of one reply as they arrive; either way it is chunked here,
        once, and every piece reaches the engine as soon as the chunker releases it. ``request`` carries
        voice, language, speed, instruction and seed (its ``text`` is ignored). ``on_piece`` sees each
        piece as it goes to the engine. Raises :class:`SynthesisTimeout`, :class:`SynthesisFailed`, or the
        engine's ``TTSUnsupported`` for a request it cannot honour.
        """
        import soxr  # not at module level: the TTS service's import must not need it on a GPU box

        clock = _EngineClock(self.timeout_s)
        chunks = self.engine.synthesize_stream(self._pieces(text, on_piece, clock, request.language),
                                               replace(request, text=""))
        resampler = (
            soxr.ResampleStream(self.engine.sample_rate, self.out_rate, 1, dtype="float32", quality="HQ")
            if self.engine.sample_rate != self.out_rate else None
        )
        try:
            while True:
                try:
                    async with asyncio.timeout(None) as deadline:
                        clock.set(waiting_audio=True, deadline=deadline)
                        try:
                            pcm = await anext(chunks)
                        finally:
                            clock.set(waiting_audio=False, deadline=None)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    raise SynthesisTimeout(f"synthesis took over {self.timeout_s:g} s") from exc
                x = np.asarray(pcm, dtype=np.float32).reshape(-1)
                if x.size == 0:
                    continue
                if not np.isfinite(x).all():
                    raise SynthesisFailed("non-finite audio from the TTS engine")
                if resampler is not None:
                    x = resampler.resample_chunk(x)
                if x.size:
                    yield x
            if resampler is not None:
                tail = resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
                if tail.size:
                    yield tail
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]

    async def _pieces(self, text: str | AsyncIterator[str], on_piece: Callable[[str], None] | None,
                      clock: _EngineClock, language: str | None = None) -> AsyncIterator[str]:
        chunker = TextChunker(self.chunker, language=language)  # the text shaped for the ear, in the turn's language
        if isinstance(text, str):
            pieces = [*chunker.push(text), *chunker.flush()]
        else:
            while True:
                clock.set(waiting_text=True)  # the engine waits for the writer: not the engine's time
                try:
                    delta = await anext(text)
                except StopAsyncIteration:
                    break
                finally:
                    clock.set(waiting_text=False)
                for piece in chunker.push(delta):
                    if on_piece is not None:
                        on_piece(piece)
                    yield piece
            pieces = chunker.flush()
        for piece in pieces:
            if on_piece is not None:
                on_piece(piece)
            yield piece


class _EngineClock:
    """The engine's own time against its budget: it runs while the consumer waits for audio and the
    engine is not itself waiting for text; the pending ``asyncio.timeout`` is moved to match."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds
        self.waiting_audio = False
        self.waiting_text = False
        self._since: float | None = None
        self._deadline: asyncio.Timeout | None = None

    _UNSET: Any = object()

    def set(self, *, waiting_audio: bool | None = None, waiting_text: bool | None = None,
            deadline: Any = _UNSET) -> None:
        now = time.monotonic()
        if self._since is not None:
            self.left -= now - self._since
            self._since = None
        if waiting_audio is not None:
            self.waiting_audio = waiting_audio
        if waiting_text is not None:
            self.waiting_text = waiting_text
        if deadline is not _EngineClock._UNSET:
            self._deadline = deadline
        running = self.waiting_audio and not self.waiting_text
        if running:
            self._since = now
        if self._deadline is not None:
            loop_now = asyncio.get_running_loop().time()
            self._deadline.reschedule(loop_now + max(0.0, self.left) if running else None)
