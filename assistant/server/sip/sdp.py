"""SDP (RFC 4566) and the offer/answer of one audio stream (RFC 3264): what a peer offers, the codec we take from
it, and the descriptions we write (answers to incoming calls, offers for outgoing ones).

Only what a call needs is read: the audio m-line, its connection address, codecs (rtpmap, fmtp), RFC 4733
telephone-event, the direction (hold), ptime, rtcp and rtcp-mux, and SDES keys for SRTP (RFC 4568 ``a=crypto``,
AES_CM_128_HMAC_SHA1_80 and _32). Other media lines are refused in the answer (port 0). Parsing raises only
:class:`SdpError`.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass, field

MAX_LINES = 256
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
REVERSE = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}
TELEPHONE_EVENT = "telephone-event"
RTP_PROFILES = ("RTP/AVP", "RTP/AVPF")
SRTP_PROFILES = ("RTP/SAVP", "RTP/SAVPF")
SRTP_SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")  # what libsrtp (pylibsrtp) does with SDES
SRTP_KEY_BYTES = 30  # a 16-byte master key and a 14-byte salt (RFC 4568 6.2.1)
SRTP_MODES = ("off", "optional", "required")


class SdpError(ValueError):
    """A session description we cannot read."""


@dataclass(frozen=True)
class Codec:
    """An audio codec as SDP names it: ``opus/48000/2`` on payload type 111."""

    name: str  # as our settings spell it: opus, PCMU, PCMA, telephone-event
    clock_rate: int
    channels: int = 1
    payload_type: int = 0
    fmtp: str = ""

    @property
    def rtpmap(self) -> str:
        return f"{self.name}/{self.clock_rate}" + (f"/{self.channels}" if self.channels != 1 else "")


# The static payload types we take (RFC 3551), and the dynamic ones we offer.
STATIC = {0: Codec("PCMU", 8000, 1, 0), 8: Codec("PCMA", 8000, 1, 8)}
OURS = {"opus": Codec("opus", 48_000, 2, 111, "useinbandfec=1"), "PCMU": STATIC[0], "PCMA": STATIC[8]}
DTMF_OFFER = (Codec(TELEPHONE_EVENT, 8000, 1, 101, "0-16"), Codec(TELEPHONE_EVENT, 48_000, 1, 100, "0-16"))


@dataclass(frozen=True)
class Crypto:
    """One SDES key (RFC 4568): ``a=crypto:TAG SUITE inline:KEY`` (the key and salt, 30 bytes)."""

    tag: str
    suite: str
    key: bytes

    def line(self) -> str:
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode()}"


def parse_crypto(value: str) -> Crypto | None:
    """An ``a=crypto`` value we can use, or None (another suite, a key with an MKI, a malformed line)."""
    parts = value.split()
    if len(parts) < 3 or not parts[0].isdigit() or parts[1] not in SRTP_SUITES or len(parts) > 3:
        return None  # session parameters (UNENCRYPTED_SRTP...) are not taken
    method, _, key_params = parts[2].partition(":")
    if method != "inline":
        return None
    key_text, _, lifetime_mki = key_params.partition("|")
    if "|" in lifetime_mki or ":" in lifetime_mki:  # an MKI: libsrtp's SDES here takes none
        return None
    try:
        key = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return Crypto(parts[0], parts[1], key) if len(key) == SRTP_KEY_BYTES else None


@dataclass
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: list[str]
    connection: str | None = None
    codecs: dict[int, Codec] = field(default_factory=dict)
    direction: str | None = None
    ptime: int | None = None
    rtcp_port: int | None = None
    rtcp_address: str | None = None
    rtcp_mux: bool = False
    crypto: list[str] = field(default_factory=list)  # the a=crypto values, as written


@dataclass
class SessionDescription:
    origin_id: str = "0"
    origin_version: int = 0
    connection: str | None = None
    direction: str | None = None
    media: list[MediaDescription] = field(default_factory=list)

    @property
    def audio(self) -> MediaDescription | None:
        """The first audio stream that is not refused (port 0), if any."""
        return next((m for m in self.media if m.media == "audio" and m.port), None)


def _address(text: str) -> str:
    """``IN IP4 192.0.2.1`` / ``IN IP6 ::1`` → the address (a multicast TTL suffix is refused)."""
    parts = text.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"bad connection {text[:60]!r}")
    try:
        return str(ipaddress.ip_address(parts[2]))
    except ValueError:
        raise SdpError(f"bad connection address {parts[2][:60]!r}") from None


def parse_sdp(text: str) -> SessionDescription:
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line]
    if len(lines) > MAX_LINES:
        raise SdpError(f"more than {MAX_LINES} lines")
    if not lines or lines[0].strip() != "v=0":
        raise SdpError("an SDP starts with v=0")
    sdp = SessionDescription()
    current: MediaDescription | None = None
    for line in lines[1:]:
        kind, eq, value = line.partition("=")
        if not eq or len(kind) != 1:
            raise SdpError(f"bad line {line[:60]!r}")
        value = value.strip()
        if kind == "o":
            parts = value.split()
            if len(parts) != 6 or not parts[2].isdigit() or len(parts[2]) > 20:
                raise SdpError(f"bad origin {value[:60]!r}")
            sdp.origin_id, sdp.origin_version = parts[1], int(parts[2])
        elif kind == "c":
            address = _address(value)
            if current is None:
                sdp.connection = address
            else:
                current.connection = address
        elif kind == "m":
            parts = value.split()
            if len(parts) < 4 or not parts[1].split("/")[0].isdigit():
                raise SdpError(f"bad media line {value[:60]!r}")
            port = int(parts[1].split("/")[0])
            if port > 65_535:
                raise SdpError("media port out of range")
            current = MediaDescription(parts[0], port, parts[2], parts[3:])
            sdp.media.append(current)
        elif kind == "a":
            _attribute(sdp, current, value)
    for m in sdp.media:
        for fmt in m.formats:
            if fmt.isdigit() and int(fmt) in STATIC and int(fmt) not in m.codecs:
                m.codecs[int(fmt)] = STATIC[int(fmt)]
    return sdp


def _attribute(sdp: SessionDescription, media: MediaDescription | None, value: str) -> None:
    name, _, arg = value.partition(":")
    if name in DIRECTIONS:
        if media is None:
            sdp.direction = name
        else:
            media.direction = name
    if media is None:
        return
    if name == "rtpmap":
        pt_text, _, spec = arg.partition(" ")
        parts = spec.strip().split("/")
        if not pt_text.isdigit() or len(parts) < 2 or not parts[1].isdigit():
            return  # a malformed rtpmap names no codec we could take (RFC 4475's own test has one): skipped
        pt = int(pt_text)
        channels = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1
        codec_name = parts[0]
        known = {c.lower(): c for c in (*OURS, TELEPHONE_EVENT)}
        codec_name = known.get(codec_name.lower(), codec_name)
        old = media.codecs.get(pt)
        media.codecs[pt] = Codec(codec_name, int(parts[1]), channels, pt, old.fmtp if old else "")
    elif name == "fmtp":
        pt_text, _, params = arg.partition(" ")
        if pt_text.isdigit() and int(pt_text) in media.codecs:
            old = media.codecs[int(pt_text)]
            media.codecs[int(pt_text)] = Codec(old.name, old.clock_rate, old.channels, old.payload_type, params.strip())
    elif name == "ptime" and arg.strip().isdigit():
        media.ptime = int(arg.strip())
    elif name == "rtcp-mux":
        media.rtcp_mux = True
    elif name == "crypto" and len(media.crypto) < 8:
        media.crypto.append(arg.strip())
    elif name == "rtcp":
        parts = arg.split(None, 1)
        if parts and parts[0].isdigit() and int(parts[0]) <= 65_535:
            media.rtcp_port = int(parts[0])
            if len(parts) > 1:
                media.rtcp_address = _address(parts[1])


@dataclass(frozen=True)
class Negotiated:
    """What an offer and its answer agree on for the call's audio."""

    codec: Codec  # with the payload type the peer uses for it
    dtmf: Codec | None  # telephone-event, if the peer offered it
    address: str  # where the peer receives RTP
    port: int
    rtcp_port: int  # where it receives RTCP (the RTP port itself under rtcp-mux)
    rtcp_mux: bool
    direction: str  # ours: what we do (sendrecv; recvonly while the peer holds the call)
    crypto: Crypto | None = None  # the peer's SRTP key (its packets are protected with it); None: plain RTP

    @property
    def sends(self) -> bool:
        """We send audio (the peer takes it)."""
        return self.direction in ("sendrecv", "sendonly") and not ipaddress.ip_address(self.address).is_unspecified

    @property
    def on_hold(self) -> bool:
        return not self.sends


def negotiate(sdp: SessionDescription, preferences: list[str], *, offer: bool = True,
              srtp: str = "optional") -> Negotiated:
    """The codec, addresses and SRTP key of ``sdp``'s audio stream: as an offer, our first preference it lists; as
    an answer, the first codec of ours it chose. ``srtp`` (``sip.srtp``): off refuses an SRTP stream, required a
    plain one. SdpError when nothing fits (the call gets 488)."""
    media = sdp.audio
    if media is None:
        raise SdpError("no audio stream")
    crypto: Crypto | None = None
    if media.proto in SRTP_PROFILES:
        if srtp == "off":
            raise SdpError("SRTP offered, and sip.srtp is off")
        crypto = next((c for value in media.crypto if (c := parse_crypto(value)) is not None), None)
        if crypto is None:
            raise SdpError(f"no SDES key in a suite we take ({', '.join(SRTP_SUITES)})")
    elif media.proto not in RTP_PROFILES:
        raise SdpError(f"media profile {media.proto[:20]!r} (RTP/AVP or RTP/SAVP)")
    elif srtp == "required":
        raise SdpError("plain RTP offered, and sip.srtp is required")
    address = media.connection or sdp.connection
    if address is None:
        raise SdpError("no connection address")
    offered = [media.codecs[int(f)] for f in media.formats if f.isdigit() and int(f) in media.codecs]
    codec: Codec | None = None
    if offer:
        for name in preferences:
            codec = next((c for c in offered if _same(c, OURS[name])), None)
            if codec is not None:
                break
    else:
        codec = next((c for c in offered if any(_same(c, OURS[n]) for n in preferences)), None)
    if codec is None:
        raise SdpError("no common audio codec")
    events = [c for c in offered if c.name == TELEPHONE_EVENT]
    dtmf = next((c for c in events if c.clock_rate == codec.clock_rate), events[0] if events else None)
    theirs = media.direction or sdp.direction or "sendrecv"
    ours = REVERSE.get(theirs, "sendrecv")
    rtcp = media.port if media.rtcp_mux else (media.rtcp_port or media.port + 1)
    return Negotiated(codec, dtmf, address, media.port, rtcp, media.rtcp_mux, ours, crypto)


def _same(a: Codec, b: Codec) -> bool:
    return a.name.lower() == b.name.lower() and a.clock_rate == b.clock_rate


@dataclass
class LocalDescription:
    """What we write about our side of a call: session id and version (bumped by every change), address, port."""

    address: str
    port: int
    session_id: int
    version: int = 1
    crypto: list[Crypto] = field(default_factory=list)  # our SRTP keys: an answer's one, an offer's each suite

    def render(self, codecs: list[Codec], direction: str = "sendrecv", rtcp_mux: bool = False,
               refused: list[MediaDescription] | None = None) -> str:
        """An SDP with one audio stream of ``codecs`` (an answer lists the one chosen and telephone-event), and a
        refused (port 0) line for each of ``refused``, in the offer's order."""
        ip = "IP6" if ":" in self.address else "IP4"
        lines = ["v=0", f"o=- {self.session_id} {self.version} IN {ip} {self.address}", "s=assistant",
                 f"c=IN {ip} {self.address}", "t=0 0"]
        audio_done = False
        for other in refused or []:
            if other.media == "audio" and other.port and not audio_done:
                lines += self._audio(codecs, direction, rtcp_mux)
                audio_done = True
            else:
                lines.append(f"m={other.media} 0 {other.proto} {' '.join(other.formats)}")
        if not audio_done:
            lines += self._audio(codecs, direction, rtcp_mux)
        return "\r\n".join(lines) + "\r\n"

    def _audio(self, codecs: list[Codec], direction: str, rtcp_mux: bool) -> list[str]:
        proto = "RTP/SAVP" if self.crypto else "RTP/AVP"
        lines = [f"m=audio {self.port} {proto} {' '.join(str(c.payload_type) for c in codecs)}"]
        for c in codecs:
            lines.append(f"a=rtpmap:{c.payload_type} {c.rtpmap}")
            if c.fmtp:
                lines.append(f"a=fmtp:{c.payload_type} {c.fmtp}")
        lines.append("a=ptime:20")
        if rtcp_mux:
            lines.append("a=rtcp-mux")
        else:
            lines.append(f"a=rtcp:{self.port + 1}")
        lines.append(f"a={direction}")
        lines += [f"a=crypto:{c.line()}" for c in self.crypto]
        return lines


def answer_codecs(chosen: Negotiated) -> list[Codec]:
    """What an answer lists: the codec chosen (under the peer's payload type) and telephone-event if offered."""
    codec = chosen.codec
    if codec.name == "opus":  # we send mono; say so (RFC 7587: stereo=0 is the default anyway)
        codec = Codec(codec.name, codec.clock_rate, codec.channels, codec.payload_type, "useinbandfec=1")
    return [codec] + ([chosen.dtmf] if chosen.dtmf is not None else [])


def offer_codecs(preferences: list[str]) -> list[Codec]:
    return [OURS[name] for name in preferences] + list(DTMF_OFFER)
