"""Per-client limits: who the client is (behind the proxies we trust), a rate budget per kind of route, and how
many of a thing one client holds open.

Which budget a route spends is a fact of its row in the route table (``Route.budget``); the guard middleware
(``front.py``) spends it before the handler runs, so a refused request costs no body read. The TTS WebSocket
spends the ``tts`` budget once per request it carries, the same bucket as ``POST /api/tts``.

The client is the peer address, unless the peer is one of ``server.trusted_proxies``: then the address its
``X-Forwarded-For`` (or, without one, ``Forwarded``) names, read from the right, past every trusted hop. IPv6
clients are keyed by their /48 (``server.ipv6_client_prefix``): a /48 is what one site gets, and keying by anything
longer would hand its holder a budget per address it can take (a /48 holds 65,536 /64s). The price: everyone behind
one /48 (a carrier that numbers its phones from one, as a large NAT shares one IPv4 address) shares one budget.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator

from aiohttp import web

from assistant.config import Config, ConfigError
from assistant.server.http import APIError

MAX_RATE_CLIENTS = 10_000   # buckets kept per budget; the least recently seen go first
IPV6_CLIENT_PREFIX = 48  # the default of server.ipv6_client_prefix
CLIENT_KEY: web.RequestKey[str] = web.RequestKey("client", str)  # a request's client, once worked out

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RateLimiter:
    """Token bucket per client: ``per_minute`` requests of burst, refilled evenly over a minute."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client → (tokens, stamp)

    def take(self, client: str) -> float:
        """Spend one token; return 0.0 if allowed, else the seconds until a token is back."""
        if self.per_minute <= 0:
            return 0.0
        now = self.clock()
        rate = self.per_minute / 60.0
        tokens, stamp = self._buckets.pop(client, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - stamp) * rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / rate
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > MAX_RATE_CLIENTS:
            self._buckets.popitem(last=False)
        return wait


# Each budget: its requests per client per minute, and what a refusal calls them.
BUDGETS: dict[str, tuple[Callable[[Config], int], str]] = {
    "offer": (lambda c: c.server.offers_per_minute, "offers"),
    "trickle": (lambda c: c.server.trickle_per_minute, "trickle PATCHes"),
    "ice": (lambda c: c.server.ice_per_minute, "ICE configurations"),
    "tts": (lambda c: c.tts_api.rate_per_minute, "TTS requests"),
    "voices": (lambda c: c.tts_api.voices_per_minute, "voice changes"),
    "keys": (lambda c: c.keys.per_minute, "keys minted"),
    "dial": (lambda c: c.sip.dials_per_minute, "outgoing calls"),
}


def trusted_networks(cidrs: list[str]) -> list[Network]:
    out = []
    for text in cidrs:
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError as exc:
            raise ConfigError(f"server.trusted_proxies: {text!r} is not a CIDR ({exc})") from None
    return out


def _address(text: str) -> Address | None:
    """An address as proxies write it (``1.2.3.4``, ``1.2.3.4:5678``, ``[::1]:443``, ``"[::1]"``), or None."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _forwarded_chain(request: web.Request) -> list[str]:
    """The addresses the proxies recorded, oldest first (X-Forwarded-For; else Forwarded's ``for=``)."""
    xff = request.headers.getall("X-Forwarded-For", [])
    if xff:
        return [part for value in xff for part in value.split(",")]
    chain = []
    for value in request.headers.getall("Forwarded", []):
        for element in value.split(","):
            for pair in element.split(";"):
                name, _, val = pair.strip().partition("=")
                if name.lower() == "for":
                    chain.append(val)
    return chain


def client_key(address: Address, ipv6_prefix: int = IPV6_CLIENT_PREFIX) -> str:
    """What the limits count by: the address, an IPv6 one by its ``ipv6_prefix`` (a /48 by default)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/{ipv6_prefix}", strict=False))
    return str(address)


class Limits:
    """The per-client budgets of one front (a gateway or the dispatcher) and what clients hold open."""

    def __init__(self, cfg: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.trusted = trusted_networks(cfg.server.trusted_proxies)
        self.ipv6_prefix = cfg.server.ipv6_client_prefix
        if not 16 <= self.ipv6_prefix <= 128:
            raise ConfigError(f"server.ipv6_client_prefix must be from 16 to 128, got {self.ipv6_prefix}")
        self.rates = {kind: RateLimiter(rate(cfg), clock) for kind, (rate, _) in BUDGETS.items()}
        self._held: dict[str, Counter[str]] = {}

    def _trusted(self, address: Address | None) -> bool:
        return address is not None and any(address in net for net in self.trusted)

    def via_trusted_proxy(self, request: web.Request) -> bool:
        """Whether the request came through one of ``server.trusted_proxies``."""
        return self._trusted(_address(request.remote or ""))

    def client_address(self, request: web.Request) -> str:
        """The client's address: the peer's, or past trusted proxies the one their headers name."""
        peer = _address(request.remote or "")
        if peer is None or not self._trusted(peer):
            return str(peer) if peer is not None else (request.remote or "unknown")
        hop = peer
        for entry in reversed(_forwarded_chain(request)):
            named = _address(entry)
            if named is None:  # a hop we cannot read: the last one we could is as far as we know
                break
            hop = named
            if not self._trusted(named):
                break
        return str(hop)

    def client(self, request: web.Request) -> str:
        """The key the per-client limits use for this request (worked out once per request)."""
        if CLIENT_KEY not in request:
            address = _address(self.client_address(request))
            request[CLIENT_KEY] = (client_key(address, self.ipv6_prefix) if address is not None
                                   else (request.remote or "unknown"))
        return request[CLIENT_KEY]

    def take(self, kind: str, client: str) -> None:
        """Spend one of ``client``'s ``kind`` budget, or raise 429 ``rate_limited`` with Retry-After."""
        wait = self.rates[kind].take(client)
        if wait > 0:
            raise APIError(429, "rate_limited", f"more than {self.rates[kind].per_minute} {BUDGETS[kind][1]} per "
                           "minute from this client", {"Retry-After": str(max(1, math.ceil(wait)))})

    @contextlib.contextmanager
    def holding(self, kind: str, client: str, per_client: int, total: int, what: str) -> Iterator[None]:
        """Count one ``kind`` held open by ``client`` for the block: 429 past ``per_client``, 503 past ``total``."""
        held = self._held.setdefault(kind, Counter())
        if held[client] >= per_client:
            raise APIError(429, "too_many", f"this client already holds {per_client} {what}",
                           {"Retry-After": "5"})
        if held.total() >= total:
            raise APIError(503, "busy", f"all {total} {what} are in use", {"Retry-After": "5"})
        held[client] += 1
        try:
            yield
        finally:
            held[client] -= 1
            if held[client] <= 0:
                del held[client]


LIMITS: web.AppKey[Limits] = web.AppKey("limits", Limits)
