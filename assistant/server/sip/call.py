"""A SIP call as one session of the conversation: :class:`SipCall` is a peerless ``ConversationSession`` whose audio
comes from its :class:`~assistant.server.sip.rtpsession.RtpSession` and whose reply sink is a ``ReplyTrack`` at the
codec's rate, paced out as RTP.

It is admitted like every session (``voice/signaling.admit``: a slot of ``server.max_sessions``, listed by
``GET /api/sessions``, hung up by ``DELETE``, counted in the metrics, owned by the key that dialed it, or by nobody
for an incoming call, so only the admin sees it). Turn-taking, barge-in, languages, traces and the heard history
are the conversation's. What is SIP's: the dialog, the session timer (RFC 4028), key presses, and its end: a BYE
from the peer, or ours when anything else ends it (a hang-up, the media stopping, the timer, the last slot of
``sip.max_call_s``, shutdown). Its ports are freed on every one of those paths (:meth:`_release`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Unpack

from assistant.config import Config
from assistant.rtc.outbound import ReplyTrack
from assistant.server.limits import RateLimiter
from assistant.server.services import Services
from assistant.server.sip.dialog import Dialog
from assistant.server.sip.dtmf import DigitCollector
from assistant.server.sip.rtpsession import RtpSession
from assistant.server.sip.sdp import LocalDescription
from assistant.server.sip.transaction import ServerTransaction
from assistant.server.voice.session import ConversationSession, SessionOptions

if TYPE_CHECKING:
    from assistant.server.sip.message import SipRequest

log = logging.getLogger(__name__)

# Reasons the peer ended the call itself: no BYE of ours follows (the user agent reads it).
PEER_ENDED = frozenset({"bye", "cancel", "peer_gone"})
REFRESH_MARGIN_S = 32.0  # RFC 4028 10: a refresher's peer waits min(32 s, a third) past the half before giving up


class SipCall(ConversationSession):
    """See the module docstring."""

    transport = "sip"
    carrier = "sip"

    def __init__(self, services: Services, cfg: Config, sink: ReplyTrack,
                 on_closed: Callable[[ConversationSession], None] | None, **options: Unpack[SessionOptions]) -> None:
        super().__init__(services, cfg, sink, on_closed, **options)
        self.track = sink
        self.direction = "inbound"
        self.dialog: Dialog | None = None
        self.rtp: RtpSession | None = None
        self.local: LocalDescription | None = None
        self.invite_tx: ServerTransaction | None = None  # our 200 to their INVITE, sent until its ACK
        self.ack: SipRequest | None = None  # our ACK to their 2xx (outgoing calls), sent again for a retransmitted 2xx
        self.acked = False
        self.session_expires = 0  # the session timer's interval (0: none)
        self.we_refresh = False
        self.refreshed = time.monotonic()
        self.refreshes = 0  # session refreshes we sent that the peer took
        self.released: Callable[[SipCall], None] | None = None  # the user agent's: our BYE, the dialog forgotten
        self.dtmf_budget = RateLimiter(cfg.sip.dtmf_per_minute)
        self.digits = DigitCollector(cfg.sip.dtmf_gap_ms / 1000.0, self._on_entry)
        self.remote = ""  # who the call is with, for the log (the peer's URI)

    # --- key presses --------------------------------------------------------------------------------------
    def on_digit(self, digit: str) -> None:
        """A key pressed on the caller's phone: an event at once, and into the entry the responder will hear."""
        if self.closed:
            return
        if self.dtmf_budget.take("call") > 0:
            self.spawn(self.close("dtmf_flood"), "close")
            return
        self.events.emit("dtmf", digit=digit)
        log.info("sip_dtmf session=%s%s", self.id, f" digit={digit}" if self.cfg.log.debug_content else "")
        self.digits.add(digit)

    def _on_entry(self, digits: str) -> None:
        if self.closed:
            return
        self.conversation.respond_to(text=self.cfg.sip.dtmf_text.replace("{digits}", digits))

    # --- lifecycle ----------------------------------------------------------------------------------------
    def _stale(self) -> str:
        now = time.monotonic()
        rtp = self.rtp
        if rtp is not None:
            if reason := rtp.abuse():
                return reason
            neg = rtp.negotiated
            # The peer sends while it is not holding the call inactive (a held call sends its music on hold).
            expects_media = neg is not None and neg.direction != "inactive"
            timeout = self.cfg.sip.media_timeout_s
            if expects_media and self.acked and timeout and now - rtp.last_packet > timeout:
                return "media_timeout"
            rtp.adapt(self.cfg.audio.jitter_buffer_max_packets)
        if self.session_expires and not self.we_refresh:
            grace = min(REFRESH_MARGIN_S, self.session_expires / 3)
            if now - self.refreshed > self.session_expires - grace:
                return "session_expired"
        if self.cfg.sip.max_call_s and now - self.created > self.cfg.sip.max_call_s:
            return "max_call_length"
        return super()._stale()

    async def _release(self) -> None:
        """Stop the reply, free the ports, and (unless the peer ended it) say BYE."""
        self.digits.close()
        self.track.stop()
        if self.rtp is not None:
            counters = self.rtp.counters
            log.info("sip_media session=%s received=%d sent=%d foreign=%d flooded=%d malformed=%d other=%d "
                     "digits=%d rtcp=%d rtcp_dropped=%d", self.id, counters.received, counters.sent, counters.foreign,
                     counters.flooded, counters.malformed, counters.other_payload, counters.digits,
                     counters.rtcp_received, counters.rtcp_dropped)
            self.rtp.close()
        if self.released is not None:
            self.released(self)


def log_turn(session: SipCall, event: dict[str, object]) -> None:
    """A SIP call has no events channel: each turn's server-side voice-to-voice goes to the log."""
    if event.get("type") == "turn_metrics":
        durations = event.get("durations_ms")
        log.info("sip_turn session=%s turn=%s server_v2v_ms=%s", session.id, event.get("turn"),
                 durations.get("server_v2v_ms") if isinstance(durations, dict) else None)
