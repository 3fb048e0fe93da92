"""Real SIP peers for the tests, as processes on loopback: Debian's SIPp (``sip-tester``) running a scenario from
``tests/data/sip``, and baresip, a softphone driven over its ``ctrl_tcp`` socket (netstring JSON). Both are asked of
``tests/needs.py`` (a failure under CI when missing); scripts/test.sh installs them.

Also the recorded request as the peers play it: a shared speech file as G.711 μ-law in a WAV (SIPp's
``rtp_stream``) or as 48 kHz PCM (baresip's ``aufile``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

from assistant.bench.audio_source import load_utterance
from assistant.bench.telephony_client import utterance_ulaw
from assistant.g711 import ULAW_SILENCE
from tests import needs

SCENARIOS = Path(__file__).parent / "data" / "sip"
LOOPBACK = "127.0.0.1"


def free_port(pair: bool = False, tcp: bool = False) -> int:
    """A port free on 127.0.0.1 for UDP (and TCP with ``tcp``); with ``pair``, an even one whose next is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        if pair and port % 2:
            continue
        wanted = [port, port + 1] if pair else [port]
        held: list[socket.socket] = []
        try:
            for p in wanted:
                for kind in ([socket.SOCK_DGRAM, socket.SOCK_STREAM] if tcp else [socket.SOCK_DGRAM]):
                    s = socket.socket(socket.AF_INET, kind)
                    held.append(s)
                    s.bind((LOOPBACK, p))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return port
    raise OSError("no free port on 127.0.0.1")


def ulaw_wav(speech: Path, out: Path, silence_s: float = 3.0) -> float:
    """``speech`` as a phone line carries it (8 kHz μ-law, format 7 WAV, what SIPp's rtp_stream plays), then
    ``silence_s`` of silence; returns where the speech ends (s)."""
    utt = load_utterance(speech)
    data, _ = utterance_ulaw(utt)
    data += bytes([ULAW_SILENCE]) * int(8000 * silence_s)
    fmt = struct.pack("<HHIIHH", 7, 1, 8000, 8000, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    out.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return utt.speech_end_s


def pcm48_wav(speech: Path, out: Path, silence_s: float = 3.0) -> float:
    """``speech`` as 48 kHz mono s16 (baresip's aufile source), then silence; returns where the speech ends (s)."""
    utt = load_utterance(speech)
    pcm = np.concatenate([utt.pcm, np.zeros(int(48_000 * silence_s), np.int16)])
    sf.write(out, pcm, 48_000, subtype="PCM_16")
    return utt.speech_end_s


# --- SIPp ----------------------------------------------------------------------------------------------------
@dataclass
class Sipp:
    """One SIPp run of a scenario (``[name]`` placeholders filled from ``values`` first: SIPp reads some attributes,
    such as rtp_stream's file, only as written)."""

    scenario: str
    folder: Path
    remote: str = ""  # host:port a UAC calls; empty for a UAS
    values: dict[str, str] = field(default_factory=dict)
    user: str = ""
    password: str = ""
    port: int = field(default_factory=free_port)
    media_port: int = field(default_factory=lambda: free_port(pair=True))
    process: asyncio.subprocess.Process | None = None

    @property
    def uri_host(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    async def start(self) -> None:
        program = needs.program("sipp", "sip-tester")
        text = (SCENARIOS / f"{self.scenario}.xml").read_text()
        for key, value in self.values.items():
            text = text.replace(f"[{key}]", value)
        path = self.folder / f"{self.scenario}-{self.port}.xml"
        path.write_text(text)
        self.errors = self.folder / f"{self.scenario}-{self.port}-errors.log"
        self.messages = self.folder / f"{self.scenario}-{self.port}-messages.log"
        args = [program, "-sf", str(path), "-i", LOOPBACK, "-p", str(self.port), "-mi", LOOPBACK,
                "-mp", str(self.media_port), "-m", "1", "-nostdin", "-trace_err", "-error_file", str(self.errors),
                "-trace_msg", "-message_file", str(self.messages), "-timeout", "120s", "-timeout_error"]
        if self.user:
            args += ["-au", self.user, "-ap", self.password]
        if self.remote:
            args.append(self.remote)
        self.process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                            stderr=asyncio.subprocess.PIPE)

    async def wait(self, timeout_s: float = 120.0) -> int:
        """SIPp's exit status (0: the scenario ran as written)."""
        assert self.process is not None
        _, err = await asyncio.wait_for(self.process.communicate(), timeout_s)
        self.stderr = err.decode(errors="replace")
        return self.process.returncode if self.process.returncode is not None else -1

    def log(self) -> str:
        """What went wrong, for an assertion message: SIPp's errors and its last messages."""
        parts = []
        for path in (getattr(self, "errors", None), getattr(self, "messages", None)):
            if path is not None and path.exists():
                parts.append(path.read_text(errors="replace")[-3000:])
        return "\n".join(parts) + getattr(self, "stderr", "")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def sipp(scenario: str, folder: Path, remote: str = "", **kw: object) -> AsyncIterator[Sipp]:
    run = Sipp(scenario, folder, remote, **kw)  # type: ignore[arg-type]
    await run.start()
    try:
        yield run
    finally:
        await run.stop()


# --- RTP on the test's side ---------------------------------------------------------------------------------------
class Ear(asyncio.DatagramProtocol):
    """A UDP socket that keeps the RTP sent to it (the payloads, with their payload type and arrival time)."""

    def __init__(self) -> None:
        self.packets: list[tuple[float, int, bytes, tuple[str, int]]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) >= 12 and data[0] >> 6 == 2 and not 192 <= data[1] <= 223:  # RTP, not RTCP
            header = 12 + 4 * (data[0] & 0x0F)
            self.packets.append((time.monotonic(), data[1] & 0x7F, data[header:], addr))

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def payloads(self, payload_type: int) -> list[bytes]:
        return [p for _, pt, p, _ in self.packets if pt == payload_type]


@contextlib.asynccontextmanager
async def ear(host: str = LOOPBACK, port: int = 0) -> AsyncIterator[Ear]:
    transport, protocol = await asyncio.get_running_loop().create_datagram_endpoint(Ear, local_addr=(host, port))
    try:
        yield protocol
    finally:
        transport.close()


# --- baresip ------------------------------------------------------------------------------------------------------
MODULES = ("aufile.so", "aubridge.so", "sndfile.so")
APP_MODULES = ("account.so", "menu.so", "ctrl_tcp.so")


class Baresip:
    """A baresip softphone in its own folder (config, accounts, the audio it heard as dump-*-dec.wav)."""

    def __init__(self, folder: Path, audio: Path, codecs: tuple[str, ...] = ("opus.so",), user: str = "phone",
                 auth: tuple[str, str] | None = None, answer: str = "auto", cafile: Path | None = None,
                 mediaenc: str = "") -> None:
        self.folder = folder
        self.dumps = folder / "dumps"
        self.dumps.mkdir(parents=True, exist_ok=True)
        while True:
            self.port = free_port(tcp=True)
            if self.port < 65_000 and _free_tcp(self.port + 1):  # sip_listen takes port+1 for TLS too
                break
        self.ctrl_port = free_port(tcp=True)
        rtp = free_port(pair=True)
        modules = "\n".join(f"module {m}" for m in (*codecs, *MODULES))
        apps = "\n".join(f"module_app {m}" for m in APP_MODULES)
        (folder / "config").write_text(f"""poll_method epoll
sip_listen {LOOPBACK}:{self.port}
net_interface {LOOPBACK}
audio_player aubridge,nil
audio_alert aubridge,nil
audio_source aufile,{audio}
ausrc_srate 48000
ausrc_channels 1
auplay_channels 1
auplay_srate 48000
rtp_ports {rtp}-{rtp + 9}
rtcp_mux no
module_path /usr/lib/baresip/modules
{modules}
{apps}
ctrl_tcp_listen {LOOPBACK}:{self.ctrl_port}
snd_path {self.dumps}
""" + (f"sip_cafile {cafile}\n" if cafile is not None else ""))
        secret = f";auth_user={auth[0]};auth_pass={auth[1]}" if auth else ""
        encryption = f";mediaenc={mediaenc}" if mediaenc else ""  # srtp-mand: SDES SRTP only (RTP/SAVP)
        (folder / "accounts").write_text(
            f"<sip:{user}@{LOOPBACK}:{self.port}>{secret};regint=0;answermode={answer}{encryption}\n")
        self.process: asyncio.subprocess.Process | None = None
        self.events: list[dict[str, object]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._replies: asyncio.Queue[dict[str, object]] = asyncio.Queue()

    async def start(self) -> None:
        program = needs.program("baresip", "baresip")
        self.log = open(self.folder / "baresip.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = await asyncio.create_subprocess_exec(program, "-f", str(self.folder), stdout=self.log,
                                                            stderr=self.log, stdin=asyncio.subprocess.DEVNULL,
                                                            env={**os.environ, "HOME": str(self.folder)})
        deadline = time.monotonic() + 20
        while True:
            try:
                self._reader, self._writer = await asyncio.open_connection(LOOPBACK, self.ctrl_port)
                break
            except OSError:
                if time.monotonic() > deadline or self.process.returncode is not None:
                    raise RuntimeError("baresip did not open its control socket: "
                                       + (self.folder / "baresip.log").read_text(errors="replace")[-2000:]) from None
                await asyncio.sleep(0.1)
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self._reader is not None
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ValueError):
            while True:
                length = int((await self._reader.readuntil(b":"))[:-1])
                data = await self._reader.readexactly(length + 1)
                message = json.loads(data[:-1])
                if message.get("event"):
                    self.events.append(message)
                else:
                    self._replies.put_nowait(message)

    async def command(self, command: str, params: str = "") -> dict[str, object]:
        """One ctrl_tcp command (``dial``, ``hangup``, ``sndcode``…) and baresip's answer."""
        assert self._writer is not None
        body = json.dumps({"command": command, "params": params, "token": command}).encode()
        self._writer.write(f"{len(body)}:".encode() + body + b",")
        await self._writer.drain()
        return await asyncio.wait_for(self._replies.get(), 10)

    def saw(self, kind: str) -> bool:
        return any(e.get("type") == kind for e in self.events)

    def heard(self) -> tuple[np.ndarray, int]:
        """What the phone played (its decoded audio, sndfile's dump), int16 and its rate."""
        files = sorted(self.dumps.glob("dump-*-dec.wav"))
        if not files:
            return np.zeros(0, np.int16), 48_000
        pcm, rate = sf.read(files[-1], dtype="int16")
        return (pcm if pcm.ndim == 1 else pcm[:, 0]), int(rate)

    async def stop(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.command("quit"), 2)
            self._writer.close()
        if self.process is not None and self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if hasattr(self, "log"):
            self.log.close()


def _free_tcp(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


@contextlib.asynccontextmanager
async def baresip(folder: Path, audio: Path, **kw: object) -> AsyncIterator[Baresip]:
    phone = Baresip(folder, audio, **kw)  # type: ignore[arg-type]
    await phone.start()
    try:
        yield phone
    finally:
        await phone.stop()
