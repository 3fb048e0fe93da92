"""What a WebRTC client builds that the server never does: an aiortc configuration from ``GET /api/ice`` (the
page's view). The tests are the only such clients."""

from __future__ import annotations

from typing import Any

from aiortc import RTCConfiguration

from assistant.server.voice.ice import IceServer, rtc_configuration


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
