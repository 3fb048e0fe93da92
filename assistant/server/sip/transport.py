"""SIP's transports (RFC 3261 18): UDP datagrams, and TCP or TLS streams framed by Content-Length; the door every
message passes before it is read.

The door is hostile: a message is weighed before it is parsed. Without ``sip.password`` only the trunk and
``sip.allow_from`` may call, and a message from anywhere else is dropped unread; with it, each other source address
has a budget of messages a minute (``sip.messages_per_minute``; the trusted have none), a datagram or a message over
``sip.max_message_bytes`` is dropped unread, a stream that sends a head without its end (or a body past the cap)
is closed, connections are capped in all and per source, and an idle one is closed. What is dropped is counted
(``assistant_sip_dropped_total{reason}``), never logged one line per packet: a flood would flood the log too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from assistant.config import SIPConfig
from assistant.server.limits import RateLimiter
from assistant.server.sip.message import (
    SipParseError,
    SipRequest,
    SipResponse,
    content_length,
    parse_message,
    split_head,
)

log = logging.getLogger(__name__)

Address = tuple[str, int]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Received = Callable[[SipRequest | SipResponse, "Flow"], None]
Dropped = Callable[[str], None]
CONNECTION_SHARE = 4  # one source holds at most this share of sip.max_connections
WRITE_LIMIT = 256 * 1024  # bytes queued to a stream that does not read; past it the connection is closed
KEEPALIVE = b"\r\n\r\n"  # RFC 5626 4.4.1: a CRLF ping on a stream, answered by one CRLF
READ_CHUNK = 4096


class Door:
    """Who may send how much (see the module docstring): budgets per source address, and who is trusted."""

    def __init__(self, cfg: SIPConfig, trusted: list[Network]) -> None:
        self.trusted_networks = list(trusted)
        self.messages = RateLimiter(cfg.messages_per_minute)
        self.answers = RateLimiter(cfg.refusals_per_minute)
        # Without credentials only trusted sources may call (and every call, in or out, is with one of them):
        # a message from anywhere else is dropped before it is read.
        self.open = bool(cfg.password)

    def trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.trusted_networks)

    def admit(self, host: str) -> bool:
        """One more message from ``host`` is worth reading: it is trusted, or callers may authenticate and it is
        within its budget."""
        return self.trusted(host) or (self.open and self.messages.take(host) == 0.0)

    def may_answer(self, host: str) -> bool:
        """``host`` (not trusted, not known) may be told no once more this minute."""
        return self.trusted(host) or self.answers.take(host) == 0.0


@dataclass(eq=False)
class Connection:
    """One TCP or TLS stream to a peer."""

    transport: str  # tcp or tls
    remote: Address
    writer: asyncio.StreamWriter
    closed: bool = False

    def write(self, data: bytes) -> bool:
        if self.closed or self.writer.is_closing():
            return False
        if self.writer.transport.get_write_buffer_size() > WRITE_LIMIT:
            self.close()
            return False
        self.writer.write(data)
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.writer.close()


@dataclass(frozen=True, eq=False)
class Flow:
    """Where a message came from, and so where its answer (and, for a call, every later request) goes."""

    transport: str  # udp, tcp, tls
    remote: Address
    connection: Connection | None = field(default=None, compare=False)

    @property
    def reliable(self) -> bool:
        return self.transport != "udp"

    @property
    def host(self) -> str:
        return self.remote[0]


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransport) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str, int] | tuple[str, int, int, int]) -> None:
        self.owner.on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:  # an ICMP error for something we sent: nothing to do
        self.owner.drop("icmp_error")


class SipTransport:
    """The listening sockets and the streams we opened, one ``received`` callback for every message that passes."""

    def __init__(self, cfg: SIPConfig, door: Door, received: Received, dropped: Dropped,
                 tls: ssl.SSLContext | None = None) -> None:
        self.cfg = cfg
        self.door = door
        self.received = received
        self.drop = dropped
        self.tls = tls
        self.udp: asyncio.DatagramTransport | None = None
        self.servers: dict[str, asyncio.Server] = {}
        self.ports: dict[str, int] = {}
        self.connections: set[Connection] = set()
        self._per_source: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.cfg
        if "udp" in cfg.transports:
            transport, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self),
                                                               local_addr=(cfg.host, cfg.port))
            self.udp = transport
            self.ports["udp"] = transport.get_extra_info("sockname")[1]
        tcp_port = self.ports.get("udp", cfg.port)
        if "tcp" in cfg.transports:
            server = await asyncio.start_server(lambda r, w: self._accept(r, w, "tcp"), cfg.host, tcp_port)
            self.servers["tcp"] = server
            self.ports["tcp"] = server.sockets[0].getsockname()[1]
        if "tls" in cfg.transports:
            if self.tls is None:
                raise RuntimeError("SIP over TLS needs a certificate (sip.tls_cert or server.tls_cert)")
            server = await asyncio.start_server(lambda r, w: self._accept(r, w, "tls"), cfg.host, cfg.tls_port,
                                                ssl=self.tls)
            self.servers["tls"] = server
            self.ports["tls"] = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.udp is not None:
            self.udp.close()
            self.udp = None
        for server in self.servers.values():
            server.close()
        for conn in list(self.connections):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for server in self.servers.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.servers.clear()

    # --- in -----------------------------------------------------------------------------------------------------
    def on_datagram(self, data: bytes, remote: Address) -> None:
        if len(data) > self.cfg.max_message_bytes:
            self.drop("too_large")
            return
        if not data.strip(b"\r\n\x00 "):  # a keepalive (CRLF, or a zero byte some phones send): nothing to read
            return
        if not self.door.admit(remote[0]):
            self.drop("rate" if self.door.open else "not_allowed")
            return
        self._deliver(data, Flow("udp", remote), stream=False)

    def _deliver(self, data: bytes, flow: Flow, stream: bool) -> None:
        try:
            message = parse_message(data, stream=stream)
        except SipParseError as exc:
            self.drop("malformed")
            log.debug("sip_malformed from=%s:%d detail=%s", flow.remote[0], flow.remote[1], str(exc)[:120])
            return
        try:
            self.received(message, flow)
        except Exception:  # a fault in handling one message must not end the listener
            self.drop("handler_error")
            log.exception("sip_handler_failed from=%s:%d", flow.remote[0], flow.remote[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, transport: str) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        remote = (str(peer[0]), int(peer[1]))
        per_source = max(1, self.cfg.max_connections // CONNECTION_SHARE)
        if not self.door.open and not self.door.trusted(remote[0]):  # nothing it could send would be read
            self.drop("not_allowed")
            writer.close()
            return
        if (len(self.connections) >= self.cfg.max_connections
                or (self._per_source[remote[0]] >= per_source and not self.door.trusted(remote[0]))):
            self.drop("connections")
            writer.close()
            return
        conn = Connection(transport, remote, writer)
        await self._read_stream(conn, reader)

    async def _read_stream(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        """Read messages off one stream until it ends, is idle too long or breaks the framing."""
        self.connections.add(conn)
        self._per_source[conn.remote[0]] += 1
        flow = Flow(conn.transport, conn.remote, conn)
        buffer = b""
        try:
            while not conn.closed:
                if buffer[:2] == b"\r\n":  # CRLF keepalives between messages (RFC 5626): a double one is a ping
                    if buffer.startswith(KEEPALIVE):
                        conn.write(b"\r\n")
                        buffer = buffer[len(KEEPALIVE):]
                    elif len(buffer) < len(KEEPALIVE) and KEEPALIVE.startswith(buffer):
                        buffer = await self._read_more(reader, buffer)
                    else:
                        buffer = buffer[2:]
                    continue
                parts = split_head(buffer)
                if parts is None:
                    if len(buffer) > self.cfg.max_message_bytes:
                        self.drop("too_large")
                        break
                    buffer = await self._read_more(reader, buffer)
                    continue
                head, rest = parts
                try:
                    length = content_length(head) or 0
                except SipParseError:
                    self.drop("malformed")
                    break
                head_len = len(buffer) - len(rest)
                if head_len + length > self.cfg.max_message_bytes:
                    self.drop("too_large")
                    break
                while len(buffer) < head_len + length:
                    buffer = await self._read_more(reader, buffer)
                data, buffer = buffer[: head_len + length], buffer[head_len + length :]
                if not self.door.admit(conn.remote[0]):
                    self.drop("rate" if self.door.open else "not_allowed")
                    continue
                self._deliver(data, flow, stream=True)
        except (EOFError, ConnectionError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            conn.close()
            self.connections.discard(conn)
            self._per_source[conn.remote[0]] -= 1
            if self._per_source[conn.remote[0]] <= 0:
                del self._per_source[conn.remote[0]]

    async def _read_more(self, reader: asyncio.StreamReader, buffer: bytes) -> bytes:
        async with asyncio.timeout(self.cfg.connection_idle_s):
            chunk = await reader.read(READ_CHUNK)
        if not chunk:
            raise EOFError
        return buffer + chunk

    # --- out ----------------------------------------------------------------------------------------------------
    def send(self, message: SipRequest | SipResponse, flow: Flow) -> bool:
        """Send on ``flow``: a datagram to its address, or on its connection (False if that is gone)."""
        data = message.encode()
        if flow.transport == "udp":
            if self.udp is None:
                return False
            self.udp.sendto(data, flow.remote)
            return True
        return flow.connection is not None and flow.connection.write(data)

    async def connect(self, transport: str, remote: Address, server_name: str = "") -> Flow:
        """A flow to ``remote``: UDP from our listening socket, or a new TCP/TLS connection (read like any other)."""
        if transport == "udp":
            if self.udp is None:
                raise OSError("SIP over UDP is not listening (sip.transports)")
            return Flow("udp", remote)
        context: ssl.SSLContext | None = None
        if transport == "tls":
            context = ssl.create_default_context()
        reader, writer = await asyncio.open_connection(remote[0], remote[1], ssl=context,
                                                       server_hostname=server_name or None)
        conn = Connection(transport, remote, writer)
        task = asyncio.get_running_loop().create_task(self._read_stream(conn, reader), name=f"sip-{transport}-out")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return Flow(transport, remote, conn)

    def local_port(self, transport: str) -> int:
        return self.ports.get(transport) or self.ports.get("udp") or self.cfg.port
