"""The conversation loop of one session: the only place that knows the order of the stages.

    inbound 16 kHz audio → Endpointer (VAD) → [turn] ASR → Responder → TextChunker → TTS → ReplyTrack

Barge-in: speech that starts while the bot is talking cancels the turn (responder, TTS and queued audio)
and the conversation listens again. Speech that starts while a turn is still being prepared (no reply
audio yet) means the user was not done: that turn is dropped silently and its audio is carried into the
next utterance, so nothing the user said is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr

from assistant.audio import float_to_s16
from assistant.config import Config
from assistant.pipeline.events import EventChannel
from assistant.pipeline.trace import TurnTrace
from assistant.respond.base import Responder, ResponderError
from assistant.respond.history import ConversationHistory
from assistant.rtc.outbound import OUT_SAMPLE_RATE, ReplyTrack
from assistant.tts.base import TTSEngine, TTSRequest
from assistant.tts.chunker import TextChunker
from assistant.vad.endpoint import Endpointer, SpeechEnd, SpeechStart

log = logging.getLogger(__name__)

IN_SAMPLE_RATE = 16_000
# Text chunks waiting for TTS inside one turn; the responder waits when TTS is this far behind.
TTS_TEXT_QUEUE = 16
# PCM chunks synthesized ahead of playout (a Piper sentence or a CosyVoice hop each): enough that the
# next sentence is ready before the current one ends, bounded so a cancelled turn wastes little work.
PCM_AHEAD_CHUNKS = 8
# The spoken apology after a failed turn must not itself hang the session.
APOLOGY_TIMEOUT_S = 10.0


class StageError(RuntimeError):
    """A turn failed in one stage; ``message`` is safe to show (and say) to the user."""

    def __init__(self, stage: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message
        self.cause = cause


async def _stage(stage: str, message: str, coro: Any) -> Any:
    """Await one stage's work, turning any failure into a :class:`StageError` for that stage."""
    try:
        return await coro
    except asyncio.CancelledError:
        raise
    except TimeoutError as exc:
        raise StageError(stage, "that took too long", exc) from exc
    except Exception as exc:
        raise StageError(stage, message, exc) from exc


@dataclass
class TurnDeps:
    """What a turn needs besides the conversation's own state (shared, process-wide engines)."""

    asr: Any  # ASRRunner: ``await transcribe(audio) -> Transcript``
    tts: TTSEngine
    responder: Responder
    voice: str | None = None  # TTS voice id for this session (None: the engine's default)
    on_turn_done: Callable[[TurnTrace], None] | None = None
    on_error: Callable[[str], None] | None = None


class Conversation:
    def __init__(
        self,
        cfg: Config,
        endpointer: Endpointer,
        deps: TurnDeps,
        track: ReplyTrack,
        events: EventChannel,
        session_id: str = "",
    ) -> None:
        self.cfg = cfg
        self.endpointer = endpointer
        self.deps = deps
        self.track = track
        self.events = events
        self.session_id = session_id
        self.history = ConversationHistory(cfg.respond.history_turns)
        self.turns = 0
        self._turn_task: asyncio.Task[None] | None = None
        self._trace: TurnTrace | None = None
        self._speaking = False  # reply audio has started for the current turn
        self._carry_audio = np.zeros(0, dtype=np.float32)
        self._samples_in = 0  # stream position, in 16 kHz samples
        self._clock: tuple[float, int] = (time.time(), 0)  # (wall time, stream sample) of the last chunk
        self._barge_in_at: int | None = None  # stream sample at which pending speech may interrupt
        self.last_audio_wall = time.time()  # the latest audio packet (any level)
        self.last_activity_wall = time.time()  # the latest speech start or reply
        track.on_first_audible = self._on_first_audible

    # --- audio in ----------------------------------------------------------------------------------
    def wall_time(self, sample: int) -> float:
        """Wall-clock time of stream sample ``sample`` (from the arrival time of the latest chunk)."""
        wall, pos = self._clock
        return wall - (pos - sample) / IN_SAMPLE_RATE

    def feed(self, chunk: np.ndarray, arrived: float | None = None) -> None:
        """Feed 16 kHz mono float32 audio as it arrives (called from the inbound reader)."""
        now = time.time() if arrived is None else arrived
        self._samples_in += len(chunk)
        self._clock = (now, self._samples_in)
        self.last_audio_wall = now
        for event in self.endpointer.feed(chunk):
            if isinstance(event, SpeechStart):
                self._on_speech_start(event)
            elif isinstance(event, SpeechEnd):
                self._on_speech_end(event)
        if self._barge_in_at is not None and self._samples_in >= self._barge_in_at:
            self._barge_in_at = None
            if self.endpointer.speaking:
                self._interrupt("barge_in")

    def _on_speech_start(self, ev: SpeechStart) -> None:
        self.last_activity_wall = time.time()
        self.events.emit("speech_start", turn=self.turns + 1, at_ms=round(self.wall_time(ev.sample_index) * 1000, 1))
        if self._turn_task is None or self._turn_task.done():
            return
        if not self._speaking:
            # The user was not done: drop the turn in preparation, keep its audio for the next one.
            self._cancel_turn(carry=True)
            return
        if not self.cfg.turn.barge_in:
            return
        confirmed_ms = (self._samples_in - ev.sample_index) * 1000 / IN_SAMPLE_RATE
        wait_ms = self.cfg.turn.barge_in_min_speech_ms - confirmed_ms
        if wait_ms <= 0:
            self._interrupt("barge_in")
        else:
            self._barge_in_at = self._samples_in + int(wait_ms * IN_SAMPLE_RATE / 1000)

    def _on_speech_end(self, ev: SpeechEnd) -> None:
        speech_end = self.wall_time(round(ev.time_s * IN_SAMPLE_RATE))
        self.events.emit(
            "speech_end",
            turn=self.turns + 1,
            at_ms=round(speech_end * 1000, 1),
            duration_ms=round(len(ev.audio) * 1000 / IN_SAMPLE_RATE, 1),
        )
        audio = ev.audio
        if self._carry_audio.size:
            audio = np.concatenate([self._carry_audio, audio])
            self._carry_audio = np.zeros(0, dtype=np.float32)
        if self._turn_task is not None and not self._turn_task.done():
            if not self.cfg.turn.barge_in:
                # Half-duplex: what the user says over the bot is not a turn.
                log.info("utterance_ignored session=%s reason=bot_speaking", self.session_id)
                return
            self._interrupt("new_turn")
        self.turns += 1
        trace = TurnTrace(self.turns)
        trace.mark("speech_end", speech_end)
        trace.mark("vad_end")
        self._trace = trace
        self._speaking = False
        self._turn_task = asyncio.get_running_loop().create_task(
            self._run_turn(trace, audio), name=f"turn-{self.session_id}-{self.turns}"
        )

    # --- interruption ------------------------------------------------------------------------------
    def _cancel_turn(self, carry: bool) -> None:
        task = self._turn_task
        if task is None or task.done():
            return
        task.cancel()
        self._turn_task = None
        self.track.interrupt()
        if carry and self._pending_audio is not None:
            self._carry_audio = self._pending_audio
        log.info("turn_dropped session=%s turn=%d carry=%s", self.session_id, self.turns, carry)

    def _interrupt(self, reason: str) -> None:
        task = self._turn_task
        if task is None or task.done():
            return
        task.cancel()
        self._turn_task = None
        dropped = self.track.interrupt()
        self._speaking = False
        self.events.emit("interrupted", turn=self.turns, reason=reason, dropped_ms=dropped * 20)
        log.info("turn_interrupted session=%s turn=%d reason=%s", self.session_id, self.turns, reason)

    _pending_audio: np.ndarray | None = None

    # --- one turn ----------------------------------------------------------------------------------
    async def _run_turn(self, trace: TurnTrace, audio: np.ndarray) -> None:
        self._pending_audio = audio
        turn = trace.turn
        gen = self.track.generation
        try:
            transcript = await _stage("asr", "I could not make that out", self.deps.asr.transcribe(audio))
            trace.mark("asr_done")
            text = transcript.text.strip()
            self.events.emit("transcript", turn=turn, final=True, text=text)
            if not text:
                log.info("turn_empty session=%s turn=%d", self.session_id, turn)
                return
            if self.cfg.log.debug_content:
                log.debug("turn_text session=%s turn=%d text=%r", self.session_id, turn, text)
            self._pending_audio = None  # heard and understood: from here on an interruption is a barge-in
            reply = await self._reply(trace, text, gen)
            self.history.add_turn(text, reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, StageError) else StageError("turn", "the reply failed", exc)
            self._turn_failed(trace, error)
            if error.stage != "tts":
                await self._apologize(gen)
        finally:
            self.last_activity_wall = time.time()
            if self._trace is trace and trace.has("first_frame_sent"):
                trace.mark("reply_done")
                self.events.emit("reply_done", turn=turn, durations_ms=trace.durations_ms())
                if self.deps.on_turn_done is not None:
                    self.deps.on_turn_done(trace)

    async def _reply(self, trace: TurnTrace, text: str, gen: int) -> str:
        """Responder → chunker → TTS → track: the three run side by side, joined by bounded queues."""
        pieces: asyncio.Queue[str | None] = asyncio.Queue(maxsize=TTS_TEXT_QUEUE)
        reply_parts: list[str] = []
        self.track.expect_reply()

        async def produce_text() -> None:
            chunker = TextChunker(self.cfg.chunker)
            try:
                async with asyncio.timeout(self.cfg.respond.total_timeout_s):
                    async for delta in self.deps.responder.respond(text, self.history.messages):
                        if not delta:
                            continue
                        trace.mark("first_text")
                        reply_parts.append(delta)
                        self.events.emit("reply_text", turn=trace.turn, delta=delta, text="".join(reply_parts))
                        for piece in chunker.push(delta):
                            await pieces.put(piece)
                for piece in chunker.flush():
                    await pieces.put(piece)
            except ResponderError as exc:
                raise StageError("responder", str(exc), exc) from exc
            except TimeoutError as exc:
                raise StageError("responder", "the reply took too long", exc) from exc
            except Exception as exc:
                raise StageError("responder", "the reply failed", exc) from exc
            finally:
                await pieces.put(None)

        await self._run_side_by_side(produce_text(), self._speak(trace, pieces, gen))
        return "".join(reply_parts)

    async def _speak(self, trace: TurnTrace, pieces: asyncio.Queue[str | None], gen: int) -> None:
        """TTS each text piece into a PCM queue while a writer feeds the track at its own pace.

        Synthesis runs ahead of playout (bounded by ``PCM_AHEAD_CHUNKS``), so the next sentence is
        ready before the current one ends and there is no gap between them.
        """
        pcm_q: asyncio.Queue[np.ndarray | None] = asyncio.Queue(maxsize=PCM_AHEAD_CHUNKS)

        async def synthesize() -> None:
            try:
                while (piece := await pieces.get()) is not None:
                    trace.mark("first_tts_text")
                    async for out in self._synthesize_48k(piece):
                        trace.mark("first_audio")
                        await pcm_q.put(out)
            finally:
                await pcm_q.put(None)

        async def write() -> None:
            while (out := await pcm_q.get()) is not None:
                if not await self.track.write(float_to_s16(out), gen):
                    return
            await self.track.flush(gen)

        await self._run_side_by_side(synthesize(), write())

    async def _synthesize_48k(self, text: str) -> AsyncIterator[np.ndarray]:
        """One TTS request, resampled to the track's 48 kHz, checked for garbage, with a time limit."""
        tts = self.deps.tts
        resampler = soxr.ResampleStream(tts.sample_rate, OUT_SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        request = TTSRequest(text=text, voice=self.deps.voice, language=self.cfg.tts.language or None)
        try:
            async with asyncio.timeout(self.cfg.tts.timeout_s):
                async for pcm in tts.synthesize(request):
                    x = np.asarray(pcm, dtype=np.float32).reshape(-1)
                    if x.size == 0:
                        continue
                    if not np.isfinite(x).all():
                        raise StageError("tts", "the voice failed", ValueError("non-finite audio from TTS"))
                    yield resampler.resample_chunk(x)
            tail = resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            if tail.size:
                yield tail
        except StageError:
            raise
        except TimeoutError as exc:
            raise StageError("tts", "the voice took too long", exc) from exc
        except Exception as exc:
            raise StageError("tts", "the voice failed", exc) from exc

    @staticmethod
    async def _run_side_by_side(first: Any, second: Any) -> None:
        """Run two coroutines together; the first failure cancels the other and is raised."""
        tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    async def _apologize(self, gen: int) -> None:
        """Say the configured error message (best effort, short time limit): a failed turn is not silent."""
        message = self.cfg.turn.error_message.strip()
        if not message or gen != self.track.generation:
            return
        try:
            async with asyncio.timeout(APOLOGY_TIMEOUT_S):
                async for out in self._synthesize_48k(message):
                    if not await self.track.write(float_to_s16(out), gen):
                        return
                await self.track.flush(gen)
        except Exception as exc:  # the apology itself failed: the error event already told the page
            log.info("apology_failed session=%s error=%s", self.session_id, type(exc).__name__)

    def _on_first_audible(self, at: float) -> None:
        trace = self._trace
        if trace is None or trace.has("first_frame_sent"):
            return
        trace.mark("first_frame_sent", at)
        self._speaking = True
        self.events.emit("reply_audio_start", turn=trace.turn)
        self.events.emit("turn_metrics", **trace.as_event())

    def _turn_failed(self, trace: TurnTrace, error: StageError) -> None:
        cause = error.__cause__ or error.cause
        log.warning(
            "turn_failed session=%s turn=%d stage=%s error=%s",
            self.session_id,
            trace.turn,
            error.stage,
            type(cause).__name__ if cause else "StageError",
            exc_info=cause if cause is not None and not isinstance(cause, ResponderError | TimeoutError) else None,
        )
        self.events.emit("error", turn=trace.turn, stage=error.stage, message=error.message)
        if self.deps.on_error is not None:
            self.deps.on_error(error.stage)

    async def close(self) -> None:
        task = self._turn_task
        self._turn_task = None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
