"""ICE configuration for both peers: STUN/TURN servers, TURN credentials and the transport policy.

The browser gets the same servers as the server's own peer (``GET /api/ice``, and ``Link`` headers on a WHIP
answer), so a browser behind a symmetric NAT or a strict firewall can fall back to a TURN relay.

TURN credentials are either static (``ice.turn_username`` / ``ice.turn_credential``) or time-limited TURN REST
credentials (coturn's ``use-auth-secret``): username ``<expiry unix time>:<name>``, credential
``base64(HMAC-SHA1(secret, username))``. The TURN server recomputes the HMAC with the same secret and refuses
the credential after its expiry, so the secret stays on the server.

A credential does not die with its session: nothing tells the TURN server that a call hung up. Until its expiry
(``ice.turn_ttl_s``, 5 minutes by default: enough to set a call up) whoever holds it can allocate relays on the
TURN server, within that server's own quotas and ``denied-peer-ip`` rules; coturn checks the expiry only when a
relay is allocated, so a relay allocated in time lives on for as long as its holder refreshes it. Short
lifetimes, the bearer token on ``GET /api/ice`` and its per-client budget are what bound that.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer
from aiortc.rtcconfiguration import RTCIceTransportPolicy
from aiortc.rtcicetransport import parse_stun_turn_uri

from assistant.config import ConfigError, ICEConfig
from assistant.server.http import CONFIG
from assistant.server.openapi import documented, json_body

POLICIES = {"all": RTCIceTransportPolicy.ALL, "relay": RTCIceTransportPolicy.RELAY}


@dataclass
class IceServer:
    """One entry of ``RTCConfiguration.iceServers``, in the browser's shape."""

    urls: list[str]
    username: str = ""
    credential: str = ""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"urls": list(self.urls)}
        if self.username or self.credential:
            out["username"] = self.username
            out["credential"] = self.credential
        return out

    def to_rtc(self) -> RTCIceServer:
        if self.username or self.credential:
            return RTCIceServer(urls=list(self.urls), username=self.username, credential=self.credential)
        return RTCIceServer(urls=list(self.urls))


def turn_rest_credential(secret: str, name: str, ttl_s: float, now: float | None = None) -> tuple[str, str]:
    """A TURN REST username and credential for ``name`` that expire ``ttl_s`` seconds from ``now``."""
    expiry = int((time.time() if now is None else now) + ttl_s)
    username = f"{expiry}:{name}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def check_ice_config(ice: ICEConfig) -> None:
    """Refuse an ICE setup that cannot work, at startup rather than at the first call."""
    if ice.transport_policy not in POLICIES:
        raise ConfigError(f"ice.transport_policy must be one of {sorted(POLICIES)}, got {ice.transport_policy!r}")
    for url in ice.stun_urls:
        if not url.startswith(("stun:", "stuns:")):
            raise ConfigError(f"ice.stun_urls: {url!r} is not a stun: or stuns: URL")
        _parse(url, "ice.stun_urls")
    for url in ice.turn_urls:
        if not url.startswith(("turn:", "turns:")):
            raise ConfigError(f"ice.turn_urls: {url!r} is not a turn: or turns: URL")
        _parse(url, "ice.turn_urls")
    if ice.turn_urls and not ice.turn_secret and not (ice.turn_username and ice.turn_credential):
        raise ConfigError("ice.turn_urls needs credentials: ice.turn_secret (TURN REST) or turn_username/credential")
    if ice.transport_policy == "relay" and not ice.turn_urls:
        raise ConfigError("ice.transport_policy = relay needs at least one TURN server in ice.turn_urls")
    if ice.turn_ttl_s <= 0:
        raise ConfigError(f"ice.turn_ttl_s must be positive, got {ice.turn_ttl_s}")
    if ice.max_fragment_bytes <= 0 or ice.max_remote_candidates <= 0:
        raise ConfigError("ice.max_fragment_bytes and ice.max_remote_candidates must be positive")


def _parse(url: str, where: str) -> None:
    try:
        parse_stun_turn_uri(url)
    except ValueError as exc:
        raise ConfigError(f"{where}: {url!r}: {exc}") from None


def ice_servers(ice: ICEConfig, name: str, now: float | None = None) -> list[IceServer]:
    """The STUN and TURN servers for one peer; TURN REST credentials are minted for ``name``."""
    servers: list[IceServer] = []
    if ice.stun_urls:
        servers.append(IceServer(list(ice.stun_urls)))
    if ice.turn_urls:
        if ice.turn_secret:
            username, credential = turn_rest_credential(ice.turn_secret, name, ice.turn_ttl_s, now)
        else:
            username, credential = ice.turn_username, ice.turn_credential
        servers.append(IceServer(list(ice.turn_urls), username, credential))
    return servers


def rtc_configuration(servers: list[IceServer], policy: str = "all") -> RTCConfiguration:
    """The aiortc configuration for these servers and transport policy (``all`` or ``relay``)."""
    return RTCConfiguration(iceServers=[s.to_rtc() for s in servers], iceTransportPolicy=POLICIES[policy])


def browser_config(ice: ICEConfig, name: str, now: float | None = None) -> dict[str, object]:
    """The body of ``GET /api/ice``: what the page passes to ``new RTCPeerConnection``, plus trickle."""
    now = time.time() if now is None else now
    body: dict[str, object] = {
        "iceServers": [s.to_json() for s in ice_servers(ice, name, now)],
        "iceTransportPolicy": ice.transport_policy,
        "trickle": ice.trickle,
    }
    if ice.turn_urls and ice.turn_secret:
        body["expires_at"] = int(now + ice.turn_ttl_s)
    return body


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def link_headers(servers: list[IceServer]) -> list[str]:
    """``Link`` header values announcing ICE servers to a WHIP client (RFC 9725 section 4.6)."""
    out = []
    for server in servers:
        for url in server.urls:
            value = f'<{url}>; rel="ice-server"'
            if server.username or server.credential:
                value += (
                    f"; username={_quote(server.username)}; credential={_quote(server.credential)}"
                    '; credential-type="password"'
                )
            out.append(value)
    return out


@documented("ICE configuration for a page: STUN/TURN servers (TURN REST credentials minted per "
            "call), iceTransportPolicy, trickle, expires_at",
            responses={"200": json_body({"type": "object"}, "what RTCPeerConnection takes, plus trickle")})
async def get_ice(request: web.Request) -> web.Response:
    """``GET /api/ice``: the page's ICE configuration, with TURN credentials of its own (never cached)."""
    body = browser_config(request.app[CONFIG].ice, f"page-{secrets.token_urlsafe(9)}")
    return web.json_response(body, headers={"Cache-Control": "no-store"})
