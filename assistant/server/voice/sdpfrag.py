"""Trickle ICE SDP fragments (``application/trickle-ice-sdpfrag``, RFC 8840): parse, check, build.

A fragment carries the sender's ICE credentials, its media sections (``m=`` + ``a=mid``), the candidates it
gathered since the last fragment, and ``a=end-of-candidates`` once it has no more. Anything malformed raises
:class:`FragmentError` with the line that is wrong, so the client hears what to fix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from aiortc import RTCIceCandidate
from aiortc.sdp import candidate_from_sdp

CONTENT_TYPE = "application/trickle-ice-sdpfrag"
CANDIDATE_TYPES = {"host", "srflx", "prflx", "relay"}
_LINE = re.compile(r"^[a-z]=\S")
_MDNS = re.compile(r"^[A-Za-z0-9-]{1,63}\.local$")


class FragmentError(ValueError):
    """The fragment is not a trickle ICE SDP fragment we can apply."""


@dataclass
class TrickleFragment:
    ufrag: str | None = None
    pwd: str | None = None
    candidates: list[RTCIceCandidate] = field(default_factory=list)
    end_of_candidates: bool = False


def parse_candidate(value: str, where: str = "candidate") -> RTCIceCandidate:
    """One ``candidate:`` attribute value (without the ``a=candidate:`` prefix), checked field by field."""
    try:
        cand = candidate_from_sdp(value)
    except (AssertionError, ValueError, IndexError):
        raise FragmentError(f"{where}: not an ICE candidate: {value[:80]!r}") from None
    bits = value.split()
    if bits[6] != "typ" or cand.type not in CANDIDATE_TYPES:
        raise FragmentError(f"{where}: candidate type must be one of {sorted(CANDIDATE_TYPES)}")
    if cand.protocol.lower() not in ("udp", "tcp"):
        raise FragmentError(f"{where}: candidate transport must be udp or tcp, got {cand.protocol!r}")
    if not 0 <= cand.port <= 65535 or cand.component not in (1, 2):
        raise FragmentError(f"{where}: candidate port or component out of range")
    if not _MDNS.match(cand.ip):
        try:
            ipaddress.ip_address(cand.ip)
        except ValueError:
            raise FragmentError(f"{where}: candidate address {cand.ip[:64]!r} is not an IP or mDNS name") from None
    return cand


def parse_sdpfrag(text: str, max_candidates: int) -> TrickleFragment:
    """Parse a fragment; candidates carry the ``sdpMid``/``sdpMLineIndex`` of the section they came in."""
    frag = TrickleFragment()
    section = -1  # candidates before any m= line belong to the first section
    pending: list[RTCIceCandidate] = []  # this section's candidates, waiting for its a=mid
    mid: str | None = None

    def close_section() -> None:
        for cand in pending:
            cand.sdpMid = mid
            cand.sdpMLineIndex = max(section, 0)
        frag.candidates.extend(pending)
        pending.clear()

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"line {number}"
        if not _LINE.match(line):
            raise FragmentError(f"{where}: not an SDP line: {line[:80]!r}")
        if line.startswith("m="):
            close_section()
            section, mid = section + 1, None
        elif line.startswith("a=mid:"):
            mid = line[len("a=mid:") :]
        elif line.startswith("a=ice-ufrag:"):
            frag.ufrag = line[len("a=ice-ufrag:") :]
        elif line.startswith("a=ice-pwd:"):
            frag.pwd = line[len("a=ice-pwd:") :]
        elif line.startswith("a=candidate:"):
            pending.append(parse_candidate(line[len("a=candidate:") :], where))
            if len(frag.candidates) + len(pending) > max_candidates:
                raise FragmentError(f"more than {max_candidates} candidates in one fragment")
        elif line == "a=end-of-candidates":
            frag.end_of_candidates = True
        # Other attributes (a=ice-options, a=group, ...) carry nothing to apply.
    close_section()
    if not frag.candidates and not frag.end_of_candidates and frag.ufrag is None:
        raise FragmentError("the fragment has no candidates, no ICE credentials and no end-of-candidates")
    return frag


def ice_credentials(sdp: str) -> tuple[str | None, str | None]:
    """The first ``ice-ufrag`` and ``ice-pwd`` of an SDP (one ICE session: BUNDLE)."""
    ufrag = pwd = None
    for line in sdp.splitlines():
        if ufrag is None and line.startswith("a=ice-ufrag:"):
            ufrag = line[len("a=ice-ufrag:") :].strip()
        elif pwd is None and line.startswith("a=ice-pwd:"):
            pwd = line[len("a=ice-pwd:") :].strip()
    return ufrag, pwd


def build_sdpfrag(
    ufrag: str, pwd: str, candidates: list[tuple[str, str]], end_of_candidates: bool = False
) -> str:
    """A fragment for ``(mid, "candidate:...")`` pairs, one media section per mid (what a WHIP client sends)."""
    lines = [f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}"]
    mids: dict[str, list[str]] = {}
    for mid, cand in candidates:
        mids.setdefault(mid, []).append(cand)
    for mid, cands in mids.items() or [("0", [])]:
        lines += ["m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}"]
        lines += [f"a={c}" if not c.startswith("a=") else c for c in cands]
    if end_of_candidates:
        lines.append("a=end-of-candidates")
    return "\r\n".join(lines) + "\r\n"
