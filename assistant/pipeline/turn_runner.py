"""The turn runner: one turn's words to the reply's sound. ASR → responder → synthesis path → reply sink.

It knows nothing of voice activity: the turn-taking policy (``turn_taking.py``) starts turns, commits or drops
them, and pauses, resumes or cancels the reply. What the runner guarantees: a turn not yet committed is
never seen or heard (its events are held, its audio waits behind ``Turn.committed``, a failure waits there
too and is dropped with the turn if it never commits); a failed turn says so (an ``error`` event and the
spoken apology); and the history keeps what was really said, so a reply cut short enters it only as far as
it was played.

The way out has two queues, each for its own job: the responder's text deltas (so the responder runs ahead
of a slow voice, bounded), and synthesized audio waiting for the reply sink (so the next sentence is ready
while this one plays, and so a speculative turn's audio is made before it is committed but written only
after). The sink itself holds ``audio.reply_queue_ms``, which bounds barge-in. The sink reports the first
audible frame by resolving a future (:meth:`ReplySink.expect_reply`); it never calls back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import numpy as np

from assistant import languages
from assistant.asr.base import PassKind, PassTiming, Transcript
from assistant.asr.tail import HeardBefore, join_tail, lost_tail, words
from assistant.audio import FRAME_MS, S16_SCALE, SILENCE_PEAK_S16, SPEECH_RATE, float_to_s16
from assistant.config import ChunkerConfig, LogConfig, RespondConfig, TTSConfig, TurnConfig
from assistant.pipeline.events import EventChannel
from assistant.pipeline.loops import LoopGuard
from assistant.pipeline.reply import ReplySink
from assistant.pipeline.synthesis import SynthesisPath, SynthesisTimeout
from assistant.pipeline.trace import Ending, Span
from assistant.pipeline.turn import BargeIn, StageError, Turn, TurnDeps, stage
from assistant.respond.base import ReplyOptions, ResponderError, closing, reply_stream
from assistant.respond.history import ConversationHistory
from assistant.tts.base import TTSBusy, TTSRequest
from assistant.tts.routing import choose_voice, speaks_piece_by_piece

log = logging.getLogger(__name__)

# Text deltas waiting for the synthesis path inside one turn; the responder waits when TTS is this far behind.
TTS_TEXT_QUEUE = 64
# PCM chunks synthesized ahead of playout (a Piper sentence or a CosyVoice hop each): enough that the
# next sentence is ready before the current one ends, bounded so a cancelled turn wastes little work.
PCM_AHEAD_CHUNKS = 8
# The spoken apology after a failed turn must not itself hang the session.
APOLOGY_TIMEOUT_S = 10.0
# Of a reply's leading silence (turn.trim_reply_silence), this much is kept before its first audible sample:
# the voice's own onset ramp, so the cut is never heard.
LEAD_IN_MS = 10
# Events of the reply itself, sent only once its turn is confirmed (as its audio is heard only then): a turn
# committed on an unsure end and dropped when the speaker goes on was never shown or read either (the page, a
# Realtime client that reads text), only its audio was held before.
AFTER_CONFIRM = frozenset({"reply_text"})


class TurnRunner:
    def __init__(
        self,
        respond: RespondConfig,
        tts: TTSConfig,
        chunker: ChunkerConfig,
        turn: TurnConfig,
        logs: LogConfig,
        deps: TurnDeps,
        sink: ReplySink,
        events: EventChannel,
        session_id: str = "",
    ) -> None:
        self.respond_cfg, self.debug_content = respond, logs.debug_content
        self.deps, self.sink, self.events, self.session_id = deps, sink, events, session_id
        self.history = ConversationHistory(respond.history_turns)
        if speaks_piece_by_piece(deps.tts):
            # An engine that speaks a piece only once it has all of it: the reply's first piece as short as a
            # clause allows, since the listener waits for it (a streaming engine starts on any text anyway).
            # Its next clauses go out alone too while little speech is made (a one-word "No," first), and a long
            # clause a slow model is still writing is cut before a joining word meanwhile.
            chunker = dataclasses.replace(chunker, first_min_chars=chunker.reply_first_min_chars,
                                          runway_chars=chunker.reply_runway_chars,
                                          phrase_break_ms=chunker.reply_phrase_break_ms)
        self.synthesis = SynthesisPath(deps.tts, sink.sample_rate, timeout_s=tts.timeout_s, chunker=chunker)
        self.request = TTSRequest(text="", voice=deps.voice, language=tts.language or None, session=session_id,
                                  reuse_audio=True)  # a reply's opener spoken before is spoken again at once
        # The language this session's turns are heard in: a code, "auto" (detected per turn), or None (asr.language).
        self.language: str | None = None
        self.apology = turn.error_message.strip()
        self.trim_silence = turn.trim_reply_silence
        self.turns = 0
        self.current: Turn | None = None  # the committed turn (preparing or speaking)
        self.paused = False  # its reply is held while the user makes a sound over it
        self.last_activity_wall = time.time()  # the latest reply (the policy adds speech starts)

    # --- the policy's handles ------------------------------------------------------------------------
    def start(self, audio: np.ndarray, audio_end: int, *, speculative: bool, heard: str | None = None,
              before: HeardBefore | None = None, say: str | None = None, language: str | None = None) -> Turn:
        """Start a turn on ``audio`` (``heard``: its words are known, no ASR; ``before``: what a pass at an
        earlier pause of it heard, asr/tail.py); a speculative one is numbered, seen and heard only once
        committed. ``say``: a turn of the assistant's own (a timer that rang), no user words and no responder:
        ``say`` in ``language`` is its reply, heard like any other (a barge-in cuts it)."""
        number = self.turns + 1 if speculative else self._next_number()
        turn = Turn(number, audio, audio_end, self.sink.generation, speculative)
        turn.before = before
        if say is not None:
            turn.announcement, turn.language = say, language
        turn.task = asyncio.get_running_loop().create_task(
            self._run(turn, heard), name=f"turn-{self.session_id}-{number}{'-spec' if speculative else ''}"
        )
        return turn

    def commit(self, turn: Turn, ending: Ending, *, confirmed: bool = True) -> None:
        """The turn is the user's: it becomes the current one, its held events go out, its audio may play (with
        ``confirmed`` False, an unsure end: only once :meth:`confirm` is called, turn.confirm_ms)."""
        if turn.speculative:
            turn.number = turn.trace.turn = self._next_number()
        turn.trace.ending = ending
        turn.trace.mark("speech_end", ending.speech_end)
        turn.trace.mark("vad_end", ending.decided)
        self.current = turn
        turn.committed.set()
        self.sink.expect_reply().add_done_callback(functools.partial(self._on_first_audible, turn))
        if confirmed:
            self.confirm(turn)
        self._release(turn)

    def confirm(self, turn: Turn) -> None:
        """The committed ``turn``'s reply may be heard (its end is sure, or the silence since confirmed it)."""
        if not turn.confirmed.is_set():
            turn.trace.mark("confirmed")
            turn.confirmed.set()
            self._release(turn)

    def discard(self, turn: Turn) -> None:
        """Cancel a turn that will never be committed (a speculation the user talked over): nothing of it,
        not even a failure, reaches the user."""
        turn.cancel()

    @property
    def busy(self) -> bool:
        return self.current is not None and self.current.active

    @property
    def speaking(self) -> bool:
        return self.busy and self.current is not None and self.current.reply.speaking

    def drop(self, reason: str = "not_done") -> np.ndarray | None:
        """Drop the current turn, the user was not done: before its reply was heard, or just after it began
        (``turn.rejoin_ms``; the ``interrupted`` event says so). Its words do not enter the history: they are the
        start of the next turn, whose audio this returns (``turn_dropped`` tells the clients, which show them again
        there)."""
        turn = self.current
        if turn is None or not turn.active:
            return None
        audible, was_paused = turn.reply.speaking, self.paused
        turn.cancel()
        self.current, self.paused = None, False
        dropped = self.sink.interrupt()
        if audible and not was_paused:  # a paused reply was already announced as interrupted
            self.events.emit("interrupted", turn=turn.number, reason=reason, dropped_ms=dropped * FRAME_MS)
            if self.deps.on_interrupted is not None:
                self.deps.on_interrupted()
        self.events.emit("turn_dropped", turn=turn.number, reason=reason, heard=audible)
        log.info("turn_dropped session=%s turn=%d reason=%s audible=%s", self.session_id, turn.number, reason,
                 audible)
        return turn.audio

    def pause(self, reason: str) -> None:
        """Hold the reply where it is (the user makes a sound over it): heard as an interruption."""
        turn = self.current
        if turn is None or not turn.active or self.paused:
            return
        self.paused = True
        turn.notes.barge_ins.append(BargeIn(time.time(), reason, True, turn.reply.heard(self.sink)))
        self.sink.pause()
        self.events.emit("interrupted", turn=turn.number, reason=reason, paused=True, dropped_ms=0)
        if self.deps.on_interrupted is not None:
            self.deps.on_interrupted()
        log.info("reply_paused session=%s turn=%d reason=%s", self.session_id, turn.number, reason)

    def resume(self, reason: str) -> None:
        """Go on from where the reply was held (the sound was a backchannel, not a turn)."""
        if not self.paused:
            return
        self.paused = False
        self.sink.resume()
        if self.current is not None:
            self.events.emit("reply_resumed", turn=self.current.number, reason=reason)
        log.info("reply_resumed session=%s reason=%s", self.session_id, reason)

    def interrupt(self, reason: str) -> None:
        """Cancel the current turn's reply; the history keeps the user's words and what of the reply was heard."""
        turn = self.current
        if turn is None or not turn.active:
            return
        heard = turn.reply.heard(self.sink)  # before the sink drops what is queued
        turn.notes.barge_ins.append(BargeIn(time.time(), reason, False, heard))
        turn.cancel()
        self.current = None
        was_paused, self.paused = self.paused, False
        dropped = self.sink.interrupt()
        if turn.transcript:
            self._keep(turn, turn.transcript, heard)
        if not was_paused:  # a paused reply was already announced as interrupted
            self.events.emit("interrupted", turn=turn.number, reason=reason, dropped_ms=dropped * FRAME_MS)
            if self.deps.on_interrupted is not None:
                self.deps.on_interrupted()
        log.info(
            "turn_interrupted session=%s turn=%d reason=%s dropped_ms=%d heard_chars=%d/%d",
            self.session_id, turn.number, reason, dropped * FRAME_MS, len(heard), len(turn.reply.text),
        )

    async def close(self, *extra: Turn | None) -> None:
        turns = [t for t in (self.current, *extra) if t is not None]
        self.current = None
        for turn in turns:
            turn.cancel()
        for turn in turns:
            if turn.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await turn.task

    def _next_number(self) -> int:
        self.turns += 1
        return self.turns

    def _emit(self, turn: Turn, kind: str, **fields: Any) -> None:
        """An event of ``turn``: out now, or held (in order) until the turn is committed, and for the reply's own
        words (:data:`AFTER_CONFIRM`) until it is confirmed."""
        turn.held_events.append((kind, fields))
        self._release(turn)

    def _release(self, turn: Turn) -> None:
        """Send the held events of ``turn`` that may go out now, in the order they came."""
        if not turn.committed.is_set():
            return
        held = turn.held_events
        while held and (turn.confirmed.is_set() or held[0][0] not in AFTER_CONFIRM):
            kind, fields = held.pop(0)
            self.events.emit(kind, **{**fields, "turn": turn.number})

    # --- one turn ------------------------------------------------------------------------------------
    async def _run(self, turn: Turn, given: str | None) -> None:
        trace = turn.trace
        try:
            if turn.announcement is not None:
                await self._announce(turn, turn.announcement)
                return
            heard = Transcript(text=given) if given is not None else await self._transcribe(turn)
            text = heard.text.strip()
            if not turn.heard.done():
                turn.heard.set_result(heard)
            trace.mark("asr_done")
            turn.transcript = text
            turn.language = self._reply_language(heard)
            said: dict[str, Any] = {"language": heard.language or turn.language}
            if heard.language:
                said["language_probability"] = heard.language_probability
            self._emit(turn, "transcript", final=True, text=text, **said)
            if not text:
                log.info("turn_empty session=%s turn=%d", self.session_id, turn.number)
                return
            if self.debug_content:
                log.debug("turn_text session=%s turn=%d text=%r", self.session_id, turn.number, text)
            deltas: asyncio.Queue[str | None] = asyncio.Queue(maxsize=TTS_TEXT_QUEUE)
            await _side_by_side(self._respond(turn, text, deltas), self._speak(turn, deltas))
            await turn.committed.wait()
            self._keep(turn, text, turn.reply.text)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc if isinstance(exc, StageError) else StageError("turn", "the reply failed", exc)
            turn.failed = error.stage
            if not turn.heard.done():
                turn.heard.set_result(None)
            await turn.committed.wait()  # a speculative turn that is never committed ends here, unseen
            await turn.confirmed.wait()  # ... and one dropped before its end was confirmed, unheard
            self._failed(turn, error)
            if error.stage != "tts":
                await self._apologize(turn.gen)
        finally:
            if not turn.kept.done():  # it never entered the history: nothing is prepared for it
                turn.kept.cancel()
            if turn.committed.is_set():
                self.last_activity_wall = time.time()
            if trace.has("first_frame_sent"):
                trace.mark("reply_done")
                self.events.emit("reply_done", turn=turn.number, durations_ms=trace.durations_ms())
                if self.deps.on_turn_done is not None and turn.announcement is None:  # only turns the user waited on
                    self.deps.on_turn_done(trace)
            turn.notes.ended = time.time()
            if turn.committed.is_set() and self.deps.on_turn_end is not None and turn.announcement is None:
                try:
                    self.deps.on_turn_end(turn)
                except Exception:  # telemetry must never break the conversation
                    log.exception("turn_end_listener_failed session=%s turn=%d", self.session_id, turn.number)

    def _keep(self, turn: Turn, text: str, reply: str) -> None:
        """The turn enters the history: the user's words and what of the reply was said (or heard)."""
        self.history.add_turn(text, reply)
        if not turn.kept.done():
            turn.kept.set_result(reply)

    async def _announce(self, turn: Turn, text: str) -> None:
        """A turn of the assistant's own: ``text`` through the speech path, as a reply would be said."""
        if not turn.heard.done():
            turn.heard.set_result(Transcript(text=""))
        deltas: asyncio.Queue[str | None] = asyncio.Queue(maxsize=TTS_TEXT_QUEUE)

        async def words() -> None:
            await self._say(turn, text, deltas)
            await deltas.put(None)

        await _side_by_side(words(), self._speak(turn, deltas))
        log.info("turn_announced session=%s turn=%d chars=%d", self.session_id, turn.number, len(text))

    async def _transcribe(self, turn: Turn) -> Transcript:
        """The turn's ASR pass; its span goes into the trace and its answer to ``turn.heard`` at once."""
        asked = time.time()
        kind = PassKind.SPECULATIVE if turn.speculative and not turn.committed.is_set() else PassKind.FINAL
        turn.notes.asr_kind = kind.name.lower()
        result = await stage(
            "asr", "I could not make that out",
            self.deps.asr.transcribe(turn.audio, session=self.session_id, kind=kind, language=self.language),
        )
        before = turn.before
        if before is not None and before.tail_worth_a_pass() and lost_tail(result.text, before.transcript.text):
            result = await self._hear_tail(turn, before, result, kind)
        t = result.timing
        turn.notes.asr_remote = t.remote if t is not None else None
        turn.trace.asr = Span(t.asked, t.started, t.done) if t is not None else Span(asked, asked, time.time())
        if not turn.heard.done():
            turn.heard.set_result(result)
        return result

    async def _hear_tail(self, turn: Turn, before: HeardBefore, whole: Transcript, kind: PassKind) -> Transcript:
        """The turn's pass heard nothing past an earlier pause although the user spoke on: a pass over the audio
        after that pause (told the words before it), joined to the pause's transcript (asr/tail.py). If that pass
        fails, the turn keeps its own pass's transcript."""
        heard = before.transcript
        try:
            tail = await self.deps.asr.transcribe(turn.audio[before.samples:], session=self.session_id, kind=kind,
                                                  language=heard.language or self.language, prompt=heard.text.strip())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the turn's own pass answered: a failed second pass costs the tail, not the turn
            log.warning("asr.tail_failed session=%s turn=%d error=%s", self.session_id, turn.number,
                        type(exc).__name__)
            return whole
        joined = join_tail(heard, tail)
        turn.notes.asr_tail = joined is not heard
        log.info("asr.tail_heard session=%s turn=%d words_before=%d words_whole=%d words_tail=%d tail_s=%.2f",
                 self.session_id, turn.number, len(words(heard.text)), len(words(whole.text)), len(words(tail.text)),
                 (len(turn.audio) - before.samples) / SPEECH_RATE)
        if not turn.notes.asr_tail:
            return whole
        first, last = whole.timing, tail.timing  # the turn waited for both passes, one after the other
        timing = PassTiming(first.asked, first.started, last.done) if first and last else last
        return dataclasses.replace(joined, timing=timing, compute_s=whole.compute_s + tail.compute_s)

    def _reply_language(self, heard: Transcript) -> str | None:
        """The language the turn is answered in: the one the ASR heard it in (this turn's own pass, the one the
        turn was committed on); for typed words, the session's fixed language, else what their script says,
        else ``tts.language``."""
        if heard.language:
            return heard.language
        fixed = self.language if self.language not in (None, languages.AUTO) else None
        return fixed or languages.script_language(heard.text) or self.request.language

    async def _respond(self, turn: Turn, text: str, deltas: asyncio.Queue[str | None]) -> None:
        """The responder's deltas into ``deltas`` (bounded: the responder waits when TTS is behind)."""
        notes = turn.notes
        options = self._reply_options(turn)
        try:
            async with asyncio.timeout(self.respond_cfg.total_timeout_s):
                notes.respond_started = time.time()
                told = False
                guard = LoopGuard()  # a reply that repeats itself ends with its last new sentence (loops.py)
                stream = reply_stream(self.deps.responder, text, self.history.messages, options)
                async with closing(stream):  # a cancelled turn frees the responder's slot at once
                    async for delta in stream:
                        if options.fallback and not told:  # another responder stands in: the page says so
                            told = True
                            self._emit(turn, "responder_fallback", reason=options.fallback)
                        await self._say(turn, guard.feed(delta), deltas)
                        if guard.stopped:
                            log.info("reply_loop_stopped session=%s turn=%d said_chars=%d dropped_chars=%d",
                                     self.session_id, turn.number, len(turn.reply.text), len(guard.dropped))
                            break  # closing the stream stops the responder
                await self._say(turn, guard.finish(), deltas)
            notes.respond_done = time.time()
        except ResponderError as exc:
            raise StageError("responder", str(exc), exc) from exc
        except TimeoutError as exc:
            raise StageError("responder", "the reply took too long", exc) from exc
        except Exception as exc:
            raise StageError("responder", "the reply failed", exc) from exc
        finally:
            notes.usage, notes.tool_calls = options.usage, options.tool_calls
        # The end mark only on success: on failure or cancel the consumer is cancelled too, and an awaited
        # put into a full queue nobody reads would hang the turn (and Session.close) for ever.
        await deltas.put(None)

    async def _say(self, turn: Turn, delta: str, deltas: asyncio.Queue[str | None]) -> None:
        """Text of the reply that may be said: to the page and the speech path."""
        if not delta:
            return
        turn.trace.mark("first_text")
        turn.reply.text += delta
        self._emit(turn, "reply_text", delta=delta, text=turn.reply.text)
        await deltas.put(delta)

    def _reply_options(self, turn: Turn) -> ReplyOptions:
        """The turn's own asks of the responder: the language the user spoke (from the ASR pass)."""
        return ReplyOptions(language=turn.language, session=self.session_id, kept=turn.kept, sure=turn.confirmed)

    def _reply_request(self, turn: Turn) -> TTSRequest:
        """The voice for the reply's language (``tts.voices``); with none for it, the default voice, and a
        ``voice_fallback`` event that says so."""
        choice = choose_voice(self.synthesis.engine, turn.language, self.request.voice)
        turn.notes.tts_engine, turn.notes.tts_voice = choice.engine, choice.voice or self.request.voice or ""
        if choice.fallback:
            self._emit(turn, "voice_fallback", language=turn.language, engine=choice.engine,
                       voice=choice.voice or "default")
            log.info("voice_fallback session=%s turn=%d language=%s", self.session_id, turn.number, turn.language)
        return dataclasses.replace(self.request, language=choice.language)

    async def _speak(self, turn: Turn, deltas: asyncio.Queue[str | None]) -> None:
        """The reply's text through the synthesis path into a PCM queue, while a writer feeds the sink.

        Synthesis runs ahead of playout (``PCM_AHEAD_CHUNKS``), so the next sentence is ready before the
        current one ends. The writer starts only once the turn is committed and confirmed: nothing speculative is
        heard, and an unsure end's reply waits for the silence that confirms it (``turn.confirm_ms``). Each
        piece's place in the audio is kept (``ReplyProgress.spoken``), to cut the text where playback stopped.
        """
        reply = turn.reply
        pcm_q: asyncio.Queue[np.ndarray | None] = asyncio.Queue(maxsize=PCM_AHEAD_CHUNKS)

        async def text() -> AsyncIterator[str]:
            while (delta := await deltas.get()) is not None:
                yield delta

        def on_piece(piece: str) -> None:
            turn.trace.mark("first_tts_text")
            reply.spoken.append((reply.samples_made, piece))

        async def synthesize() -> None:
            onset = not self.trim_silence
            request = self._reply_request(turn)
            turn.notes.tts_language = request.language or ""
            with _tts_stage():
                async for out in self.synthesis.speak(text(), request, on_piece=on_piece):
                    if not onset:  # the reply starts where its voice does: leading silence is only delay
                        out, onset = _from_onset(out, self.sink.sample_rate * LEAD_IN_MS // 1000)
                        if not out.size:
                            continue
                    turn.trace.mark("first_audio")
                    reply.samples_made += len(out)
                    await pcm_q.put(out)
            turn.notes.tts_done = time.time()
            await pcm_q.put(None)  # only on success (see _respond)

        async def write() -> None:
            await turn.committed.wait()
            await turn.confirmed.wait()  # an unsure end: heard only once more silence confirmed it
            while (out := await pcm_q.get()) is not None:
                if reply.frames_base is None:
                    reply.frames_base = self.sink.audible_frames_sent
                if not await self.sink.write(float_to_s16(out), turn.gen):
                    return
            await self.sink.flush(turn.gen)

        await _side_by_side(synthesize(), write())

    def _on_first_audible(self, turn: Turn, audible: asyncio.Future[float]) -> None:
        """The sink handed the first audible frame of this turn's reply (or apology) to the listener."""
        if audible.cancelled() or turn.trace.has("first_frame_sent"):
            return
        turn.trace.mark("first_frame_sent", audible.result())
        turn.reply.speaking = True
        self.events.emit("reply_audio_start", turn=turn.number)
        if turn.announcement is None:  # the latency of a turn the user waited on (not a timer's)
            self.events.emit("turn_metrics", speculative=turn.speculative, **turn.trace.as_event())

    def _failed(self, turn: Turn, error: StageError) -> None:
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

    async def _apologize(self, gen: int) -> None:
        """Say the configured error message (best effort, short time limit): a failed turn is not silent."""
        if not self.apology or gen != self.sink.generation:
            return
        try:
            async with asyncio.timeout(APOLOGY_TIMEOUT_S):
                with _tts_stage():
                    async for out in self.synthesis.speak(self.apology, self.request):
                        if not await self.sink.write(float_to_s16(out), gen):
                            return
                await self.sink.flush(gen)
        except Exception as exc:  # the apology itself failed: the error event already told the page
            log.info("apology_failed session=%s error=%s", self.session_id, type(exc).__name__)


def _from_onset(pcm: np.ndarray, lead_in: int) -> tuple[np.ndarray, bool]:
    """``pcm`` from ``lead_in`` samples before its first audible one (peak ≥ ``SILENCE_PEAK_S16``), and whether
    it has one; all of it silent gives an empty array."""
    loud = np.flatnonzero(np.abs(pcm) >= SILENCE_PEAK_S16 / S16_SCALE)
    if not loud.size:
        return pcm[:0], False
    return pcm[max(0, int(loud[0]) - lead_in):], True


@contextlib.contextmanager
def _tts_stage() -> Iterator[None]:
    """The synthesis path's failures as the ``tts`` stage's, with a message the user may hear."""
    try:
        yield
    except (asyncio.CancelledError, StageError):
        raise
    except SynthesisTimeout as exc:
        raise StageError("tts", "the voice took too long", exc) from exc
    except TTSBusy as exc:
        raise StageError("tts", "busy: every synthesis place is taken; try again shortly", exc) from exc
    except Exception as exc:
        raise StageError("tts", "the voice failed", exc) from exc


async def _side_by_side(first: Awaitable[None], second: Awaitable[None]) -> None:
    """Run two coroutines together; the first failure cancels the other and is raised."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if (exc := t.exception()) is not None:
                raise exc
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
