"""The session's one sample clock: 16 kHz stream samples ↔ the wall-clock moment each reached the server.

Every ``AudioChunk`` carries its place on the sample clock (``start``) and when its packet arrived
(``arrived``, ``lag``); this keeps the recent ones, so any event the VAD places on a sample (a speech start, the
last audible frame) can be put on the wall clock the page and the bench client measure with.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from assistant.audio import SPEECH_RATE, AudioChunk

# Anchors kept (one per inbound chunk, 20 ms each): 10 s, more than any hangover, pause or utterance cut.
ANCHORS = 512


class SampleClock:
    def __init__(self) -> None:
        self.samples = 0  # stream position: samples fed so far
        # (stream sample, wall time): every sample before it had arrived by then.
        self._anchors: collections.deque[tuple[int, float]] = collections.deque([(0, time.time())], maxlen=ANCHORS)
        self._arrivals_known = False  # chunks carried packet arrival times (not bare arrays)

    def advance(self, chunk: AudioChunk | np.ndarray) -> tuple[np.ndarray, int]:
        """Take one chunk; returns its samples and its start on the stream clock.

        A bare array is taken to follow the previous audio and to end now; with no arrival times of its own
        it is taken to have flowed in real time (tests and benches feeding files).
        """
        now = time.time()
        if isinstance(chunk, AudioChunk):
            samples, start = chunk.samples, chunk.start
            self._arrivals_known = True
            self._anchors.append((chunk.end + chunk.lag, min(chunk.arrived or now, now)))
        else:
            samples, start = np.asarray(chunk, dtype=np.float32).reshape(-1), self.samples
            self._arrivals_known = False
            self._anchors.append((start + len(samples), now))
        self.samples = max(self.samples, start + len(samples))
        return samples, start

    def wall_time(self, sample: int) -> float:
        """When stream sample ``sample`` reached the server: the arrival of the packet that carried it (what a
        client counts from: the moment the frame holding that sample was sent)."""
        if self._arrivals_known:
            for pos, wall in self._anchors:
                if pos > sample:
                    return wall
        pos, wall = self._anchors[-1]
        return wall - (pos - sample) / SPEECH_RATE

    def ms_since(self, sample: int) -> float:
        """Stream time from ``sample`` to the latest sample fed, in ms."""
        return (self.samples - sample) * 1000 / SPEECH_RATE
