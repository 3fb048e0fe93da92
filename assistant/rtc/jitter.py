"""The server's own receive buffer for the user's audio, sized to the measured jitter.

aiortc holds 4 audio packets (80 ms) in its receive jitter buffer before the decoder sees one, so the VAD
hears the end of every utterance 80 ms late. The server never *plays* this audio: all the buffer has to
do is put packets back in order. On a LAN or loopback one packet is enough; on a jittery path the
interarrival jitter (RFC 3550, which aiortc's receiver already tracks) tells how many packets can arrive
out of order, and the buffer grows to that, up to a cap.

This reaches into aiortc's receiver (name-mangled attributes): if a future aiortc renames them, the
buffer is left at aiortc's default and a warning says so.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aiortc.jitterbuffer import JitterBuffer

log = logging.getLogger(__name__)

AUDIO_CAPACITY = 16  # packets aiortc's audio buffer holds (a power of two); unchanged
PACKET_MS = 20
RTP_CLOCK = 48_000  # Opus RTP timestamps tick at 48 kHz
# Packets held per unit of measured jitter: 2× the jitter covers nearly all reordering (RFC 3550 jitter is
# a mean deviation, and reordering shows up as deviations of about a packet time).
JITTER_MARGIN = 2.0


class AdaptiveReceiveBuffer:
    """Owns the prefetch depth of one audio receiver's jitter buffer."""

    def __init__(self, receiver: Any, initial_packets: int, max_packets: int, adaptive: bool) -> None:
        self.receiver = receiver
        self.max_packets = max(1, max_packets)
        self.adaptive = adaptive
        self.packets = max(0, min(initial_packets, self.max_packets))
        self.buffer: JitterBuffer | None = None
        attr = "_RTCRtpReceiver__jitter_buffer"
        if hasattr(receiver, attr):
            self.buffer = JitterBuffer(capacity=AUDIO_CAPACITY, prefetch=self.packets)
            setattr(receiver, attr, self.buffer)
        else:  # pragma: no cover - depends on aiortc internals
            log.warning("jitter_buffer_unavailable aiortc internals changed; using aiortc's default")

    def jitter_ms(self) -> float | None:
        """The largest interarrival jitter over the receiver's streams, in ms (None if not known yet)."""
        streams = getattr(self.receiver, "_RTCRtpReceiver__remote_streams", None)
        if not streams:
            return None
        return max(s.jitter for s in streams.values()) * 1000.0 / RTP_CLOCK

    def adapt(self) -> int:
        """Resize the prefetch to the measured jitter; returns the depth now in use (packets)."""
        if self.buffer is None or not self.adaptive:
            return self.packets
        jitter = self.jitter_ms()
        if jitter is None:
            return self.packets
        want = max(1, min(self.max_packets, math.ceil(JITTER_MARGIN * jitter / PACKET_MS)))
        # Grow at once (audio is being damaged); shrink one packet at a time (jitter is bursty).
        target = want if want > self.packets else max(want, self.packets - 1)
        if target != self.packets:
            log.info("jitter_buffer_resize packets=%d->%d jitter_ms=%.1f", self.packets, target, jitter)
            self.packets = target
            self.buffer._prefetch = target  # read on every packet by aiortc's buffer
        return self.packets
