"""SIP transactions (RFC 3261 17): a request and its responses, made reliable over UDP by retransmission.

- :class:`ServerTransaction`: a request we answer. A retransmitted request gets the last response again; over UDP
  an INVITE's final response is sent again (T1, doubling to T2) until its ACK comes or 64·T1 passes (for a 2xx
  that is RFC 3261 13.3.1.4's rule for the UA core, kept here in one place: the ACK of a 2xx is matched by its
  dialog, which tells the transaction). A non-INVITE's final response is remembered 64·T1 for retransmissions.
- :class:`ClientTransaction`: a request we send (INVITE, BYE, re-INVITE, UPDATE, REGISTER, CANCEL). Over UDP it
  is sent again (timer A/E) until a response; it fails with a timeout after 64·T1 (timer B/F). An INVITE's
  non-2xx final response is ACKed here.

Both tables are bounded (``sip.max_transactions``): past it a new request is dropped, never an old one's state.
Every timer is a loop handle the transaction cancels when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from assistant.server.sip.message import MAGIC_COOKIE, Headers, SipRequest, SipResponse
from assistant.server.sip.transport import Flow

log = logging.getLogger(__name__)

T1 = 0.5  # RTT estimate (RFC 3261 17.1.1.1)
T2 = 4.0  # the longest retransmit interval for non-INVITE requests and INVITE responses
TIMEOUT = 64 * T1  # timers B, F, H, J: 32 s
Send = Callable[[SipRequest | SipResponse, Flow], bool]


def server_key(request: SipRequest) -> tuple[str, ...]:
    """What matches a request to its server transaction (RFC 3261 17.2.3): the branch and sent-by of the top Via
    and the method (ACK matches its INVITE); for an old branch, the Call-ID, From tag, CSeq and Via instead."""
    via = request.top_via
    method = "INVITE" if request.method == "ACK" else request.method
    if via.branch.startswith(MAGIC_COOKIE):
        return (via.branch, via.sent_by, method)
    return (request.call_id, request.from_.tag, str(request.cseq.number), via.sent_by, method)


class ServerTransaction:
    def __init__(self, table: ServerTransactions, key: tuple[str, ...], request: SipRequest, flow: Flow) -> None:
        self.table, self.key, self.request, self.flow = table, key, request, flow
        self.invite = request.method == "INVITE"
        self.last: SipResponse | None = None
        self.acked = False
        self.cancelled = False  # a CANCEL came for this INVITE
        self._timer: asyncio.TimerHandle | None = None
        self._interval = T1
        self._expire: asyncio.TimerHandle | None = None

    @property
    def final(self) -> bool:
        return self.last is not None and self.last.status >= 200

    def respond(self, response: SipResponse) -> None:
        """Send a response; a final one ends the transaction after its retransmissions (or at once)."""
        if self.final:  # one final response per transaction
            return
        self.last = response
        self.table.send(response, self.flow)
        if response.status < 200:
            return
        loop = asyncio.get_running_loop()
        self._expire = loop.call_later(TIMEOUT, self._timeout)
        if self.invite and not self.flow.reliable:
            self._timer = loop.call_later(self._interval, self._retransmit)
        elif not self.invite and self.flow.reliable:
            self.finish()

    def retransmission(self) -> None:
        """The same request came again: send the last response again (nothing yet: the 100 is implied)."""
        if self.last is not None:
            self.table.send(self.last, self.flow)

    def on_ack(self) -> None:
        """The ACK of our final response: stop sending it again."""
        self.acked = True
        self.finish()

    def _retransmit(self) -> None:
        if self.last is None or self.acked:
            return
        self.table.send(self.last, self.flow)
        self._interval = min(self._interval * 2, T2)
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._retransmit)

    def _timeout(self) -> None:
        if self.invite and not self.acked and self.table.on_ack_timeout is not None:
            self.table.on_ack_timeout(self)
        self.finish()

    def finish(self) -> None:
        for handle in (self._timer, self._expire):
            if handle is not None:
                handle.cancel()
        self._timer = self._expire = None
        if self.table.entries.get(self.key) is self:
            del self.table.entries[self.key]


class ServerTransactions:
    def __init__(self, send: Send, limit: int) -> None:
        self.send = send
        self.limit = limit
        self.entries: dict[tuple[str, ...], ServerTransaction] = {}
        self.on_ack_timeout: Callable[[ServerTransaction], None] | None = None

    def find(self, request: SipRequest) -> ServerTransaction | None:
        return self.entries.get(server_key(request))

    def find_invite(self, cancel: SipRequest) -> ServerTransaction | None:
        """The INVITE transaction a CANCEL names (the same branch and sent-by)."""
        key = server_key(cancel)
        return self.entries.get((*key[:-1], "INVITE"))

    def create(self, request: SipRequest, flow: Flow) -> ServerTransaction | None:
        """A transaction for a new request; None when the table is full (the request is dropped)."""
        if len(self.entries) >= self.limit:
            return None
        key = server_key(request)
        tx = ServerTransaction(self, key, request, flow)
        self.entries[key] = tx
        return tx

    def close(self) -> None:
        for tx in list(self.entries.values()):
            tx.finish()


@dataclass
class Outcome:
    """A client transaction's end: its final response, or why none came (``timeout``, ``unreachable``)."""

    response: SipResponse | None
    error: str = ""


class ClientTransaction:
    def __init__(self, table: ClientTransactions, request: SipRequest, flow: Flow,
                 on_provisional: Callable[[SipResponse], None] | None = None) -> None:
        self.table, self.request, self.flow = table, request, flow
        self.invite = request.method == "INVITE"
        self.branch = request.top_via.branch
        self.on_provisional = on_provisional
        self.done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.provisional = False
        self._interval = T1
        self._timer: asyncio.TimerHandle | None = None
        self._expire: asyncio.TimerHandle | None = None
        self._ack: SipRequest | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if not self.table.send(self.request, self.flow):
            self._end(Outcome(None, "unreachable"))
            return
        if not self.flow.reliable:
            self._timer = loop.call_later(self._interval, self._retransmit)
        self._expire = loop.call_later(TIMEOUT, lambda: self._end(Outcome(None, "timeout")))

    def _retransmit(self) -> None:
        if self.done.done() or (self.invite and self.provisional):
            return
        self.table.send(self.request, self.flow)
        self._interval = min(self._interval * 2, T2) if not self.invite else self._interval * 2
        if not self.invite and self.provisional:
            self._interval = T2
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._retransmit)

    def on_response(self, response: SipResponse) -> None:
        if response.status < 200:
            self.provisional = True
            if self.on_provisional is not None and not self.done.done():
                self.on_provisional(response)
            return
        if self.invite and response.status >= 300:  # RFC 3261 17.1.1.3: the transaction ACKs a failure
            if self._ack is None:
                self._ack = failure_ack(self.request, response)
            self.table.send(self._ack, self.flow)
        if not self.done.done():
            self._end(Outcome(response))

    def _end(self, outcome: Outcome) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.done.set_result(outcome)
        # Kept a while for a retransmitted final response (its ACK is sent again); then forgotten.
        if self._expire is not None:
            self._expire.cancel()
        linger = 0.0 if self.flow.reliable or not self.invite else TIMEOUT
        self._expire = asyncio.get_running_loop().call_later(linger, self.forget)

    def forget(self) -> None:
        for handle in (self._timer, self._expire):
            if handle is not None:
                handle.cancel()
        self._timer = self._expire = None
        key = (self.branch, self.request.method)
        if self.table.entries.get(key) is self:
            del self.table.entries[key]


class ClientTransactions:
    def __init__(self, send: Send, limit: int) -> None:
        self.send = send
        self.limit = limit
        self.entries: dict[tuple[str, str], ClientTransaction] = {}

    def start(self, request: SipRequest, flow: Flow,
              on_provisional: Callable[[SipResponse], None] | None = None) -> ClientTransaction:
        tx = ClientTransaction(self, request, flow, on_provisional)
        if len(self.entries) >= self.limit:
            tx.done.set_result(Outcome(None, "busy"))
            return tx
        self.entries[(tx.branch, request.method)] = tx
        tx.start()
        return tx

    def match(self, response: SipResponse) -> ClientTransaction | None:
        try:
            key = (response.top_via.branch, response.cseq.method)
        except ValueError:
            return None
        return self.entries.get(key)

    def close(self) -> None:
        for tx in list(self.entries.values()):
            if not tx.done.done():
                tx.done.set_result(Outcome(None, "closed"))
            tx.forget()


def failure_ack(invite: SipRequest, response: SipResponse) -> SipRequest:
    """The ACK of a failed INVITE (RFC 3261 17.1.1.3): the INVITE's Request-URI, top Via, From, Call-ID, CSeq number
    and Route, the response's To."""
    headers = Headers()
    headers.add("Via", invite.headers.get("Via") or "")
    headers.add("Max-Forwards", "70")
    headers.add("From", invite.headers.get("From") or "")
    headers.add("To", response.headers.get("To") or "")
    headers.add("Call-ID", invite.call_id)
    headers.add("CSeq", f"{invite.cseq.number} ACK")
    for route in invite.headers.get_all("Route"):
        headers.add("Route", route)
    return SipRequest("ACK", invite.uri, headers)
