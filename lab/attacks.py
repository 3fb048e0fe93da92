"""What the open internet sends, from a client in its own process over real sockets: the attacks of
``tests/test_open_internet.py`` and of ``python -m lab attacks`` (before/after tables in docs/reliability.md).

- bodies that arrive in pieces (:func:`send_request`: HTTP/1.1 by hand, any piece size and pause, TLS too);
- clips that decode into gigabytes (:func:`flac_of_silence`, :func:`opus_of_silence`, :func:`lying_wav`);
- readers that stop reading (:func:`stalled_reader`: a tiny receive window, then nothing);
- a WebRTC peer whose RTP is hostile (:class:`HostilePeer`: sequence or timestamp jumps, floods, garbage);
- floods of offers and of TTS WebSockets; a page on a foreign ``Origin``;
- JSON nested thousands deep, or with more members than anyone needs, at every place JSON is read
  (:func:`json_bombs`);
- Realtime audio appended as fast as the socket drains (:func:`realtime_audio_flood`), and upgrades reset right
  after the request (:func:`upgrade_resets`).

And what the server pays for them, measured from outside: its RSS and peak RSS (``/proc``), and its event loop's
lag, seen as the latency of ``GET /healthz`` sampled while an attack runs (:class:`LagProbe`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import json
import os
import random
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pylibsrtp

from assistant.bench.v2v import BenchSession

PIECE_BYTES = 8192     # a body's pieces, as a slow network delivers them
PIECE_PAUSE_S = 0.01
PROBE_INTERVAL_S = 0.05
IDLE_WAIT_S = 15.0     # how long a flood of idle WebSockets is watched for the server closing them


# --- HTTP by hand ----------------------------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def error(self) -> str:
        data = self.json()
        if isinstance(data, dict):
            err = data.get("error")
            return err.get("code", "") if isinstance(err, dict) else str(err or "")
        return ""


async def _connect(url: str, tls: ssl.SSLContext | None = None,
                   rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    limit = rcvbuf if rcvbuf is not None else 2**16
    return await asyncio.open_connection(sock=sock, ssl=tls, server_hostname=parts.hostname if tls else None,
                                         limit=limit)


def _head(method: str, url: str, headers: dict[str, str], length: int | None) -> bytes:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    status_line = await reader.readline()
    if not status_line:
        return Answer(0, {}, b"")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0] or b"0", 16)
            if size == 0:
                break
            body += await reader.readexactly(size)
            await reader.readline()
        return Answer(status, headers, bytes(body))
    if "content-length" in headers:
        return Answer(status, headers, await reader.readexactly(int(headers["content-length"])))
    return Answer(status, headers, await reader.read())


async def send_request(url: str, method: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
                       piece: int = PIECE_BYTES, pause_s: float = PIECE_PAUSE_S,
                       tls: ssl.SSLContext | None = None) -> Answer:
    """One HTTP/1.1 request whose body goes out ``piece`` bytes at a time, ``pause_s`` apart (Content-Length
    known): what a slow link or TLS records do to a body. Returns the whole answer."""
    reader, writer = await _connect(url, tls)
    try:
        writer.write(_head(method, url, headers or {}, len(body) if body or method != "GET" else None))
        await writer.drain()
        for i in range(0, len(body), piece):
            writer.write(body[i:i + piece])
            await writer.drain()
            await asyncio.sleep(pause_s)
        return await _read_answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def multipart(fields: dict[str, bytes | str], boundary: str = "attackboundary") -> tuple[bytes, str]:
    """A multipart/form-data body (bytes fields as files) and its Content-Type."""
    out = bytearray()
    for name, value in fields.items():
        out += f"--{boundary}\r\n".encode()
        if isinstance(value, bytes):
            out += f'Content-Disposition: form-data; name="{name}"; filename="{name}.bin"\r\n'.encode()
            out += b"Content-Type: application/octet-stream\r\n\r\n" + value + b"\r\n"
        else:
            out += f'Content-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


# --- clips that decode into gigabytes ------------------------------------------------------------------------
@functools.cache
def flac_of_silence(hours: float = 3.0, rate: int = 8000) -> bytes:
    """FLAC of silence: about 25 KB a minute, so hours fit under any upload cap."""
    import soundfile as sf

    buf = io.BytesIO()
    minute = np.zeros(rate * 60, np.int16)
    with sf.SoundFile(buf, "w", samplerate=rate, channels=1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(int(hours * 60)):
            f.write(minute)
    return buf.getvalue()


@functools.cache
def opus_of_silence(hours: float = 3.0) -> bytes:
    """Ogg Opus of silence: one encoded 60 ms packet of silence, muxed again and again (3 h: about 3 MB)."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=48_000, layout="mono")
        stream.bit_rate = 6000
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 48_000), np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48_000, 0
        packets = list(stream.encode(frame))
        model = packets[len(packets) // 2]
        assert model.duration is not None, "libopus gives every packet a duration"
        duration = int(model.duration)
        for i in range(int(hours * 3600 * 48_000 / duration)):
            packet = av.Packet(bytes(model))
            packet.stream = stream
            packet.pts = packet.dts = i * duration
            packet.duration, packet.time_base = duration, model.time_base
            container.mux(packet)
    return out.getvalue()


@functools.cache
def lying_wav(minutes: float = 50.0) -> bytes:
    """A GSM 6.10 WAV (13 kbit/s, so 50 minutes fit in 5 MB) whose header lies: its ``fact`` chunk says one second
    of audio, its RIFF and data sizes say 4 GB."""
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=8000, channels=1, format="WAV", subtype="GSM610") as f:
        minute = np.zeros(8000 * 60, np.int16)
        for _ in range(int(minutes)):
            f.write(minute)
    data = bytearray(buf.getvalue())
    fact = data.find(b"fact")
    if fact > 0:
        data[fact + 8:fact + 12] = struct.pack("<I", 8000)
    chunk = data.find(b"data")
    data[chunk + 4:chunk + 8] = struct.pack("<I", 0xFFFFFFFF)
    data[4:8] = struct.pack("<I", 0xFFFFFFFF)
    return bytes(data)


# --- readers that stop reading -------------------------------------------------------------------------------
@dataclass
class Stalled:
    """A connection that read the answer's status line and then nothing; :meth:`cut` says whether the server gave
    up on it (closed or reset it before its answer was complete)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int

    async def cut(self, after_s: float, drain_s: float = 20.0) -> bool:
        """Stay stalled ``after_s``, then read what is there: True if the connection ends (EOF or reset) without
        the answer's last chunk, that is, the server cut it; False if the answer ends whole or never ends."""
        await asyncio.sleep(after_s)
        cast(asyncio.Transport, self.writer.transport).resume_reading()
        tail = b""
        deadline = time.monotonic() + drain_s
        try:
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(self.reader.read(1 << 16), deadline - time.monotonic())
                if not data:
                    return not tail.endswith(b"0\r\n\r\n")  # chunked: a whole answer ends with its last chunk
                tail = (tail + data)[-16:]
        except (ConnectionError, asyncio.IncompleteReadError):
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.writer.transport.abort()


async def stalled_reader(url: str, method: str, body: bytes, headers: dict[str, str],
                         rcvbuf: int = 4096, tls: ssl.SSLContext | None = None) -> Stalled:
    """Send a request, read the status line, then stop reading with a tiny receive window: the server's writes
    fill the socket buffers and wait."""
    reader, writer = await _connect(url, tls, rcvbuf=rcvbuf)
    writer.transport.set_write_buffer_limits(0)
    writer.write(_head(method, url, headers, len(body)) + body)
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 120)
    status = int(line.split()[1]) if line else 0
    cast(asyncio.Transport, writer.transport).pause_reading()
    return Stalled(reader, writer, status)


async def stalled_websocket(url: str, message: dict[str, Any], rcvbuf: int = 4096) -> Stalled:
    """Open ``/ws/tts`` by hand, send one request, then read nothing more."""
    import base64

    key = base64.b64encode(os.urandom(16)).decode()
    reader, writer = await _connect(url, rcvbuf=rcvbuf)
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key,
               "Sec-WebSocket-Version": "13"}
    parts = urlsplit(url)
    head = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
    writer.write(head.encode())
    line = await asyncio.wait_for(reader.readline(), 30)
    await reader.readuntil(b"\r\n\r\n")
    payload = json.dumps(message).encode()
    mask = os.urandom(4)
    frame = bytearray([0x81])  # FIN, text
    if len(payload) < 126:
        frame.append(0x80 | len(payload))
    else:
        frame.append(0x80 | 126)
        frame += struct.pack(">H", len(payload))
    frame += mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    writer.write(bytes(frame))
    await writer.drain()
    cast(asyncio.Transport, writer.transport).pause_reading()
    return Stalled(reader, writer, int(line.split()[1]) if line else 0)


# --- hostile RTP -----------------------------------------------------------------------------------------------
class HostilePeer:
    """A real WebRTC peer (the bench client) whose outgoing RTP is rewritten once it is connected.

    ``mode``: ``seq_jump`` (each packet 30 000 sequence numbers on), ``ts_jump`` (each packet 4.9 s of timestamps
    on), ``flood`` (each packet sent ``copies`` times with fresh sequence numbers), ``garbage`` (random payloads).
    """

    def __init__(self, url: str, http: aiohttp.ClientSession, mode: str, copies: int = 20) -> None:
        self.client = BenchSession(index=99, url=url, http=http)
        self.mode = mode
        self.copies = copies
        self.sent = 0
        self._seq = 0
        self._seq_from: int | None = None
        self._ts = 0

    async def connect(self) -> None:
        await self.client.connect()
        sender = next(s for s in self.client.pc.getSenders() if s.track is not None and s.track.kind == "audio")
        transport = sender.transport
        original: Callable[[bytes], Awaitable[None]] = transport._send_rtp

        async def hostile(data: bytes) -> None:
            for packet in self._rewrite(bytes(data)):
                self.sent += 1
                # A packet our own SRTP refuses (its replay check) is dropped, not allowed to end the sender.
                with contextlib.suppress(ConnectionError, pylibsrtp.Error):
                    await original(packet)

        transport._send_rtp = hostile  # type: ignore[method-assign]  # the hostile peer's whole point

    def _rewrite(self, data: bytes) -> list[bytes]:
        if len(data) < 12 or (data[1] & 0x7F >= 72 and data[1] & 0x7F <= 76):  # not RTP (RTCP types 200-204)
            return [data]
        size = 12 + 4 * (data[0] & 0x0F)  # the fixed header and its CSRCs
        if data[0] & 0x10 and len(data) >= size + 4:  # a header extension: its words follow
            size += 4 + 4 * struct.unpack(">H", data[size + 2:size + 4])[0]
        header = bytearray(data[:size])
        payload = data[size:]
        if self.mode == "seq_jump":
            if self._seq_from is None:  # jump forward from where the real stream is, or our own SRTP refuses it
                self._seq_from = self._seq = struct.unpack(">H", header[2:4])[0]
            self._seq = (self._seq + 30_000) % 65_536
            header[2:4] = struct.pack(">H", self._seq)
        elif self.mode == "ts_jump":
            self._ts = (self._ts + int(4.9 * 48_000) + 960) % 2**32
            header[4:8] = struct.pack(">I", self._ts)
        elif self.mode == "garbage":
            payload = bytes([0x03, 0x00]) + os.urandom(max(1, len(payload) - 2))  # code 3, zero frames: malformed
        elif self.mode == "flood":  # fresh sequence numbers, always forward (SRTP's replay check lets them in)
            out = []
            if not self._seq:
                self._seq = struct.unpack(">H", header[2:4])[0]
            for _ in range(self.copies):
                self._seq = (self._seq + 1) % 65_536
                header[2:4] = struct.pack(">H", self._seq)
                out.append(bytes(header) + payload)
            return out
        return [bytes(header) + payload]

    def close_reason(self) -> str:
        """The reason in the server's ``close`` event, if it closed this peer."""
        closes = [e.body for e in self.client.events if e.body.get("type") == "close"]
        return str(closes[-1].get("reason", "")) if closes else ""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()


# --- what the server pays ------------------------------------------------------------------------------------
def _status_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmRSS") / 1024


def peak_rss_mb(pid: int) -> float:
    return _status_kb(pid, "VmHWM") / 1024


def reset_peak_rss(pid: int) -> bool:
    """Start the process's peak RSS (VmHWM) afresh at its current RSS (Linux ``clear_refs`` 5); False if refused."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class LagProbe:
    """``GET /healthz`` every PROBE_INTERVAL_S from this process: how long the server's event loop takes to
    answer, while an attack runs (an answer past ``timeout_s`` counts as that long)."""

    url: str
    timeout_s: float = 10.0
    samples_ms: list[float] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            while True:
                t0 = time.perf_counter()
                try:
                    async with http.get(f"{self.url}/healthz") as r:
                        await r.read()
                except (aiohttp.ClientError, TimeoutError, OSError):
                    pass
                self.samples_ms.append(1000 * (time.perf_counter() - t0))
                await asyncio.sleep(PROBE_INTERVAL_S)

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run(), name="lag-probe")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.samples_ms, q)) if self.samples_ms else 0.0

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms, default=0.0)


def speech_offer_sdp() -> Callable[[], Awaitable[str]]:
    """An aiortc offer's SDP (audio and the events channel), made once and reused for a flood of offers."""
    cache: list[str] = []

    async def make() -> str:
        if not cache:
            from aiortc import RTCPeerConnection

            pc = RTCPeerConnection()
            pc.createDataChannel("events")
            pc.addTransceiver("audio", direction="sendrecv")
            await pc.setLocalDescription(await pc.createOffer())
            cache.append(pc.localDescription.sdp)
            await pc.close()
        return cache[0]

    return make


def random_text(chars: int, seed: int = 0) -> str:
    """Short plain sentences (Piper speaks them one by one) up to ``chars`` characters."""
    rng = random.Random(seed)
    words = ["the", "weather", "today", "is", "calm", "and", "bright", "with", "a", "light", "wind", "from", "west"]
    sentences: list[str] = []
    while sum(len(x) + 1 for x in sentences) < chars - 60:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 9)))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
    return " ".join(sentences)[:chars]


# --- the scenarios: each attack, what it got, and what the server paid ----------------------------------------
@dataclass
class Target:
    """The server under attack (in another process) and what every scenario needs."""

    url: str
    pid: int
    audio: Path                            # the shared speech files
    attacker: dict[str, str] = field(default_factory=dict)  # headers naming the attacker (X-Forwarded-For)
    write_timeout_s: float = 10.0          # the server's tts_api.write_timeout_s (its default)
    ws_idle_timeout_s: float = 120.0
    _sdp: Callable[[], Awaitable[str]] = field(default_factory=speech_offer_sdp)

    async def sdp(self) -> str:
        return await self._sdp()


@dataclass
class Outcome:
    """One scenario's result: what the attacker was answered (``got``: one line for a table) and the details a
    test checks; the server's cost (RSS, event-loop lag) and whether the bystander's turn was heard."""

    name: str
    got: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_end_mb: float = 0.0
    lag_p99_ms: float = 0.0
    lag_max_ms: float = 0.0
    heard: bool | None = None             # the bystander's turn during the attack (None: none was played)
    heard_reason: str = ""

    @property
    def rss_growth_mb(self) -> float:
        return self.rss_peak_mb - self.rss_start_mb


def _counts(statuses: list[Any]) -> str:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return ", ".join(f"{n}×{s}" for s, n in sorted(counts.items()))


async def no_attack(t: Target, http: aiohttp.ClientSession) -> Outcome:
    """The control: only the bystander's turn (what a turn itself costs the server)."""
    await asyncio.sleep(1.0)
    return Outcome("none (the bystander's turn alone)", "-")


async def bodies_in_pieces(t: Target, http: aiohttp.ClientSession) -> Outcome:
    """Every body route, its body in 8 KB pieces 10 ms apart (small bodies in 64-byte pieces)."""
    from assistant.server.voice.sdpfrag import build_sdpfrag, ice_credentials

    got: dict[str, tuple[int, str]] = {}
    js = {"Content-Type": "application/json", **t.attacker}

    async def one(name: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        piece = PIECE_BYTES if len(body) > 4 * PIECE_BYTES else 64
        answer = await send_request(t.url + path, method, body, headers, piece=piece)
        got[name] = (answer.status, answer.error)
        return answer

    sdp = await t.sdp()
    offer = await one("offer", "POST", "/api/offer", json.dumps({"sdp": sdp, "type": "offer"}).encode(), js)
    session = (offer.json() or {}).get("session_id", "") if offer.status == 200 else ""
    if session:
        ufrag, pwd = ice_credentials(sdp)
        frag = build_sdpfrag(ufrag or "", pwd or "", [("0", "candidate:1 1 udp 2130706431 192.0.2.1 9 typ host")])
        await one("trickle", "PATCH", f"/api/sessions/{session}", frag.encode(),
                  {"Content-Type": "application/trickle-ice-sdpfrag", **t.attacker})
        await one("hang-up", "DELETE", f"/api/sessions/{session}", b"", dict(t.attacker))
    whip = await one("whip", "POST", "/api/whip", sdp.encode(), {"Content-Type": "application/sdp", **t.attacker})
    location = whip.headers.get("location", "")
    if whip.status == 201 and location:
        await send_request(t.url + location, "DELETE", b"", dict(t.attacker))
    pad = b" " * 250_000  # JSON allows whitespace: a 256 KB body whose text is short
    await one("tts", "POST", "/api/tts", json.dumps({"text": "Hello there.", "format": "pcm"}).encode()[:-1]
              + pad + b"}", js)
    form, ctype = multipart({"request": json.dumps({"text": "Hello there."}) + " " * 200_000})
    await one("tts multipart", "POST", "/api/tts", form, {"Content-Type": ctype, **t.attacker})
    clip = (t.audio / "en_reference_voice.wav").read_bytes()
    form, ctype = multipart({"clip": clip, "transcript": "a reference voice", "name": "pieces"})
    voice = await one("voices", "POST", "/api/voices", form, {"Content-Type": ctype, **t.attacker})
    voice_id = (voice.json() or {}).get("voice_id") if voice.status == 201 else None
    if voice_id:
        await send_request(f"{t.url}/api/voices/{voice_id}", "DELETE", b"", dict(t.attacker))
    speech = json.dumps({"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"})
    await one("speech", "POST", "/v1/audio/speech", speech.encode()[:-1] + b" " * 60_000 + b"}", js)
    bad = {k: v for k, v in got.items() if not 200 <= v[0] < 300}
    summary = "all 2xx" if not bad else "; ".join(f"{k} {s} {e}".strip() for k, (s, e) in bad.items())
    return Outcome("bodies in pieces (every body route)", summary, {"answers": got})


async def _post_clip(t: Target, name: str, clip: bytes) -> Outcome:
    form, ctype = multipart({"clip": clip, "transcript": "silence", "name": "bomb"})
    answer = await send_request(t.url + "/api/voices", "POST", form, {"Content-Type": ctype, **t.attacker},
                                piece=1 << 20, pause_s=0.0)
    voice_id = (answer.json() or {}).get("voice_id") if answer.status == 201 else None
    if voice_id:
        await send_request(f"{t.url}/api/voices/{voice_id}", "DELETE", b"", dict(t.attacker))
    return Outcome(name, f"{answer.status} {answer.error}".strip(),
                   {"status": answer.status, "error": answer.error, "bytes": len(clip)})


async def flac_bomb(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _post_clip(t, "FLAC, 3 h of silence (0.27 MB)", flac_of_silence(3.0))


async def opus_bomb(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _post_clip(t, "Opus, 3 h of silence (3 MB)", opus_of_silence(3.0))


async def wav_that_lies(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _post_clip(t, "WAV whose header lies (50 min GSM, 4.9 MB)", lying_wav(50.0))


async def slow_readers(t: Target, http: aiohttp.ClientSession) -> Outcome:
    """Streamed answers whose readers stop reading: POST /api/tts (streaming, twice), /v1/audio/speech, /ws/tts:
    as many as the server has synthesis slots (tts.max_concurrent, 4)."""
    # Minutes of audio (more than the socket buffers between us hold), at 48 kHz or slowed down.
    text = random_text(2000)
    js = {"Content-Type": "application/json", **t.attacker}
    tts = json.dumps({"text": text, "streaming": True, "format": "pcm", "sample_rate": 48_000}).encode()
    speech = json.dumps({"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm",
                         "speed": 0.5}).encode()
    stalled = [
        await stalled_reader(t.url + "/api/tts", "POST", tts, js),
        await stalled_reader(t.url + "/v1/audio/speech", "POST", speech, js),
        await stalled_reader(t.url + "/api/tts", "POST", tts, js),
        await stalled_websocket(t.url.replace("http", "ws", 1) + "/ws/tts", {"text": text, "sample_rate": 48_000}),
    ]
    try:
        # Past the server's write timeout (and the time it takes to fill the buffers), with the readers still
        # stalled: can anyone else synthesise? Then look whether the server cut them.
        await asyncio.sleep(t.write_timeout_s + 25.0)
        async with http.post(f"{t.url}/api/tts", json={"text": "Are you still there?"}, headers=t.attacker) as r:
            after = r.status
        cut = await asyncio.gather(*(s.cut(0.0) for s in stalled))
    finally:
        for s in stalled:
            s.close()
    names = ["tts stream", "openai speech", "tts stream 2", "ws"]
    summary = f"{sum(cut)}/{len(cut)} cut; TTS meanwhile: {after}"
    return Outcome("4 readers that stop reading", summary, {"cut": dict(zip(names, cut, strict=True)),
                                                            "tts_after": after,
                                                            "statuses": [s.status for s in stalled]})


async def _hostile(t: Target, http: aiohttp.ClientSession, mode: str, name: str, wait_s: float = 20.0) -> Outcome:
    peer = HostilePeer(t.url, http, mode)
    try:
        await peer.connect()
        deadline = time.monotonic() + wait_s
        while not peer.close_reason() and time.monotonic() < deadline and not peer.client.failed:
            await asyncio.sleep(0.1)
        reason = peer.close_reason()
        return Outcome(name, f"closed: {reason}" if reason else f"not closed in {wait_s:g} s",
                       {"reason": reason, "sent": peer.sent})
    finally:
        await peer.close()


async def rtp_sequence_jumps(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _hostile(t, http, "seq_jump", "RTP: every packet 30 000 sequence numbers on")


async def rtp_timestamp_jumps(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _hostile(t, http, "ts_jump", "RTP: every packet 4.9 s of timestamps on")


async def rtp_flood(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _hostile(t, http, "flood", "RTP: every packet sent 20 times (1000/s)")


async def rtp_garbage(t: Target, http: aiohttp.ClientSession) -> Outcome:
    return await _hostile(t, http, "garbage", "RTP: malformed Opus")


async def offer_flood(t: Target, http: aiohttp.ClientSession, offers: int = 40) -> Outcome:
    """``offers`` offers at once that never connect."""
    body = json.dumps({"sdp": await t.sdp(), "type": "offer"}).encode()
    headers = {"Content-Type": "application/json", **t.attacker}
    answers = await asyncio.gather(*(send_request(t.url + "/api/offer", "POST", body, headers, pause_s=0.0)
                                     for _ in range(offers)))
    statuses = [f"{a.status} {a.error}".strip() for a in answers]
    return Outcome(f"{offers} offers at once that never connect", _counts(statuses), {"statuses": statuses})


async def ws_flood(t: Target, http: aiohttp.ClientSession, sockets: int = 40) -> Outcome:
    """``sockets`` /ws/tts connections at once, then silence on all of them."""
    opened: list[aiohttp.ClientWebSocketResponse] = []
    statuses: list[str] = []

    async def one() -> None:
        try:
            opened.append(await http.ws_connect(t.url + "/ws/tts", headers=t.attacker))
            statuses.append("101")
        except aiohttp.WSServerHandshakeError as exc:
            statuses.append(str(exc.status))
        except (aiohttp.ClientError, OSError) as exc:
            statuses.append(type(exc).__name__)

    await asyncio.gather(*(one() for _ in range(sockets)))
    closed = []
    try:
        for ws in opened[:1]:  # the first tells: they idle alike (watched for at most IDLE_WAIT_S)
            with contextlib.suppress(TimeoutError):
                msg = await ws.receive(timeout=min(t.ws_idle_timeout_s + 5.0, IDLE_WAIT_S))
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    closed.append(f"{ws.close_code} {msg.extra or ''}".strip())
    finally:
        for ws in opened:
            await ws.close()
    idle = f"; idle one closed: {closed[0][:24]}" if closed else f"; idle one open after {IDLE_WAIT_S:g} s"
    return Outcome(f"{sockets} TTS WebSockets at once, idle", _counts(statuses) + idle,
                   {"statuses": statuses, "closed": closed})


async def foreign_origin(t: Target, http: aiohttp.ClientSession) -> Outcome:
    """A page on another site posting to the server (as a browser would, with its Origin)."""
    evil = {"Origin": "https://evil.example", **t.attacker}
    got: dict[str, int] = {}
    body = json.dumps({"sdp": await t.sdp(), "type": "offer"}).encode()
    for name, path, payload, ctype in (("offer", "/api/offer", body, "application/json"),
                                       ("tts", "/api/tts", b'{"text": "hello"}', "application/json"),
                                       ("offer as text/plain", "/api/offer", body, "text/plain")):
        answer = await send_request(t.url + path, "POST", payload, {"Content-Type": ctype, **evil}, pause_s=0.0)
        got[name] = answer.status
        if answer.status == 200 and name.startswith("offer"):
            session = (answer.json() or {}).get("session_id")
            if session:
                await send_request(f"{t.url}/api/sessions/{session}", "DELETE", b"", dict(t.attacker))
    try:
        ws = await http.ws_connect(t.url + "/ws/tts", headers=evil)
        got["ws"] = 101
        await ws.close()
    except aiohttp.WSServerHandshakeError as exc:
        got["ws"] = exc.status
    return Outcome("a page on a foreign Origin", ", ".join(f"{k} {v}" for k, v in got.items()), {"statuses": got})


def deep_json(levels: int) -> str:
    """``levels`` arrays inside each other (what once raised ``RecursionError`` in the parser)."""
    return "[" * levels + "]" * levels


def wide_json(members: int) -> str:
    """One object with ``members`` members (one short name, repeated: 6 bytes a member, so the smallest body cap,
    OpenAI speech's 73 KB, holds 11,000)."""
    return "{" + ",".join(['"a":0'] * members) + "}"


async def json_bombs(t: Target, http: aiohttp.ClientSession) -> Outcome:
    """Every route and socket that reads JSON, sent JSON nested 30,000 deep (in an object, where the route wants
    one) and an object of 11,000 members, each under every route's body cap: each must answer 400 (an ``error``
    event, or an error message, on a socket), never a 5xx or a dropped connection."""
    deep, wide = deep_json(30_000), wide_json(11_000)
    got: dict[str, str] = {}
    json_type = {"Content-Type": "application/json", **t.attacker}
    bodies = {"deep": '{"a": ' + deep + "}", "wide": wide}
    for name, path in (("offer", "/api/offer"), ("tts", "/api/tts"), ("speech", "/v1/audio/speech"),
                       ("keys", "/api/keys"), ("client secret", "/v1/realtime/client_secrets")):
        for shape, body in bodies.items():
            answer = await send_request(t.url + path, "POST", body.encode(), json_type, pause_s=0.0)
            got[f"{name} {shape}"] = str(answer.status)
    boundary = "jsonbomb"
    for shape, body in bodies.items():
        form, ctype = multipart({"sdp": "v=0\r\n", "session": body}, boundary)
        answer = await send_request(t.url + "/v1/realtime/calls", "POST", form,
                                    {"Content-Type": ctype, **t.attacker}, pause_s=0.0)
        got[f"call session {shape}"] = str(answer.status)
        form, ctype = multipart({"request": body}, boundary)
        answer = await send_request(t.url + "/api/tts", "POST", form, {"Content-Type": ctype, **t.attacker},
                                    pause_s=0.0)
        got[f"tts form {shape}"] = str(answer.status)
    for name, path, first in (("ws tts", "/ws/tts?keep_open=1", None), ("realtime ws", "/v1/realtime", "session")):
        for shape, body in bodies.items():
            try:
                async with http.ws_connect(t.url + path, headers=t.attacker) as ws:
                    if first:
                        await ws.receive(timeout=15)  # session.created
                    await ws.send_str(body)
                    msg = await ws.receive(timeout=15)
                    reply = json.loads(msg.data) if msg.type == aiohttp.WSMsgType.TEXT else {}
                    error = reply.get("error")
                    code = error.get("code") if isinstance(error, dict) else error
                    got[f"{name} {shape}"] = f"error {code}" if code else f"{msg.type.name} {msg.extra or ''}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                got[f"{name} {shape}"] = type(exc).__name__
    return Outcome("JSON nested 30,000 deep, or with 11,000 members", _counts(list(got.values())), {"answers": got})


async def realtime_audio_flood(t: Target, http: aiohttp.ClientSession, seconds: int = 600) -> Outcome:
    """``input_audio_buffer.append`` as fast as the socket drains: ``seconds`` of PCM16 in 1 s events (issue 40:
    Silero over it inline held every other call's audio behind it)."""
    event = json.dumps({"type": "input_audio_buffer.append",
                        "audio": base64.b64encode(bytes(2 * 24_000)).decode()})
    errors: dict[str, int] = {}
    sent = 0
    t0 = time.perf_counter()
    async with http.ws_connect(t.url + "/v1/realtime?model=echo", protocols=("realtime",), headers=t.attacker,
                               max_msg_size=0) as ws:
        await ws.receive(timeout=15)  # session.created

        async def read() -> None:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    if data.get("type") == "error":
                        code = str(data["error"].get("code"))
                        errors[code] = errors.get(code, 0) + 1

        reader = asyncio.create_task(read())
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            for _ in range(seconds):
                if ws.closed:
                    break
                await ws.send_str(event)
                sent += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), 5.0)
        reader.cancel()
        close = f"closed {ws.close_code}" if ws.closed else "open"
    took = time.perf_counter() - t0
    refused = _counts([k for k, n in errors.items() for _ in range(n)]) or "no errors"
    got = f"{sent} s of audio in {took:.1f} s; {refused}; {close}"
    return Outcome(f"Realtime audio appended as fast as the socket drains ({seconds} s)", got,
                   {"sent_s": sent, "errors": errors, "close": close})


async def upgrade_resets(t: Target, http: aiohttp.ClientSession, count: int = 1000) -> Outcome:
    """``count`` ``/v1/realtime`` upgrade requests, each reset (RST) right after it is sent; then the session table
    (issue 40: a failed upgrade left its session in the table for ever, and the server answered 503 to everyone)."""
    parts = urlsplit(t.url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in t.attacker.items())
    head = (f"GET /v1/realtime?model=echo HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: realtime\r\n{extra}\r\n").encode()
    loop = asyncio.get_running_loop()
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (parts.hostname, parts.port))
            await loop.sock_sendall(sock, head)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            sock.close()
    left = -1
    for _ in range(100):  # the server's closes run after the resets: look until the table empties (10 s at most)
        async with http.get(t.url + "/api/sessions") as r:
            listed = await r.json(content_type=None)
        left = len(listed.get("sessions", [])) if isinstance(listed, dict) else -1
        if 0 <= left <= 1:  # the bystander's own session
            break
        await asyncio.sleep(0.1)
    return Outcome(f"{count} Realtime upgrades reset after the request",
                   f"sessions listed after: {left} (the bystander's included)", {"left": left})


# What a scenario makes before it runs (outside the measured window: making a bomb is the client's work, and would
# stall this process's lag probe and bystander).
PREPARE: dict[str, Callable[[], Any]] = {
    "flac": lambda: flac_of_silence(3.0),
    "opus": lambda: opus_of_silence(3.0),
    "wav": lambda: lying_wav(50.0),
}

SCENARIOS: dict[str, Callable[[Target, aiohttp.ClientSession], Awaitable[Outcome]]] = {
    "none": no_attack,
    "bodies": bodies_in_pieces,
    "flac": flac_bomb,
    "opus": opus_bomb,
    "wav": wav_that_lies,
    "slow": slow_readers,
    "rtp_seq": rtp_sequence_jumps,
    "rtp_ts": rtp_timestamp_jumps,
    "rtp_flood": rtp_flood,
    "rtp_garbage": rtp_garbage,
    "origin": foreign_origin,
    "ws_flood": ws_flood,
    "json": json_bombs,
    "realtime_flood": realtime_audio_flood,
    "upgrade_resets": upgrade_resets,
    "offer_flood": offer_flood,  # last: it spends the attacker's offer budget
}


async def warm_up(t: Target, http: aiohttp.ClientSession, bystander: BenchSession | None) -> None:
    """What normal clients do first (a turn, a TTS request, a voice registered and deleted, OpenAI speech), so
    the memory an attack adds is measured above ordinary traffic's high-water mark, not the first turn's."""
    from assistant.bench.audio_source import load_utterance
    from assistant.bench.v2v import TurnSettings

    if bystander is not None:
        await bystander.run_turn(load_utterance(t.audio / "en_timer.wav"), 0,
                                 TurnSettings(timeout_s=45.0, silence_ms=1200, settle_ms=300))
    async with http.post(f"{t.url}/api/tts", json={"text": "Warming up."}) as r:
        await r.read()
    form = aiohttp.FormData()
    form.add_field("clip", (t.audio / "en_reference_voice.wav").read_bytes(), filename="ref.wav")
    form.add_field("transcript", "a reference voice")
    async with http.post(f"{t.url}/api/voices", data=form) as r:
        voice = await r.json(content_type=None)
    if isinstance(voice, dict) and voice.get("voice_id"):
        async with http.delete(f"{t.url}/api/voices/{voice['voice_id']}") as r:
            await r.read()
    async with http.post(f"{t.url}/v1/audio/speech", json={"model": "tts-1", "input": "Warming up.",
                                                           "voice": "alloy"}) as r:
        await r.read()
    # As many long syntheses at once as the server has slots (tts.max_concurrent, 4): the engine's memory for
    # that (Piper's ONNX arenas: about 300 MB) is what ordinary TTS traffic costs, not what an attack adds.
    text = random_text(1200, seed=1)

    async def long(body: dict[str, Any]) -> None:
        async with http.post(f"{t.url}/api/tts", json={"text": text, **body}) as r:
            await r.read()

    await asyncio.gather(long({"sample_rate": 48_000}), long({"speed": 0.5}), long({}), long({"speed": 0.5}))


async def run_scenario(t: Target, name: str, http: aiohttp.ClientSession,
                       bystander: BenchSession | None = None) -> Outcome:
    """One attack with the server's cost measured around it (peak RSS from a reset high-water mark, event-loop
    lag from ``/healthz``), and the bystander's turn played at the same time."""
    from assistant.bench.audio_source import load_utterance
    from assistant.bench.v2v import TurnSettings

    if name in PREPARE:
        await asyncio.to_thread(PREPARE[name])
    reset_peak_rss(t.pid)
    start = rss_mb(t.pid)

    async def listen() -> tuple[bool, str]:
        if bystander is None:
            return False, ""
        await asyncio.sleep(0.5)  # into the attack
        result = await bystander.run_turn(load_utterance(t.audio / "en_weather.wav"), 0,
                                          TurnSettings(timeout_s=45.0, silence_ms=1200, settle_ms=300))
        return result.status == "ok" and "weather" in result.transcript.lower(), result.reason

    async with LagProbe(t.url) as probe:
        outcome, (heard, reason) = await asyncio.gather(SCENARIOS[name](t, http), listen())
    outcome.rss_start_mb, outcome.rss_peak_mb, outcome.rss_end_mb = start, peak_rss_mb(t.pid), rss_mb(t.pid)
    outcome.lag_p99_ms, outcome.lag_max_ms = probe.percentile(99), probe.max_ms
    if bystander is not None:
        outcome.heard, outcome.heard_reason = heard, reason
    return outcome
