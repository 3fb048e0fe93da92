"""What ``assistant bench v2v`` measures: a server, the protocol it is spoken to in, where each request goes, and
whether the server is ours.

``--url`` is a server's base URL; each protocol adds its standard path unless the URL already names one:

- ``page``: our page's ``POST /api/offer`` (only our server speaks it).
- ``whip``: a WHIP endpoint (RFC 9725): the URL itself when it has a path, else our ``/api/whip``.
- ``realtime`` (WebRTC, ``…/realtime/calls``) and ``realtime-ws`` (``…/realtime``): OpenAI's Realtime API at
  ``/v1/realtime`` (a URL ending in ``/v1``, as OpenAI's SDKs write a base URL, gets ``/realtime``; one ending in
  ``/realtime`` is taken as it is), the model by name and the key as OpenAI's API expects them (``?model=`` on the
  WebSocket, the ``session`` part of the call's form; ``Authorization: Bearer``).
- ``twilio``: a phone bot's voice webhook, as Twilio would post it: the URL itself when it has a path, else our
  ``/telephony/twilio/voice``.

Our server answers ``GET /api/stages``; only then does the bench ask for the per-stage marks (``turn_metrics``, or
the Realtime API's ``?extensions=1``) and wait on ``/readyz``. Any other server is measured from the client's side
only, and the report says what was left out and why (:attr:`Target.left_out`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp

log = logging.getLogger(__name__)

PROTOCOLS = ("page", "whip", "realtime", "realtime-ws", "twilio", "sip")
PROBE_PATH = "/api/stages"  # ours alone serves it (the page's stage legend)
PROBE_TIMEOUT_S = 10.0
PROBE_RETRY_S = 0.5  # a server not listening yet is asked again so often (within the bench's --ready-timeout)

OURS = "assistant"
OTHER = "other"


@dataclass(frozen=True)
class Target:
    """One server and the protocol the bench speaks to it in."""

    protocol: str
    url: str  # the base URL as given, without a trailing slash
    ours: bool = True  # an assistant server: it sends every turn's stage marks
    key: str = field(default="", repr=False)  # the bearer credential; never logged, printed or written
    model: str = ""  # the Realtime API's model name ("" leaves the server's default)

    @property
    def server(self) -> str:
        return OURS if self.ours else OTHER

    @property
    def origin(self) -> str:
        """``scheme://host:port`` of the URL."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    @property
    def left_out(self) -> str:
        """What this run cannot measure, and why ("" when nothing is left out)."""
        if self.protocol == "twilio":
            return ("the stage columns: a phone call's media stream carries no events, so only the caller's side is "
                    "measured")
        if self.protocol == "sip":
            return "the stage columns: a SIP call's RTP carries no events, so only the caller's side is measured"
        if not self.ours:
            return (f"the stage columns: {self.origin} is not an assistant server (GET {PROBE_PATH} did not answer "
                    "with our stage legend; ours with a token needs --token), so no turn sends its stage marks; the "
                    "client's columns are measured")
        return ""

    # --- where each request goes ----------------------------------------------------------------------------
    def _path(self) -> str:
        return urlsplit(self.url).path.rstrip("/")

    def realtime_url(self) -> str:
        """The Realtime API's base: ``…/v1/realtime`` (see the module docstring)."""
        path = self._path()
        if path.endswith("/realtime"):
            return self.url
        if path.endswith("/v1"):
            return f"{self.url}/realtime"
        return f"{self.url}/v1/realtime"

    def realtime_ws_url(self) -> str:
        """The WebSocket URL with its query: the model, and our extensions on our server."""
        base = self.realtime_url()
        scheme = "wss" if base.startswith("https:") else "ws"
        query = [f"model={self.model}"] if self.model else []
        if self.ours:
            query.append("extensions=1")
        rest = base.split(":", 1)[1]
        return f"{scheme}:{rest}" + ("?" + "&".join(query) if query else "")

    def calls_url(self) -> str:
        """``POST`` here to start a Realtime call over WebRTC."""
        return f"{self.realtime_url()}/calls" + ("?extensions=1" if self.ours else "")

    def whip_url(self) -> str:
        return self.url if self._path() else f"{self.url}/api/whip"

    def webhook_url(self) -> str:
        return self.url if self._path() else f"{self.url}/telephony/twilio/voice"


def check_protocols(protocols: list[str]) -> str:
    """An error naming the first unknown protocol, or ""."""
    unknown = [p for p in protocols if p not in PROTOCOLS]
    return f"unknown protocol {unknown[0]!r}; choose from {', '.join(PROTOCOLS)}" if unknown else ""


async def is_ours(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
                  wait_s: float = 0.0) -> bool:
    """Whether the server at ``url``'s origin is an assistant server (``GET /api/stages`` answers our legend; a server
    with a token wants the key the bench was given). A server that does not answer at all yet (connection refused:
    still starting) is asked again for up to ``wait_s``; any answer decides."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    probe = urlunsplit((scheme, parts.netloc, PROBE_PATH, "", ""))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            async with http.get(probe, headers=headers or {},
                                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
            return isinstance(body, dict) and isinstance(body.get("stages"), list)
        except (aiohttp.ClientConnectionError, OSError) as exc:
            if time.monotonic() >= deadline or isinstance(exc, aiohttp.ServerDisconnectedError):
                return False
            await asyncio.sleep(PROBE_RETRY_S)  # not listening yet: a server still starting
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False


async def make_target(http: aiohttp.ClientSession, protocol: str, url: str, *, key: str = "",
                      model: str = "", wait_s: float = 0.0) -> Target:
    """The target for ``protocol`` at ``url``, with whether the server is ours found by asking it (waiting up to
    ``wait_s`` for a server that is still starting to listen)."""
    url = url.rstrip("/")
    ours = await is_ours(http, url, Target(protocol, url, key=key).headers(), wait_s)
    log.info("bench.target protocol=%s url=%s server=%s model=%s key=%s", protocol, url, OURS if ours else OTHER,
             model or "-", "set" if key else "none")
    return Target(protocol, url, ours, key, model)


__all__ = ["OTHER", "OURS", "PROTOCOLS", "Target", "check_protocols", "is_ours", "make_target"]
