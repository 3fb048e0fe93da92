"""The turn-taking policy: when the user is done, when they barge in, and what a short sound means.

It hears the VAD's events on the session's sample clock and tells the turn runner what to do:

- **speculation** (``turn.speculative``): on a pause of ``speculative_pause_ms`` a turn starts on the audio so
  far, unseen and unheard until committed; if the user goes on it is dropped without a trace (a failure
  included);
- **end of turn**: at that pause the evidence (the speculative transcript, the audio end-of-turn model) is
  weighed by ``end_of_turn.decide``: the turn ends now, or the silence that will end it is set (up to
  ``max_silence_ms``). The decision is taken again on every chunk of the pause and the moment each answer
  lands, so no time passes between the last evidence and the decision; with the falling policy the model hears
  the pause again at each of ``end_of_turn_recheck_ms``, and the threshold falls as the silence grows. The
  model is asked once the transcript has landed, not beside the ASR pass it would slow (``_ask_model``);
- **the user was not done**: speech while a committed turn is still being prepared drops it and carries
  its audio into the next utterance, so nothing said is lost;
- **barge-in** (``turn.barge_in``): speech over the reply pauses it; if the speech was short or a few words
  of backchannel ("mm-hmm", "yeah": :func:`is_backchannel`), the reply resumes where it stopped; otherwise
  ("Madrid.", the speaker going on) it is cancelled and the speech is the next turn (``backchannel_ms`` 0:
  cancel at once, as before);
- **partial transcripts** while the user speaks (``asr.partials``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from dataclasses import dataclass, field

import numpy as np

from assistant.asr.base import Transcript
from assistant.asr.tail import HeardBefore
from assistant.audio import SPEECH_RATE, AudioChunk
from assistant.config import ASRConfig, TurnConfig, VADConfig
from assistant.pipeline.clock import SampleClock
from assistant.pipeline.end_of_turn import (
    Cue,
    Evidence,
    TurnEnd,
    confirm_hold_ms,
    cue,
    decide,
    judge,
    last_word_probability,
    since_pause,
    word_count,
)
from assistant.pipeline.events import EventChannel
from assistant.pipeline.trace import Ending, Span
from assistant.pipeline.turn import Turn, TurnDeps
from assistant.pipeline.turn_runner import TurnRunner
from assistant.vad.endpoint import Endpointer, SpeechEnd, SpeechStart

log = logging.getLogger(__name__)

WORD = re.compile(r"[\w']+")
# Short words that stop the bot rather than encourage it: never taken for a backchannel.
STOP_WORDS = frozenset({"stop", "wait", "no", "pause", "quiet", "shut", "hold", "cancel", "enough", "sorry"})
# What a listener says over a reply without taking the turn, in the languages with a voice here (English,
# Japanese, Chinese, Cantonese, Korean). In those, short speech is a backchannel only if every word is one of these:
# "Madrid." said just after the reply began (a decision at the pause before the city) is the speaker going on, a
# turn, not a sound to resume over and lose.
BACKCHANNEL_WORDS = frozenset({
    "mm", "mmm", "hmm", "hm", "mhm", "uh", "huh", "um", "ah", "oh", "ooh", "aha", "yeah", "yea", "yes", "yep", "yup",
    "ya", "ok", "okay", "kay", "right", "alright", "sure", "cool", "nice", "great", "good", "fine", "wow", "really",
    "i", "see", "got", "it", "gotcha", "exactly", "true", "indeed", "totally", "absolutely",
    "definitely", "interesting", "thanks", "thank", "you", "please", "go", "on", "of", "course", "so", "well",
    "はい", "うん", "ええ", "ああ", "あー", "そう", "そうそう", "そうですね", "そうなんだ", "そうなんですね",
    "なるほど", "へえ", "へー", "ふーん", "ほう", "ほんと", "本当", "確かに", "たしかに", "ですね", "いいね",
    "嗯", "嗯嗯", "对", "对对", "对啊", "是", "是的", "是啊", "好", "好的", "哦", "噢", "啊", "行", "没错", "明白",
    "係", "啱", "冇錯",
    "네", "응", "예", "그래", "그래요", "그렇죠", "맞아", "맞아요", "아", "음", "오", "네네",
})
BACKCHANNEL_LANGUAGES = frozenset({"en", "ja", "zh", "yue", "ko"})
# A held reply's wall-clock timer, while audio still comes with a sound in it that may be speech: look again so soon.
HOLD_RECHECK_S = 0.05


def is_backchannel(text: str | None, language: str, duration_ms: float, cfg: TurnConfig) -> bool:
    """Whether speech over the paused reply was a backchannel (resume the reply) rather than a turn: shorter than
    ``backchannel_ms`` or of fewer than ``backchannel_words`` words, no stop word, and, where the transcript's
    language has a list (:data:`BACKCHANNEL_LANGUAGES`; none given: any list), every word one of
    :data:`BACKCHANNEL_WORDS`. ``text`` None (the ASR failed): the length alone decides; no words: a breath or a
    cough, a backchannel."""
    words = [w.lower() for w in WORD.findall(text or "")]
    short = duration_ms < cfg.backchannel_ms
    few = text is not None and len(words) < cfg.backchannel_words
    if not (short or few) or STOP_WORDS.intersection(words):
        return False
    if text is None or not words or (language and language not in BACKCHANNEL_LANGUAGES):
        return True
    return all(w in BACKCHANNEL_WORDS for w in words)


@dataclass
class Pause:
    """Turn-taking's evidence at one pause: the speculative turn started on it and what the transcript and the
    end-of-turn model said. This policy is its only writer; the turn itself is the runner's (read here only
    through its ``heard`` future)."""

    turn: Turn
    audio_end: int  # stream sample where the speech before the pause ends
    carried: int  # samples of an earlier dropped turn's audio at the start of the turn's audio
    asked_at: float  # wall time the evidence was asked for (the pause was long enough to speculate)
    text: TurnEnd | None = None  # the transcript rule's answer
    cue: Cue | None = None  # how complete the transcript looks (the falling policy's text evidence)
    text_failed: bool = False  # the speculative ASR raised: its answer will not come
    probs: list[tuple[int, float]] = field(default_factory=list)  # the model's answers: (silence heard, p)
    model_failed: bool = False
    model_span: Span | None = None  # the latest model call
    model_after_text: bool = False  # ... was held until the transcript landed (_ask_model)
    model_task: asyncio.Task[None] | None = None
    asked_marks: set[int] = field(default_factory=set)  # silences (ms) at which the model was asked
    words: int = 0  # words in the transcript
    sure: bool = False  # the verdict that ended the turn here was sure (end_of_turn.Decision.sure)
    used_text: bool = False  # the latest verdict used the text's answer
    used_model: bool = False  # ... and the model's

    @property
    def model_prob(self) -> float | None:
        return self.probs[-1][1] if self.probs else None

    def evidence(self) -> str:
        """What the pause's evidence said, for a log line (no content: the rule's answer and word count)."""
        model = "/".join(f"{p:.2f}@{ms}" for ms, p in self.probs) or "-"
        return (f"text={self.text.value if self.text else '-'} cue={self.cue.value if self.cue else '-'} "
                f"words={self.words} model={model}")

    def close(self) -> None:
        if self.model_task is not None and not self.model_task.done():
            self.model_task.cancel()


class TurnTaking:
    def __init__(
        self,
        turn: TurnConfig,
        asr: ASRConfig,
        vad: VADConfig,
        endpointer: Endpointer,
        runner: TurnRunner,
        deps: TurnDeps,
        events: EventChannel,
        session_id: str = "",
    ) -> None:
        self.cfg, self.asr_cfg, self.end_silence_ms = turn, asr, vad.end_silence_ms
        self.endpointer, self.runner, self.deps, self.events = endpointer, runner, deps, events
        self.session_id = session_id
        self.clock = SampleClock()
        self.pause: Pause | None = None  # the evidence at the current pause (its speculative turn)
        self._carry = np.zeros(0, dtype=np.float32)  # audio of a dropped turn, for the next utterance
        # The latest pause of the utterance in progress whose pass landed before the user spoke on (its transcript,
        # the samples of the turn audio it covered, the carry it was on) and where the speech came back: the
        # tail after it gets a pass of its own if the next pass loses it (asr/tail.py).
        self._before: tuple[Transcript, int, int, int] | None = None
        # Where the speech came back (stream sample) after the utterance's latest pause of speculative_pause_ms or
        # more, and the silence of the pause in progress: the end-of-turn model hears the speech since then
        # (turn.end_of_turn_since_pause).
        self._resumed_at: int | None = None
        self._silence_ms = 0
        self._barge_in_at: int | None = None  # stream sample at which pending speech may interrupt
        # A committed turn whose unsure end waits for more silence before its reply is heard (turn.confirm_ms): the
        # turn, the stream sample that confirms it, and the wall-clock timer that does if no audio comes.
        self._held: tuple[Turn, int, asyncio.TimerHandle] | None = None
        self._check: asyncio.Task[None] | None = None  # is the sound over the reply a backchannel?
        self._check_audio: np.ndarray | None = None  # that sound's audio, while it is being judged
        self._partial: asyncio.Task[None] | None = None
        self._last_partial_at = 0
        self._partial_text = ""
        self.last_audio_wall = time.time()  # the latest audio packet (any level)
        self.last_activity_wall = time.time()  # the latest speech start
        self.speculations = {"started": 0, "committed": 0, "dropped": 0}

    # --- audio in ----------------------------------------------------------------------------------
    def feed(self, chunk: AudioChunk | np.ndarray) -> None:
        """16 kHz mono float32 audio as it arrives: an ``AudioChunk`` (with its clock) or a bare array."""
        samples, start = self.clock.advance(chunk)
        self.last_audio_wall = time.time()
        for event in self.endpointer.feed(samples, start=start):
            if isinstance(event, SpeechStart):
                self._on_speech_start(event)
            else:
                self._on_speech_end(event)
        if (self._held is not None and self.endpointer.samples_fed >= self._held[1]
                and not self.endpointer.onset_pending):  # a sound that may be the speaker going on: not yet
            self._confirm_held()
        if self._barge_in_at is not None and self.clock.samples >= self._barge_in_at:
            self._barge_in_at = None
            if self.endpointer.speaking:
                self._barge_in()
        if self.endpointer.speaking:
            self._while_speaking()

    def _while_speaking(self) -> None:
        """Per chunk while the user talks: partial transcripts, speculation, the end of turn."""
        cfg = self.cfg
        pause_ms = self.endpointer.silence_samples * 1000 // SPEECH_RATE
        if pause_ms == 0 and self._silence_ms >= cfg.speculative_pause_ms:
            self._resumed_at = self.endpointer.samples_fed  # the speaker went on after a pause
        self._silence_ms = pause_ms
        if pause_ms == 0:
            if self.pause is not None:  # the user went on: the pause was not the end
                pause = self.pause
                self._keep_heard(pause.turn, pause.turn.audio.size, pause.carried, self.endpointer.samples_fed)
                self._drop_speculation("resumed")
            self.endpointer.set_end_silence(None)
            self._maybe_partial()
            return
        if self.pause is None:
            if cfg.speculative and pause_ms >= cfg.speculative_pause_ms and not self.runner.busy:
                self._start_speculation()
            return
        self._decide()

    def _decide(self, text_landed: bool = False) -> None:
        """Weigh the evidence at the current pause (``end_of_turn.decide``): end the turn now, or set how much
        silence will end it. Called on every chunk of the pause and as soon as an answer lands (``text_landed``:
        the transcript, just now)."""
        pause, cfg = self.pause, self.cfg
        if pause is None or not self.endpointer.speaking or self.endpointer.silence_samples == 0:
            return
        pause_ms = self.endpointer.silence_samples * 1000 // SPEECH_RATE
        use_text = cfg.smart_endpoint and not pause.text_failed
        # A transcript asked for but failed: the model alone does not end the turn (end_of_turn.py).
        use_audio = (cfg.end_of_turn_model and self.deps.end_of_turn is not None and not pause.model_failed
                     and not (cfg.smart_endpoint and pause.text_failed))
        if use_audio:
            self._ask_model(pause, pause_ms, text_landed)
        ev = Evidence(use_text=use_text, use_audio=use_audio, text=pause.text, cue=pause.cue, words=pause.words,
                      probs=list(pause.probs))
        d = decide(cfg, ev, pause_ms, self.end_silence_ms)
        pause.used_text = use_text and pause.text is not None
        pause.used_model = use_audio and pause.model_prob is not None
        end_ms = d.end_silence_ms
        if d.end_now:
            reason = "complete_sentence" if d.reason == "text_complete" else "end_of_turn"
            # When the silence the decision needed had passed: none past the pause that asked for the evidence
            # (a commit), or needed_ms of it (a fixed wait, or where the falling threshold met the score).
            silence_met = (pause.asked_at if d.needed_ms is None
                           else self.clock.wall_time(self.endpointer.utterance_end + d.needed_ms * SPEECH_RATE // 1000))
            pause.sure = d.sure
            log.info("turn_end_decided session=%s verdict=%s pause_ms=%d sure=%s %s", self.session_id,
                     d.reason or "silence", pause_ms, d.sure, pause.evidence())
            ev_end = self.endpointer.force_end(reason)
            if ev_end is not None:
                self._on_speech_end(ev_end, silence_met=min(silence_met, time.time()))
        else:
            self.endpointer.set_end_silence(end_ms if end_ms is not None and end_ms > self.end_silence_ms else None)

    def _ask_model(self, pause: Pause, pause_ms: int, text_landed: bool = False) -> None:
        """Ask the end-of-turn model about the latest of its marks the pause has reached (the falling policy: each
        of ``turn.end_of_turn_recheck_ms``; the flat one: the speculative pause), one call at a time, on the audio
        as it was at that mark (as ``bench eot`` collects the evidence).

        While the turn's own transcript is coming the model is not asked: the decision waits for the transcript
        anyway (nothing of the reply exists before it), and a model run beside the ASR pass slowed the pass (its
        two CTranslate2 threads stalled while a core was taken: ~30 ms per run). With one thread a pass (small
        machines, asr.cpu_threads) it still does not pay: on 2 cores it gained nothing at one session and made four
        sessions' turns ~200 ms slower (lab/notes/end_of_turn_history.md). So the model hears the pause once
        the transcript has landed, at the latest mark passed, and answers (~50 ms of one Zen 5 core, ~115 on an
        older EPYC) while the responder writes the reply."""
        if pause.model_task is not None and not pause.model_task.done():
            return  # a call is still running
        if self.cfg.smart_endpoint and pause.cue is None and not pause.text_failed:
            return  # the transcript is coming
        marks = self.cfg.end_of_turn_recheck_ms if self.cfg.policy == "falling" else [self.cfg.speculative_pause_ms]
        due = [m for m in marks if m <= pause_ms and m not in pause.asked_marks]
        if not due:
            return
        pause.asked_marks.update(due)
        utterance = self.endpointer.utterance()
        if utterance is None or not utterance.size:
            return
        starts_at = self.endpointer.samples_fed - utterance.size  # the utterance's first sample, on the stream
        mark = max(due)
        past_mark = self.endpointer.samples_fed - (pause.audio_end + mark * SPEECH_RATE // 1000)
        if past_mark > 0:
            utterance = utterance[: max(0, utterance.size - past_mark)]
        if self.cfg.end_of_turn_since_pause:  # the speech since the latest pause (a dropped turn's carry is before)
            audio = since_pause(utterance, None if self._resumed_at is None else self._resumed_at - starts_at)
        else:
            audio = np.concatenate([self._carry, utterance]) if pause.carried else utterance
        after_text = text_landed and mark < pause_ms  # held: the mark passed while the transcript was coming
        pause.model_task = asyncio.get_running_loop().create_task(
            self._hear_end_of_turn(pause, audio, mark, after_text))

    # --- VAD events --------------------------------------------------------------------------------
    def _on_speech_start(self, ev: SpeechStart) -> None:
        self.last_activity_wall = time.time()
        self._cancel_hold("went_on")  # an unsure end the speaker talked through: its reply, unheard, is dropped below
        self._before = None  # a new utterance: no pause of it heard yet
        self._resumed_at, self._silence_ms = None, 0
        at_ms = round(self.clock.wall_time(ev.sample_index) * 1000, 1)
        self.events.emit("speech_start", turn=self.runner.turns + 1, at_ms=at_ms, start_sample=ev.sample_index)
        self._partial_text = ""
        self._last_partial_at = ev.sample_index
        if self._check is not None and not self._check.done():
            self._check.cancel()  # more speech after the sound over the reply: not a backchannel
            self.runner.interrupt("barge_in")
            if self._check_audio is not None:  # what was said is the start of the next turn
                self._carry = np.concatenate([self._carry, self._check_audio])
            self._check_audio = None
        if not self.runner.busy:
            return
        went_on = self._went_on(ev)
        if not self.runner.speaking or went_on:
            # The user was not done: drop the turn in preparation (or whose reply just began), keep its audio and
            # what its pass heard for the next one.
            current = self.runner.current
            audio = self.runner.drop("went_on" if went_on else "not_done")
            if audio is not None:
                self._carry = audio
                self._keep_heard(current, audio.size, audio.size, ev.sample_index)
            return
        if not self.cfg.barge_in:
            return
        wait_ms = self.cfg.barge_in_min_speech_ms - self.clock.ms_since(ev.sample_index)
        if wait_ms <= 0:
            self._barge_in()
        else:
            self._barge_in_at = self.clock.samples + int(wait_ms * SPEECH_RATE / 1000)

    def _went_on(self, ev: SpeechStart) -> bool:
        """Speech began within ``turn.rejoin_ms`` of the current turn's decision: the speaker went on after a
        pause the decision took for the end (too soon to be an answer to a reply that had barely begun)."""
        return self._began_within(ev.sample_index, self.cfg.rejoin_ms)

    def _went_on_over_reply(self, ev: SpeechEnd, text: str | None) -> bool:
        """Speech over the paused reply, no backchannel and no stop word, that began within ``turn.went_on_ms`` of
        the turn's decision: the speaker went on after a pause the decision took for the end ("Navigate to 53
        Sycamore Drive in [pause] Madrid.", or an afterthought), too soon to be about a reply barely heard."""
        if STOP_WORDS.intersection(w.lower() for w in WORD.findall(text or "")):
            return False
        return self._began_within(round(ev.start_s * SPEECH_RATE), self.cfg.went_on_ms)

    def _began_within(self, sample: int, ms: int) -> bool:
        """Speech starting at stream ``sample`` began within ``ms`` (> 0) of the current turn's decision."""
        current = self.runner.current
        ending = current.trace.ending if current is not None else None
        if ms <= 0 or ending is None:
            return False
        return self.clock.wall_time(sample) - ending.decided <= ms / 1000

    def _keep_heard(self, turn: Turn | None, samples: int, carried: int, resumed: int) -> None:
        """The speaker went on after ``turn`` (a speculation at a pause, or a turn dropped just after its decision):
        if its pass has landed, what it heard is the start of the next turn's words, covering ``samples`` of its
        audio (with ``carried`` samples of carry) up to where the speech came back at ``resumed``; the tail after
        it may need a pass of its own (asr/tail.py). A pass still running is dropped with the turn."""
        heard = turn.heard if turn is not None else None
        if heard is None or not heard.done() or heard.cancelled():
            return
        transcript = heard.result()
        if transcript is not None and transcript.text.strip():
            self._before = (transcript, samples, carried, resumed)

    def _barge_in(self) -> None:
        if self.cfg.backchannel_ms > 0 or self.cfg.backchannel_words > 0:
            self.runner.pause("barge_in")  # decided at the speech's end: a backchannel, or a turn
        else:
            self.runner.interrupt("barge_in")

    def _on_speech_end(self, ev: SpeechEnd, silence_met: float | None = None) -> None:
        """The utterance is over (by silence, by the evidence, or cut): commit its turn.

        ``silence_met``: when the silence the deciding verdict needed had passed (default: now, the
        endpointer's own silence decided)."""
        decided = time.time()
        speech_end = self.clock.wall_time(ev.speech_end)
        self.events.emit(
            "speech_end",
            turn=self.runner.turns + 1,
            at_ms=round(speech_end * 1000, 1),
            # How long ago the speech ended, by the server's clock: the page finds the same moment on its
            # own clock (its last loud mic sample before event arrival − ago_ms) without sharing clocks.
            ago_ms=round(max(0.0, decided - speech_end) * 1000, 1),
            duration_ms=round(len(ev.audio) * 1000 / SPEECH_RATE, 1),
            reason=ev.reason,
            # Where the utterance's audio starts and where its end was decided, on the stream's sample clock.
            start_sample=round(ev.audio_start_s * SPEECH_RATE),
            end_sample=round(ev.detected_at_s * SPEECH_RATE),
        )
        self._cancel_partial()
        if self.runner.busy:
            if not self.cfg.barge_in:
                # Half-duplex: what the user says over the bot is not a turn.
                log.info("utterance_ignored session=%s reason=bot_speaking", self.session_id)
                self._drop_speculation("bot_speaking")
                return
            if self.runner.paused:
                self._check_audio = ev.audio
                self._check = asyncio.get_running_loop().create_task(self._backchannel_or_turn(ev, speech_end))
                return
            self.runner.interrupt("new_turn")
        pause, self.pause = self.pause, None
        ending = Ending(speech_end=speech_end, decided=decided, silence_met=silence_met or decided, reason=ev.reason)
        if pause is not None and pause.audio_end == ev.sample_index and pause.carried == self._carry.size:
            turn = pause.turn  # the pause was the end: the speculative turn becomes the turn
            self.speculations["committed"] += 1
            if silence_met is None:  # the endpointer's own silence ended it: say what the evidence was
                log.info("turn_end_decided session=%s verdict=%s pause_ms=%d %s", self.session_id, ev.reason,
                         (ev.detected_at_s - ev.time_s) * 1000, pause.evidence())
            pause.close()
            ending = Ending(speech_end=speech_end, decided=decided, silence_met=ending.silence_met,
                            text=pause.used_text, model=pause.model_span if pause.used_model else None,
                            model_after_text=pause.used_model and pause.model_after_text, reason=ev.reason)
        else:
            if pause is not None:
                self.pause = pause
                self._drop_speculation("changed")
            audio = np.concatenate([self._carry, ev.audio]) if self._carry.size else ev.audio
            turn = self.runner.start(audio, ev.sample_index, speculative=False,
                                     before=self._heard_before(audio, ev.sample_index))
        self._carry = np.zeros(0, dtype=np.float32)
        self._before = None
        self._resumed_at, self._silence_ms = None, 0
        sure = pause is not None and turn is pause.turn and pause.sure
        hold_ms = confirm_hold_ms(self.cfg, sure)
        confirm_at = ev.speech_end + hold_ms * SPEECH_RATE // 1000
        held = hold_ms > 0 and self.endpointer.samples_fed < confirm_at
        self.runner.commit(turn, ending, confirmed=not held)
        if held:
            self._hold(turn, confirm_at, speech_end, hold_ms)

    # --- an unsure end waits for the silence that confirms it ----------------------------------------------
    def _hold(self, turn: Turn, confirm_at: int, speech_end: float, hold_ms: int) -> None:
        """Hear ``turn``'s reply only once the stream reaches ``confirm_at`` (``hold_ms`` of silence after the speech
        end: turn.confirm_ms, or turn.confirm_sure_ms for a sure end), or that much wall time has passed (a client
        that stops sending audio); speech before then drops it unheard (:meth:`_on_speech_start`)."""
        self._cancel_hold()
        delay = max(0.0, speech_end + hold_ms / 1000 - time.time())
        timer = asyncio.get_running_loop().call_later(delay, self._on_hold_timer)
        self._held = (turn, confirm_at, timer)
        log.info("reply_held session=%s turn=%d until_ms=%d", self.session_id, turn.number, hold_ms)

    def _on_hold_timer(self) -> None:
        """The hold's wall time is up: confirm, unless audio is still coming and a sound in it may be the speaker
        going on (then the audio decides, or this timer again shortly)."""
        held = self._held
        if held is None:
            return
        if self.endpointer.onset_pending and time.time() - self.last_audio_wall < HOLD_RECHECK_S:
            timer = asyncio.get_running_loop().call_later(HOLD_RECHECK_S, self._on_hold_timer)
            self._held = (held[0], held[1], timer)
            return
        self._confirm_held()

    def _confirm_held(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        turn, _, timer = held
        timer.cancel()
        if turn is self.runner.current and turn.active:
            self.runner.confirm(turn)

    def _cancel_hold(self, reason: str = "") -> None:
        held, self._held = self._held, None
        if held is not None:
            held[2].cancel()
            if reason:
                log.info("reply_unheard session=%s turn=%d reason=%s", self.session_id, held[0].number, reason)

    async def _backchannel_or_turn(self, ev: SpeechEnd, speech_end: float) -> None:
        """Speech over the (paused) reply has ended: resume the reply after a backchannel, else cancel it
        and make the speech the next turn (its transcript is reused)."""
        vad_end = time.time()
        language = ""
        try:
            heard = await self.deps.asr.transcribe(ev.audio, session=self.session_id)
            text, language = heard.text.strip(), heard.language
        except Exception as exc:  # cannot tell what was said: the length decides
            log.info("backchannel_asr_failed session=%s error=%s", self.session_id, type(exc).__name__)
            text = None
        if is_backchannel(text, language, ev.duration_s * 1000, self.cfg):
            self._check_audio = None
            self.runner.resume("backchannel")
            return
        self._check_audio = None
        went_on = self._went_on_over_reply(ev, text)
        before = self.runner.drop("went_on") if went_on else None
        if before is None:
            self.runner.interrupt("barge_in")
        parts = [a for a in (before, self._carry, ev.audio) if a is not None and a.size]
        audio = np.concatenate(parts) if len(parts) > 1 else ev.audio
        self._carry = np.zeros(0, dtype=np.float32)
        # Gone on: one turn of both stretches, heard again whole; else the speech alone, its transcript reused.
        turn = self.runner.start(audio, ev.sample_index, speculative=False, heard=None if before is not None else text)
        self.runner.commit(turn, Ending(speech_end=speech_end, decided=vad_end, silence_met=vad_end, reason=ev.reason))

    # --- speculation and the end-of-turn model -------------------------------------------------------
    def _start_speculation(self) -> None:
        utterance = self.endpointer.utterance()
        if utterance is None or not utterance.size:
            return
        audio = np.concatenate([self._carry, utterance]) if self._carry.size else utterance
        turn = self.runner.start(audio, self.endpointer.utterance_end, speculative=True,
                                 before=self._heard_before(audio, self.endpointer.utterance_end))
        pause = self.pause = Pause(turn, self.endpointer.utterance_end, self._carry.size, time.time())
        self.speculations["started"] += 1
        turn.heard.add_done_callback(functools.partial(self._on_transcript, pause))
        self._decide()  # the model is asked here when no transcript is coming (_ask_model)

    def _on_transcript(self, pause: Pause, heard: asyncio.Future[Transcript | None]) -> None:
        """The speculative turn's ASR answered: judge the text once, and decide at once."""
        if heard.cancelled() or pause is not self.pause:
            return
        result = heard.result()
        if result is None:
            pause.text_failed = True
        elif self.cfg.smart_endpoint:
            text = result.text.strip()
            pause.text = judge(text)
            pause.cue = cue(text, last_word_probability(result.words), self.cfg.doubtful_below,
                            self.cfg.number_whole_digits, asked=self.runner.history.last_reply,
                            phone_plan=self.cfg.phone_plan)
            pause.words = word_count(text)
        if result is not None:
            self._partial_from(result.text.strip())
        self._decide(text_landed=True)

    async def _hear_end_of_turn(self, pause: Pause, audio: np.ndarray, pause_ms: int, after_text: bool) -> None:
        """Ask the audio end-of-turn model about this pause (``pause_ms`` of it heard; ``after_text``: the call was
        held until the transcript landed); a failure leaves the decision to the rest."""
        assert self.deps.end_of_turn is not None
        asked = time.time()
        try:
            prob = await self.deps.end_of_turn.probability(audio)
        except Exception as exc:
            log.warning("end_of_turn_failed session=%s error=%s", self.session_id, type(exc).__name__)
            pause.model_failed = True
        else:
            log.debug("end_of_turn session=%s prob=%.3f pause_ms=%d", self.session_id, prob, pause_ms)
            pause.probs.append((pause_ms, prob))
            pause.model_span, pause.model_after_text = Span(asked, asked, time.time()), after_text
        if pause is self.pause:
            self._decide()

    def _drop_speculation(self, reason: str) -> None:
        pause, self.pause = self.pause, None
        if pause is not None:
            pause.close()
            self.runner.discard(pause.turn)
            self.speculations["dropped"] += 1
            log.debug("speculation_dropped session=%s reason=%s %s", self.session_id, reason, pause.evidence())

    def _heard_before(self, audio: np.ndarray, speech_end: int) -> HeardBefore | None:
        """What a pass at an earlier pause of this utterance heard, for a turn on ``audio`` whose speech ends at
        stream sample ``speech_end``; None when there is none (or the carried audio changed since)."""
        if self._before is None:
            return None
        transcript, samples, carried, resumed = self._before
        if carried != self._carry.size or samples >= audio.size:
            return None
        return HeardBefore(transcript, samples, tail_speech_ms=max(0, speech_end - resumed) * 1000 // SPEECH_RATE)

    # --- partial transcripts -----------------------------------------------------------------------
    def _maybe_partial(self) -> None:
        if not self.asr_cfg.partials or (self._partial is not None and not self._partial.done()):
            return
        if self.clock.ms_since(self._last_partial_at) < self.asr_cfg.partial_interval_ms:
            return
        audio = self.endpointer.utterance()
        if audio is None or len(audio) < SPEECH_RATE // 2:
            return
        self._last_partial_at = self.clock.samples
        self._partial = asyncio.get_running_loop().create_task(self._run_partial(audio))

    def end_utterance(self, reason: str = "client") -> bool:
        """End the utterance in progress now, as if its silence had passed (a client that commits the audio
        itself); False when nobody is speaking."""
        if not self.endpointer.speaking:
            return False
        ev = self.endpointer.force_end(reason)  # in a pause: the speech ends where the pause began
        if ev is None:  # still voiced: it ends with the audio fed so far
            ends = self.endpointer.finish()
            ev = ends[0] if ends and isinstance(ends[0], SpeechEnd) else None
        if ev is None:
            return False
        self._on_speech_end(ev)
        return True

    def drop_utterance(self) -> None:
        """Forget the utterance in progress and any speculation on it (a client that clears its input)."""
        self._cancel_partial()
        self._drop_speculation("cleared")
        self._carry = np.zeros(0, dtype=np.float32)
        self._before = None
        self._resumed_at, self._silence_ms = None, 0
        self.endpointer.reset()

    def _partial_from(self, text: str) -> None:
        """A pass over the speech so far (a speculative turn's ASR) is a partial transcript too."""
        if text and self.endpointer.speaking and text != self._partial_text:
            stable = _common_prefix(self._partial_text, text)
            self._partial_text = text
            self.events.emit("transcript", turn=self.runner.turns + 1, final=False, text=text, stable=stable)

    async def _run_partial(self, audio: np.ndarray) -> None:
        try:
            result = await self.deps.asr.transcribe_partial(audio, session=self.session_id,
                                                            language=self.runner.language)
        except Exception as exc:  # a partial is a nicety: never let it hurt the turn
            log.debug("partial_failed session=%s error=%s", self.session_id, type(exc).__name__)
            return
        if result is None or not self.endpointer.speaking:
            return
        text = result.text.strip()
        stable = _common_prefix(self._partial_text, text)
        self._partial_text = text
        self.events.emit("transcript", turn=self.runner.turns + 1, final=False, text=text, stable=stable,
                         language=result.language or None)

    def _cancel_partial(self) -> None:
        if self._partial is not None and not self._partial.done():
            self._partial.cancel()
        self._partial = None

    async def close(self) -> None:
        self._cancel_hold()
        for task in (self._partial, self._check):
            if task is not None and not task.done():
                task.cancel()
        pause, self.pause = self.pause, None
        if pause is not None:
            pause.close()
        await self.runner.close(pause.turn if pause is not None else None)


def _common_prefix(a: str, b: str) -> str:
    """The words two consecutive hypotheses agree on (local agreement: what later passes will keep)."""
    out: list[str] = []
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        out.append(x)
    return " ".join(out)
