"""Outgoing calls: the server dials a number or a SIP URI through the configured trunk and puts the assistant on the
line (``POST /api/sip/calls``, ``api.py``).

Toll fraud is the classic attack on a SIP server, so nothing is dialed without ``sip.trunk`` and a destination that
``sip.dial_allow`` names (exactly, or up to a trailing ``*``); the key that asks needs the ``dial`` scope (or is
the admin's), spends the per-client ``dial`` budget, and at most ``sip.max_dialing`` calls ring at once.

An :class:`OutgoingCall` is the record of one: its events as they happen (``dialing``, ``ringing``, then the
result: ``answered`` with the session id, ``busy``, ``no_answer`` or ``failed`` with the SIP status, and
``ended`` when an answered call ends), which ``GET /api/sip/calls/{id}`` and its event stream give to the key that
dialed. The INVITE carries our SDP offer; a 401/407 from the trunk is answered once with
``sip.trunk_username``/``trunk_password``; past ``sip.ring_timeout_s`` a ringing call is cancelled. Answered, the
call is a session like an incoming one, owned by the key that dialed it. Its ports are freed however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from assistant.server.http import HTTPJSONError
from assistant.server.sip.call import SipCall
from assistant.server.sip.dialog import USER_AGENT, Dialog
from assistant.server.sip.digest import authorization, pick_challenge
from assistant.server.sip.message import Headers, SipRequest, SipResponse, new_branch, new_call_id, new_tag
from assistant.server.sip.rtpports import NoPorts
from assistant.server.sip.rtpsession import RtpSession, codec_rate
from assistant.server.sip.sdp import LocalDescription, SdpError, negotiate, offer_codecs, parse_sdp
from assistant.server.sip.transaction import TIMEOUT, ClientTransaction, Outcome
from assistant.server.sip.transport import Flow
from assistant.server.sip.uri import AddressError, SipURI, parse_uri
from assistant.server.sip.useragent import ALLOW, SUPPORTED, UserAgent, offer_crypto, session_timer, with_auth
from assistant.server.voice.signaling import SESSIONS, Caller, check_held

log = logging.getLogger(__name__)

NUMBER = re.compile(r"\+?[0-9*#]{1,32}")
RECORDS_KEPT = 256  # outgoing calls remembered (their events), the oldest finished ones forgotten first
BUSY = {486, 600, 603}
NO_ANSWER = {408, 480, 487}
FINAL = ("busy", "no_answer", "failed", "ended")


@dataclass
class OutgoingCall:
    """One outgoing call's record: who dialed it, where, and what happened (its events, in order)."""

    id: str
    owner: str
    to: str
    created: float = field(default_factory=time.time)
    state: str = "dialing"
    status: int | None = None
    session_id: str = ""
    events: list[dict[str, object]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def emit(self, kind: str, **fields: object) -> None:
        self.state = kind if kind != "ringing" or self.state == "dialing" else self.state
        self.events.append({"type": kind, "at": round(time.time(), 3), **fields})
        self.changed.set()
        log.info("sip_dial_event call=%s type=%s%s", self.id, kind,
                 "".join(f" {k}={v}" for k, v in fields.items()))

    @property
    def finished(self) -> bool:
        return self.state in FINAL

    def describe(self) -> dict[str, object]:
        return {"call_id": self.id, "to": self.to, "state": self.state, "status": self.status,
                "session_id": self.session_id or None, "created": round(self.created, 3), "events": self.events}


def destination(to: str, allow: list[str], trunk: SipURI) -> SipURI:
    """The Request-URI for ``to`` (a number through the trunk, or a SIP URI), if ``sip.dial_allow`` allows it;
    ValueError saying why not."""
    to = to.strip()
    if NUMBER.fullmatch(to):
        key = to
        uri = SipURI(trunk.scheme, to, trunk.host, trunk.port,
                     {"transport": trunk.params["transport"]} if "transport" in trunk.params else {})
    else:
        try:
            uri = parse_uri(to)
        except AddressError as exc:
            raise ValueError(f"'to' must be a number (+15551234567) or a SIP URI: {exc}") from None
        if not uri.is_sip or uri.headers or uri.password:
            raise ValueError("'to' must be a sip: or sips: URI without headers or a password")
        key = str(uri).lower()
    for pattern in allow:
        pattern = pattern.strip()
        if pattern.endswith("*") and key.startswith(pattern[:-1].lower() if not NUMBER.fullmatch(to) else
                                                    pattern[:-1]):
            return uri
        if key == (pattern if NUMBER.fullmatch(to) else pattern.lower()):
            return uri
    raise ValueError("this destination is not in sip.dial_allow")


class Dialer:
    """The outgoing calls of one gateway (see the module docstring)."""

    def __init__(self, agent: UserAgent, trunk: SipURI | None, trunk_address: tuple[str, int] | None) -> None:
        self.agent = agent
        self.cfg = agent.cfg
        self.trunk = trunk
        self.trunk_address = trunk_address
        self.records: OrderedDict[str, OutgoingCall] = OrderedDict()

    @property
    def dialing(self) -> int:
        return sum(1 for r in self.records.values() if r.state in ("dialing", "ringing"))

    def start(self, to: str, caller: Caller, responder: str | None = None, voice: str | None = None,
              language: str | None = None) -> OutgoingCall:
        """Check and start one outgoing call (HTTPJSONError when refused); its record is returned at once."""
        sip = self.cfg.sip
        if self.trunk is None or self.trunk_address is None:
            raise HTTPJSONError(409, "no_trunk", "outgoing calls need sip.trunk")
        try:
            target = destination(to, sip.dial_allow, self.trunk)
        except ValueError as exc:
            self.agent.metrics.sip_calls_total.labels(direction="outbound", outcome="refused").inc()
            raise HTTPJSONError(403, "destination_refused", str(exc)) from None
        check_held(self.agent.app, caller)
        if self.dialing >= sip.max_dialing:
            raise HTTPJSONError(503, "busy", f"{sip.max_dialing} outgoing calls are ringing already",
                                headers={"Retry-After": "5"})
        if len(self.agent.app[SESSIONS]) + self.dialing >= self.cfg.server.max_sessions:
            raise HTTPJSONError(503, "busy", "every session slot is taken", headers={"Retry-After": "5"})
        record = OutgoingCall(secrets.token_urlsafe(12), caller.owner, to.strip())
        self.records[record.id] = record
        while len(self.records) > RECORDS_KEPT:
            oldest = next((k for k, r in self.records.items() if r.finished), None)
            if oldest is None:
                break
            del self.records[oldest]
        record.emit("dialing", to=record.to)
        self.agent.spawn(self._dial(record, target, caller, responder, voice, language), f"sip-dial-{record.id}")
        return record

    async def _dial(self, record: OutgoingCall, target: SipURI, caller: Caller, responder: str | None,
                    voice: str | None, language: str | None) -> None:
        agent, sip = self.agent, self.cfg.sip
        assert self.trunk is not None and self.trunk_address is not None
        rtp = agent.new_rtp()
        answered = False
        try:
            try:
                port = await rtp.open()
            except NoPorts:
                record.emit("failed", reason="no_ports")
                return
            flow = await agent.transport.connect(self.trunk.transport, self.trunk_address, self.trunk.host)
            local = LocalDescription(agent.advertised(flow.host), port, secrets.randbelow(2**31),
                                     crypto=offer_crypto(rtp, sip.srtp))
            invite = self._invite(target, flow, local.render(offer_codecs(sip.codecs)))
            outcome, invite = await self._invite_through(invite, flow, record)
            answer = outcome.response
            if answer is None or not 200 <= answer.status < 300:
                self._result(record, outcome)
                return
            dialog = Dialog.as_uac(invite, answer, flow, agent.contact(flow), agent.via_host(flow))
            ack = dialog.request("ACK", cseq=invite.cseq.number)
            agent.transport.send(ack, flow)
            call = self._answered(record, dialog, ack, answer, rtp, local, caller, responder, voice, language)
            if call is None:
                return
            answered = True
            closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            def on_event(event: dict[str, object]) -> None:
                if event.get("type") == "close" and not closed.done():
                    closed.set_result(str(event.get("reason", "")))

            call.events.subscribe(on_event)
            record.emit("ended", reason=await closed)
        except (OSError, TimeoutError) as exc:
            record.status = None
            record.emit("failed", reason=f"unreachable: {type(exc).__name__}")
        finally:
            if not answered:
                rtp.close()

    def _invite(self, target: SipURI, flow: Flow, sdp: str) -> SipRequest:
        agent, sip = self.agent, self.cfg.sip
        ours = agent.advertised(flow.host)
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{flow.transport.upper()} {agent.via_host(flow)};branch={new_branch()};rport")
        headers.add("Max-Forwards", "70")
        headers.add("From", f"<sip:{sip.user}@{ours}>;tag={new_tag()}")
        headers.add("To", f"<{target}>")
        headers.add("Call-ID", new_call_id(ours))
        headers.add("CSeq", f"{secrets.randbelow(2**16) + 1} INVITE")
        headers.add("Contact", agent.contact(flow))
        headers.add("Allow", ALLOW)
        headers.add("Supported", SUPPORTED)
        headers.add("Session-Expires", f"{sip.session_expires_s};refresher=uac")
        headers.add("User-Agent", USER_AGENT)
        headers.add("Content-Type", "application/sdp")
        return SipRequest("INVITE", target, headers, sdp.encode())

    async def _invite_through(self, invite: SipRequest, flow: Flow, record: OutgoingCall
                              ) -> tuple[Outcome, SipRequest]:
        """Send the INVITE (answering one challenge), ring up to ``sip.ring_timeout_s``, then CANCEL it; the final
        outcome and the INVITE it answers."""
        sip, agent = self.cfg.sip, self.agent
        deadline = time.monotonic() + sip.ring_timeout_s

        def provisional(resp: SipResponse) -> None:
            if resp.status in (180, 183) and record.state == "dialing":
                record.emit("ringing", status=resp.status)

        outcome = Outcome(None, "timeout")
        for attempt in range(2):
            tx = agent.client_tx.start(invite, flow, provisional)
            outcome = await self._ring(tx, deadline)
            answer = outcome.response
            if attempt == 0 and answer is not None and answer.status in (401, 407) and sip.trunk_username:
                header = "WWW-Authenticate" if answer.status == 401 else "Proxy-Authenticate"
                challenge = pick_challenge(answer.headers.get_all(header))
                value = (authorization(challenge, "INVITE", str(invite.uri), sip.trunk_username, sip.trunk_password)
                         if challenge else None)
                if value is not None:
                    invite = with_auth(invite, "Authorization" if answer.status == 401 else "Proxy-Authorization",
                                       value)
                    continue
            break
        return outcome, invite

    async def _ring(self, tx: ClientTransaction, deadline: float) -> Outcome:
        """The INVITE's final response; past the deadline a CANCEL (once it rang) and then the 487."""
        try:
            return await asyncio.wait_for(asyncio.shield(tx.done), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            pass
        if tx.provisional:
            cancel = cancel_of(tx.request)
            self.agent.client_tx.start(cancel, tx.flow)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(tx.done), TIMEOUT)
        except TimeoutError:
            outcome = Outcome(None, "timeout")
        if outcome.response is None or outcome.response.status == 487:
            return Outcome(outcome.response, "ring_timeout")
        return outcome

    def _result(self, record: OutgoingCall, outcome: Outcome) -> None:
        answer = outcome.response
        status = answer.status if answer is not None else None
        record.status = status
        if status in BUSY:
            kind = "busy"
        elif status in NO_ANSWER or outcome.error == "ring_timeout":
            kind = "no_answer"
        else:
            kind = "failed"
        self.agent.metrics.sip_calls_total.labels(direction="outbound", outcome=kind).inc()
        record.emit(kind, status=status, reason=(answer.reason if answer is not None else outcome.error))

    def _answered(self, record: OutgoingCall, dialog: Dialog, ack: SipRequest, answer: SipResponse,
                  rtp: RtpSession, local: LocalDescription, caller: Caller, responder: str | None,
                  voice: str | None, language: str | None) -> SipCall | None:
        """The callee answered: the call becomes a session (or is hung up if its answer cannot be used)."""
        agent, sip = self.agent, self.cfg.sip
        record.status = answer.status

        def hang_up(reason: str) -> None:
            agent.client_tx.start(dialog.request("BYE", headers=[("Reason", f'SIP;cause=200;text="{reason}"')]),
                                  dialog.flow)
            agent.metrics.sip_calls_total.labels(direction="outbound", outcome="failed").inc()
            record.emit("failed", status=answer.status, reason=reason)

        try:
            chosen = negotiate(parse_sdp(answer.body.decode("utf-8")), sip.codecs, offer=False, srtp=sip.srtp)
        except (SdpError, UnicodeDecodeError):
            hang_up("no_codec")
            return None
        try:
            call = agent.admit(codec_rate(chosen.codec), caller.client, caller=caller, responder=responder,
                               voice=voice)
        except HTTPJSONError:
            hang_up("busy_here")
            return None
        call.direction = "outbound"
        agent.bind(call, dialog, record.to, rtp)
        call.local, call.ack, call.acked = local, ack, True
        if language:
            call.conversation.set_language(language)
        rtp.configure(chosen, dialog.flow.host)
        expires, refresher = session_timer(answer.headers.get("Session-Expires"))
        if expires:
            call.session_expires, call.we_refresh = expires, refresher != "uas"
        agent.start_media(call)
        record.session_id = call.id
        agent.metrics.sip_calls_total.labels(direction="outbound", outcome="answered").inc()
        record.emit("answered", status=answer.status, session_id=call.id)
        log.info("sip_call_open session=%s direction=outbound to=%s codec=%s port=%d", call.id, record.to[:120],
                 chosen.codec.rtpmap, rtp.port)
        return call


def cancel_of(invite: SipRequest) -> SipRequest:
    """The CANCEL of a pending INVITE (RFC 3261 9.1): its Request-URI, top Via, From, To, Call-ID, Route."""
    headers = Headers()
    headers.add("Via", invite.headers.get("Via") or "")
    headers.add("Max-Forwards", "70")
    for name in ("From", "To", "Call-ID"):
        headers.add(name, invite.headers.get(name) or "")
    headers.add("CSeq", f"{invite.cseq.number} CANCEL")
    for route in invite.headers.get_all("Route"):
        headers.add("Route", route)
    return SipRequest("CANCEL", invite.uri, headers)


def resolve(uri: SipURI) -> tuple[str, int]:
    """The trunk's address (A/AAAA; SRV and NAPTR are not looked up) and port (5060, or 5061 for TLS)."""
    port = uri.port or (5061 if uri.transport == "tls" else 5060)
    infos = socket.getaddrinfo(uri.host, port, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"{uri.host} does not resolve")
    return str(infos[0][4][0]), port
