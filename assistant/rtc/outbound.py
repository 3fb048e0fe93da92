"""ReplyTrack: the bot's voice as an aiortc audio track.

It emits 20 ms mono s16 frames at 48 kHz (or the rate it is made with: a SIP call's G.711 takes 8 kHz), paced on
the wall clock with continuous pts, and silence when there is nothing to say. Reply audio is written into a small
queue (``reply_queue_ms``, 60 ms by default): writers wait when it is full, so the TTS runs at most a few frames
ahead of what the peer has been given, and an interruption (:meth:`ReplyTrack.interrupt`) is heard within a frame
or two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from assistant.audio import FRAME_MS, SILENCE_PEAK_S16, WEBRTC_RATE
from assistant.rtc.pacing import FramePacer, s16_mono_frame

log = logging.getLogger(__name__)

# A reply track this far behind its clock jumps ahead instead of sending the backlog in a burst.
RESYNC_AFTER_S = 0.2



class FirstAudible:
    """The future a reply sink's ``expect_reply`` hands out, resolved with the wall time of the first audible
    piece sent after it was armed; arming again or disarming cancels the one armed before."""

    def __init__(self) -> None:
        self._future: asyncio.Future[float] | None = None

    def arm(self) -> asyncio.Future[float]:
        self.disarm()
        self._future = asyncio.get_running_loop().create_future()
        return self._future

    def disarm(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.cancel()
        self._future = None

    def heard(self, at: float) -> None:
        """An audible piece went out at wall time ``at``."""
        if self._future is not None:
            if not self._future.done():
                self._future.set_result(at)
            self._future = None


class SinkBase:
    """What every reply sink (``pipeline/reply.ReplySink``) holds alike: the ``generation`` its writers carry,
    the first-audible future :meth:`expect_reply` hands out, and the pause flag. A sink calls
    :meth:`_new_generation` where it drops what was written (interrupt, stop)."""

    def __init__(self) -> None:
        super().__init__()
        self._generation = 0  # bumped by _new_generation(); writers of an older generation stop
        self._first_audible = FirstAudible()  # armed by expect_reply(), resolved by the sink's first audible piece
        self._paused = False  # held by pause(): the listener hears silence, writers wait

    @property
    def generation(self) -> int:
        return self._generation

    def expect_reply(self) -> asyncio.Future[float]:
        """A future that the next audible piece handed to the listener resolves with its wall time (``time.time``).

        The sink only sets the result; whoever waits on it (the turn runner) does the rest on its own time.
        Arming again, or an interrupt, cancels the future armed before.
        """
        return self._first_audible.arm()

    def pause(self) -> None:
        """Hold the queued reply (the listener hears silence meanwhile); writers wait for room as usual."""
        self._paused = True

    def resume(self) -> None:
        """Play on from where :meth:`pause` held."""
        self._paused = False

    def _new_generation(self) -> None:
        """Writers of the current generation stop (their writes return False); the armed future is cancelled."""
        self._generation += 1
        self._first_audible.disarm()


class ReplyTrack(SinkBase, MediaStreamTrack):
    """The bot's voice: the pipeline's reply sink (``pipeline/speech.ReplySink``) as an aiortc track."""

    kind = "audio"
    sample_rate = WEBRTC_RATE

    def __init__(self, queue_ms: int = 60, sample_rate: int = WEBRTC_RATE) -> None:
        super().__init__()
        self.sample_rate = sample_rate
        self._frame = sample_rate * FRAME_MS // 1000  # samples in one 20 ms frame (FRAME_SAMPLES at 48 kHz)
        self._max_frames = max(1, queue_ms // FRAME_MS)
        self._frames: deque[np.ndarray] = deque()
        self._partial = np.zeros(0, dtype=np.int16)
        self._space = asyncio.Event()
        self._space.set()
        self._pacer = FramePacer(sample_rate)
        self._pts = 0
        self._silence = np.zeros(self._frame, dtype=np.int16)
        self.frames_sent = 0
        self.audible_frames_sent = 0  # reply frames (queued audio, not idle silence) handed to the peer
        self.last_audible_sent_at = 0.0  # wall time the latest audible frame was handed to the peer

    # --- writer side -------------------------------------------------------------------------------
    async def write(self, pcm: np.ndarray, generation: int | None = None) -> bool:
        """Queue mono int16 samples at ``sample_rate``; waits while the queue is full.

        Returns False (and drops the audio) if the track was interrupted since ``generation``.
        """
        gen = self._generation if generation is None else generation
        if gen != self._generation:
            return False
        data = np.concatenate([self._partial, np.asarray(pcm, dtype=np.int16)]) if self._partial.size else pcm
        frame = self._frame
        n_full = len(data) // frame
        for i in range(n_full):
            while len(self._frames) >= self._max_frames:
                self._space.clear()
                await self._space.wait()
                if gen != self._generation or self.readyState != "live":
                    return False
            self._frames.append(np.ascontiguousarray(data[i * frame : (i + 1) * frame]))
        self._partial = np.array(data[n_full * frame :], dtype=np.int16)
        return True

    async def flush(self, generation: int | None = None) -> bool:
        """Pad the last partial frame with silence and wait until every queued frame has been sent."""
        gen = self._generation if generation is None else generation
        if self._partial.size and gen == self._generation:
            pad = np.zeros(self._frame - self._partial.size, dtype=np.int16)
            tail, self._partial = np.concatenate([self._partial, pad]), np.zeros(0, dtype=np.int16)
            if not await self.write(tail, gen):
                return False
        while self._frames and gen == self._generation and self.readyState == "live":
            self._space.clear()
            await self._space.wait()
        return gen == self._generation

    def interrupt(self) -> int:
        """Drop everything queued now; writers of the old generation return False. Returns frames dropped."""
        self._paused = False
        dropped = len(self._frames)
        self._frames.clear()
        self._partial = np.zeros(0, dtype=np.int16)
        self._new_generation()
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
            skipped = int(late * self.sample_rate) // self._frame * self._frame
            self._pts += skipped
            log.debug("reply_track_resync skipped_ms=%d", skipped * 1000 // self.sample_rate)
        if self._frames and not self._paused:
            samples = self._frames.popleft()
            self._space.set()
            if int(np.abs(samples).max()) > SILENCE_PEAK_S16:
                self.last_audible_sent_at = time.time()
                self._first_audible.heard(self.last_audible_sent_at)
            self.audible_frames_sent += 1
        else:
            samples = self._silence
        frame = s16_mono_frame(samples, self.sample_rate, self._pts)
        self._pts += self._frame
        self.frames_sent += 1
        return frame

    def stop(self) -> None:
        super().stop()
        self._first_audible.disarm()
        self._frames.clear()
        self._space.set()
