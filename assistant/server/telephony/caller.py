"""The caller's side of a call's media: μ-law at 8 kHz in, 16 kHz float32 ``AudioChunk``s out, and the checks a
stream of media messages must pass (size, order, pace).

The conversation's VAD, end-of-turn model and ASR all take 16 kHz (``SPEECH_RATE``): one streaming soxr resampler
per call carries the telephone band up (nothing above 4 kHz comes back, but no samples are lost and chunk edges
leave no clicks). "MQ" as for our WebRTC audio: its delay adds straight to endpointing latency.
"""

from __future__ import annotations

import time

import numpy as np
import soxr

from assistant.audio import S16_SCALE, SPEECH_RATE, AudioChunk
from assistant.g711 import ulaw_decode
from assistant.server.telephony.dialects import TELEPHONE_RATE, ProtocolError

RESAMPLE_QUALITY = "MQ"
MAX_LATE_FRAMES = 50  # media older than media already fed is dropped; this many in one call is not a network
FLOOD_MARGIN_S = 2.0  # audio may arrive this far ahead of the wall clock (bunched by the network), no further


class CallerAudio:
    """One call's inbound media: checked, decoded, resampled, stamped on the call's 16 kHz sample clock."""

    def __init__(self, max_payload_bytes: int, clock: float | None = None) -> None:
        self.max_payload_bytes = max_payload_bytes
        self._resampler = soxr.ResampleStream(TELEPHONE_RATE, SPEECH_RATE, 1, dtype="float32",
                                              quality=RESAMPLE_QUALITY)
        self.position = 0  # 16 kHz samples handed on
        self.received = 0  # 8 kHz samples received
        self.started = time.monotonic() if clock is None else clock  # when the first media came
        self.last_chunk: int | None = None
        self.late = 0  # media messages dropped for coming after newer ones
        self.missing = 0  # chunk numbers never seen (the carrier or the network lost them)

    def accept_order(self, chunk: int | None) -> bool:
        """Whether a media message numbered ``chunk`` comes in order (False: drop it); too many late ones raise."""
        if chunk is None:
            return True
        last = self.last_chunk
        if last is not None and chunk <= last:
            self.late += 1
            if self.late > MAX_LATE_FRAMES:
                raise ProtocolError("media_out_of_order", f"{self.late} media messages came after newer ones")
            return False
        if last is not None:
            self.missing += chunk - last - 1
        self.last_chunk = chunk
        return True

    def push(self, ulaw: bytes, arrived: float, now: float | None = None) -> AudioChunk | None:
        """One message's μ-law bytes → the 16 kHz chunk that is ready (None while the resampler fills)."""
        if len(ulaw) > self.max_payload_bytes:
            raise ProtocolError("media_too_large", f"{len(ulaw)} bytes in one media message; at most "
                                f"{self.max_payload_bytes}")
        if not ulaw:
            return None
        now = time.monotonic() if now is None else now
        self.received += len(ulaw)
        if self.received / TELEPHONE_RATE > (now - self.started) + FLOOD_MARGIN_S:
            raise ProtocolError("media_flood", f"{self.received / TELEPHONE_RATE:.1f} s of audio in "
                                f"{now - self.started:.1f} s")
        x = ulaw_decode(ulaw).astype(np.float32) / S16_SCALE
        y = self._resampler.resample_chunk(x)
        if not y.size:
            return None
        chunk = AudioChunk(self.position, y, arrived, self.lag)
        self.position += y.size
        return chunk

    @property
    def lag(self) -> int:
        """16 kHz samples the resampler still holds: the newest audio runs this far past ``position``."""
        return max(0, self.received * SPEECH_RATE // TELEPHONE_RATE - self.position)
