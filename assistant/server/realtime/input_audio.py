"""A Realtime session's input audio: to the conversation's turn-taking as it arrives, or, while turn detection is
off, held in the input audio buffer until the client commits or clears it. Both on one clock: the 16 kHz samples
given to the conversation, which the speech events' ``audio_start_ms`` / ``audio_end_ms`` are read against.

The last ``RECENT_S`` of what was given to the conversation is kept too: a client may commit, under turn
detection, audio that no speech was detected in, and speech the conversation made no turn of (spoken over a
reply that ``interrupt_response: false`` lets play on) is still transcribed into its item.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from assistant.audio import SPEECH_RATE, AudioChunk
from assistant.pipeline.conversation import Conversation

RECENT_S = 30.0  # audio given to the conversation that stays at hand (longer than an utterance may be)
# The pace of input_audio_buffer.append (every input path has one: the peer's is its RTP clock, a phone call's is
# telephony/caller.py's): a recorded minute may come at once, then audio at most PACE_SPEED x real time: faster
# than anyone speaks, and what our own clients send (4x), but not the 350x a flood reaches (docs/reliability.md).
PACE_BURST_S = 60.0
PACE_SPEED = 4.0
FEED_SLICE = SPEECH_RATE  # a big append reaches turn-taking a second at a time, the loop free between slices


class InputPace:
    """A token bucket of audio seconds: ``PACE_BURST_S`` at once, refilled at ``PACE_SPEED`` x the wall clock.
    What it refuses is counted, and forgotten at the pace the bucket refills: a client that runs ahead now and then
    in a long session is not closed for the sum of its hours, one that keeps sending another burst's worth past the
    refusals (more than twice the pace, for long) is flooding."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.allowance = PACE_BURST_S
        self._stamp = clock()
        self.refused_s = 0.0

    def take(self, seconds: float) -> bool:
        """Spend ``seconds`` of audio; False (nothing spent) when it comes faster than the pace allows."""
        now = self.clock()
        elapsed = max(0.0, now - self._stamp)
        self.allowance = min(PACE_BURST_S, self.allowance + elapsed * PACE_SPEED)
        self.refused_s = max(0.0, self.refused_s - elapsed * PACE_SPEED)
        self._stamp = now
        if seconds > self.allowance:
            self.refused_s += seconds
            return False
        self.allowance -= seconds
        return True

    @property
    def flooding(self) -> bool:
        return self.refused_s > PACE_BURST_S


class InputAudio:
    """The fed samples and the held buffer of one session (16 kHz mono float32)."""

    def __init__(self, conversation: Conversation, max_buffer_s: float) -> None:
        self.conversation = conversation
        self.max_buffer_s = max_buffer_s
        self.fed = 0  # 16 kHz samples given to the conversation (the input stream's clock)
        self.committed = 0  # where the audio not yet committed starts (turn detection on)
        self._held: list[np.ndarray] = []
        self._held_samples = 0
        self._recent: deque[tuple[int, np.ndarray]] = deque()  # (start, samples) of what was fed, oldest first

    @property
    def held_ms(self) -> float:
        return self._held_samples * 1000 / SPEECH_RATE

    @property
    def uncommitted_ms(self) -> float:
        """Audio given to turn-taking since the last commit (of speech or by the client)."""
        return max(0, self.fed - self.committed) * 1000 / SPEECH_RATE

    def feed(self, samples: np.ndarray, arrived: float = 0.0) -> None:
        """Audio to the conversation's turn-taking, stamped with when it arrived (now, if not given)."""
        if samples.size:
            chunk = AudioChunk(self.fed, samples, arrived or time.time())
            self._keep(self.fed, samples)
            self.fed += samples.size
            self.conversation.feed(chunk)

    def feed_chunk(self, chunk: AudioChunk) -> None:
        """A chunk already on the input stream's clock (the peer's track)."""
        self._keep(chunk.start, chunk.samples)
        self.fed = chunk.end
        self.conversation.feed(chunk)

    def _keep(self, start: int, samples: np.ndarray) -> None:
        self._recent.append((start, samples))
        horizon = start + samples.size - int(RECENT_S * SPEECH_RATE)
        while self._recent and self._recent[0][0] + self._recent[0][1].size < horizon:
            self._recent.popleft()

    def recent(self, start: int, end: int) -> np.ndarray:
        """What was fed from stream sample ``start`` to ``end`` (as far as it is still kept)."""
        parts = [x[max(0, start - s): max(0, end - s)] for s, x in self._recent if s < end and s + x.size > start]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def hold(self, samples: np.ndarray) -> bool:
        """Keep ``samples`` for a commit; False (nothing kept) when the buffer would pass ``max_buffer_s``."""
        if (self._held_samples + samples.size) / SPEECH_RATE > self.max_buffer_s:
            return False
        self._held.append(samples)
        self._held_samples += samples.size
        return True

    def take(self) -> np.ndarray:
        """What is held, as one clip; the buffer is empty after."""
        clip = np.concatenate(self._held) if self._held else np.zeros(0, np.float32)
        self.clear()
        return clip

    def take_uncommitted(self) -> np.ndarray:
        """What turn-taking was given since the last commit, as one clip; committed from now on."""
        clip = self.recent(self.committed, self.fed)
        self.committed = self.fed
        return clip

    def clear(self) -> None:
        self._held.clear()
        self._held_samples = 0
        self.committed = self.fed
