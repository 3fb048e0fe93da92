"""What a WebRTC client builds that the server never does: a trickle fragment to PATCH (as a WHIP client sends
it) and an aiortc configuration from ``GET /api/ice`` (the page's view). The tests are the only such clients."""

from __future__ import annotations

from typing import Any

from aiortc import RTCConfiguration

from assistant.server.ice import IceServer, rtc_configuration


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


def rtc_configuration_from_json(payload: dict[str, Any]) -> RTCConfiguration:
    """What a client (the bench, the tests) builds from ``GET /api/ice``: the page's view, for aiortc."""
    servers = [
        IceServer(
            [s["urls"]] if isinstance(s["urls"], str) else list(s["urls"]),
            s.get("username", ""),
            s.get("credential", ""),
        )
        for s in payload.get("iceServers", [])
    ]
    return rtc_configuration(servers, payload.get("iceTransportPolicy", "all"))
