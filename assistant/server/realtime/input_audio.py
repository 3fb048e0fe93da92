"""A Realtime session's input audio: to the conversation's turn-taking as it arrives, or, while turn detection is
off, held in the input audio buffer until the client commits or clears it. Both on one clock: the 16 kHz samples
given to the conversation, which the speech events' ``audio_start_ms`` / ``audio_end_ms`` are read against."""

from __future__ import annotations

import time

import numpy as np

from assistant.audio import SPEECH_RATE, AudioChunk
from assistant.pipeline.conversation import Conversation


class InputAudio:
    """The fed samples and the held buffer of one session (16 kHz mono float32)."""

    def __init__(self, conversation: Conversation, max_buffer_s: float) -> None:
        self.conversation = conversation
        self.max_buffer_s = max_buffer_s
        self.fed = 0  # 16 kHz samples given to the conversation (the input stream's clock)
        self._held: list[np.ndarray] = []
        self._held_samples = 0

    @property
    def held_ms(self) -> float:
        return self._held_samples * 1000 / SPEECH_RATE

    def feed(self, samples: np.ndarray, arrived: float = 0.0) -> None:
        """Audio to the conversation's turn-taking, stamped with when it arrived (now, if not given)."""
        if samples.size:
            chunk = AudioChunk(self.fed, samples, arrived or time.time())
            self.fed += samples.size
            self.conversation.feed(chunk)

    def feed_chunk(self, chunk: AudioChunk) -> None:
        """A chunk already on the input stream's clock (the peer's track)."""
        self.fed = chunk.end
        self.conversation.feed(chunk)

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

    def clear(self) -> None:
        self._held.clear()
        self._held_samples = 0
