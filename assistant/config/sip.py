"""Calls straight from a SIP trunk or a PBX (``[sip]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting

SIP_TRANSPORTS = ("udp", "tcp", "tls")
SIP_CODECS = ("opus", "PCMU", "PCMA")
DIGEST_ALGORITHMS = ("MD5", "SHA-256")


@dataclass
class SIPConfig:
    """SIP and RTP on the server's own sockets (``server/sip/``): a PBX or a trunk calls in, the API dials out."""

    enabled: bool = setting(False, "open the SIP listener (off: no SIP or RTP socket is opened)")
    host: str = setting("127.0.0.1", "address the SIP listener and the calls' RTP bind (0.0.0.0: every interface)")
    port: int = setting(5060, "SIP over UDP and TCP on this port (0: any free one, for tests)")
    transports: list[str] = setting(["udp", "tcp"], "udp, tcp, tls: which SIP transports listen")
    tls_port: int = setting(5061, "SIP over TLS on this port, when transports has tls (0: any free one)")
    tls_cert: str = setting("", "PEM certificate chain for SIP over TLS (empty: server.tls_cert)")
    tls_key: str = setting("", "PEM private key for sip.tls_cert (empty: server.tls_key)")
    advertised_address: str = setting(
        "", "the address a peer must send to, written in SDP (c=), Contact and Via: behind NAT the public address "
        "(port forwarding for sip.port and the RTP range); empty: sip.host, or with 0.0.0.0 the address the system "
        "routes toward the peer"
    )
    rtp_port_min: int = setting(20_000, "first port of the calls' RTP range (each call takes an even port and the "
                                "next for RTCP)")
    rtp_port_max: int = setting(20_999, "last port of the calls' RTP range")
    symmetric_rtp: bool = setting(
        True, "send RTP back to the address the caller's RTP comes from (it goes through the caller's NAT), not to "
        "the one its SDP names"
    )
    srtp: str = setting(
        "optional", "SRTP with SDES keys (RFC 4568, AES_CM_128_HMAC_SHA1_80/32): optional takes an RTP/SAVP offer "
        "and offers plain RTP; required refuses plain RTP and offers SRTP; off refuses SRTP (the keys travel in the "
        "SDP: use SIP over TLS, or they protect nothing)"
    )
    codecs: list[str] = setting(["opus", "PCMU", "PCMA"], "audio codecs in order of preference: opus (wideband, "
                                "48 kHz), PCMU, PCMA (G.711 at 8 kHz)")
    allow_from: list[str] = setting(
        [], "CIDRs that may call without digest authentication and are answered OPTIONS pings: the PBX's or the "
        "trunk's signalling addresses (the trunk's own address is always allowed)"
    )
    username: str = setting("", "digest user a caller outside sip.allow_from must authenticate as")
    password: str = setting("", "digest password for sip.username (empty: only sip.allow_from and the trunk may "
                            "call; others get no answer)")
    realm: str = setting("assistant", "digest realm of the challenges the server sends")
    digest_algorithms: list[str] = setting(
        ["MD5"], "the challenges a caller is offered, one per algorithm, in order of preference (MD5, SHA-256): "
        "measured, SIPp 3.6 answers only the first and only MD5, and baresip 1.0 (libre) gives up on a 401 that "
        "offers SHA-256 at all, so MD5 alone by default; offer SHA-256 where every caller takes it (RFC 8760)"
    )
    trunk: str = setting(
        "", "the trunk or PBX, as a SIP URI (sip:pbx.example.com:5060;transport=tcp): outgoing calls and the "
        "registration go there; empty: no outgoing calls"
    )
    trunk_username: str = setting("", "digest user the server gives the trunk (registration and outgoing calls)")
    trunk_password: str = setting("", "digest password for sip.trunk_username")
    register: bool = setting(False, "register with the trunk (REGISTER, refreshed before it expires), so calls to "
                             "sip.user reach this server")
    register_expires_s: int = setting(300, "registration lifetime asked of the trunk")
    user: str = setting("assistant", "the server's SIP user: its address of record, the From of outgoing calls")
    dial_allow: list[str] = setting(
        [], "destinations outgoing calls may reach, as numbers or SIP URIs; a trailing * matches the rest "
        "(+44*, sip:*@pbx.example.com is not a pattern: only the end may be *); empty: no outgoing call at all"
    )
    ring_timeout_s: float = setting(45.0, "an outgoing call not answered this long is cancelled (no_answer)")
    dials_per_minute: int = setting(10, "outgoing calls one client may place per minute (0: unlimited)")
    max_dialing: int = setting(4, "outgoing calls ringing at once; past it 503")
    ring_ms: int = setting(0, "an incoming call rings this long (180 Ringing) before it is answered")
    responder: str = setting("", "responder for SIP calls (echo, rules or the configured one; empty: respond.engine)")
    voice: str = setting("", "voice of SIP calls (a voice id; empty: the engine's default)")
    language: str = setting("", "language SIP calls are heard in (a code the ASR hears, or auto; empty: "
                            "asr.language); an INVITE's Accept-Language may choose another the ASR hears")
    media_timeout_s: float = setting(30.0, "a call whose peer sent no RTP or RTCP this long (not on hold) is hung up")
    max_call_s: float = setting(14_400.0, "the longest a SIP call lasts")
    session_expires_s: int = setting(1800, "session timer (RFC 4028) the server asks for when the peer supports "
                                     "one; a dead peer is found within it")
    min_session_expires_s: int = setting(90, "the shortest session timer accepted (Min-SE)")
    messages_per_minute: int = setting(
        1200, "SIP messages one source address may send a minute (sip.allow_from and the trunk aside); past it "
        "they are dropped unread"
    )
    refusals_per_minute: int = setting(
        10, "answers (challenges, refusals) one unknown source gets a minute; past it it gets none"
    )
    max_message_bytes: int = setting(16_384, "largest SIP message accepted (UDP datagram or TCP message)")
    max_connections: int = setting(256, "SIP TCP/TLS connections at once (each source at most a quarter)")
    connection_idle_s: float = setting(120.0, "a SIP TCP/TLS connection idle this long is closed")
    max_transactions: int = setting(4096, "SIP transactions remembered at once; past it new requests are dropped")
    dtmf_gap_ms: int = setting(1500, "key presses this close together are one entry: the responder gets them as "
                               "one text when the gap passes (or at once on #)")
    dtmf_text: str = setting("The caller pressed {digits} on the keypad.", "what the responder is told for keys "
                             "pressed ({digits}: the keys, e.g. 12#)")
    dtmf_per_minute: int = setting(120, "key presses a call may send a minute; past it the call is hung up")
