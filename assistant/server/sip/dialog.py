"""A SIP dialog (RFC 3261 12): the peer-to-peer relationship one call is, and the requests we send within it.

A dialog is named by its Call-ID and the two tags; it keeps both CSeq counters, the peer's target (its Contact)
and the route set (Record-Route), and the flow the call came on: requests within the dialog go back on it (the
same UDP address, the same TCP connection while it is open), which is what reaches a peer behind NAT.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from assistant.server.sip.message import Headers, SipRequest, SipResponse, new_branch
from assistant.server.sip.transport import Flow
from assistant.server.sip.uri import NameAddress, SipURI

USER_AGENT = "assistant"


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local: NameAddress  # our From in requests we send (with our tag)
    remote: NameAddress  # their address, our To (with their tag)
    remote_target: SipURI  # where requests go: the peer's Contact
    flow: Flow
    contact: str  # our Contact value
    via_host: str  # our sent-by in Vias: the advertised address and port
    route_set: list[str] = field(default_factory=list)
    local_cseq: int = field(default_factory=lambda: secrets.randbelow(2**16) + 1)
    remote_cseq: int = 0
    allow: set[str] = field(default_factory=set)  # methods the peer said it takes (Allow)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.call_id, self.local_tag, self.remote_tag)

    @classmethod
    def as_uas(cls, invite: SipRequest, local_tag: str, flow: Flow, contact: str, via_host: str) -> Dialog:
        """The dialog an incoming INVITE creates (RFC 3261 12.1.1)."""
        peer = invite.contact
        target = peer.uri if peer is not None and peer.uri.is_sip else invite.from_.uri
        return cls(invite.call_id, local_tag, invite.from_.tag, invite.to.with_tag(local_tag), invite.from_, target,
                   flow, contact, via_host, invite.headers.get_all("Record-Route"), remote_cseq=invite.cseq.number,
                   allow=invite.values("Allow"))

    @classmethod
    def as_uac(cls, invite: SipRequest, answer: SipResponse, flow: Flow, contact: str, via_host: str) -> Dialog:
        """The dialog our INVITE's 2xx creates (RFC 3261 12.1.2): the route set is the Record-Route reversed."""
        peer = answer.contact
        target = peer.uri if peer is not None and peer.uri.is_sip else invite.uri
        return cls(invite.call_id, invite.from_.tag, answer.to.tag, invite.from_, answer.to, target, flow, contact,
                   via_host, list(reversed(answer.headers.get_all("Record-Route"))),
                   local_cseq=invite.cseq.number, allow=answer.values("Allow"))

    def request(self, method: str, body: bytes = b"", content_type: str = "",
                headers: Iterable[tuple[str, str]] = (), cseq: int | None = None) -> SipRequest:
        """A request within the dialog (RFC 3261 12.2.1.1); a new CSeq unless one is given (an ACK's)."""
        if cseq is None:
            self.local_cseq += 1
            cseq = self.local_cseq
        out = Headers()
        out.add("Via", f"SIP/2.0/{self.flow.transport.upper()} {self.via_host};branch={new_branch()};rport")
        out.add("Max-Forwards", "70")
        out.add("From", str(self.local))
        out.add("To", str(self.remote))
        out.add("Call-ID", self.call_id)
        out.add("CSeq", f"{cseq} {method}")
        for route in self.route_set:
            out.add("Route", route)
        out.add("Contact", self.contact)
        out.add("User-Agent", USER_AGENT)
        for name, value in headers:
            out.add(name, value)
        if body:
            out.add("Content-Type", content_type or "application/sdp")
        return SipRequest(method, self.remote_target, out, body)

    def in_order(self, request: SipRequest) -> bool:
        """A request's CSeq is past the last one seen (RFC 3261 12.2.2); an older one gets 500."""
        number = request.cseq.number
        if request.method in ("ACK", "CANCEL"):
            return True
        if self.remote_cseq and number <= self.remote_cseq:
            return False
        self.remote_cseq = number
        return True
