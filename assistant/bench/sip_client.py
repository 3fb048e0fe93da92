"""A SIP phone for the benches (``assistant bench v2v --protocol sip``) and the tests: it calls the server's SIP
listener over UDP as a phone on a PBX would, and measures what its caller would hear.

:class:`SipPhone` is a small user agent of its own (it reads and writes SIP with the server's ``sip/message.py``
and ``sdp.py``, the wire format, not the server's call handling): an INVITE with an SDP offer of one codec
(``PCMU``, 8 kHz, or ``opus``, 48 kHz), answered digest challenges, the ACK, the BYE; the server's own requests
(its BYE, session refreshes) are answered 200. Its RTP goes out every 20 ms from the first, in real time, silence
between utterances, as a phone's microphone does; the server's RTP is decoded and played as a phone plays it:
each packet at its arrival, or when the one before it has finished, the queue starting afresh at each speech end
(as the page bench's listener does: a player drains while its user talks). :func:`phone_turn` measures one turn
from the packet that carried the manifest's speech end to the first audible reply sample played.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

from assistant.audio import FRAME_MS, WEBRTC_RATE, float_to_s16, resample, s16_to_float
from assistant.bench.audio_source import Utterance
from assistant.bench.phone_line import AUDIBLE_DBFS, Playout, Voice, now
from assistant.bench.telephony_client import TAIL_S, PhoneTurn
from assistant.g711 import ulaw_decode, ulaw_encode
from assistant.rtc.inbound import frame_to_float
from assistant.rtc.pacing import s16_mono_frame
from assistant.server.sip.digest import authorization, pick_challenge
from assistant.server.sip.message import (
    Headers,
    SipParseError,
    SipRequest,
    SipResponse,
    new_branch,
    new_call_id,
    new_tag,
    parse_message,
    response,
)
from assistant.server.sip.sdp import OURS, LocalDescription, SdpError, negotiate, parse_sdp
from assistant.server.sip.transaction import failure_ack
from assistant.server.sip.uri import parse_uri

log = logging.getLogger(__name__)

CODECS = ("PCMU", "opus")
RETRANSMIT_S = 0.5
SIGNALLING_TIMEOUT_S = 32.0


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, tuple[str, int]], None]) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int] | tuple[str, int, int, int]) -> None:
        self.on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        pass


class SipPhone(Playout):
    """One call to the server's SIP listener (see the module docstring)."""

    queue_runs_dry = False  # the server's RTP carries silence between replies

    def __init__(self, server: tuple[str, int], *, codec: str = "PCMU", user: str = "", password: str = "",
                 host: str = "127.0.0.1", threshold_dbfs: float = AUDIBLE_DBFS) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}")
        super().__init__(OURS[codec].clock_rate if codec == "opus" else 8000, threshold_dbfs)
        self.server, self.codec, self.user, self.password, self.host = server, codec, user, password, host
        self.frame = self.rate * FRAME_MS // 1000
        self.call_id = new_call_id(host)
        self.tag = new_tag()
        self.cseq = 0
        self._sip: asyncio.DatagramTransport | None = None
        self._rtp: asyncio.DatagramTransport | None = None
        self._waiting: dict[tuple[int, str], asyncio.Queue[SipResponse]] = {}
        self.remote_tag = ""
        self.remote_target = ""
        self.remote_rtp: tuple[str, int] | None = None
        self.payload_type = OURS[codec].payload_type
        self.ended = asyncio.Event()  # the server hung up
        self._tasks: list[asyncio.Task[None]] = []
        self._encoder = OpusEncoder() if codec == "opus" else None
        self._decoder = OpusDecoder() if codec == "opus" else None
        self._voice = Voice(self._encode(np.zeros(self.frame, np.int16)))
        self.packets_in = 0

    # --- signalling ---------------------------------------------------------------------------------------------
    @property
    def sip_port(self) -> int:
        assert self._sip is not None
        return int(self._sip.get_extra_info("sockname")[1])

    @property
    def rtp_port(self) -> int:
        assert self._rtp is not None
        return int(self._rtp.get_extra_info("sockname")[1])

    def _headers(self, method: str, cseq: int, to_tag: str = "") -> Headers:
        h = Headers()
        h.add("Via", f"SIP/2.0/UDP {self.host}:{self.sip_port};branch={new_branch()};rport")
        h.add("Max-Forwards", "70")
        h.add("From", f"<sip:phone@{self.host}:{self.sip_port}>;tag={self.tag}")
        h.add("To", f"<sip:assistant@{self.server[0]}:{self.server[1]}>" + (f";tag={to_tag}" if to_tag else ""))
        h.add("Call-ID", self.call_id)
        h.add("CSeq", f"{cseq} {method}")
        h.add("Contact", f"<sip:phone@{self.host}:{self.sip_port}>")
        return h

    def _on_sip(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            message = parse_message(data)
        except SipParseError:
            return
        if isinstance(message, SipResponse):
            queue = self._waiting.get((message.cseq.number, message.cseq.method))
            if queue is not None:
                queue.put_nowait(message)
            return
        # The server's own requests: its BYE ends the call; refreshes and pings are answered.
        assert self._sip is not None
        self._sip.sendto(response(message, 200).encode(), addr)
        if message.method == "BYE":
            self.ended.set()

    async def _transact(self, request: SipRequest) -> SipResponse:
        """Send ``request`` (again every 0.5 s until something comes back) and return its final response."""
        assert self._sip is not None
        key = (request.cseq.number, request.method)
        queue: asyncio.Queue[SipResponse] = asyncio.Queue()
        self._waiting[key] = queue
        data, deadline, heard = request.encode(), now() + SIGNALLING_TIMEOUT_S, False
        try:
            while True:
                if not heard:
                    self._sip.sendto(data, self.server)
                try:
                    answer = await asyncio.wait_for(queue.get(), RETRANSMIT_S if not heard else deadline - now())
                except TimeoutError:
                    if now() > deadline:
                        raise
                    continue
                heard = True
                if answer.status >= 200:
                    return answer
        finally:
            self._waiting.pop(key, None)

    async def dial(self) -> None:
        """Call the server: INVITE (with credentials if it challenges), ACK; then the RTP starts both ways."""
        loop = asyncio.get_running_loop()
        self._sip, _ = await loop.create_datagram_endpoint(lambda: _Socket(self._on_sip), local_addr=(self.host, 0))
        self._rtp, _ = await loop.create_datagram_endpoint(lambda: _Socket(self._on_rtp), local_addr=(self.host, 0))
        codec = OURS[self.codec]
        offer = LocalDescription(self.host, self.rtp_port, secrets.randbelow(2**31)).render([codec]).encode()
        uri = parse_uri(f"sip:assistant@{self.server[0]}:{self.server[1]}")
        auth: tuple[str, str] | None = None
        for _ in range(2):
            self.cseq += 1
            h = self._headers("INVITE", self.cseq)
            if auth is not None:
                h.add(*auth)
            h.add("Content-Type", "application/sdp")
            invite = SipRequest("INVITE", uri, h, offer)
            answer = await self._transact(invite)
            if answer.status in (401, 407) and auth is None and self.user:
                assert self._sip is not None
                self._sip.sendto(failure_ack(invite, answer).encode(), self.server)
                header = "WWW-Authenticate" if answer.status == 401 else "Proxy-Authenticate"
                challenge = pick_challenge(answer.headers.get_all(header))
                value = authorization(challenge, "INVITE", str(uri), self.user, self.password) if challenge else None
                if value is None:
                    raise RuntimeError("cannot answer the server's challenge")
                auth = ("Authorization" if answer.status == 401 else "Proxy-Authorization", value)
                continue
            break
        if not 200 <= answer.status < 300:
            assert self._sip is not None
            self._sip.sendto(failure_ack(invite, answer).encode(), self.server)
            raise RuntimeError(f"the call was refused: {answer.status} {answer.reason}")
        self.remote_tag = answer.to.tag
        contact = answer.contact
        self.remote_target = str(contact.uri) if contact is not None else str(uri)
        try:
            chosen = negotiate(parse_sdp(answer.body.decode()), [self.codec], offer=False)
        except (SdpError, UnicodeDecodeError) as exc:
            raise RuntimeError(f"the server's answer is not usable: {exc}") from None
        self.payload_type = chosen.codec.payload_type
        self.remote_rtp = (chosen.address, chosen.port)
        ack = SipRequest("ACK", parse_uri(self.remote_target), self._headers("ACK", self.cseq, self.remote_tag))
        assert self._sip is not None
        self._sip.sendto(ack.encode(), self.server)
        self._tasks = [loop.create_task(self._stream(), name="sip-phone-tx")]

    async def hang_up(self) -> None:
        """BYE (unless the server hung up first), then the sockets close."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.remote_tag and not self.ended.is_set() and self._sip is not None:
            self.cseq += 1
            bye = SipRequest("BYE", parse_uri(self.remote_target),
                             self._headers("BYE", self.cseq, self.remote_tag))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._transact(bye), 5)
        for transport in (self._sip, self._rtp):
            if transport is not None:
                transport.close()

    # --- what the caller says -------------------------------------------------------------------------------------
    def _encode(self, pcm: np.ndarray) -> bytes:
        if self._encoder is None:
            return ulaw_encode(pcm)
        payloads, _ = self._encoder.encode(s16_mono_frame(np.ascontiguousarray(pcm, np.int16), self.rate, 0))
        return payloads[0] if payloads else b""

    def say(self, utt: Utterance, tail_s: float = TAIL_S) -> asyncio.Future[float]:
        """Queue an utterance (then ``tail_s`` of silence); the future is when the packet holding its last speech
        sample (the manifest's) was sent."""
        pcm = utt.pcm if self.rate == WEBRTC_RATE else float_to_s16(resample(s16_to_float(utt.pcm), WEBRTC_RATE,
                                                                              self.rate))
        pcm = np.concatenate([pcm, np.zeros(int(tail_s * self.rate), np.int16)])
        pcm = np.pad(pcm, (0, -len(pcm) % self.frame))
        return self._voice.say((self._encode(pcm[i: i + self.frame]) for i in range(0, len(pcm), self.frame)),
                               int(utt.speech_end_s * self.rate) // self.frame)

    async def _stream(self) -> None:
        """An RTP packet every 20 ms from the first, on the phone's clock: speech when there is some."""
        assert self._rtp is not None and self.remote_rtp is not None
        ssrc, seq, ts = secrets.randbits(32), secrets.randbits(16), secrets.randbits(32)
        t0, k = time.perf_counter(), 0
        while True:
            await asyncio.sleep(max(0.0, t0 + k * FRAME_MS / 1000 - time.perf_counter()))
            packet = RtpPacket(self.payload_type, int(k == 0), seq, ts, ssrc, self._voice.next_frame())
            self._rtp.sendto(packet.serialize(), self.remote_rtp)
            seq, ts = (seq + 1) & 0xFFFF, (ts + self.frame) & 0xFFFFFFFF
            if self._voice.sent():
                self.drained()  # the player drained while the caller spoke (as the page bench's listener)
            k += 1

    # --- what the caller hears ------------------------------------------------------------------------------------
    def _on_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        at = now()
        try:
            packet = RtpPacket.parse(data)
        except ValueError:
            return
        if packet.payload_type != self.payload_type:
            return
        self.packets_in += 1
        if self._decoder is None:
            pcm = ulaw_decode(packet.payload)
        else:
            frames = [f for f in self._decoder.decode(JitterFrame(data=packet.payload, timestamp=packet.timestamp))
                      if isinstance(f, av.AudioFrame)]
            pcm = (np.concatenate([float_to_s16(frame_to_float(f)) for f in frames]) if frames
                   else np.zeros(0, np.int16))
        self.play(pcm, at)


async def phone_turn(phone: SipPhone, utt: Utterance, *, timeout_s: float = 30.0) -> PhoneTurn:
    """Say ``utt`` on an open call and measure the reply (never raises for a missing one)."""
    result = PhoneTurn(utt.name, f"sip-{phone.codec}")
    speech_end = await asyncio.wait_for(phone.say(utt), utt.seconds + TAIL_S + 10)
    if not await phone.reply_done(speech_end, timeout_s=timeout_s):
        result.error = "hung up" if phone.ended.is_set() else "no reply in time"
    heard = phone.first_audible(speech_end)
    if heard is not None:
        result.v2v_ms = round((heard - speech_end) * 1000, 1)
        result.reply_s = round(len(phone.heard_pcm(speech_end)) / phone.rate, 2)
    return result


async def bench_sip(server: tuple[str, int], utterances: list[Utterance], turns: int, *, calls: int = 1,
                    codec: str = "PCMU", user: str = "", password: str = "", timeout_s: float = 30.0,
                    stagger_s: float = 0.25) -> list[PhoneTurn]:
    """``calls`` calls at once to the server's SIP listener, each saying ``turns`` utterances in turn (call i
    starts ``i × stagger_s`` later and with utterance i, so the calls do not speak in step); every turn measured."""

    async def one(index: int) -> list[PhoneTurn]:
        await asyncio.sleep(index * stagger_s)
        phone = SipPhone(server, codec=codec, user=user, password=password)
        out: list[PhoneTurn] = []
        try:
            await phone.dial()
            for k in range(turns):
                out.append(await phone_turn(phone, utterances[(index + k) % len(utterances)], timeout_s=timeout_s))
                log.info("bench.sip call=%d turn=%d file=%s v2v_ms=%s error=%s", index, k, out[-1].file,
                         out[-1].v2v_ms, out[-1].error)
                if phone.ended.is_set():
                    break
        except (RuntimeError, OSError, TimeoutError) as exc:
            out.append(PhoneTurn("-", f"sip-{codec}", error=f"call {index}: {exc}"))
        finally:
            await phone.hang_up()
        return out

    results = await asyncio.gather(*(one(i) for i in range(calls)))
    return [turn for call in results for turn in call]
