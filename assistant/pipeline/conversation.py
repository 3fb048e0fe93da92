"""The conversation loop of one session: the only place that knows the order of the stages.

    inbound 16 kHz audio → Endpointer (VAD) → [turn] ASR → Responder → TextChunker → TTS → ReplyTrack

Barge-in: speech that starts while the bot is talking cancels the turn (responder, TTS and queued audio)
and the conversation listens again. Speech that starts while a turn is still being prepared (no reply
audio yet) means the user was not done: that turn is dropped silently and its audio is carried into the
next utterance, so nothing the user said is lost.

Speculation (``turn.speculative``): on a short pause the whole turn starts on the audio so far, but its
events are held back and its audio waits behind a gate. If the pause becomes the end of the utterance, the
turn is committed and its (already prepared) reply is heard at once; if the user goes on, it is dropped
without a trace. The speculative transcript also moves the endpoint (``turn.smart_endpoint``): sooner
after a sentence that looks complete, later after one that trails off.
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

from assistant.audio import SPEECH_RATE, float_to_s16
from assistant.config import Config
from assistant.pipeline.events import EventChannel
from assistant.pipeline.speech import ReplySink, SpeechPath, SpeechTimeout
from assistant.pipeline.trace import TurnTrace
from assistant.pipeline.turn_end import TurnEnd, judge
from assistant.respond.base import Responder, ResponderError
from assistant.respond.history import ConversationHistory
from assistant.tts.base import TTSEngine, TTSRequest
from assistant.vad.endpoint import Endpointer, SpeechEnd, SpeechStart

log = logging.getLogger(__name__)

# Text deltas waiting for the speech path inside one turn; the responder waits when TTS is this far behind.
TTS_TEXT_QUEUE = 64
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
    on_interrupted: Callable[[], None] | None = None


class Turn:
    """One user utterance and its reply: its trace, task, audio, and (while speculative) its gate.

    Until :meth:`commit`, events are held back and reply audio waits; a turn that is never committed
    leaves no trace the user can see or hear.
    """

    def __init__(self, number: int, audio: np.ndarray, audio_end: int, gen: int, speculative: bool) -> None:
        self.number = number
        self.trace = TurnTrace(number)
        self.audio = audio
        self.audio_end = audio_end  # stream sample where this turn's speech ends
        self.gen = gen  # the reply track generation this turn writes in
        self.speculative = speculative
        self.committed = asyncio.Event()
        self.held_events: list[tuple[str, dict[str, Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.transcript: str | None = None
        self.verdict: TurnEnd | None = None  # is the transcript a finished sentence? (smart endpoint)
        self.speaking = False  # its reply audio has started
        self.carried = 0  # samples of an earlier dropped turn's audio at the start of ``audio``

    @property
    def active(self) -> bool:
        return self.task is not None and not self.task.done()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


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
        self.cfg = cfg
        self.endpointer = endpointer
        self.deps = deps
        self.track = track
        self.events = events
        self.session_id = session_id
        self.history = ConversationHistory(cfg.respond.history_turns)
        self.speech = SpeechPath(deps.tts, track.sample_rate, timeout_s=cfg.tts.timeout_s, chunker=cfg.chunker)
        self.turns = 0
        self._turn: Turn | None = None  # the committed turn (preparing or speaking)
        self._spec: Turn | None = None  # a speculative turn started on the current pause
        self._partial: asyncio.Task[None] | None = None
        self._last_partial_at = 0
        self._partial_text = ""
        self._carry_audio = np.zeros(0, dtype=np.float32)
        self._samples_in = 0  # stream position, in 16 kHz samples
        self._clock: tuple[float, int] = (time.time(), 0)  # (wall time, stream sample) of the last chunk
        self._barge_in_at: int | None = None  # stream sample at which pending speech may interrupt
        self.last_audio_wall = time.time()  # the latest audio packet (any level)
        self.last_activity_wall = time.time()  # the latest speech start or reply
        self.speculations = {"started": 0, "committed": 0, "dropped": 0}
        track.on_first_audible = self._on_first_audible

    # --- audio in ----------------------------------------------------------------------------------
    def wall_time(self, sample: int) -> float:
        """Wall-clock time of stream sample ``sample`` (from the arrival time of the latest chunk)."""
        wall, pos = self._clock
        return wall - (pos - sample) / SPEECH_RATE

    def feed(self, chunk: np.ndarray) -> None:
        """Feed 16 kHz mono float32 audio as it arrives (called from the inbound reader)."""
        now = time.time()
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
        if self.endpointer.speaking:
            self._while_speaking()

    def _while_speaking(self) -> None:
        """Per chunk while the user talks: partial transcripts, speculation, the adaptive endpoint."""
        cfg = self.cfg
        pause_ms = self.endpointer.silence_samples * 1000 // SPEECH_RATE
        spec = self._spec
        if pause_ms == 0:
            if spec is not None:  # the user went on: the pause was not the end
                self._drop_speculation("resumed")
            self.endpointer.set_end_silence(None)
            self._maybe_partial()
            return
        if spec is None:
            if cfg.turn.speculative and pause_ms >= cfg.turn.speculative_pause_ms and not self._busy_replying():
                self._start_speculation()
            return
        if cfg.turn.smart_endpoint and spec.transcript is not None:
            if spec.verdict is None:  # judged once per speculation, not on every chunk of the pause
                spec.verdict = judge(spec.transcript)
            verdict = spec.verdict
            if verdict is TurnEnd.INCOMPLETE:
                self.endpointer.set_end_silence(cfg.turn.incomplete_endpoint_ms)
            elif verdict is TurnEnd.COMPLETE and pause_ms >= cfg.turn.complete_endpoint_ms:
                ev = self.endpointer.force_end("complete_sentence")
                if ev is not None:
                    self._on_speech_end(ev)

    def _busy_replying(self) -> bool:
        return self._turn is not None and self._turn.active

    def _on_speech_start(self, ev: SpeechStart) -> None:
        self.last_activity_wall = time.time()
        self.events.emit("speech_start", turn=self.turns + 1, at_ms=round(self.wall_time(ev.sample_index) * 1000, 1))
        self._partial_text = ""
        self._last_partial_at = ev.sample_index
        turn = self._turn
        if turn is None or not turn.active:
            return
        if not turn.speaking:
            # The user was not done: drop the turn in preparation, keep its audio for the next one.
            self._drop_turn(carry=True)
            return
        if not self.cfg.turn.barge_in:
            return
        confirmed_ms = (self._samples_in - ev.sample_index) * 1000 / SPEECH_RATE
        wait_ms = self.cfg.turn.barge_in_min_speech_ms - confirmed_ms
        if wait_ms <= 0:
            self._interrupt("barge_in")
        else:
            self._barge_in_at = self._samples_in + int(wait_ms * SPEECH_RATE / 1000)

    def _on_speech_end(self, ev: SpeechEnd) -> None:
        speech_end = self.wall_time(ev.sample_index)
        self.events.emit(
            "speech_end",
            turn=self.turns + 1,
            at_ms=round(speech_end * 1000, 1),
            duration_ms=round(len(ev.audio) * 1000 / SPEECH_RATE, 1),
            reason=ev.reason,
        )
        self._cancel_partial()
        if self._busy_replying():
            if not self.cfg.turn.barge_in:
                # Half-duplex: what the user says over the bot is not a turn.
                log.info("utterance_ignored session=%s reason=bot_speaking", self.session_id)
                self._drop_speculation("bot_speaking")
                return
            self._interrupt("new_turn")
        spec, self._spec = self._spec, None
        if spec is not None and spec.audio_end == ev.sample_index and spec.carried == self._carry_audio.size:
            turn = spec  # the pause was the end: the speculative turn becomes the turn
            self._carry_audio = np.zeros(0, dtype=np.float32)
            self.speculations["committed"] += 1
        else:
            if spec is not None:
                self._drop_speculation("changed", spec)
            audio = ev.audio
            if self._carry_audio.size:
                audio = np.concatenate([self._carry_audio, audio])
                self._carry_audio = np.zeros(0, dtype=np.float32)
            turn = self._new_turn(audio, ev.sample_index, speculative=False)
        turn.trace.mark("speech_end", speech_end)
        turn.trace.mark("vad_end")
        self._turn = turn
        self._commit(turn)

    # --- turns -------------------------------------------------------------------------------------
    def _new_turn(self, audio: np.ndarray, audio_end: int, speculative: bool) -> Turn:
        number = self.turns + 1 if speculative else self._next_number()
        turn = Turn(number, audio, audio_end, self.track.generation, speculative)
        turn.task = asyncio.get_running_loop().create_task(
            self._run_turn(turn), name=f"turn-{self.session_id}-{number}{'-spec' if speculative else ''}"
        )
        return turn

    def _next_number(self) -> int:
        self.turns += 1
        return self.turns

    def _commit(self, turn: Turn) -> None:
        if turn.speculative:
            turn.number = turn.trace.turn = self._next_number()
        turn.committed.set()
        self.track.expect_reply()
        for kind, fields in turn.held_events:
            self.events.emit(kind, **{**fields, "turn": turn.number})
        turn.held_events.clear()

    def _emit(self, turn: Turn, kind: str, **fields: Any) -> None:
        if turn.committed.is_set():
            self.events.emit(kind, turn=turn.number, **fields)
        else:
            turn.held_events.append((kind, fields))

    def _start_speculation(self) -> None:
        utterance = self.endpointer.utterance()
        if utterance is None or not utterance.size:
            return
        audio = np.concatenate([self._carry_audio, utterance]) if self._carry_audio.size else utterance
        self._spec = self._new_turn(audio, self.endpointer.utterance_end, speculative=True)
        self._spec.carried = self._carry_audio.size
        self.speculations["started"] += 1

    def _drop_speculation(self, reason: str, spec: Turn | None = None) -> None:
        spec = spec or self._spec
        if spec is self._spec:
            self._spec = None
        if spec is not None:
            spec.cancel()
            self.speculations["dropped"] += 1
            log.debug("speculation_dropped session=%s reason=%s", self.session_id, reason)

    def _drop_turn(self, carry: bool) -> None:
        turn = self._turn
        if turn is None or not turn.active:
            return
        turn.cancel()
        self._turn = None
        self.track.interrupt()
        if carry:
            self._carry_audio = turn.audio
        log.info("turn_dropped session=%s turn=%d carry=%s", self.session_id, turn.number, carry)

    def _interrupt(self, reason: str) -> None:
        turn = self._turn
        if turn is None or not turn.active:
            return
        turn.cancel()
        self._turn = None
        dropped = self.track.interrupt()
        self.events.emit("interrupted", turn=turn.number, reason=reason, dropped_ms=dropped * 20)
        if self.deps.on_interrupted is not None:
            self.deps.on_interrupted()
        log.info("turn_interrupted session=%s turn=%d reason=%s", self.session_id, turn.number, reason)

    # --- partial transcripts -----------------------------------------------------------------------
    def _maybe_partial(self) -> None:
        cfg = self.cfg.asr
        if not cfg.partials or (self._partial is not None and not self._partial.done()):
            return
        if (self._samples_in - self._last_partial_at) * 1000 < cfg.partial_interval_ms * SPEECH_RATE:
            return
        audio = self.endpointer.utterance()
        if audio is None or len(audio) < SPEECH_RATE // 2:
            return
        self._last_partial_at = self._samples_in
        self._partial = asyncio.get_running_loop().create_task(
            self._run_partial(audio), name=f"partial-{self.session_id}"
        )

    async def _run_partial(self, audio: np.ndarray) -> None:
        try:
            result = await self.deps.asr.transcribe_partial(audio)
        except Exception as exc:  # a partial is a nicety: never let it hurt the turn
            log.debug("partial_failed session=%s error=%s", self.session_id, type(exc).__name__)
            return
        if result is None or not self.endpointer.speaking:
            return
        text = result.text.strip()
        stable = _common_prefix(self._partial_text, text)
        self._partial_text = text
        self.events.emit("transcript", turn=self.turns + 1, final=False, text=text, stable=stable)

    def _cancel_partial(self) -> None:
        if self._partial is not None and not self._partial.done():
            self._partial.cancel()
        self._partial = None

    # --- one turn ----------------------------------------------------------------------------------
    async def _run_turn(self, turn: Turn) -> None:
        trace = turn.trace
        try:
            transcript = await _stage("asr", "I could not make that out", self.deps.asr.transcribe(turn.audio))
            trace.mark("asr_done")
            text = turn.transcript = transcript.text.strip()
            self._emit(turn, "transcript", final=True, text=text)
            if not text:
                log.info("turn_empty session=%s turn=%d", self.session_id, turn.number)
                return
            if self.cfg.log.debug_content:
                log.debug("turn_text session=%s turn=%d text=%r", self.session_id, turn.number, text)
            reply = await self._reply(turn, text)
            await turn.committed.wait()
            self.history.add_turn(text, reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, StageError) else StageError("turn", "the reply failed", exc)
            await turn.committed.wait()
            self._turn_failed(turn, error)
            if error.stage != "tts":
                await self._apologize(turn.gen)
        finally:
            if turn.committed.is_set():
                self.last_activity_wall = time.time()
            if trace.has("first_frame_sent"):
                trace.mark("reply_done")
                self.events.emit("reply_done", turn=turn.number, durations_ms=trace.durations_ms())
                if self.deps.on_turn_done is not None:
                    self.deps.on_turn_done(trace)

    async def _reply(self, turn: Turn, text: str) -> str:
        """Responder → speech path → track: they run side by side, joined by bounded queues."""
        trace = turn.trace
        deltas: asyncio.Queue[str | None] = asyncio.Queue(maxsize=TTS_TEXT_QUEUE)
        reply_parts: list[str] = []

        async def produce_text() -> None:
            try:
                async with asyncio.timeout(self.cfg.respond.total_timeout_s):
                    async for delta in self.deps.responder.respond(text, self.history.messages):
                        if not delta:
                            continue
                        trace.mark("first_text")
                        reply_parts.append(delta)
                        self._emit(turn, "reply_text", delta=delta, text="".join(reply_parts))
                        await deltas.put(delta)
            except ResponderError as exc:
                raise StageError("responder", str(exc), exc) from exc
            except TimeoutError as exc:
                raise StageError("responder", "the reply took too long", exc) from exc
            except Exception as exc:
                raise StageError("responder", "the reply failed", exc) from exc
            # The end mark only on success: on failure or cancel the consumer is cancelled too, and an
            # awaited put into a full queue nobody reads would hang the turn (and Session.close) for ever.
            await deltas.put(None)

        await self._run_side_by_side(produce_text(), self._speak(turn, deltas))
        return "".join(reply_parts)

    async def _speak(self, turn: Turn, deltas: asyncio.Queue[str | None]) -> None:
        """The reply's text through the speech path into a PCM queue, while a writer feeds the track.

        Synthesis runs ahead of playout (bounded by ``PCM_AHEAD_CHUNKS``), so the next sentence is
        ready before the current one ends and there is no gap between them. The writer starts only
        once the turn is committed: nothing speculative is ever heard.
        """
        trace = turn.trace
        pcm_q: asyncio.Queue[np.ndarray | None] = asyncio.Queue(maxsize=PCM_AHEAD_CHUNKS)

        async def text() -> AsyncIterator[str]:
            while (delta := await deltas.get()) is not None:
                yield delta

        async def synthesize() -> None:
            async for out in self._speech(text(), on_piece=lambda _: trace.mark("first_tts_text")):
                trace.mark("first_audio")
                await pcm_q.put(out)
            await pcm_q.put(None)  # only on success (see produce_text)

        async def write() -> None:
            await turn.committed.wait()
            while (out := await pcm_q.get()) is not None:
                if not await self.track.write(float_to_s16(out), turn.gen):
                    return
            await self.track.flush(turn.gen)

        await self._run_side_by_side(synthesize(), write())

    async def _speech(
        self, text: str | AsyncIterator[str], on_piece: Callable[[str], None] | None = None
    ) -> AsyncIterator[np.ndarray]:
        """The speech path for this session's voice, its failures turned into the ``tts`` stage's errors."""
        request = TTSRequest(text="", voice=self.deps.voice, language=self.cfg.tts.language or None)
        try:
            async for out in self.speech.speak(text, request, on_piece=on_piece):
                yield out
        except SpeechTimeout as exc:
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
                async for out in self._speech(message):
                    if not await self.track.write(float_to_s16(out), gen):
                        return
                await self.track.flush(gen)
        except Exception as exc:  # the apology itself failed: the error event already told the page
            log.info("apology_failed session=%s error=%s", self.session_id, type(exc).__name__)

    def _on_first_audible(self, at: float) -> None:
        turn = self._turn
        if turn is None or turn.trace.has("first_frame_sent"):
            return
        turn.trace.mark("first_frame_sent", at)
        turn.speaking = True
        self.events.emit("reply_audio_start", turn=turn.number)
        self.events.emit("turn_metrics", speculative=turn.speculative, **turn.trace.as_event())

    def _turn_failed(self, turn: Turn, error: StageError) -> None:
        cause = error.__cause__ or error.cause
        log.warning(
            "turn_failed session=%s turn=%d stage=%s error=%s",
            self.session_id,
            turn.number,
            error.stage,
            type(cause).__name__ if cause else "StageError",
            exc_info=cause if cause is not None and not isinstance(cause, ResponderError | TimeoutError) else None,
        )
        self.events.emit("error", turn=turn.number, stage=error.stage, message=error.message)
        if self.deps.on_error is not None:
            self.deps.on_error(error.stage)

    async def close(self) -> None:
        tasks = [t.task for t in (self._turn, self._spec) if t is not None and t.task is not None]
        tasks += [self._partial] if self._partial is not None else []
        self._turn = self._spec = self._partial = None
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _common_prefix(a: str, b: str) -> str:
    """The words two consecutive hypotheses agree on (local agreement: what later passes will keep)."""
    out: list[str] = []
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        out.append(x)
    return " ".join(out)
