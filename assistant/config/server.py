"""The server's own settings: where it listens and who may call (``[server]``), how peers find a path
(``[ice]``), keys (``[keys]``), logging (``[log]``) and the front for several gateways (``[dispatch]``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from assistant.config.fields import ConfigError, setting


@dataclass
class ServerConfig:
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0 to expose on the network)")
    port: int = setting(8080, "HTTP port")
    web_dir: str = setting("", "folder served at / (empty: the page in the package, assistant/web/)")
    data_dir: str = setting("data", "where voices and other saved state live")
    max_sessions: int = setting(32, "voice chat sessions at once; offers past this get 503")
    idle_timeout_s: float = setting(120.0, "close a session whose peer sent no audio packets for this long")
    max_silence_s: float = setting(600.0, "close a session in which nobody spoke for this long")
    connect_timeout_s: float = setting(20.0, "close a peer that has not connected this long after the offer")
    max_body_bytes: int = setting(262_144, "largest JSON request body accepted (offers, TTS requests)")
    max_sdp_bytes: int = setting(65_536, "largest SDP accepted in an offer")
    body_timeout_s: float = setting(60.0, "a request body still arriving after this long is refused (408): a body "
                                    "trickled in forever would hold its handler forever")
    auth_token: str = setting(
        "", "the admin key: bearer token required on /api/*, /ws/* and /v1/* (or a key it minted); empty: no auth, "
        "and only a loopback address (server.allow_public_without_token)",
    )
    cors_origins: list[str] = setting([], "origins allowed to call the API cross-site (empty: CORS off)")
    tls_cert: str = setting("", "PEM certificate chain file: serve HTTPS and WSS directly (with server.tls_key)")
    tls_key: str = setting("", "PEM private key file for server.tls_cert")
    shutdown_timeout_s: float = setting(5.0, "time given to sessions to close at shutdown")
    exit_on_load_failure: bool = setting(
        True, "`assistant serve` stops (exit status 1) when a model fails to load; false: stay up, /readyz 503 "
        "with the reason",
    )
    gateway_id: str = setting(
        "",
        "this gateway's name behind `assistant dispatch` (letters, digits, - and _, at most 32): every session id "
        "becomes ID.TOKEN, so the dispatcher routes a session's PATCH/DELETE here (empty: no prefix)",
    )
    trusted_proxies: list[str] = setting(
        [], "CIDRs of proxies in front (Caddy, nginx, `assistant dispatch`) whose X-Forwarded-For or Forwarded "
        "header names the client; the per-client limits key on that client (empty: the peer address)",
    )
    allowed_hosts: list[str] = setting(
        [], "host names this server answers to (421 otherwise; loopback names always); empty: any, except that a "
        "server with no auth_token answers only to loopback names, IP addresses and trusted proxies (no DNS "
        "rebinding)",
    )
    offers_per_minute: int = setting(20, "offers (POST /api/offer, WHIP) per client per minute (0: unlimited)")
    trickle_per_minute: int = setting(600, "trickle PATCHes per client per minute (0: unlimited)")
    ice_per_minute: int = setting(60, "GET /api/ice (fresh TURN credentials) per client per minute (0: unlimited)")
    max_connecting: int = setting(
        16, "sessions not yet connected at once; when these or all session slots are taken, a new offer replaces "
        "the oldest one still connecting after 5 s (else 503)",
    )
    max_connecting_per_client: int = setting(4, "sessions not yet connected per client; past it 429")
    # Who may call, and how much one client may hold (docs/security.md).
    max_sessions_per_client: int = setting(
        8, "sessions one client holds at once, connected or not (page calls, WHIP, Realtime calls and WebSockets); "
        "past it 429 (0: no cap)",
    )
    ipv6_client_prefix: int = setting(
        48, "the IPv6 prefix the per-client limits count as one client: a /48 is one site, so its holder cannot "
        "multiply its budgets by hopping addresses; everyone behind one /48 shares them (64: one subnet)",
    )
    allow_public_without_token: bool = setting(
        False, "I mean it: listen on a non-loopback address with no auth_token (anyone who reaches the port may "
        "open calls and use the TTS API; a warning is logged). Off: `serve` and `dispatch` refuse to start so",
    )
    metrics_port: int = setting(
        0, "a second listener serving only GET /metrics with no token, for Prometheus (0: none; /metrics on the "
        "main port needs the token)",
    )
    metrics_host: str = setting("127.0.0.1", "address of the metrics listener (server.metrics_port)")


@dataclass
class ICEConfig:
    """How both peers find a path: STUN/TURN servers, TURN credentials, transport policy, trickle."""

    stun_urls: list[str] = setting([], "STUN URLs (stun:host:port) for both peers (none and no TURN: host candidates)")
    turn_urls: list[str] = setting(
        [],
        "TURN URLs (turn:host:port?transport=udp|tcp, turns:host:port?transport=tcp) for both peers; the "
        "server's own peer uses the first one it supports",
    )
    turn_username: str = setting("", "static TURN username (used when turn_secret is empty)")
    turn_credential: str = setting("", "static TURN password (used when turn_secret is empty)")
    turn_secret: str = setting(
        "",
        "TURN REST shared secret (coturn static-auth-secret with use-auth-secret): each session gets its own "
        "username and HMAC credential that expire; the secret never leaves the server",
    )
    turn_ttl_s: int = setting(
        300, "lifetime of a TURN REST credential: a call must set up its relay within it (coturn checks the "
        "expiry when a relay is allocated; one made in time lives on while the call refreshes it)",
    )
    transport_policy: str = setting("all", "ICE transport policy for both peers: all, or relay (only TURN paths)")
    trickle: bool = setting(
        True, "the page sends its offer at once and its candidates as they come (off: gathered first)")
    max_fragment_bytes: int = setting(16_384, "largest trickle ICE fragment (PATCH body) accepted")
    max_remote_candidates: int = setting(64, "most trickled candidates one session may add")


@dataclass
class KeysConfig:
    """Short-lived keys the server token mints (POST /api/keys, POST /v1/realtime/client_secrets)."""

    default_ttl_s: int = setting(600, "lifetime of a minted key when the request names none")
    max_ttl_s: int = setting(86_400, "longest lifetime a minted key may have")
    per_minute: int = setting(600, "keys minted per client per minute (0: unlimited)")


@dataclass
class LogConfig:
    level: str = setting("INFO", "log level")
    debug_content: bool = setting(False, "log user text and transcripts (off: only sizes and timings)")


@dataclass
class DispatchConfig:
    """``assistant dispatch``: one front for several gateways (each an ``assistant serve`` with a gateway_id)."""

    gateways: list[str] = setting(
        [], "gateway base URLs (http://10.0.0.5:8081, ...): the only places the dispatcher ever sends a request"
    )
    poll_interval_s: float = setting(1.0, "time between heartbeats (GET /readyz) to each gateway")
    poll_timeout_s: float = setting(
        2.0, "a heartbeat slower than this fails: the gateway counts as down until it answers")
    request_timeout_s: float = setting(
        25.0,
        "longest a proxied call may wait for a gateway's answer (above server.connect_timeout_s, which an offer "
        "may take); streamed answers: longest wait between two chunks",
    )
    max_connections: int = setting(512, "connections to the gateways at once (each proxied WebSocket holds one)")


GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def check_gateway_id(value: str) -> str:
    """``server.gateway_id``, or a ConfigError saying why it cannot prefix session ids (the dot separates them)."""
    if value and not GATEWAY_ID.fullmatch(value):
        raise ConfigError(f"server.gateway_id must be 1-32 letters, digits, - or _ (got {value!r})")
    return value
