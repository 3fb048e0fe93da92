"""Endpointing: 16 kHz audio in, ``SpeechStart`` / ``SpeechEnd`` events out.

The ``Endpointer`` buffers arbitrary-length chunks into Silero's 512-sample windows (no drift, no lost
samples: feeding a file in any chunk sizes gives the same events) and runs a small state machine with
hysteresis:

- idle → speaking once windows at/above ``threshold`` have lasted ``min_speech_ms`` without a window
  below ``neg_threshold``; ``SpeechStart`` carries when the speech *started*, not when it was confirmed.
- speaking → idle once windows below ``neg_threshold`` have lasted ``end_silence_ms`` (the hangover; a window
  at/above ``threshold`` cancels it, in-between windows neither start nor cancel it). ``SpeechEnd`` carries
  when the speech *really* ended (the detection time minus the hangover) and the utterance's audio.
- ``SpeechEnd.audible_end`` places the end on the last audible 10 ms frame of the audio held (Silero's
  windows are 32 ms and it hears a tail: its own end lands 70–95 ms after the last audible sample). Audible is
  relative to the speaker: ``AUDIBLE_BELOW_PEAK_DB`` under the utterance's loudest frame (at most ``AUDIBLE_DBFS``),
  and above the hangover's noise. A fixed −45 dBFS put a quiet speaker's end before their last consonant: on the
  human recordings' tuning half 28 of 80 ends came more than 32 ms before the labels (down to −182 ms), 6 now
  (docs/latency.md, "Where the speech ends").
- an utterance reaching ``max_utterance_s`` is cut: ``SpeechEnd(reason="max_utterance")``, and if the user is
  still talking a new ``SpeechStart`` at the cut point follows at once.

All times are seconds on the clock of samples fed (sample index / 16000), which ``InboundAudio`` keeps true.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from assistant.audio import SPEECH_RATE
from assistant.config import VADConfig
from assistant.vad.silero import WINDOW_SAMPLES, SileroModel, SileroStream

log = logging.getLogger(__name__)

AUDIBLE_FRAME = SPEECH_RATE // 100  # 10 ms
AUDIBLE_DBFS = -45.0  # a 10 ms frame whose RMS reaches this is audible, however loud the speaker
AUDIBLE_BELOW_PEAK_DB = 40.0  # ... and so is one this far under the utterance's loudest 10 ms frame (a quiet one)
AUDIBLE_LOOKBACK = SPEECH_RATE // 2  # the VAD's end is never this far past the last audible sample
NOISE_MARGIN = 2.0  # an audible frame is also twice as loud (RMS) as the loudest frame of the hangover


def frame_rms(audio: np.ndarray) -> np.ndarray:
    """RMS of each whole 10 ms frame, counted back from the end of ``audio`` (oldest first)."""
    n = len(audio) // AUDIBLE_FRAME
    tail = audio[len(audio) - n * AUDIBLE_FRAME :].astype(np.float64).reshape(n, AUDIBLE_FRAME)
    return np.sqrt(np.mean(tail**2, axis=1))


def audible_floor(peak_rms: float = 0.0, noise_rms: float = 0.0,
                  below_peak_db: float | None = AUDIBLE_BELOW_PEAK_DB) -> float:
    """The RMS a 10 ms frame must reach to be speech: ``AUDIBLE_DBFS``, or ``below_peak_db`` under the utterance's
    loudest frame ``peak_rms`` where that is lower (0 or None: not known, not used), and ``NOISE_MARGIN`` times the
    loudest frame of the noise after it."""
    floor = 10 ** (AUDIBLE_DBFS / 20)
    if peak_rms > 0 and below_peak_db is not None:
        floor = min(floor, peak_rms * 10 ** (-below_peak_db / 20))
    return max(floor, NOISE_MARGIN * noise_rms)


def last_audible_end(audio: np.ndarray, noise_rms: float = 0.0, peak_rms: float = 0.0,
                     below_peak_db: float | None = AUDIBLE_BELOW_PEAK_DB) -> int | None:
    """Index just past the last 10 ms frame of ``audio`` that is audible (:func:`audible_floor`; None: no
    audible frame).

    Frames are counted from the end, so the answer is exact to the frame at the end of ``audio``.
    """
    floor = audible_floor(peak_rms, noise_rms, below_peak_db)
    rms = frame_rms(audio)
    n = len(rms)
    loud = np.flatnonzero(rms >= floor)
    if not loud.size:
        return None
    return len(audio) - (n - 1 - int(loud[-1])) * AUDIBLE_FRAME


@dataclass(frozen=True)
class SpeechStart:
    sample_index: int  # first sample of the first speech window
    time_s: float  # sample_index in seconds: when speech started
    detected_at_s: float  # when the start was confirmed (time_s + ≥ min_speech_ms)


@dataclass(frozen=True)
class SpeechEnd:
    sample_index: int  # first sample after the speech (start of the hangover silence, or the cut point)
    time_s: float  # when speech really ended = detected_at_s − hangover (to one window)
    detected_at_s: float  # when the end was decided
    start_s: float  # when this utterance's speech started
    audio_start_s: float  # stream time of audio[0] (start − speech_pad_ms, clamped)
    audio: np.ndarray = field(repr=False, compare=False)  # start − pad … end + pad, 16 kHz float32
    reason: str = "silence"  # "silence", "max_utterance" or "stream_end"
    audible_end: int = -1  # just past the last audible 10 ms frame (−1: not known, use sample_index)

    @property
    def speech_end(self) -> int:
        """Where the user's speech really ended: the last audible frame, else the VAD's end."""
        return self.audible_end if self.audible_end >= 0 else self.sample_index

    @property
    def duration_s(self) -> float:
        return self.time_s - self.start_s


VADEvent = SpeechStart | SpeechEnd


class _SampleBuffer:
    """Samples addressed by absolute stream index, kept as a list of chunks (no per-append copying)."""

    def __init__(self) -> None:
        self.start = 0  # stream index of the first kept sample
        self.end = 0  # stream index one past the last sample
        self._chunks: list[np.ndarray] = []

    def append(self, x: np.ndarray) -> None:
        if len(x):
            self._chunks.append(x)
            self.end += len(x)

    def slice(self, a: int, b: int) -> np.ndarray:
        a, b = max(a, self.start), min(b, self.end)
        if b <= a:
            return np.zeros(0, np.float32)
        out = np.empty(b - a, np.float32)
        pos, filled = self.start, 0
        for c in self._chunks:
            c_end = pos + len(c)
            if c_end > a and pos < b:
                lo, hi = max(a, pos) - pos, min(b, c_end) - pos
                out[filled : filled + hi - lo] = c[lo:hi]
                filled += hi - lo
            pos = c_end
            if pos >= b:
                break
        return out

    def trim_before(self, index: int) -> None:
        """Forget samples before ``index`` (whole chunks only; cheap)."""
        while self._chunks and self.start + len(self._chunks[0]) <= index:
            self.start += len(self._chunks.pop(0))


class Endpointer:
    """Per-session speech start/end detector on 16 kHz float32 audio (see the module docstring)."""

    def __init__(self, cfg: VADConfig | None = None, model: SileroModel | None = None) -> None:
        self.vad = SileroStream(model)
        self.set_config(cfg or VADConfig())
        self._buf = _SampleBuffer()
        self._pending = np.zeros(0, np.float32)
        self._pos = 0  # stream index of the next window to analyse
        self.last_prob = 0.0
        self.below_peak_db: float | None = AUDIBLE_BELOW_PEAK_DB  # audible_floor's (``python -m lab speech-ends``)
        self._idle()

    def set_config(self, cfg: VADConfig) -> None:
        """New settings; an utterance in progress keeps its start, padding and end silence."""
        self.cfg = cfg
        ms = SPEECH_RATE // 1000
        self._min_speech = cfg.min_speech_ms * ms
        self._pad = cfg.speech_pad_ms * ms
        self._max_utt = int(cfg.max_utterance_s * SPEECH_RATE)
        if not getattr(self, "speaking", False):
            self._end_silence = cfg.end_silence_ms * ms

    def _idle(self) -> None:
        self._end_silence = self.cfg.end_silence_ms * (SPEECH_RATE // 1000)
        self.speaking = False
        self._candidate: int | None = None  # start of a not-yet-confirmed speech run
        self._utt_start = 0
        self._audio_start = 0
        self._silence_start: int | None = None

    @property
    def samples_fed(self) -> int:
        return self._buf.end

    @property
    def silence_samples(self) -> int:
        """Length of the pause at the end of the utterance in progress (0 while voiced or idle)."""
        if not self.speaking or self._silence_start is None:
            return 0
        return self._pos - self._silence_start

    @property
    def utterance_end(self) -> int:
        """Stream index where the utterance in progress last had speech (its end if it ends now)."""
        return self._silence_start if self._silence_start is not None else self._pos

    @property
    def onset_pending(self) -> bool:
        """Not speaking, but the latest windows sound like speech that has not yet lasted ``min_speech_ms``: it may
        be the speaker going on (turn-taking holds an unsure reply while this is so)."""
        return not self.speaking and self._candidate is not None

    def set_end_silence(self, ms: int | None) -> None:
        """Override the end-of-speech silence for the utterance in progress (None: back to config).

        Lets the conversation wait longer mid-sentence, or less after a complete one.
        """
        ms = self.cfg.end_silence_ms if ms is None else ms
        self._end_silence = int(ms) * (SPEECH_RATE // 1000)

    def force_end(self, reason: str = "endpoint") -> SpeechEnd | None:
        """End the utterance in progress now, during its pause (the caller decided the turn is over)."""
        if not self.speaking or self._silence_start is None:
            return None
        return self._end(self._silence_start, self._pos, reason)

    def reset(self) -> None:
        """Forget the model state and any utterance in progress; the sample clock keeps running."""
        self.vad.reset()
        self._idle()
        self._buf.trim_before(self._pos)

    def utterance(self) -> np.ndarray | None:
        """Audio of the utterance in progress (start − pad … now), for partial transcripts; None if idle."""
        if not self.speaking:
            return None
        return self._buf.slice(self._audio_start, self._buf.end)

    def feed(self, chunk: np.ndarray, start: int | None = None) -> list[VADEvent]:
        """Add 16 kHz mono float32 samples of any length; returns the events they complete, in order.

        ``start`` (optional) is the chunk's stream index, e.g. ``AudioChunk.start``: if audio was dropped
        upstream, the missing span is fed as silence so event times stay on the stream's clock.
        """
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if start is not None and start != self._buf.end:
            missing = start - self._buf.end
            if missing < 0:
                raise ValueError(f"chunk starts at {start}, before the {self._buf.end} samples already fed")
            log.warning("vad.skipped_audio samples=%d fill=silence", missing)
            chunk = np.concatenate([np.zeros(missing, np.float32), chunk])
        self._buf.append(chunk)
        x = np.concatenate([self._pending, chunk]) if len(self._pending) else chunk
        events: list[VADEvent] = []
        n_windows = len(x) // WINDOW_SAMPLES
        for i in range(n_windows):
            self._window(x[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES], events)
        self._pending = x[n_windows * WINDOW_SAMPLES :].copy()
        if not self.speaking:
            keep_from = self._candidate if self._candidate is not None else self._pos
            self._buf.trim_before(keep_from - self._pad)
        return events

    def finish(self) -> list[VADEvent]:
        """End of stream: close an utterance in progress (reason "stream_end")."""
        if not self.speaking:
            return []
        end = self._silence_start if self._silence_start is not None else self._buf.end
        return [self._end(end, self._buf.end, "stream_end")]

    def _window(self, win: np.ndarray, events: list[VADEvent]) -> None:
        cfg = self.cfg
        w0, w1 = self._pos, self._pos + WINDOW_SAMPLES
        self._pos = w1
        p = self.last_prob = self.vad.prob(win)
        if not self.speaking:
            if p >= cfg.threshold:
                if self._candidate is None:
                    self._candidate = w0
            elif p < cfg.neg_threshold:
                self._candidate = None
            if self._candidate is not None and w1 - self._candidate >= self._min_speech:
                events.append(self._start(self._candidate, w1, pad=True))
            return
        if p >= cfg.threshold:
            self._silence_start = None
        elif p < cfg.neg_threshold and self._silence_start is None:
            self._silence_start = w0
        if self._silence_start is not None and w1 - self._silence_start >= self._end_silence:
            events.append(self._end(self._silence_start, w1, "silence"))
        elif w1 - self._utt_start >= self._max_utt:
            if self._silence_start is not None:
                events.append(self._end(self._silence_start, w1, "max_utterance"))
            else:  # still talking: cut here and carry straight on with a new utterance
                events.append(self._end(w1, w1, "max_utterance"))
                events.append(self._start(w1, w1, pad=False))

    def _audible_end(self, end: int, detected: int, speech: np.ndarray) -> int:
        """The last audible frame near the VAD's ``end``, searched in the audio held (up to one window after
        it); audible for the loudest frame of ``speech`` (the utterance), above the hangover's own level
        (:func:`audible_floor`)."""
        lo = max(self._utt_start, end - AUDIBLE_LOOKBACK, self._buf.start)
        hi = min(end + WINDOW_SAMPLES, detected, self._buf.end)
        if hi - lo < AUDIBLE_FRAME:
            return end
        hangover = self._buf.slice(min(end + WINDOW_SAMPLES, detected), detected)
        noise = float(frame_rms(hangover).max()) if hangover.size >= AUDIBLE_FRAME else 0.0
        peak = float(frame_rms(speech).max()) if speech.size >= AUDIBLE_FRAME else 0.0
        found = last_audible_end(self._buf.slice(lo, hi), noise, peak, self.below_peak_db)
        return end if found is None else lo + found

    def _start(self, start: int, detected: int, *, pad: bool) -> SpeechStart:
        self.speaking = True
        self._candidate = None
        self._silence_start = None
        self._utt_start = start
        self._audio_start = max(start - self._pad, self._buf.start) if pad else start
        ev = SpeechStart(start, start / SPEECH_RATE, detected / SPEECH_RATE)
        log.info("vad.speech_start t=%.3f detected_at=%.3f", ev.time_s, ev.detected_at_s)
        return ev

    def _end(self, end: int, detected: int, reason: str) -> SpeechEnd:
        tail = self._pad if reason != "max_utterance" or end < detected else 0
        base = max(self._audio_start, self._buf.start)  # audio[0]'s stream index
        audio = self._buf.slice(base, min(end + tail, self._buf.end))
        speech = audio[max(0, self._utt_start - base) : max(0, end - base)]
        ev = SpeechEnd(
            audible_end=self._audible_end(end, detected, speech),
            sample_index=end,
            time_s=end / SPEECH_RATE,
            detected_at_s=detected / SPEECH_RATE,
            start_s=self._utt_start / SPEECH_RATE,
            audio_start_s=self._audio_start / SPEECH_RATE,
            audio=audio,
            reason=reason,
        )
        log.info(
            "vad.speech_end t=%.3f detected_at=%.3f duration_s=%.3f audio_s=%.3f reason=%s",
            ev.time_s,
            ev.detected_at_s,
            ev.duration_s,
            len(audio) / SPEECH_RATE,
            reason,
        )
        self._idle()
        return ev
