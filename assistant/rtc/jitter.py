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

A hostile peer costs no more than a normal one: a sequence jump is given up in one step (not walked packet by
packet), packets past ``MAX_PACKETS_PER_S`` (a flood) and Opus packets that break RFC 6716's framing are dropped
before they are decoded, and :meth:`AudioReceiveBuffer.abuse` names what a peer did too often, so its session can
close it with that reason.

It reaches into aiortc's receiver (name-mangled attributes) to hand several frames to the decoder at once;
if a future aiortc renames them, the receiver keeps aiortc's own buffer and a warning says so.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

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
# Hostile peers. A browser sends 50 packets a second (20 ms each; 100 at 10 ms); after a network stall the packets
# queued meanwhile arrive at once, so the burst allowance holds a few seconds of them.
MAX_PACKETS_PER_S = 200
PACKET_BURST = 250
FLOOD_CLOSE_PACKETS = 250   # packets dropped as a flood within FLOOD_WINDOW_S: the peer is flooding
FLOOD_WINDOW_S = 10.0       # (a long call's odd burst past the budget, now and then, never adds up to one)
JUMP_PACKETS = 1000         # a hole this long (20 s of packets) is a sequence jump, not loss
MAX_JUMPS = 5               # jumps (sequence here, timestamp in ``inbound``) within JUMP_WINDOW_S: a hostile peer
JUMP_WINDOW_S = 10.0
GARBAGE_CLOSE_PACKETS = 50  # Opus packets that break RFC 6716's framing rules (an encoder never makes one)
OPUS_MAX_FRAME_BYTES = 1275
OPUS_MAX_PACKET_MS = 120.0

Clock = Callable[[], float]
# Called for each frame when one packet releases several (see AudioReceiveBuffer): the frame and that packet.
EmitFrame = Callable[[JitterFrame, RtpPacket], None]


# --- aiortc, as far as it is touched here ----------------------------------------------------------------------
class RtpReceiver(Protocol):
    """An aiortc ``RTCRtpReceiver``: its track by name. Its jitter buffer, decoder queue and thread, codecs,
    timestamp mapper and remote streams are reached by their mangled names (``_RTCRtpReceiver__…``), checked when
    the buffer is installed; a receiver without them keeps aiortc's own buffer."""

    @property
    def track(self) -> object: ...


class Transceiver(Protocol):
    @property
    def receiver(self) -> RtpReceiver: ...


class Peer(Protocol):
    """An aiortc ``RTCPeerConnection``: its transceivers."""

    def getTransceivers(self) -> Sequence[Transceiver]: ...


def _opus_frame_ms(toc: int) -> float:
    config = toc >> 3
    if config < 12:  # SILK: 10, 20, 40, 60 ms
        return (10.0, 20.0, 40.0, 60.0)[config % 4]
    if config < 16:  # hybrid: 10, 20 ms
        return (10.0, 20.0)[config % 2]
    return (2.5, 5.0, 10.0, 20.0)[config % 4]  # CELT


def _frame_length(data: bytes, i: int) -> tuple[int, int] | None:
    """An Opus frame length field at ``i`` (one or two bytes) → (length, bytes used), or None past the end."""
    if i >= len(data):
        return None
    if data[i] < 252:
        return data[i], 1
    if i + 1 >= len(data):
        return None
    return data[i + 1] * 4 + data[i], 2


def is_valid_opus(data: bytes) -> bool:
    """Whether an Opus packet keeps the framing rules of RFC 6716 section 3.4 (R1-R7): what a decoder would
    refuse is dropped before it is decoded (and counted as garbage)."""
    if not data:  # R1
        return False
    toc, n = data[0], len(data)
    code = toc & 0x3
    if code == 0:
        return n - 1 <= OPUS_MAX_FRAME_BYTES  # R2
    if code == 1:
        return (n - 1) % 2 == 0 and (n - 1) // 2 <= OPUS_MAX_FRAME_BYTES  # R2, R3
    if code == 2:
        first = _frame_length(data, 1)
        if first is None:
            return False
        size, used = first
        return size <= n - 1 - used and n - 1 - used - size <= OPUS_MAX_FRAME_BYTES  # R4, R2
    if n < 2:  # R5
        return False
    count, vbr, padded = data[1] & 0x3F, bool(data[1] & 0x80), bool(data[1] & 0x40)
    if count == 0 or count * _opus_frame_ms(toc) > OPUS_MAX_PACKET_MS:  # R5
        return False
    i, padding = 2, 0
    while padded:
        if i >= n:
            return False
        padding += 254 if data[i] == 255 else data[i]
        padded = data[i] == 255
        i += 1
    left = n - i - padding
    if left < 0:
        return False
    if not vbr:  # R6
        return left % count == 0 and left // count <= OPUS_MAX_FRAME_BYTES
    for _ in range(count - 1):  # R7
        field = _frame_length(data, i)
        if field is None:
            return False
        size, used = field
        i += used
        left -= used + size
        if size > OPUS_MAX_FRAME_BYTES or left < 0:
            return False
    return left <= OPUS_MAX_FRAME_BYTES


class RecentEvents:
    """How many times something happened within the last ``window_s`` seconds (bounded memory)."""

    def __init__(self, limit: int, window_s: float, clock: Clock = time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._times: collections.deque[float] = collections.deque(maxlen=limit)

    def add(self) -> None:
        self._times.append(self.clock())

    @property
    def too_many(self) -> bool:
        """``limit`` events within the window."""
        return len(self._times) >= self.limit and self.clock() - self._times[0] <= self.window_s


class PacketBudget:
    """Token bucket over packets: ``rate`` a second, ``burst`` at once; ``take`` is False past it."""

    def __init__(self, rate: float, burst: int, clock: Clock = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class AudioReceiveBuffer:
    """Drop-in for aiortc's ``JitterBuffer`` on an audio receiver (``add(packet) -> (pli, frame)``)."""

    def __init__(self, hole_packets: int = 1, emit_extra: EmitFrame | None = None,
                 is_opus: Callable[[int], bool] = lambda payload_type: False, clock: Clock = time.monotonic) -> None:
        self.hole_packets = max(0, hole_packets)
        self.is_opus = is_opus  # payload types whose packets must be well-formed Opus (asked per packet: the
        # receiver learns its codecs only once the call is negotiated)
        # Called with each frame when one packet releases several: aiortc takes only one frame from ``add`` and
        # maps its timestamp after ``add`` returns, so all of them go this way, in order (a frame returned
        # after its successors were mapped would look like a timestamp wrap: a 2**32-tick jump).
        self._emit_extra = emit_extra
        self._next: int | None = None  # sequence number of the next packet to release
        self._stored: dict[int, RtpPacket] = {}
        self.lost = 0
        self.late = 0
        self.flooded = 0  # packets dropped past the packet budget, in all
        self.garbage = 0  # packets dropped as malformed Opus
        self._budget = PacketBudget(MAX_PACKETS_PER_S, PACKET_BURST, clock)
        self._floods = RecentEvents(FLOOD_CLOSE_PACKETS, FLOOD_WINDOW_S, clock)
        self._jumps = RecentEvents(MAX_JUMPS, JUMP_WINDOW_S, clock)
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

    def abuse(self) -> str:
        """What this peer did that no real client does (empty: nothing): ``rtp_flood`` or ``rtp_jumps``."""
        if self._floods.too_many:
            return "rtp_flood"
        if self.garbage >= GARBAGE_CLOSE_PACKETS:
            return "rtp_garbage"
        if self._jumps.too_many:
            return "rtp_jumps"
        return ""

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        if not self._budget.take():  # a flood: dropped before it is stored or decoded
            self.flooded += 1
            self._floods.add()
            return False, None
        data = getattr(packet, "_data", b"")  # the depayloaded frame aiortc put there
        if data and self.is_opus(packet.payload_type) and not is_valid_opus(data):
            self.garbage += 1
            return False, None
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
        if len(frames) == 1 or self._emit_extra is None:
            return False, frames[0]
        for frame in frames:
            self._emit_extra(frame, packet)
        return False, None

    def _release(self) -> list[JitterFrame]:
        assert self._next is not None
        out: list[JitterFrame] = []
        while self._stored:
            packet = self._stored.pop(self._next, None)
            if packet is None:
                if not self._hole_expired():
                    break
                # Give the hole up in one step, to the oldest packet held: a jump of any length costs the same.
                nearest = min(self._stored, key=self._ahead)
                skipped = self._ahead(nearest)
                self.lost += skipped
                if skipped >= JUMP_PACKETS:
                    self._jumps.add()
                self._next = nearest
                continue
            if self._origin is None:
                self._origin = packet.timestamp
            out.append(JitterFrame(data=packet._data, timestamp=packet.timestamp))  # type: ignore[attr-defined]
            self._next = uint16_add(self._next, 1)
        return out

    def _ahead(self, seq: int) -> int:
        """How far ``seq`` is past the next packet to release (stored packets are never behind it)."""
        assert self._next is not None
        return uint16_add(seq, -self._next)

    def _hole_expired(self) -> bool:
        """Give a missing packet up once more than ``hole_packets`` later ones could have overtaken it."""
        return max(map(self._ahead, self._stored)) > self.hole_packets or len(self._stored) >= MAX_STORED


class AdaptiveReceiveBuffer:
    """Installs an :class:`AudioReceiveBuffer` on one audio receiver and sizes its hole wait to the jitter."""

    def __init__(self, receiver: RtpReceiver, initial_packets: int, max_packets: int, adaptive: bool) -> None:
        self.receiver = receiver
        self.max_packets = max(1, max_packets)
        self.adaptive = adaptive
        self.packets = max(0, min(initial_packets, self.max_packets))
        self.buffer: AudioReceiveBuffer | None = None
        if all(hasattr(receiver, _RECEIVER + a) for a in ("jitter_buffer", "decoder_queue", "codecs")):
            self.buffer = AudioReceiveBuffer(self.packets, emit_extra=self._to_decoder, is_opus=self._is_opus)
            setattr(receiver, _RECEIVER + "jitter_buffer", self.buffer)
        else:  # pragma: no cover - depends on aiortc internals
            log.warning("receive_buffer_unavailable aiortc internals changed; using aiortc's own buffer")

    @classmethod
    def for_track(
        cls, pc: Peer, track: object, initial_packets: int, max_packets: int, adaptive: bool
    ) -> AdaptiveReceiveBuffer | None:
        """Install on the receiver of ``track`` (a remote audio track of ``pc``, found by identity); None if it
        has none."""
        receiver = next((t.receiver for t in pc.getTransceivers() if t.receiver.track is track), None)
        return None if receiver is None else cls(receiver, initial_packets, max_packets, adaptive)

    def _is_opus(self, payload_type: int) -> bool:
        codec = getattr(self.receiver, _RECEIVER + "codecs").get(payload_type)
        return codec is not None and codec.mimeType.lower() == "audio/opus"

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
