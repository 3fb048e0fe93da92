"""The server's own receive buffer for the user's audio: in order, no prefetch, holes waited on briefly.

aiortc's audio jitter buffer holds 4 packets (80 ms) before the decoder sees one, so the VAD hears the end
of every utterance 80 ms late. Worse, it releases at most one frame per arriving packet, so after a single
lost packet it waits for 16 more, skips the hole, and then stays 14 packets (280 ms) behind for the rest of
the call (see ``tests/test_jitter.py``).

The server never *plays* this audio: the buffer only has to put packets back in order. This one releases
each packet the moment everything before it is there (no prefetch), waits for a missing packet only as
long as the measured jitter says a late packet could still come (RFC 3550 interarrival jitter, which aiortc's
receiver already tracks; ``hole_packets`` at least), then gives it up as lost and releases everything behind
it at once, so a loss costs one hole of silence and no lasting delay.

It reaches into aiortc's receiver (name-mangled attributes) to hand several frames to the decoder at once;
if a future aiortc renames them, the receiver keeps aiortc's own buffer and a warning says so.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any

from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add, uint16_gt

log = logging.getLogger(__name__)

PACKET_MS = 20
RTP_CLOCK = 48_000  # Opus RTP timestamps tick at 48 kHz
# Packets waited on per unit of measured jitter: 2x covers nearly all reordering (RFC 3550 jitter is a
# mean deviation; a reordered packet shows up as a deviation of about one packet time).
JITTER_MARGIN = 2.0
MAX_STORED = 64  # packets held at most (a burst far ahead of a hole); older holes are given up first
ARRIVALS_KEPT = 256  # packet arrival times remembered (5 s of 20 ms packets), for ``arrival``
_RECEIVER = "_RTCRtpReceiver__"


class AudioReceiveBuffer:
    """Drop-in for aiortc's ``JitterBuffer`` on an audio receiver (``add(packet) -> (pli, frame)``)."""

    def __init__(self, hole_packets: int = 1, emit_extra: Any = None) -> None:
        self.hole_packets = max(0, hole_packets)
        self._emit_extra = emit_extra  # called with each further frame released by the same packet
        self._next: int | None = None  # sequence number of the next packet to release
        self._stored: dict[int, RtpPacket] = {}
        self.lost = 0
        self.late = 0
        # RTP timestamp -> wall time the packet arrived; aiortc maps RTP timestamps to frame pts by
        # subtracting the first released one (``_origin``), so ``arrival(pts)`` can find a decoded frame's.
        self._arrived: collections.OrderedDict[int, float] = collections.OrderedDict()
        self._origin: int | None = None

    def arrival(self, pts: int) -> float | None:
        """Wall time at which the packet of the decoded frame with this pts arrived (None: not known)."""
        if self._origin is None:
            return None
        return self._arrived.get((pts + self._origin) & 0xFFFFFFFF)

    @property
    def capacity(self) -> int:  # read by aiortc for video only; kept for the interface
        return MAX_STORED

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        self._arrived[packet.timestamp] = time.time()
        if len(self._arrived) > ARRIVALS_KEPT:
            self._arrived.popitem(last=False)
        if self._next is None:
            self._next = seq
        if uint16_gt(self._next, seq):  # older than what was already released: too late to use
            self.late += 1
            return False, None
        self._stored[seq] = packet
        frames = self._release()
        if not frames:
            return False, None
        for extra in frames[1:]:
            if self._emit_extra is not None:
                self._emit_extra(extra, packet)
        return False, frames[0]

    def _release(self) -> list[JitterFrame]:
        assert self._next is not None
        out: list[JitterFrame] = []
        while self._stored:
            packet = self._stored.pop(self._next, None)
            if packet is None:
                if not self._hole_expired():
                    break
                self.lost += 1
                self._next = uint16_add(self._next, 1)
                continue
            if self._origin is None:
                self._origin = packet.timestamp
            out.append(JitterFrame(data=packet._data, timestamp=packet.timestamp))  # type: ignore[attr-defined]
            self._next = uint16_add(self._next, 1)
        return out

    def _hole_expired(self) -> bool:
        """Give a missing packet up once more than ``hole_packets`` later ones could have overtaken it."""
        assert self._next is not None
        ahead = max(uint16_add(s, -self._next) for s in self._stored)
        return ahead > self.hole_packets or len(self._stored) >= MAX_STORED


class AdaptiveReceiveBuffer:
    """Installs an :class:`AudioReceiveBuffer` on one audio receiver and sizes its hole wait to the jitter."""

    def __init__(self, receiver: Any, initial_packets: int, max_packets: int, adaptive: bool) -> None:
        self.receiver = receiver
        self.max_packets = max(1, max_packets)
        self.adaptive = adaptive
        self.packets = max(0, min(initial_packets, self.max_packets))
        self.buffer: AudioReceiveBuffer | None = None
        if all(hasattr(receiver, _RECEIVER + a) for a in ("jitter_buffer", "decoder_queue", "codecs")):
            self.buffer = AudioReceiveBuffer(self.packets, emit_extra=self._to_decoder)
            setattr(receiver, _RECEIVER + "jitter_buffer", self.buffer)
        else:  # pragma: no cover - depends on aiortc internals
            log.warning("receive_buffer_unavailable aiortc internals changed; using aiortc's own buffer")

    @classmethod
    def for_track(
        cls, pc: Any, track: Any, initial_packets: int, max_packets: int, adaptive: bool
    ) -> AdaptiveReceiveBuffer | None:
        """Install on the receiver of ``track`` (a remote audio track of ``pc``); None if it has none."""
        receiver = next((t.receiver for t in pc.getTransceivers() if t.receiver.track is track), None)
        return None if receiver is None else cls(receiver, initial_packets, max_packets, adaptive)

    def _to_decoder(self, frame: JitterFrame, packet: RtpPacket) -> None:
        """Queue a frame for decoding the way aiortc queues the one ``add`` returns."""
        r = self.receiver
        codec = getattr(r, _RECEIVER + "codecs").get(packet.payload_type)
        mapper = getattr(r, _RECEIVER + "timestamp_mapper", None)
        if codec is None or mapper is None or getattr(r, _RECEIVER + "decoder_thread", None) is None:
            return
        frame.timestamp = mapper.map(frame.timestamp)
        getattr(r, _RECEIVER + "decoder_queue").put((codec, frame))

    def jitter_ms(self) -> float | None:
        """The largest interarrival jitter over the receiver's streams, in ms (None if not known yet)."""
        streams = getattr(self.receiver, _RECEIVER + "remote_streams", None)
        if not streams:
            return None
        return max(s.jitter for s in streams.values()) * 1000.0 / RTP_CLOCK

    def adapt(self) -> int:
        """Resize the hole wait to the measured jitter; returns the wait now in use (packets)."""
        if self.buffer is None or not self.adaptive:
            return self.packets
        jitter = self.jitter_ms()
        if jitter is None:
            return self.packets
        want = max(1, min(self.max_packets, math.ceil(JITTER_MARGIN * jitter / PACKET_MS)))
        # Grow at once (packets are being given up too early); shrink one packet at a time (jitter is bursty).
        target = want if want > self.packets else max(want, self.packets - 1)
        if target != self.packets:
            log.info("receive_buffer_resize hole_packets=%d->%d jitter_ms=%.1f", self.packets, target, jitter)
            self.packets = self.buffer.hole_packets = target
        return self.packets
