"""ReplyTrack: the bot's voice as an aiortc audio track.

It emits 20 ms mono s16 frames at 48 kHz, paced on the wall clock with continuous pts, and silence when
there is nothing to say. Reply audio is written into a small queue (``reply_queue_ms``, 60 ms by default):
writers wait when it is full, so the TTS runs at most a few frames ahead of what the peer has been given,
and an interruption (:meth:`ReplyTrack.interrupt`) is heard within a frame or two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from assistant.rtc.pacing import FramePacer, s16_mono_frame

log = logging.getLogger(__name__)

OUT_SAMPLE_RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = OUT_SAMPLE_RATE * FRAME_MS // 1000  # 960
# A frame whose peak is below this (s16) counts as silence for "first audible frame" marks (≈ −60 dBFS).
SILENCE_PEAK_S16 = 32
# A reply track this far behind its clock jumps ahead instead of sending the backlog in a burst.
RESYNC_AFTER_S = 0.2


class ReplyTrack(MediaStreamTrack):
    """The bot's voice: the pipeline's reply sink (``pipeline/speech.ReplySink``) as an aiortc track."""

    kind = "audio"
    sample_rate = OUT_SAMPLE_RATE

    def __init__(self, queue_ms: int = 60, on_first_audible: Callable[[float], None] | None = None) -> None:
        super().__init__()
        self._max_frames = max(1, queue_ms // FRAME_MS)
        self._frames: deque[np.ndarray] = deque()
        self._partial = np.zeros(0, dtype=np.int16)
        self._space = asyncio.Event()
        self._space.set()
        self._pacer = FramePacer(OUT_SAMPLE_RATE)
        self._pts = 0
        self._generation = 0  # bumped by interrupt(); writers of an older generation stop
        self._silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        self.on_first_audible = on_first_audible
        self._await_audible = False
        self.frames_sent = 0
        self.audible_frames_sent = 0  # reply frames (queued audio, not idle silence) handed to the peer
        self.last_audible_sent_at = 0.0  # wall time the latest audible frame was handed to the peer

    # --- writer side -------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._generation

    def expect_reply(self) -> None:
        """Arm the ``on_first_audible`` callback for the next audible frame."""
        self._await_audible = True

    async def write(self, pcm: np.ndarray, generation: int | None = None) -> bool:
        """Queue 48 kHz mono int16 samples; waits while the queue is full.

        Returns False (and drops the audio) if the track was interrupted since ``generation``.
        """
        gen = self._generation if generation is None else generation
        if gen != self._generation:
            return False
        data = np.concatenate([self._partial, np.asarray(pcm, dtype=np.int16)]) if self._partial.size else pcm
        n_full = len(data) // FRAME_SAMPLES
        for i in range(n_full):
            while len(self._frames) >= self._max_frames:
                self._space.clear()
                await self._space.wait()
                if gen != self._generation or self.readyState != "live":
                    return False
            self._frames.append(np.ascontiguousarray(data[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]))
        self._partial = np.array(data[n_full * FRAME_SAMPLES :], dtype=np.int16)
        return True

    async def flush(self, generation: int | None = None) -> bool:
        """Pad the last partial frame with silence and wait until every queued frame has been sent."""
        gen = self._generation if generation is None else generation
        if self._partial.size and gen == self._generation:
            pad = np.zeros(FRAME_SAMPLES - self._partial.size, dtype=np.int16)
            tail, self._partial = np.concatenate([self._partial, pad]), np.zeros(0, dtype=np.int16)
            if not await self.write(tail, gen):
                return False
        while self._frames and gen == self._generation and self.readyState == "live":
            self._space.clear()
            await self._space.wait()
        return gen == self._generation

    def interrupt(self) -> int:
        """Drop everything queued now; writers of the old generation return False. Returns frames dropped."""
        dropped = len(self._frames)
        self._frames.clear()
        self._partial = np.zeros(0, dtype=np.int16)
        self._generation += 1
        self._await_audible = False
        self._space.set()
        return dropped

    @property
    def queued_ms(self) -> int:
        return len(self._frames) * FRAME_MS

    # --- aiortc side -------------------------------------------------------------------------------
    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        late = await self._pacer.wait(self._pts)
        if late > RESYNC_AFTER_S:
            # The loop stalled (GC, a slow callback): skip ahead rather than bursting frames.
            skipped = int(late * OUT_SAMPLE_RATE) // FRAME_SAMPLES * FRAME_SAMPLES
            self._pts += skipped
            log.debug("reply_track_resync skipped_ms=%d", skipped * 1000 // OUT_SAMPLE_RATE)
        if self._frames:
            samples = self._frames.popleft()
            self._space.set()
            if int(np.abs(samples).max()) > SILENCE_PEAK_S16:
                self.last_audible_sent_at = time.time()
                if self._await_audible:
                    self._await_audible = False
                    if self.on_first_audible is not None:
                        self.on_first_audible(self.last_audible_sent_at)
            self.audible_frames_sent += 1
        else:
            samples = self._silence
        frame = s16_mono_frame(samples, OUT_SAMPLE_RATE, self._pts)
        self._pts += FRAME_SAMPLES
        self.frames_sent += 1
        return frame

    def stop(self) -> None:
        super().stop()
        self._frames.clear()
        self._space.set()
