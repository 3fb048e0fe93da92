"""The server's SIP user agent (RFC 3261 8, 12-15): every message that passes the door (``transport.py``) comes
here, and every request we send leaves from here.

Who may call: a source in ``sip.allow_from`` (or the trunk's own address) as it is; anyone else only with digest
credentials (``digest.py``), and only when ``sip.password`` is set. An INVITE from a source that may not call gets
nothing back (a scanner learns nothing), or with credentials configured a stateless 401 within the source's
``sip.refusals_per_minute``: no transaction, no dialog, no port, no task is kept for it, so a flood costs a parse
and an HMAC per message. An OPTIONS or REGISTER from an unknown source is dropped the same way.

An INVITE that may call becomes a :class:`~assistant.server.sip.call.SipCall`: admitted as a session (486 when
every slot is taken), a port pair from the range, the SDP answer (488 when no codec fits), 180 while
``sip.ring_ms`` rings, 200 sent until its ACK. Within the dialog: BYE, CANCEL before the answer, re-INVITE and
UPDATE (hold, a codec change, session refreshes), INFO (key presses), OPTIONS. The session timer (RFC 4028) is
kept both ways: we refresh when we are the refresher, and hang up a peer that stops refreshing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING

from aiohttp.helpers import ChainMapProxy

from assistant.config import Config
from assistant.rtc.outbound import ReplyTrack
from assistant.server.http import CONFIG, HTTPJSONError
from assistant.server.services import SERVICES
from assistant.server.sip.call import PEER_ENDED, SipCall, log_turn
from assistant.server.sip.dialog import USER_AGENT, Dialog
from assistant.server.sip.digest import DigestServer, authorization, pick_challenge
from assistant.server.sip.dtmf import relay_digit
from assistant.server.sip.message import (
    Headers,
    SipRequest,
    SipResponse,
    new_tag,
    response,
)
from assistant.server.sip.rtpports import NoPorts, RtpPorts
from assistant.server.sip.rtpsession import RTCP_INTERVAL_S, RtpSession, codec_rate
from assistant.server.sip.sdp import (
    OURS,
    SRTP_SUITES,
    Crypto,
    LocalDescription,
    Negotiated,
    SdpError,
    SessionDescription,
    answer_codecs,
    negotiate,
    offer_codecs,
    parse_sdp,
)
from assistant.server.sip.transaction import ClientTransactions, Outcome, ServerTransaction, ServerTransactions
from assistant.server.sip.transport import Door, Flow, SipTransport
from assistant.server.voice.session import language_choices
from assistant.server.voice.signaling import SESSIONS, Caller, admit

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE, INFO"
SUPPORTED = "timer"
NOT_HERE = frozenset({"REFER", "MESSAGE", "SUBSCRIBE", "NOTIFY", "PRACK", "PUBLISH"})  # known, not taken: 405
IN_DIALOG = frozenset({"BYE", "INFO", "UPDATE"})  # outside a dialog: 481
RETRY_PENDING_S = (0.5, 2.0)  # after a 491 our refresh is sent again this long later (RFC 3261 14.1)


def offer_crypto(rtp: RtpSession, mode: str) -> list[Crypto]:
    """Our SDES keys for an offer: one per suite when ``sip.srtp`` is required, none otherwise (plain RTP)."""
    return [Crypto(str(tag), suite, rtp.local_key) for tag, suite in enumerate(SRTP_SUITES, 1)] if (
        mode == "required") else []


def session_timer(value: str | None) -> tuple[int, str]:
    """``Session-Expires: 1800;refresher=uac`` → (1800, "uac"); (0, "") when absent or malformed."""
    if not value:
        return 0, ""
    number, _, params = value.partition(";")
    number = number.strip()
    if not number.isdigit() or len(number) > 9:
        return 0, ""
    refresher = ""
    for part in params.split(";"):
        name, _, val = part.partition("=")
        if name.strip().lower() == "refresher":
            refresher = val.strip().lower()
    return int(number), refresher if refresher in ("uac", "uas") else ""


class UserAgent:
    """See the module docstring. One per gateway, made by ``state.SipService``."""

    def __init__(self, app: web.Application | ChainMapProxy, transport: SipTransport, door: Door,
                 ports: RtpPorts) -> None:
        self.app = app
        self.cfg: Config = app[CONFIG]
        self.services = app[SERVICES]
        self.metrics = self.services.metrics
        self.transport = transport
        self.door = door
        self.ports = ports
        sip = self.cfg.sip
        self.digest = DigestServer(sip.realm, sip.username, sip.password, algorithms=tuple(sip.digest_algorithms))
        self.server_tx = ServerTransactions(transport.send, sip.max_transactions)
        self.server_tx.on_ack_timeout = self._ack_timeout
        self.client_tx = ClientTransactions(transport.send, sip.max_transactions)
        self.calls: dict[tuple[str, str, str], SipCall] = {}
        self._routes: dict[str, str] = {}  # peer address → our address toward it (sip.host 0.0.0.0)
        self._tasks: set[asyncio.Task[object]] = set()

    # --- our addresses --------------------------------------------------------------------------------------
    def advertised(self, peer: str = "") -> str:
        """The address a peer reaches us at: ``sip.advertised_address``, else ``sip.host``, else (bound to every
        interface) the one the system routes toward the peer."""
        sip = self.cfg.sip
        if sip.advertised_address:
            return sip.advertised_address
        if sip.host not in ("0.0.0.0", "::", ""):
            return sip.host
        if peer not in self._routes:
            if len(self._routes) > 1024:
                self._routes.clear()
            family = socket.AF_INET6 if ":" in peer else socket.AF_INET
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as probe:
                    probe.connect((peer or "192.0.2.1", 9))
                    self._routes[peer] = probe.getsockname()[0]
            except OSError:
                self._routes[peer] = "127.0.0.1"
        return self._routes[peer]

    def via_host(self, flow: Flow) -> str:
        host = self.advertised(flow.host)
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self.transport.local_port(flow.transport)}"

    def contact(self, flow: Flow) -> str:
        """Our Contact on ``flow``: ``sip:`` with ``;transport=`` also over TLS (baresip 1.0, measured, ends a call
        whose Contact is a ``sips:`` URI: "Function not implemented"; most PBXes write TLS contacts so too)."""
        param = "" if flow.transport == "udp" else f";transport={flow.transport}"
        return f"<sip:{self.cfg.sip.user}@{self.via_host(flow)}{param}>"

    # --- tasks ------------------------------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[object, object, object], name: str) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("sip_task_failed task=%s error=%r", task.get_name(), task.exception())

    async def close(self) -> None:
        for call in list(self.calls.values()):
            with contextlib.suppress(Exception):
                await call.close("server_shutdown")
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.server_tx.close()
        self.client_tx.close()

    # --- counting ---------------------------------------------------------------------------------------------
    def dropped(self, reason: str) -> None:
        self.metrics.sip_dropped_total.labels(reason=reason).inc()

    def refused(self, reason: str, host: str, method: str = "INVITE") -> None:
        self.metrics.telephony_refusals_total.labels(carrier="sip", reason=reason).inc()
        log.debug("sip_refused from=%s method=%s reason=%s", host, method, reason)

    def stateless(self, request: SipRequest, flow: Flow, status: int, headers: list[tuple[str, str]] | None = None
                  ) -> None:
        """A final answer that keeps no state (the request's retransmissions get it again the same way)."""
        self.transport.send(response(request, status, to_tag=new_tag(), headers=headers or []), flow)

    def known(self, flow: Flow) -> bool:
        """A source we answer when it asks what we cannot do: trusted, or (with credentials configured) within its
        budget of refusals."""
        return self.door.trusted(flow.host) or (self.digest.enabled and self.door.may_answer(flow.host))

    def no_such_transaction(self, request: SipRequest, flow: Flow) -> None:
        """A CANCEL or in-dialog request for nothing we hold: 481 to a source we answer, silence to the others."""
        if self.known(flow):
            self.stateless(request, flow, 481)
        else:
            self.dropped("not_allowed")

    def transaction(self, request: SipRequest, flow: Flow) -> ServerTransaction | None:
        """A server transaction for ``request``, or None (counted as dropped) when the table of them is full."""
        tx = self.server_tx.create(request, flow)
        if tx is None:
            self.dropped("transactions")
        return tx

    # --- in -------------------------------------------------------------------------------------------------------
    def received(self, message: SipRequest | SipResponse, flow: Flow) -> None:
        if isinstance(message, SipResponse):
            self.on_response(message, flow)
            return
        if message.method == "ACK":
            self.on_ack(message)
            return
        tx = self.server_tx.find(message)
        if tx is not None:
            tx.retransmission()
            return
        if message.to.tag:
            self.in_dialog(message, flow)
        elif message.method == "INVITE":
            self.on_invite(message, flow)
        elif message.method == "CANCEL":
            self.on_cancel(message, flow)
        elif message.method == "OPTIONS":
            self.on_options(message, flow)
        elif self.known(flow):  # not a registrar, nor a proxy: what we do not take, said cheaply
            status = 481 if message.method in IN_DIALOG else 405 if message.method in ("REGISTER", *NOT_HERE) else 501
            self.stateless(message, flow, status, [("Allow", ALLOW)])
        else:
            self.dropped("not_allowed")

    def on_response(self, message: SipResponse, flow: Flow) -> None:
        tx = self.client_tx.match(message)
        if tx is not None:
            tx.on_response(message)
        cseq = message.cseq
        if cseq.method == "INVITE" and 200 <= message.status < 300:
            call = self.calls.get((message.call_id, message.from_.tag, message.to.tag))
            if call is not None and call.ack is not None and tx is None:  # a 2xx again: our ACK was lost
                self.transport.send(call.ack, call.dialog.flow if call.dialog else flow)

    def allowed_to_call(self, request: SipRequest, flow: Flow) -> bool:
        """Trusted, or digest credentials that check; answers the challenge (within budget) when not."""
        host = flow.host
        if self.door.trusted(host):
            return True
        if not self.digest.enabled:
            self.refused("not_allowed", host, request.method)
            self.dropped("not_allowed")
            return False
        verdict = self.digest.check(request.headers.get("Authorization"), request.method, host)
        if verdict == "ok":
            return True
        if verdict != "missing":
            self.refused(f"auth_{verdict}", host, request.method)
        if self.door.may_answer(host):
            self.stateless(request, flow, 401, [("WWW-Authenticate", c)
                                                for c in self.digest.challenge(host, verdict == "stale")])
        else:
            self.dropped("refusal_budget")
        return False

    def on_options(self, request: SipRequest, flow: Flow) -> None:
        if not self.allowed_to_call(request, flow):
            return
        self.stateless(request, flow, 200, [("Allow", ALLOW), ("Accept", "application/sdp"),
                                            ("Supported", SUPPORTED), ("User-Agent", USER_AGENT)])

    def on_invite(self, request: SipRequest, flow: Flow) -> None:
        if not self.allowed_to_call(request, flow):
            return
        tx = self.transaction(request, flow)
        if tx is None:
            return
        tx.respond(response(request, 100))
        if (problem := self._invite_problem(request)) is not None:
            status, headers = problem
            self.refused(f"status_{status}", flow.host)
            self.metrics.sip_calls_total.labels(direction="inbound", outcome="refused").inc()
            tx.respond(response(request, status, to_tag=new_tag(), headers=headers))
            return
        offer: SessionDescription | None = None
        chosen: Negotiated | None = None
        if request.body:
            try:
                offer = parse_sdp(request.body.decode("utf-8"))
                chosen = negotiate(offer, self.cfg.sip.codecs, srtp=self.cfg.sip.srtp)
            except (SdpError, UnicodeDecodeError) as exc:
                self.refused("no_codec", flow.host)
                self.metrics.sip_calls_total.labels(direction="inbound", outcome="refused").inc()
                tx.respond(response(request, 488, to_tag=new_tag(),
                                    headers=[("Warning", f'399 {self.advertised(flow.host)} "{str(exc)[:80]}"')]))
                return
        rate = codec_rate(chosen.codec if chosen else OURS[self.cfg.sip.codecs[0]])
        try:
            call = self.admit(rate, client=flow.host)
        except HTTPJSONError:
            self.refused("busy", flow.host)
            self.metrics.sip_calls_total.labels(direction="inbound", outcome="busy").inc()
            tx.respond(response(request, 486, to_tag=new_tag(), headers=[("Retry-After", "5")]))
            return
        dialog = Dialog.as_uas(request, new_tag(), flow, self.contact(flow), self.via_host(flow))
        self.bind(call, dialog, str(request.from_.uri))
        if chosen is not None:  # known from the offer: the session list shows it from admission, while it rings
            call.codec = chosen.codec.rtpmap
        call.invite_tx = tx
        if language := self._language(request):
            call.conversation.set_language(language)
        expires, refresher = session_timer(request.headers.get("Session-Expires"))
        supports_timer = "timer" in request.values("Supported") | request.values("Require")
        if expires:
            call.session_expires = expires
            call.we_refresh = refresher == "uas" or (not refresher and not supports_timer)
        else:
            call.session_expires = self.cfg.sip.session_expires_s
            call.we_refresh = not supports_timer
        call.spawn(self._answer(call, request, tx, offer, chosen, supports_timer), "sip-answer")

    def _invite_problem(self, request: SipRequest) -> tuple[int, list[tuple[str, str]]] | None:
        """Why an INVITE from someone who may call is refused before anything is set up (None: it is not)."""
        if (request.headers.get("Max-Forwards") or "70") == "0":
            return 483, []
        unknown = sorted(request.values("Require") - {"timer"})
        if unknown:
            return 420, [("Unsupported", ", ".join(unknown)[:200])]
        if request.body and request.content_type != "application/sdp":
            return 415, [("Accept", "application/sdp")]
        if not self.services.ready:
            return 503, [("Retry-After", "5")]
        expires, _ = session_timer(request.headers.get("Session-Expires"))
        if expires and expires < self.cfg.sip.min_session_expires_s:
            return 422, [("Min-SE", str(self.cfg.sip.min_session_expires_s))]
        return None

    def _language(self, request: SipRequest) -> str | None:
        """The call's language: the first of the INVITE's Accept-Language the ASR hears, else ``sip.language``."""
        choices = language_choices(self.services)
        for value in request.headers.get_all("Accept-Language"):
            code = value.split(";")[0].strip().lower().split("-")[0]
            if code in choices:
                return code
        return self.cfg.sip.language or None

    def admit(self, rate: int, client: str, caller: Caller | None = None, responder: str | None = None,
              voice: str | None = None) -> SipCall:
        """A new session for a call, owned by ``caller``'s key (None: nobody, so only the admin sees it);
        HTTPJSONError when every slot is taken or the key is over its cap."""
        cfg, services = self.cfg, self.services
        sip = cfg.sip
        sink = ReplyTrack(cfg.audio.reply_queue_ms, rate)
        call = admit(self.app, lambda on_closed: SipCall(services, cfg, sink, on_closed,
                                                          responder=responder or sip.responder or None,
                                                          voice=voice or sip.voice or None, client=client), caller)
        call.events.subscribe(lambda event: log_turn(call, event))
        return call

    def new_rtp(self) -> RtpSession:
        """A call's media, its audio and key presses going nowhere until :meth:`bind` gives it its call."""
        return RtpSession(self.ports, lambda chunk: None, lambda digit: None, symmetric=self.cfg.sip.symmetric_rtp,
                          hole_packets=self.cfg.audio.jitter_buffer_packets)

    def bind(self, call: SipCall, dialog: Dialog, remote: str, rtp: RtpSession | None = None) -> None:
        """The call belongs to its dialog from now on: in the table, told how to end, its media feeding it."""
        call.dialog = dialog
        call.remote = remote
        call.released = self.release
        self.calls[dialog.key] = call
        call.rtp = rtp or self.new_rtp()
        call.rtp.on_audio, call.rtp.on_digit = call.feed, call.on_digit

    async def _answer(self, call: SipCall, request: SipRequest, tx: ServerTransaction,
                      offer: SessionDescription | None, chosen: Negotiated | None, supports_timer: bool) -> None:
        """Ports, the SDP, the ring, the 200: the incoming call is up (or closed, its ports free)."""
        assert call.rtp is not None and call.dialog is not None
        rtp, dialog = call.rtp, call.dialog
        try:
            port = await rtp.open(rtcp_mux=bool(chosen and chosen.rtcp_mux))
        except NoPorts:
            log.warning("sip_no_ports session=%s", call.id)
            tx.respond(response(request, 503, to_tag=dialog.local_tag, headers=[("Retry-After", "5")]))
            await call.close("no_ports")
            return
        call.local = LocalDescription(self.advertised(dialog.flow.host), port, secrets.randbelow(2**31))
        call.local.crypto = rtp.answer_crypto(chosen) if chosen is not None else offer_crypto(rtp, self.cfg.sip.srtp)
        if chosen is not None:
            rtp.configure(chosen, dialog.flow.host)
            body = call.local.render(answer_codecs(chosen), chosen.direction, chosen.rtcp_mux,
                                     offer.media if offer else None)
        else:  # a late offer: ours goes in the 200, the answer comes in the ACK
            body = call.local.render(offer_codecs(self.cfg.sip.codecs))
        if self.cfg.sip.ring_ms > 0:
            tx.respond(response(request, 180, to_tag=dialog.local_tag, headers=[("Contact", dialog.contact)]))
            await asyncio.sleep(self.cfg.sip.ring_ms / 1000)
        if call.closed or tx.cancelled:
            return
        headers = [("Contact", dialog.contact), ("Allow", ALLOW), ("Supported", SUPPORTED),
                   ("User-Agent", USER_AGENT)]
        if call.session_expires:
            refresher = "uas" if call.we_refresh else "uac"
            headers.append(("Session-Expires", f"{call.session_expires};refresher={refresher}"))
            if supports_timer:
                headers.append(("Require", "timer"))
        tx.respond(response(request, 200, to_tag=dialog.local_tag, headers=headers, body=body.encode()))
        self.metrics.sip_calls_total.labels(direction="inbound", outcome="answered").inc()
        log.info("sip_call_open session=%s direction=inbound from=%s codec=%s port=%d active=%d", call.id,
                 call.remote[:120], chosen.codec.rtpmap if chosen else "late-offer", port,
                 len(self.app[SESSIONS]))
        self.start_media(call)

    def start_media(self, call: SipCall) -> None:
        assert call.rtp is not None
        call.codec = call.rtp.negotiated.codec.rtpmap if call.rtp.negotiated else ""
        call.refreshed = time.monotonic()
        call.spawn(call.rtp.send(call.track), "rtp-out")
        call.spawn(self._rtcp(call), "rtcp")
        if call.session_expires and call.we_refresh:
            call.spawn(self._refresh(call), "session-refresh")
        call.watch()

    async def _rtcp(self, call: SipCall) -> None:
        while not call.closed and call.rtp is not None:
            await asyncio.sleep(RTCP_INTERVAL_S * random.uniform(0.5, 1.5))  # RFC 3550 6.3.1: spread the reports
            call.rtp.send_report()

    def on_ack(self, request: SipRequest) -> None:
        tx = self.server_tx.find(request)
        if tx is not None and tx.final and tx.last is not None and tx.last.status >= 300:
            tx.on_ack()  # the ACK of a failure: same transaction
            return
        call = self.calls.get((request.call_id, request.to.tag, request.from_.tag))
        if call is None:
            return
        if call.invite_tx is not None:
            call.invite_tx.on_ack()
        if call.rtp is not None and call.rtp.negotiated is None:  # the answer to our late offer
            try:
                chosen = negotiate(parse_sdp(request.body.decode("utf-8")), self.cfg.sip.codecs, offer=False,
                                   srtp=self.cfg.sip.srtp)
            except (SdpError, UnicodeDecodeError):
                call.spawn(call.close("bad_answer"), "close")
                return
            call.rtp.configure(chosen, call.dialog.flow.host if call.dialog else "")
            call.codec = chosen.codec.rtpmap
        if not call.acked:
            call.acked = True
            if call.rtp is not None:
                call.rtp.last_packet = time.monotonic()

    def _ack_timeout(self, tx: ServerTransaction) -> None:
        """Our 200 was never ACKed (RFC 3261 13.3.1.4): the call is hung up."""
        for call in self.calls.values():
            if call.invite_tx is tx and tx.last is not None and 200 <= tx.last.status < 300:
                call.spawn(call.close("ack_timeout"), "close")

    def on_cancel(self, request: SipRequest, flow: Flow) -> None:
        invite = self.server_tx.find_invite(request)
        if invite is None:
            self.no_such_transaction(request, flow)
            return
        tx = self.transaction(request, flow)
        if tx is None:
            return
        tx.respond(response(request, 200, to_tag=new_tag()))
        if invite.final:
            return
        invite.cancelled = True
        call = next((c for c in self.calls.values() if c.invite_tx is invite), None)
        tag = call.dialog.local_tag if call is not None and call.dialog is not None else new_tag()
        invite.respond(response(invite.request, 487, to_tag=tag))
        self.metrics.sip_calls_total.labels(direction="inbound", outcome="cancelled").inc()
        if call is not None:
            call.spawn(call.close("cancel"), "close")

    def in_dialog(self, request: SipRequest, flow: Flow) -> None:
        call = self.calls.get((request.call_id, request.to.tag, request.from_.tag))
        if call is None or call.dialog is None:
            self.no_such_transaction(request, flow)
            return
        tx = self.transaction(request, flow)
        if tx is None:
            return
        if not call.dialog.in_order(request):
            tx.respond(response(request, 500, "CSeq Out of Order"))
            return
        method = request.method
        if method == "BYE":
            tx.respond(response(request, 200))
            self.metrics.sip_calls_total.labels(direction=call.direction, outcome="ended_by_peer").inc()
            call.spawn(call.close("bye"), "close")
        elif method in ("INVITE", "UPDATE"):
            self.on_offer(call, request, tx)
        elif method == "INFO":
            digit = relay_digit(request.content_type, request.body)
            if digit is not None:
                call.on_digit(digit)
                tx.respond(response(request, 200))
            else:
                tx.respond(response(request, 200 if not request.body else 415))
        elif method == "OPTIONS":
            tx.respond(response(request, 200, headers=[("Allow", ALLOW), ("Supported", SUPPORTED)]))
        elif method in NOT_HERE:
            tx.respond(response(request, 405, headers=[("Allow", ALLOW)]))
        else:
            tx.respond(response(request, 501))

    def on_offer(self, call: SipCall, request: SipRequest, tx: ServerTransaction) -> None:
        """A re-INVITE or UPDATE: a new offer (hold, resume, another codec, another address) and a session refresh.
        A refused offer (488) leaves the call as it was."""
        rtp, local = call.rtp, call.local
        if rtp is None or local is None or call.dialog is None:
            tx.respond(response(request, 491))
            return
        body = b""
        if request.body:
            try:
                offer = parse_sdp(request.body.decode("utf-8"))
                current = rtp.negotiated
                keep = [current.codec.name] if current is not None else []
                chosen = negotiate(offer, keep + [c for c in self.cfg.sip.codecs if c not in keep],
                                   srtp=self.cfg.sip.srtp)
            except (SdpError, UnicodeDecodeError) as exc:
                tx.respond(response(request, 488, headers=[("Warning", f'399 - "{str(exc)[:80]}"')]))
                return
            if chosen != rtp.negotiated:
                local.version += 1
                rtp.configure(chosen, call.dialog.flow.host)
                call.codec = chosen.codec.rtpmap
            local.crypto = rtp.answer_crypto(chosen)
            body = local.render(answer_codecs(chosen), chosen.direction, chosen.rtcp_mux, offer.media).encode()
        elif request.method == "INVITE" and rtp.negotiated is not None:  # no offer: ours, the answer in the ACK
            neg = rtp.negotiated
            body = local.render(answer_codecs(neg), "sendrecv", neg.rtcp_mux).encode()
        expires, refresher = session_timer(request.headers.get("Session-Expires"))
        if expires:
            if expires < self.cfg.sip.min_session_expires_s:
                tx.respond(response(request, 422, headers=[("Min-SE", str(self.cfg.sip.min_session_expires_s))]))
                return
            call.session_expires = expires
            call.we_refresh = refresher == "uas"
        call.refreshed = time.monotonic()
        headers = [("Contact", call.dialog.contact), ("Allow", ALLOW), ("Supported", SUPPORTED)]
        if call.session_expires:
            headers.append(("Session-Expires",
                            f"{call.session_expires};refresher={'uas' if call.we_refresh else 'uac'}"))
        if request.method == "INVITE":
            call.invite_tx = tx
        tx.respond(response(request, 200, headers=headers, body=body))

    # --- out --------------------------------------------------------------------------------------------------
    def release(self, call: SipCall) -> None:
        """A call closed: out of the table, and our BYE unless the peer ended it (or it never got its 200)."""
        dialog = call.dialog
        if dialog is None:
            return
        self.calls.pop(dialog.key, None)
        tx = call.invite_tx
        if tx is not None and not tx.final:  # closed before it was answered
            tx.respond(response(tx.request, 480 if call.close_reason != "server_shutdown" else 503,
                                to_tag=dialog.local_tag))
            return
        if call.close_reason in PEER_ENDED or (call.direction == "inbound" and tx is None and not call.acked):
            return
        reason = call.close_reason.replace('"', "")[:40]
        bye = dialog.request("BYE", headers=[("Reason", f'SIP;cause=200;text="{reason}"')])
        self.client_tx.start(bye, dialog.flow)
        log.info("sip_bye session=%s reason=%s", call.id, reason)

    async def request(self, request: SipRequest, flow: Flow, *, credentials: tuple[str, str] | None = None,
                      on_provisional: Callable[[SipResponse], None] | None = None,
                      resend: Callable[[SipRequest], Awaitable[None]] | None = None) -> Outcome:
        """Send a request and wait for its final response; a 401/407 is answered once with ``credentials``
        (user, password), as a new request with the next CSeq."""
        tx = self.client_tx.start(request, flow, on_provisional)
        if resend is not None:
            await resend(request)
        outcome = await tx.done
        answer = outcome.response
        if answer is None or answer.status not in (401, 407) or credentials is None:
            return outcome
        header = "WWW-Authenticate" if answer.status == 401 else "Proxy-Authenticate"
        challenge = pick_challenge(answer.headers.get_all(header))
        value = authorization(challenge, request.method, str(request.uri), *credentials) if challenge else None
        if value is None:
            return outcome
        retry = with_auth(request, "Authorization" if answer.status == 401 else "Proxy-Authorization", value)
        tx = self.client_tx.start(retry, flow, on_provisional)
        if resend is not None:
            await resend(retry)
        return await tx.done

    async def _refresh(self, call: SipCall) -> None:
        """We are the refresher (RFC 4028 10): an UPDATE (or a re-INVITE, for a peer without UPDATE) every half
        interval; a refresh that fails ends the call."""
        use_update = "UPDATE" in {m.upper() for m in (call.dialog.allow if call.dialog else set())}
        while not call.closed and call.dialog is not None and call.session_expires:
            await asyncio.sleep(max(1.0, call.session_expires / 2 - (time.monotonic() - call.refreshed)))
            if call.closed or time.monotonic() - call.refreshed < call.session_expires / 2 - 1:
                continue
            dialog, local, rtp = call.dialog, call.local, call.rtp
            timer = [("Session-Expires", f"{call.session_expires};refresher=uac" if call.direction == "outbound"
                      else f"{call.session_expires};refresher=uas"), ("Supported", SUPPORTED)]
            if use_update:
                refresh = dialog.request("UPDATE", headers=timer)
            else:
                neg = rtp.negotiated if rtp is not None else None
                sdp = local.render(answer_codecs(neg) if neg else offer_codecs(self.cfg.sip.codecs),
                                   neg.direction if neg else "sendrecv", bool(neg and neg.rtcp_mux)) if local else ""
                refresh = dialog.request("INVITE", sdp.encode(), headers=timer)
            outcome = await self.request(refresh, dialog.flow)
            answer = outcome.response
            if answer is not None and 200 <= answer.status < 300:
                call.refreshed = time.monotonic()
                call.refreshes += 1
                if refresh.method == "INVITE":
                    self.transport.send(dialog.request("ACK", cseq=refresh.cseq.number), dialog.flow)
            elif answer is not None and answer.status == 491:
                await asyncio.sleep(random.uniform(*RETRY_PENDING_S))
            elif answer is not None and answer.status in (405, 501) and use_update:
                use_update = False
            elif call.dialog is not None:
                await call.close("session_refresh_failed")
                return


def with_auth(request: SipRequest, header: str, value: str) -> SipRequest:
    """``request`` again with credentials: the next CSeq and a new branch (RFC 3261 22.2)."""
    headers = Headers()
    cseq = request.cseq
    for name, old in request.headers:
        if name == "Via" and not headers.get("Via"):
            via = request.top_via
            params = {**via.params, "branch": "z9hG4bK" + secrets.token_hex(10)}
            old = f"SIP/2.0/{via.transport} {via.sent_by}" + "".join(
                f";{k}" + (f"={v}" if v else "") for k, v in params.items())
        elif name == "CSeq":
            old = f"{cseq.number + 1} {cseq.method}"
        elif name in ("Authorization", "Proxy-Authorization"):
            continue
        headers.add(name, old)
    headers.add(header, value)
    return SipRequest(request.method, request.uri, headers, request.body)

