"""The turn-taking policy: when the user is done, when they barge in, and what a short sound means.

It hears the VAD's events on the session's sample clock and tells the turn runner what to do:

- **speculation** (``turn.speculative``): on a pause of ``speculative_pause_ms`` a turn starts on the audio so
  far, unseen and unheard until committed; if the user goes on it is dropped without a trace;
- **end of turn**: at that pause the transcript rule and the audio end-of-turn model are weighed
  (``end_of_turn.weigh``): the turn ends early, or the wait grows (up to ``max_silence_ms``);
- **the user was not done**: speech while a committed turn is still being prepared drops it and carries
  its audio into the next utterance, so nothing said is lost;
- **barge-in** (``turn.barge_in``): speech over the reply pauses it; if the speech was short or a few words
  of backchannel ("mm-hmm", "yeah"), the reply resumes where it stopped; otherwise it is cancelled and the
  speech is the next turn (``backchannel_ms`` 0: cancel at once, as before);
- **partial transcripts** while the user speaks (``asr.partials``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import numpy as np

from assistant.audio import SPEECH_RATE, AudioChunk
from assistant.config import ASRConfig, TurnConfig, VADConfig
from assistant.pipeline.clock import SampleClock
from assistant.pipeline.end_of_turn import weigh
from assistant.pipeline.events import EventChannel
from assistant.pipeline.turn import Turn, TurnDeps
from assistant.pipeline.turn_end import TurnEnd, judge
from assistant.pipeline.turn_runner import TurnRunner
from assistant.vad.endpoint import Endpointer, SpeechEnd, SpeechStart

log = logging.getLogger(__name__)

WORD = re.compile(r"[\w']+")
FAILED = -1.0  # ``Turn.eot_prob`` when the end-of-turn model raised: its answer is not waited for
# Short words that stop the bot rather than encourage it: never taken for a backchannel.
STOP_WORDS = frozenset({"stop", "wait", "no", "pause", "quiet", "shut", "hold", "cancel", "enough", "sorry"})


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
        self.spec: Turn | None = None  # a speculative turn started on the current pause
        self._carry = np.zeros(0, dtype=np.float32)  # audio of a dropped turn, for the next utterance
        self._barge_in_at: int | None = None  # stream sample at which pending speech may interrupt
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
        spec = self.spec
        if pause_ms == 0:
            if spec is not None:  # the user went on: the pause was not the end
                self._drop_speculation("resumed")
            self.endpointer.set_end_silence(None)
            self._maybe_partial()
            return
        if spec is None:
            if cfg.speculative and pause_ms >= cfg.speculative_pause_ms and not self.runner.busy:
                self._start_speculation()
            return
        text: TurnEnd | None = None
        if cfg.smart_endpoint and spec.transcript is not None:
            if spec.verdict is None:  # judged once per speculation, not on every chunk of the pause
                spec.verdict = judge(spec.transcript)
            text = spec.verdict
        use_text = cfg.smart_endpoint and (spec.transcript is not None or spec.failed is None)  # ASR may fail
        use_audio = cfg.end_of_turn_model and self.deps.end_of_turn is not None and spec.eot_prob != FAILED
        verdict = weigh(cfg, text, spec.eot_prob, use_text=use_text, use_audio=use_audio)
        end_ms = verdict.end_silence_ms
        if verdict.pending and cfg.wait_for_evidence:  # hold the turn open until the evidence is in
            end_ms = cfg.max_silence_ms
        if verdict.commit or (end_ms is not None and end_ms <= self.end_silence_ms and pause_ms >= end_ms):
            reason = "complete_sentence" if verdict.reason == "text_complete" else "end_of_turn"
            ev = self.endpointer.force_end(reason)
            if ev is not None:
                self._on_speech_end(ev)
        else:
            self.endpointer.set_end_silence(end_ms if end_ms is not None and end_ms > self.end_silence_ms else None)

    # --- VAD events --------------------------------------------------------------------------------
    def _on_speech_start(self, ev: SpeechStart) -> None:
        self.last_activity_wall = time.time()
        at_ms = round(self.clock.wall_time(ev.sample_index) * 1000, 1)
        self.events.emit("speech_start", turn=self.runner.turns + 1, at_ms=at_ms)
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
        if not self.runner.speaking:
            # The user was not done: drop the turn in preparation, keep its audio for the next one.
            audio = self.runner.drop()
            self._carry = audio if audio is not None else self._carry
            return
        if not self.cfg.barge_in:
            return
        wait_ms = self.cfg.barge_in_min_speech_ms - self.clock.ms_since(ev.sample_index)
        if wait_ms <= 0:
            self._barge_in()
        else:
            self._barge_in_at = self.clock.samples + int(wait_ms * SPEECH_RATE / 1000)

    def _barge_in(self) -> None:
        if self.cfg.backchannel_ms > 0 or self.cfg.backchannel_words > 0:
            self.runner.pause("barge_in")  # decided at the speech's end: a backchannel, or a turn
        else:
            self.runner.interrupt("barge_in")

    def _on_speech_end(self, ev: SpeechEnd) -> None:
        speech_end = self.clock.wall_time(ev.speech_end)
        self.events.emit(
            "speech_end",
            turn=self.runner.turns + 1,
            at_ms=round(speech_end * 1000, 1),
            # How long ago the speech ended, by the server's clock: the page finds the same moment on its
            # own clock (its last loud mic sample before event arrival − ago_ms) without sharing clocks.
            ago_ms=round(max(0.0, time.time() - speech_end) * 1000, 1),
            duration_ms=round(len(ev.audio) * 1000 / SPEECH_RATE, 1),
            reason=ev.reason,
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
        spec, self.spec = self.spec, None
        if spec is not None and spec.audio_end == ev.sample_index and spec.carried == self._carry.size:
            turn = spec  # the pause was the end: the speculative turn becomes the turn
            self.speculations["committed"] += 1
        else:
            if spec is not None:
                self._drop_speculation("changed", spec)
            audio = np.concatenate([self._carry, ev.audio]) if self._carry.size else ev.audio
            turn = self.runner.start(audio, ev.sample_index, speculative=False)
        self._carry = np.zeros(0, dtype=np.float32)
        turn.trace.mark("speech_end", speech_end)
        turn.trace.mark("vad_end")
        self.runner.commit(turn)

    async def _backchannel_or_turn(self, ev: SpeechEnd, speech_end: float) -> None:
        """Speech over the (paused) reply has ended: resume the reply after a backchannel, else cancel it
        and make the speech the next turn (its transcript is reused)."""
        vad_end = time.time()
        try:
            text = (await self.deps.asr.transcribe(ev.audio)).text.strip()
        except Exception as exc:  # cannot tell what was said: the length decides
            log.info("backchannel_asr_failed session=%s error=%s", self.session_id, type(exc).__name__)
            text = None
        words = {w.lower() for w in WORD.findall(text or "")}
        short = ev.duration_s * 1000 < self.cfg.backchannel_ms
        few = text is not None and len(WORD.findall(text)) < self.cfg.backchannel_words
        if (short or few) and not STOP_WORDS & words:
            self._check_audio = None
            self.runner.resume("backchannel")
            return
        self._check_audio = None
        self.runner.interrupt("barge_in")
        audio = np.concatenate([self._carry, ev.audio]) if self._carry.size else ev.audio
        self._carry = np.zeros(0, dtype=np.float32)
        turn = self.runner.start(audio, ev.sample_index, speculative=False, heard=text)
        turn.trace.mark("speech_end", speech_end)
        turn.trace.mark("vad_end", vad_end)
        self.runner.commit(turn)

    # --- speculation and the end-of-turn model -------------------------------------------------------
    def _start_speculation(self) -> None:
        utterance = self.endpointer.utterance()
        if utterance is None or not utterance.size:
            return
        audio = np.concatenate([self._carry, utterance]) if self._carry.size else utterance
        spec = self.spec = self.runner.start(audio, self.endpointer.utterance_end, speculative=True)
        spec.carried = self._carry.size
        self.speculations["started"] += 1
        if self.cfg.end_of_turn_model and self.deps.end_of_turn is not None:
            spec.eot_task = asyncio.get_running_loop().create_task(self._hear_end_of_turn(spec, audio))

    async def _hear_end_of_turn(self, spec: Turn, audio: np.ndarray) -> None:
        """Ask the audio end-of-turn model about this pause; a failure leaves the decision to the rest."""
        try:
            spec.eot_prob = await self.deps.end_of_turn.probability(audio)
        except Exception as exc:
            log.warning("end_of_turn_failed session=%s error=%s", self.session_id, type(exc).__name__)
            spec.eot_prob = FAILED
            return
        log.debug("end_of_turn session=%s prob=%.3f", self.session_id, spec.eot_prob)

    def _drop_speculation(self, reason: str, spec: Turn | None = None) -> None:
        spec = spec or self.spec
        if spec is self.spec:
            self.spec = None
        if spec is not None:
            spec.cancel()
            self.speculations["dropped"] += 1
            log.debug("speculation_dropped session=%s reason=%s", self.session_id, reason)

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
        self.events.emit("transcript", turn=self.runner.turns + 1, final=False, text=text, stable=stable)

    def _cancel_partial(self) -> None:
        if self._partial is not None and not self._partial.done():
            self._partial.cancel()
        self._partial = None

    async def close(self) -> None:
        for task in (self._partial, self._check):
            if task is not None and not task.done():
                task.cancel()
        spec, self.spec = self.spec, None
        await self.runner.close(spec)


def _common_prefix(a: str, b: str) -> str:
    """The words two consecutive hypotheses agree on (local agreement: what later passes will keep)."""
    out: list[str] = []
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        out.append(x)
    return " ".join(out)
