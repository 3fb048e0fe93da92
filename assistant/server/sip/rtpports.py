"""The RTP port range (``sip.rtp_port_min`` to ``rtp_port_max``): each call takes an even port for RTP and the next
one for RTCP, and gives both back when it ends, whatever ends it.

A port another program holds is skipped (the range is shared with whatever else runs on the machine); ports are
handed out round the range so that a port just freed is not taken again at once (a late packet of the old call
then finds nobody). :attr:`RtpPorts.in_use` is what the tests check is empty after calls end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

MakeProtocol = Callable[[], asyncio.DatagramProtocol]


class NoPorts(Exception):
    """Every pair of the range is taken."""


class RtpPorts:
    def __init__(self, host: str, low: int, high: int) -> None:
        self.host = host
        self.low = low + (low % 2)  # RTP on even ports (RFC 3550 11)
        self.high = high
        self.in_use: set[int] = set()
        self._next = self.low

    @property
    def capacity(self) -> int:
        return max(0, (self.high - self.low + 1) // 2)

    async def bind(self, rtp: MakeProtocol, rtcp: MakeProtocol | None
                   ) -> tuple[int, asyncio.DatagramTransport, asyncio.DatagramTransport | None]:
        """The next free pair bound to ``rtp()`` and ``rtcp()`` (None under rtcp-mux: the pair's odd port is still
        held, unbound): (port, RTP transport, RTCP transport)."""
        loop = asyncio.get_running_loop()
        for _ in range(self.capacity):
            port = self._next
            self._next = self._next + 2 if self._next + 3 <= self.high else self.low
            if port in self.in_use:
                continue
            try:
                rtp_transport, _ = await loop.create_datagram_endpoint(rtp, local_addr=(self.host, port))
            except OSError:
                continue
            rtcp_transport: asyncio.DatagramTransport | None = None
            if rtcp is not None:
                try:
                    rtcp_transport, _ = await loop.create_datagram_endpoint(rtcp, local_addr=(self.host, port + 1))
                except OSError:
                    rtp_transport.close()
                    continue
            self.in_use.add(port)
            return port, rtp_transport, rtcp_transport
        raise NoPorts(f"no free RTP port pair in {self.low}-{self.high}")

    def release(self, port: int, *transports: asyncio.DatagramTransport | None) -> None:
        for transport in transports:
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
        self.in_use.discard(port)
