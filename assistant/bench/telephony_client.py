"""A simulated phone carrier: what tests and ``assistant bench v2v --protocol twilio`` use to call the server.

It does what Twilio (or Telnyx) does for an inbound call, byte for byte as their documentation shows it:

1. :func:`dial` posts the carrier's voice webhook, form parameters signed as the carrier signs them
   (``X-Twilio-Signature``; Telnyx's Ed25519 headers with a private key the test holds), and reads the XML answer:
   the media stream's URL and its parameters (the call's media token).
2. :class:`PhoneCall` opens that stream and speaks the media-stream protocol: ``connected``, ``start`` (stream and
   call ids, ``audio/x-mulaw`` 8000 Hz mono, the custom parameters), then a ``media`` message every 20 ms, in real
   time, forever (silence between utterances, as a phone line does), numbered by ``sequenceNumber``, ``chunk``
   and ``timestamp``. It plays what the server sends as a carrier does: ``media`` is queued for playout at 8 kHz,
   a ``mark`` is returned when the audio queued before it has played, and ``clear`` drops what has not played and
   returns every pending mark at once. What the caller heard (``heard_pcm``) is what played before each clear.

The speech is the bench's (its own, or the files it is given), band-limited to 8 kHz (soxr, anti-aliased) and
μ-law coded, as a phone line carries it. :func:`phone_turn` is one bench turn: from the 20 ms frame that carried the
manifest's speech end to the first audible reply sample, as the carrier would play it; :func:`bench_phone` calls a
phone bot's webhook (ours, or any that answers with a bidirectional ``<Connect><Stream>``) and says each turn.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import aiohttp
import numpy as np

from assistant.audio import float_to_s16, resample, s16_to_float
from assistant.bench.audio_source import Utterance
from assistant.bench.phone_line import AUDIBLE_DBFS, Playout, Voice, now
from assistant.bench.report import TurnResult
from assistant.g711 import ULAW_SILENCE, ulaw_decode, ulaw_encode
from assistant.server.telephony.signatures import twilio_signature

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger(__name__)

RATE = 8_000
FRAME = 160  # 20 ms of μ-law: what a carrier puts in one media message
FRAME_S = FRAME / RATE
SILENCE_FRAME = bytes([ULAW_SILENCE]) * FRAME
TAIL_S = 2.5  # the caller stays quiet this long after an utterance (the server's VAD needs its hangover)


# --- the speech, as a phone line carries it -------------------------------------------------------------------
def phone_audio(x: np.ndarray, rate: int) -> bytes:
    """Float audio at ``rate`` → μ-law at 8 kHz (soxr's anti-aliasing low-pass takes everything above 4 kHz)."""
    return ulaw_encode(float_to_s16(resample(x, rate, RATE)))


def utterance_ulaw(utt: Utterance) -> tuple[bytes, int]:
    """An utterance (48 kHz) as μ-law 8 kHz, and the index of the 20 ms frame holding its last speech sample."""
    data = phone_audio(s16_to_float(utt.pcm), 48_000)
    return data, int(utt.speech_end_s * RATE) // FRAME


# --- the carriers' words -----------------------------------------------------------------------------------------
Message = dict[str, object]  # one media-stream message the carrier sends, before it is JSON


@dataclass(frozen=True)
class Carrier:
    """What one carrier sends on the media stream, and how it names things."""

    name: str
    media_format: dict[str, object]

    def connected(self) -> Message:
        if self.name == "twilio":
            return {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        return {"event": "connected", "version": "1.0.0"}

    def start(self, seq: int, stream_id: str, call_id: str, parameters: dict[str, str],
              media_format: dict[str, object] | None = None) -> Message:
        """The ``start``, with this carrier's media format or ``media_format`` (a test's other format)."""
        fmt = self.media_format if media_format is None else media_format
        if self.name == "twilio":
            return {"event": "start", "sequenceNumber": str(seq), "start": {
                "accountSid": "AC" + "0" * 32, "streamSid": stream_id, "callSid": call_id, "tracks": ["inbound"],
                "mediaFormat": fmt, "customParameters": parameters}, "streamSid": stream_id}
        return {"event": "start", "sequence_number": str(seq), "start": {
            "user_id": "3e6f995f-85f7-4705-9741-53b116d28237", "call_control_id": call_id,
            "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f", "from": "+13122010094", "to": "+13122123456",
            "custom_parameters": parameters, "media_format": fmt}, "stream_id": stream_id}

    def media(self, seq: int, stream_id: str, chunk: int, timestamp_ms: int, payload: bytes) -> Message:
        body = {"track": "inbound", "chunk": str(chunk), "timestamp": str(timestamp_ms),
                "payload": base64.b64encode(payload).decode()}
        if self.name == "twilio":
            return {"event": "media", "sequenceNumber": str(seq), "media": body, "streamSid": stream_id}
        return {"event": "media", "sequence_number": str(seq), "media": body, "stream_id": stream_id}

    def mark(self, seq: int, stream_id: str, name: str) -> Message:
        if self.name == "twilio":
            return {"event": "mark", "sequenceNumber": str(seq), "streamSid": stream_id, "mark": {"name": name}}
        return {"event": "mark", "sequence_number": str(seq), "stream_id": stream_id, "mark": {"name": name}}

    def dtmf(self, seq: int, stream_id: str, digit: str) -> Message:
        if self.name == "twilio":
            return {"event": "dtmf", "streamSid": stream_id, "sequenceNumber": str(seq),
                    "dtmf": {"track": "inbound_track", "digit": digit}}
        return {"event": "dtmf", "stream_id": stream_id, "sequence_number": str(seq), "dtmf": {"digit": digit}}

    def stop(self, seq: int, stream_id: str, call_id: str) -> Message:
        if self.name == "twilio":
            return {"event": "stop", "sequenceNumber": str(seq), "streamSid": stream_id,
                    "stop": {"accountSid": "AC" + "0" * 32, "callSid": call_id}}
        return {"event": "stop", "sequence_number": str(seq), "stream_id": stream_id,
                "stop": {"user_id": "3e6f995f-85f7-4705-9741-53b116d28237", "call_control_id": call_id}}

    def new_ids(self) -> tuple[str, str]:
        """A fresh (stream id, call id) in the carrier's style."""
        if self.name == "twilio":
            return "MZ" + secrets.token_hex(16), "CA" + secrets.token_hex(16)
        return str(_uuid()), "v3:" + secrets.token_urlsafe(40)


def _uuid() -> str:
    import uuid

    return str(uuid.uuid4()).upper()


TWILIO = Carrier("twilio", {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1})
TELNYX = Carrier("telnyx", {"encoding": "PCMU", "sample_rate": 8000, "channels": 1})
CARRIERS = {c.name: c for c in (TWILIO, TELNYX)}


# --- the webhook -----------------------------------------------------------------------------------------------
@dataclass
class Answer:
    """The webhook's answer: its status, body, and (when it connects the call) the stream's URL and parameters."""

    status: int
    body: str
    stream_url: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    rejected: str = ""  # a <Reject reason="..."/> answer's reason


def webhook_form(carrier: Carrier, call_id: str) -> list[tuple[str, str]]:
    """The form parameters an inbound call's webhook carries (the ones both carriers send)."""
    return [("AccountSid", "AC" + "0" * 32), ("ApiVersion", "2010-04-01"), ("CallSid", call_id),
            ("CallStatus", "ringing"), ("Called", "+18005551212"), ("Caller", "+12349013030"),
            ("Direction", "inbound"), ("From", "+12349013030"), ("To", "+18005551212")]


def signed_headers(carrier: Carrier, url: str, form: list[tuple[str, str]], body: bytes, *, auth_token: str = "",
                   telnyx_private_key: Ed25519PrivateKey | None = None, timestamp: int | None = None) -> dict[str, str]:
    """The carrier's signature headers for this request (Twilio: over the URL and form; Telnyx: over the body)."""
    if carrier.name == "twilio":
        return {"X-Twilio-Signature": twilio_signature(auth_token, url, form)}
    if telnyx_private_key is None:
        raise ValueError("a Telnyx webhook is signed with a private key")
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = telnyx_private_key.sign(stamp.encode() + b"|" + body)
    return {"telnyx-signature-ed25519": base64.b64encode(signature).decode(), "telnyx-timestamp": stamp}


def read_answer(status: int, body: str) -> Answer:
    """The XML answer's stream URL and parameters (TwiML and TeXML alike)."""
    answer = Answer(status, body)
    if status != 200:
        return answer
    root = ET.fromstring(body)
    reject = root.find("Reject")
    if reject is not None:
        answer.rejected = reject.get("reason", "rejected")
        return answer
    stream = root.find("./Connect/Stream")
    if stream is not None:
        answer.stream_url = stream.get("url", "")
        answer.parameters = {p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter")}
    return answer


async def dial(http: aiohttp.ClientSession, base_url: str, carrier: Carrier = TWILIO, *, call_id: str,
               auth_token: str = "", telnyx_private_key: Ed25519PrivateKey | None = None, signed_url: str = "",
               headers: dict[str, str] | None = None, webhook: str = "") -> Answer:
    """Post the carrier's voice webhook for a call (``webhook``, default our route on ``base_url``; signed for
    ``signed_url``, default the URL posted to)."""
    url = webhook or f"{base_url.rstrip('/')}/telephony/{carrier.name}/voice"
    form = webhook_form(carrier, call_id)
    body = urlencode(form).encode()
    sign = signed_headers(carrier, signed_url or url, form, body, auth_token=auth_token,
                          telnyx_private_key=telnyx_private_key) if headers is None else headers
    async with http.post(url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded", **sign}) as resp:
        return read_answer(resp.status, await resp.text())


# --- the media stream --------------------------------------------------------------------------------------------
class PhoneCall(Playout):
    """One call's media stream, as the carrier runs it (see the module docstring)."""

    def __init__(self, http: aiohttp.ClientSession, stream_url: str, carrier: Carrier, call_id: str,
                 parameters: dict[str, str], *, connect_url: str = "", media_format: dict[str, object] | None = None,
                 threshold_dbfs: float = AUDIBLE_DBFS, drop_marks: bool = False) -> None:
        super().__init__(RATE, threshold_dbfs)
        self.http = http
        self.drop_marks = drop_marks  # a carrier (or proxy) that never echoes a mark: the server paces by its clock
        self.url = connect_url or stream_url
        self.carrier = carrier
        self.stream_id, _ = carrier.new_ids()
        self.call_id = call_id
        self.parameters = parameters
        self.media_format = media_format
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._seq = 0
        self._chunk = 0
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._voice = Voice(SILENCE_FRAME)
        self._pending_marks: dict[str, asyncio.TimerHandle] = {}
        self.media_times: list[float] = []  # arrival of every reply media message
        self.messages: list[dict[str, Any]] = []  # every message the server sent, in order
        self.marks_played: list[str] = []  # returned because their audio played
        self.marks_cleared: list[str] = []  # returned because a clear dropped their audio
        self.clears: list[float] = []
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self, *, send_start: bool = True) -> None:
        self.ws = await self.http.ws_connect(self.url, max_msg_size=0)
        await self.send(self.carrier.connected())
        if send_start:
            await self.send(self.carrier.start(self._next_seq(), self.stream_id, self.call_id, self.parameters)
                            if self.media_format is None else self._start_with_format())
        self._tasks = [asyncio.create_task(self._receive(), name="carrier-rx"),
                       asyncio.create_task(self._stream(), name="carrier-tx")]

    def _start_with_format(self) -> Message:
        return self.carrier.start(self._next_seq(), self.stream_id, self.call_id, self.parameters, self.media_format)

    async def hang_up(self, *, stop: bool = True) -> None:
        """The caller hangs up: ``stop`` (as the carrier says it), then the socket closes."""
        for task in self._tasks:
            if task.get_name() == "carrier-tx":
                task.cancel()
        if stop and self.ws is not None and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.send(self.carrier.stop(self._next_seq(), self.stream_id, self.call_id))
        await self.close()

    async def close(self) -> None:
        for handle in self._pending_marks.values():
            handle.cancel()
        self._pending_marks.clear()
        if self.ws is not None and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- what the caller sends ----------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def send(self, message: Message | str) -> None:
        """One message to the server (a dict as JSON; a str as it is, for tests of malformed input)."""
        assert self.ws is not None
        async with self._lock:
            await self.ws.send_str(message if isinstance(message, str) else json.dumps(message))

    def say(self, data: bytes, end_frame: int | None = None) -> asyncio.Future[float]:
        """Queue μ-law speech (then silence); the future is the time the frame holding ``end_frame`` was sent."""
        return self._voice.say((data[i : i + FRAME].ljust(FRAME, bytes([ULAW_SILENCE]))
                                for i in range(0, len(data), FRAME)), end_frame)

    async def _stream(self) -> None:
        """A media message every 20 ms from the first: speech when there is some, silence otherwise."""
        t0 = time.perf_counter()
        k = 0
        while True:
            await asyncio.sleep(max(0.0, t0 + k * FRAME_S - time.perf_counter()))
            payload = self._voice.next_frame()
            self._chunk += 1
            await self.send(self.carrier.media(self._next_seq(), self.stream_id, self._chunk, k * 20, payload))
            self._voice.sent()
            k += 1

    # --- what the server sends ------------------------------------------------------------------------------
    async def _receive(self) -> None:
        assert self.ws is not None
        try:
            while True:
                msg = await self.ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    self.on_message(json.loads(msg.data))
                    continue
                if msg.type is aiohttp.WSMsgType.CLOSE:
                    self.close_code, self.close_reason = msg.data, str(msg.extra or "")
                break
        finally:
            if self.close_code is None:
                self.close_code = self.ws.close_code
            self.closed.set()
            self.changed.set()

    def on_message(self, message: dict[str, Any]) -> None:
        at = now()
        self.messages.append(message)
        event = message.get("event")
        if event == "media":
            self.play(ulaw_decode(base64.b64decode(message["media"]["payload"])), at)
            self.media_times.append(at)
        elif event == "mark":
            name = message["mark"]["name"]
            delay = max(0.0, self.queue_end - at)
            self._pending_marks[name] = asyncio.get_running_loop().call_later(delay, self._mark_played, name)
        elif event == "clear":
            self.clears.append(at)
            for name, handle in list(self._pending_marks.items()):  # in the order they were sent
                handle.cancel()
                self.marks_cleared.append(name)
                self._echo_mark(name)
            self._pending_marks.clear()
            self.cut_playout(at)
        self.changed.set()

    def _mark_played(self, name: str) -> None:
        if self._pending_marks.pop(name, None) is not None:
            self.marks_played.append(name)
            self._echo_mark(name)
            self.changed.set()

    def _echo_mark(self, name: str) -> None:
        if self.drop_marks:
            return
        task = asyncio.get_running_loop().create_task(self.send(self.carrier.mark(self._next_seq(), self.stream_id,
                                                                                  name)))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


def stream_path(url: str) -> str:
    """The path of the answer's stream URL (a test connects to it on 127.0.0.1 whatever host it names)."""
    return urlsplit(url).path


# --- one bench turn ------------------------------------------------------------------------------------------
@dataclass
class PhoneTurn:
    """One bench turn over a carrier: the client-side voice-to-voice, as the carrier would play it."""

    file: str
    carrier: str
    v2v_ms: float | None = None  # the frame with the speech end sent → first audible reply sample played
    first_media_ms: float | None = None  # the same frame → the first reply media message received
    reply_s: float = 0.0
    error: str = ""


async def phone_turn(call: PhoneCall, utt: Utterance, *, timeout_s: float = 30.0) -> PhoneTurn:
    """Say ``utt`` on an open call and measure the reply (never raises for a missing one)."""
    result = PhoneTurn(utt.name, call.carrier.name)
    data, end_frame = utterance_ulaw(utt)
    speech_end = await asyncio.wait_for(call.say(data + SILENCE_FRAME * int(TAIL_S / FRAME_S), end_frame),
                                        len(data) / RATE + TAIL_S + 10)
    if not await call.reply_done(speech_end, timeout_s=timeout_s):
        result.error = "closed: " + str(call.close_code) if call.closed.is_set() else "no reply in time"
    heard = call.first_audible(speech_end)
    if heard is not None:
        result.v2v_ms = round((heard - speech_end) * 1000, 1)
        first = next((t for t in call.media_times if t >= speech_end), None)
        result.first_media_ms = round((first - speech_end) * 1000, 1) if first is not None else None
        result.reply_s = round(len(call.heard_pcm(speech_end)) / RATE, 2)
    return result


def phone_turn_result(turn: PhoneTurn, index: int) -> TurnResult:
    """A phone turn as a row of the bench's result (the caller's side only: a media stream carries no events)."""
    result = TurnResult(session=0, index=index, file=turn.file)
    if turn.v2v_ms is None:
        result.status, result.reason = "dropped", turn.error or "no audible reply"
        return result
    first = turn.first_media_ms
    result.columns = {"v2v_ms": turn.v2v_ms, "first_audio_ms": first,
                      "onset_ms": round(turn.v2v_ms - first, 1) if first is not None else None}
    if turn.error:
        result.status, result.reason = "error", turn.error
    return result


async def bench_phone(url: str, utterances: list[Utterance], turns: int, *, carrier: Carrier = TWILIO,
                      auth_token: str = "", timeout_s: float = 30.0, ready_timeout_s: float = 120.0,
                      webhook: str = "", wait_ready: bool = True,
                      on_turn: Callable[[TurnResult], None] | None = None) -> list[PhoneTurn]:
    """One call to the server at ``url`` (its voice webhook ``webhook``, default ours): ``turns`` utterances said one
    after another, each measured. ``wait_ready``: our server's ``/readyz`` first."""
    from assistant.bench.v2v import wait_server_ready

    url = url.rstrip("/")
    async with aiohttp.ClientSession() as http:
        if wait_ready:
            await wait_server_ready(http, url, ready_timeout_s)
        _, call_id = carrier.new_ids()
        answer = await dial(http, url, carrier, call_id=call_id, auth_token=auth_token, webhook=webhook)
        if answer.status != 200 or not answer.stream_url:
            raise RuntimeError(f"the {carrier.name} webhook was not answered with a stream: HTTP {answer.status} "
                               f"{answer.rejected or answer.body[:300]}")
        call = PhoneCall(http, answer.stream_url, carrier, call_id, answer.parameters)
        await call.open()
        out = []
        try:
            for k in range(turns):
                out.append(await phone_turn(call, utterances[k % len(utterances)], timeout_s=timeout_s))
                log.info("bench.phone turn=%d file=%s v2v_ms=%s error=%s", k, out[-1].file, out[-1].v2v_ms,
                         out[-1].error)
                if on_turn is not None:
                    on_turn(phone_turn_result(out[-1], k))
                if call.closed.is_set():
                    break
        finally:
            await call.hang_up()
    return out
