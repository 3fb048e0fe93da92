"""One call's audio over RTP and RTCP (RFC 3550): a port pair from the range, the caller's packets in, the reply out.

**In**: a datagram from an address that is not the call's is dropped before anything else (the call's addresses
are the SDP's connection address and the address the call's SIP came from; the first packet from one of them
fixes the source, ip and port, and from then on only that source is heard: RFC 3550 8.2's rule against
injection, as PBXes call "strict RTP"). Then a packet budget (a flood is dropped unread), RFC 3550 parsing
(aiortc's ``RtpPacket``), RFC 4733 telephone-events to the digit callback, and the audio through the server's
own receive buffer (``rtc/jitter.AudioReceiveBuffer``: in order, holes waited on as long as the measured jitter
says, then given up) to the decoder: G.711 by ``assistant/g711.py``, Opus by PyAV. The decoded frames carry the
RTP timestamp as their pts, so ``rtc/inbound.InboundAudio`` (the browser path's converter) fills a lost
packet's time with silence and keeps the 16 kHz sample clock the VAD counts on true; a codec change on a
re-INVITE only changes its input rate.

**Out**: the reply sink is a ``rtc/outbound.ReplyTrack`` at the codec's rate (8 kHz for G.711, 48 kHz for Opus):
the same 20 ms frames, wall-clock paced, 60 ms queued, silence when idle, as a browser call's; :meth:`send` takes
each frame as the track paces it, encodes it and sends one RTP packet. While the peer holds the call nothing is
sent. With ``sip.symmetric_rtp`` the packets go to where the caller's come from (through its NAT), else to the
SDP's address. RTCP sender reports go out every ``RTCP_INTERVAL_S``; the peer's RTCP only shows it is alive.

**SRTP** (SDES, RFC 4568, through libsrtp by ``pylibsrtp``, which aiortc brings): when the offer and answer carry
keys, what comes in is unprotected with the peer's key (a packet that fails authentication is dropped as garbage)
and what goes out is protected with ours, RTCP alike.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np
import pylibsrtp
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpreceiver import StreamStatistics
from aiortc.rtp import RtcpPacket, RtcpReceiverInfo, RtcpSenderInfo, RtcpSrPacket, RtpPacket, is_rtcp

from assistant.audio import FRAME_MS, AudioChunk
from assistant.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from assistant.rtc.inbound import InboundAudio
from assistant.rtc.jitter import MAX_PACKETS_PER_S, PACKET_BURST, AudioReceiveBuffer, PacketBudget
from assistant.rtc.outbound import ReplyTrack
from assistant.rtc.pacing import s16_mono_frame
from assistant.server.sip.dtmf import TelephoneEvents
from assistant.server.sip.rtpports import NoPorts, RtpPorts
from assistant.server.sip.sdp import SRTP_KEY_BYTES, Codec, Crypto, Negotiated

log = logging.getLogger(__name__)

MAX_DATAGRAM = 1500  # an RTP packet of 20 ms audio is under 300 bytes; an Ethernet frame is the most a peer sends
RTCP_INTERVAL_S = 5.0  # RFC 3550 6.2's minimum for a two-party session
ARRIVALS_KEPT = 256
NTP_EPOCH = 2_208_988_800  # seconds from 1900 to 1970
SRTP_PROFILES = {"AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
                 "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32}
Digit = Callable[[str], None]


def codec_rate(codec: Codec) -> int:
    """The rate our audio for ``codec`` is made at: G.711's 8 kHz, Opus's 48 kHz."""
    return 48_000 if codec.name == "opus" else 8000


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int] | tuple[str, int, int, int]) -> None:
        self.on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable while the peer is not yet listening
        pass


class TimestampUnwrap:
    """RTP timestamps (32 bits, per SSRC) → one increasing pts for the whole call: a new SSRC (the PBX switched
    the source) continues where the last frame ended instead of jumping."""

    def __init__(self) -> None:
        self.ssrc: int | None = None
        self._last = 0
        self._pts = 0
        self.end = 0  # pts just past the latest frame

    def pts(self, ssrc: int, timestamp: int, samples: int) -> int:
        if ssrc != self.ssrc:
            self.ssrc, self._last, self._pts = ssrc, timestamp, self.end
        else:
            delta = (timestamp - self._last) & 0xFFFFFFFF
            self._pts += delta if delta < 2**31 else delta - 2**32
            self._last = timestamp
        self.end = max(self.end, self._pts + samples)
        return self._pts


@dataclass
class Counters:
    received: int = 0
    foreign: int = 0
    flooded: int = 0
    malformed: int = 0
    other_payload: int = 0
    digits: int = 0
    sent: int = 0
    rtcp_received: int = 0
    rtcp_dropped: int = 0  # RTCP we could not read (or, under SRTP, authenticate)


class RtpSession:
    """See the module docstring."""

    def __init__(self, ports: RtpPorts, on_audio: Callable[[AudioChunk], None], on_digit: Digit, *,
                 symmetric: bool = True, hole_packets: int = 1) -> None:
        self.ports = ports
        self.on_audio = on_audio
        self.on_digit = on_digit
        self.symmetric = symmetric
        self.hole_packets = hole_packets
        self.port = 0
        self.rtcp_mux = False
        self._rtp: asyncio.DatagramTransport | None = None
        self._rtcp: asyncio.DatagramTransport | None = None
        self.negotiated: Negotiated | None = None
        self._hosts: set[str] = set()
        self._source: tuple[str, int] | None = None
        self._rtcp_source: tuple[str, int] | None = None
        self._budget = PacketBudget(MAX_PACKETS_PER_S, PACKET_BURST)
        self.counters = Counters()
        self.last_packet = time.monotonic()  # RTP or RTCP from the call's source
        self.inbound = InboundAudio()
        self._buffer: AudioReceiveBuffer | None = None
        self._stats: StreamStatistics | None = None
        self._decoder: OpusDecoder | None = None
        self._unwrap = TimestampUnwrap()
        self._arrivals: OrderedDict[int, float] = OrderedDict()
        self._events = TelephoneEvents()
        self.ssrc = secrets.randbits(32)
        self._seq = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._octets = 0
        self._encoder: OpusEncoder | None = None
        self._resampler: av.AudioResampler | None = None
        self._resample_rates = (0, 0)
        self._resample_pts = 0
        self._marker = True
        self._failures = 0
        self.local_key = secrets.token_bytes(SRTP_KEY_BYTES)  # our SRTP master key and salt (used if agreed)
        self._srtp_in: pylibsrtp.Session | None = None
        self._srtp_out: pylibsrtp.Session | None = None
        self.closed = False

    # --- set up ---------------------------------------------------------------------------------------------
    async def open(self, rtcp_mux: bool = False) -> int:
        """Take a port pair (RTCP on the odd one unless muxed); returns the RTP port."""
        if self.closed:
            raise NoPorts("the call ended before its ports were taken")
        self.rtcp_mux = rtcp_mux
        rtcp = None if rtcp_mux else (lambda: _Protocol(self._on_rtcp))
        port, rtp_transport, rtcp_transport = await self.ports.bind(lambda: _Protocol(self._on_datagram), rtcp)
        if self.closed:  # the call ended while they were being bound: give them back at once
            self.ports.release(port, rtp_transport, rtcp_transport)
            raise NoPorts("the call ended while its ports were taken")
        self.port, self._rtp, self._rtcp = port, rtp_transport, rtcp_transport
        return self.port

    def configure(self, negotiated: Negotiated, signaling_host: str) -> None:
        """Use what an offer/answer agreed (again after a re-INVITE): the codec, the peer's addresses, hold."""
        old = self.negotiated
        self.negotiated = negotiated
        self._hosts = {negotiated.address, signaling_host}
        if old is None or (old.address, old.port) != (negotiated.address, negotiated.port):
            self._source = self._rtcp_source = None  # the peer moved: learn its source again
        if old is None or old.crypto != negotiated.crypto:
            self._srtp_in = self._srtp_out = None
            if negotiated.crypto is not None:
                profile = SRTP_PROFILES[negotiated.crypto.suite]
                self._srtp_in = pylibsrtp.Session(pylibsrtp.Policy(
                    key=negotiated.crypto.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile))
                self._srtp_out = pylibsrtp.Session(pylibsrtp.Policy(
                    key=self.local_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile))
        if old is None or old.codec != negotiated.codec:
            self._buffer = AudioReceiveBuffer(self.hole_packets, emit_extra=self._released,
                                              is_opus=lambda pt: negotiated.codec.name == "opus"
                                              and pt == negotiated.codec.payload_type)
            self._stats = StreamStatistics(negotiated.codec.clock_rate)
            self._decoder = OpusDecoder() if negotiated.codec.name == "opus" else None
            self._encoder = OpusEncoder() if negotiated.codec.name == "opus" else None
            self._marker = True
        log.info("rtp_configured port=%d codec=%s remote=%s:%d direction=%s srtp=%s", self.port,
                 negotiated.codec.rtpmap, negotiated.address, negotiated.port, negotiated.direction,
                 negotiated.crypto.suite if negotiated.crypto else "-")

    def answer_crypto(self, negotiated: Negotiated) -> list[Crypto]:
        """Our key for an answer to ``negotiated`` (the suite and tag the peer chose), or none for plain RTP."""
        crypto = negotiated.crypto
        return [] if crypto is None else [Crypto(crypto.tag, crypto.suite, self.local_key)]

    def abuse(self) -> str:
        """What the peer's media did that no real peer does (a flood, garbage, timestamp jumps), or empty."""
        if self.counters.flooded >= 250:
            return "rtp_flood"
        if self.counters.malformed >= 250:
            return "rtp_garbage"
        return (self._buffer.abuse() if self._buffer is not None else "") or self.inbound.abuse()

    def close(self) -> None:
        """Free the ports (idempotent): nothing is received or sent after it."""
        if self.closed:
            return
        self.closed = True
        if self._rtp is not None:
            self.ports.release(self.port, self._rtp, self._rtcp)
        self._rtp = self._rtcp = None

    # --- in -------------------------------------------------------------------------------------------------
    def _accept(self, addr: tuple[str, int]) -> bool:
        if self._source is None:
            if addr[0] not in self._hosts:
                return False
            self._source = addr
            log.info("rtp_source port=%d source=%s:%d", self.port, addr[0], addr[1])
        return addr == self._source

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            self._read(data, addr)
        except Exception:  # a fault in this call's media stays this call's: counted (its abuse() ends the call)
            self.counters.malformed += 1
            self._failures += 1
            if self._failures == 1:
                log.exception("rtp_packet_failed port=%d", self.port)

    def _read(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.closed or self.negotiated is None:
            return
        if self.rtcp_mux and is_rtcp(data):
            self._on_rtcp(data, addr)
            return
        if not self._accept(addr):
            self.counters.foreign += 1
            return
        if len(data) > MAX_DATAGRAM or not self._budget.take():
            self.counters.flooded += 1
            return
        try:
            if self._srtp_in is not None:
                data = self._srtp_in.unprotect(data)
            packet = RtpPacket.parse(data)
        except (ValueError, pylibsrtp.Error):
            self.counters.malformed += 1
            return
        self.last_packet = time.monotonic()
        neg = self.negotiated
        if neg.dtmf is not None and packet.payload_type == neg.dtmf.payload_type:
            digit = self._events.packet(packet.ssrc, packet.timestamp, packet.payload)
            if digit is not None:
                self.counters.digits += 1
                self.on_digit(digit)
            return
        if packet.payload_type != neg.codec.payload_type:
            self.counters.other_payload += 1  # comfort noise, a codec we did not agree on
            return
        self.counters.received += 1
        assert self._buffer is not None and self._stats is not None
        self._stats.add(packet)
        self._arrivals[packet.timestamp] = time.time()
        if len(self._arrivals) > ARRIVALS_KEPT:
            self._arrivals.popitem(last=False)
        packet._data = packet.payload  # type: ignore[attr-defined]  # what the receive buffer hands on
        _, frame = self._buffer.add(packet)
        if frame is not None:
            self._released(frame, packet)

    def _released(self, frame: JitterFrame, packet: RtpPacket) -> None:
        """One frame the receive buffer let go, in order: decoded, on the call's clock, to the conversation."""
        neg = self.negotiated
        if neg is None or self.closed:
            return
        arrived = self._arrivals.get(frame.timestamp, time.time())
        try:
            frames = self._decode(neg.codec, frame.data, packet.ssrc, frame.timestamp)
        except (av.FFmpegError, ValueError) as exc:
            self.counters.malformed += 1
            log.debug("rtp_decode_failed port=%d error=%r", self.port, exc)
            return
        for audio in frames:
            x = self.inbound.push(audio)
            if len(x):
                self.on_audio(AudioChunk(self.inbound.position - len(x), x, arrived, self.inbound.lag_samples))

    def _decode(self, codec: Codec, data: bytes, ssrc: int, timestamp: int) -> list[av.AudioFrame]:
        if codec.name == "opus":
            assert self._decoder is not None
            pts = self._unwrap.pts(ssrc, timestamp, 0)
            frames = [f for f in self._decoder.decode(JitterFrame(data=data, timestamp=pts))
                      if isinstance(f, av.AudioFrame)]
            for f in frames:
                self._unwrap.end = max(self._unwrap.end, pts + f.samples)
            return frames
        pcm = ulaw_decode(data) if codec.name == "PCMU" else alaw_decode(data)
        pts = self._unwrap.pts(ssrc, timestamp, len(pcm))
        return [s16_mono_frame(pcm, codec.clock_rate, pts)]

    def _on_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.closed or addr[0] not in self._hosts or len(data) > MAX_DATAGRAM:
            self.counters.foreign += 1
            return
        try:
            if self._srtp_in is not None:
                data = self._srtp_in.unprotect_rtcp(data)
            RtcpPacket.parse(data)
        except (ValueError, pylibsrtp.Error):  # baresip's first RTCP under SRTP is a plain APP packet, for one
            self.counters.rtcp_dropped += 1
            return
        if self._rtcp_source is None:
            self._rtcp_source = addr
        self.counters.rtcp_received += 1
        self.last_packet = time.monotonic()

    # --- out ------------------------------------------------------------------------------------------------
    @property
    def destination(self) -> tuple[str, int] | None:
        neg = self.negotiated
        if neg is None:
            return None
        if self.symmetric and self._source is not None:
            return self._source
        return (neg.address, neg.port)

    async def send(self, track: ReplyTrack) -> None:
        """Until the track stops: each 20 ms frame it paces out, encoded, as one RTP packet."""
        while not self.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            neg, dest = self.negotiated, self.destination
            if neg is None or dest is None or not neg.sends or self._rtp is None:
                continue
            pcm = frame.to_ndarray().reshape(-1)
            for payload, samples in self._encode(neg.codec, pcm, track.sample_rate):
                packet = RtpPacket(neg.codec.payload_type, int(self._marker), self._seq, self._timestamp, self.ssrc,
                                   payload)
                data = packet.serialize()
                self._rtp.sendto(self._srtp_out.protect(data) if self._srtp_out is not None else data, dest)
                self._marker = False
                self._seq = (self._seq + 1) & 0xFFFF
                self._timestamp = (self._timestamp + samples) & 0xFFFFFFFF
                self.counters.sent += 1
                self._octets += len(payload)

    def _encode(self, codec: Codec, pcm: np.ndarray, rate: int) -> list[tuple[bytes, int]]:
        """20 ms of int16 at ``rate`` → [(payload, RTP clock ticks)] for ``codec`` (resampled if the codec
        changed to another rate mid-call)."""
        want = codec_rate(codec)
        if rate != want:
            # The reply track was made at the first codec's rate (a late answer or a re-INVITE chose another):
            # libswresample, which answers each 20 ms frame with about 20 ms (soxr's stream answers in blocks of
            # over 100 ms, which would send RTP in bursts).
            if self._resampler is None or self._resample_rates != (rate, want):
                self._resampler = av.AudioResampler(format="s16", layout="mono", rate=want)
                self._resample_rates, self._resample_pts = (rate, want), 0
            frames = self._resampler.resample(s16_mono_frame(np.ascontiguousarray(pcm, np.int16), rate,
                                                             self._resample_pts))
            self._resample_pts += len(pcm)
            pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.int16)
            if not pcm.size:
                return []
        if codec.name == "opus":
            assert self._encoder is not None
            frame = s16_mono_frame(np.ascontiguousarray(pcm, dtype=np.int16), want, 0)
            payloads, _ = self._encoder.encode(frame)
            return [(p, want * FRAME_MS // 1000) for p in payloads]
        data = ulaw_encode(pcm) if codec.name == "PCMU" else alaw_encode(pcm)
        return [(data, len(pcm))]

    def send_report(self) -> None:
        """One RTCP sender report (with a report block on what we received, if anything)."""
        neg = self.negotiated
        if neg is None or self.closed:
            return
        dest = self._rtcp_source if self.symmetric and self._rtcp_source is not None else (
            (self._source[0] if self.symmetric and self._source is not None else neg.address), neg.rtcp_port)
        if self.rtcp_mux and self.symmetric and self._source is not None:
            dest = self._source
        now = time.time()
        ntp = (int(now + NTP_EPOCH) << 32) | int((now % 1) * (1 << 32))
        reports = []
        stats = self._stats
        if stats is not None and stats.max_seq is not None and self._unwrap.ssrc is not None:
            reports.append(RtcpReceiverInfo(self._unwrap.ssrc, stats.fraction_lost, stats.packets_lost,
                                            stats.cycles + stats.max_seq, stats.jitter, 0, 0))
        report = RtcpSrPacket(self.ssrc, RtcpSenderInfo(ntp, self._timestamp, self.counters.sent, self._octets),
                              reports)
        transport = self._rtp if self.rtcp_mux else self._rtcp
        if transport is not None:
            data = bytes(report)
            transport.sendto(self._srtp_out.protect_rtcp(data) if self._srtp_out is not None else data, dest)

    def jitter_ms(self) -> float | None:
        stats, neg = self._stats, self.negotiated
        if stats is None or neg is None or stats.packets_received < 2:
            return None
        return stats.jitter * 1000.0 / neg.codec.clock_rate

    def adapt(self, max_packets: int) -> None:
        """Size the receive buffer's hole wait to the measured jitter (as the browser path does)."""
        jitter = self.jitter_ms()
        if jitter is None or self._buffer is None:
            return
        want = max(1, min(max_packets, int(-(-2.0 * jitter // FRAME_MS))))
        current = self._buffer.hole_packets
        target = want if want > current else max(want, current - 1)
        self._buffer.hole_packets = target
