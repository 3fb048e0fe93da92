"""Calls straight from a SIP trunk or a PBX: SIP and RTP on the server's own sockets, into the same conversation.

The layers, each a module named after the protocol object it is: ``uri.py`` and ``message.py`` read and write
SIP (RFC 3261), ``sdp.py`` the session description and its offer/answer (RFC 4566, 3264), ``digest.py`` the
authentication both ways, ``transport.py`` the UDP/TCP/TLS sockets and the door every message passes (budgets per
source, caps), ``transaction.py`` the retransmissions, ``dialog.py`` a call's dialog, ``rtpports.py`` the port
range, ``rtpsession.py`` one call's RTP/RTCP (receive buffer, decode, 20 ms paced playout), ``dtmf.py`` key
presses (RFC 4733). ``useragent.py`` is the SIP user agent that puts them together for incoming calls,
``dialer.py`` places outgoing ones through the trunk, ``registration.py`` registers with it, ``call.py`` is a
call as one session of the conversation, ``api.py`` the outgoing-call routes, ``state.py`` the service a gateway
starts. Settings: ``[sip]`` (off by default: no socket is opened); for a PBX administrator: ``docs/telephony.md``.
"""

from __future__ import annotations

from assistant.server.sip.state import setup

__all__ = ["setup"]
