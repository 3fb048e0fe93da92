"""HTTP digest authentication as SIP uses it (RFC 3261 22, RFC 7616 with MD5 and SHA-256, qop=auth), both ways.

- **Callers** outside ``sip.allow_from`` prove they know ``sip.username``/``sip.password``: :class:`DigestServer`
  challenges them (401) and checks their answer. Its nonces are stateless (the time and an HMAC over the time,
  the caller's address and the realm, with a key made at start), so a flood of INVITEs costs no memory; a nonce
  is good for ``NONCE_TTL_S`` from the address it was given to, and each (nonce, nc, cnonce) is taken once (a
  bounded memory of the ones used), so a captured INVITE cannot be replayed.
- **The trunk** challenges us: :func:`authorization` answers its ``WWW-Authenticate`` or ``Proxy-Authenticate``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from assistant.server.sip.uri import AddressError, split_outside_quotes, unquote

NONCE_TTL_S = 300.0
USED_KEPT = 16_384  # answers remembered for replay (a nonce lives 5 min; this is many calls a second)
HASHES: dict[str, Callable[[bytes], hashlib._Hash]] = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}
MAX_PARAM = 1024


def parse_auth(value: str) -> tuple[str, dict[str, str]]:
    """``Digest a="b", c=d`` → ("digest", {"a": "b", "c": "d"}); ValueError if malformed."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    try:
        parts = split_outside_quotes(rest, ",")
    except AddressError as exc:
        raise ValueError(str(exc)) from None
    for part in parts:
        name, eq, val = part.strip().partition("=")
        if not eq:
            if part.strip():
                raise ValueError(f"bad parameter {part[:40]!r}")
            continue
        val = val.strip()
        if val.startswith('"'):
            try:
                val = unquote(val)
            except AddressError as exc:
                raise ValueError(str(exc)) from None
        if len(val) > MAX_PARAM:
            raise ValueError("parameter too long")
        params[name.strip().lower()] = val
    return scheme.lower(), params


def _h(algorithm: str, text: str) -> str:
    return HASHES[algorithm](text.encode()).hexdigest()


def digest_response(algorithm: str, username: str, realm: str, password: str, method: str, uri: str, nonce: str,
                    qop: str = "", nc: str = "", cnonce: str = "") -> str:
    ha1 = _h(algorithm, f"{username}:{realm}:{password}")
    ha2 = _h(algorithm, f"{method}:{uri}")
    if qop:
        return _h(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _h(algorithm, f"{ha1}:{nonce}:{ha2}")


class DigestServer:
    """Challenges callers and checks their credentials (see the module docstring)."""

    def __init__(self, realm: str, username: str, password: str, clock: Callable[[], float] = time.time,
                 algorithms: tuple[str, ...] = ("MD5",)) -> None:
        self.realm, self.username, self.password = realm, username, password
        self.algorithms = algorithms
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._used: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.password)

    def _nonce_mac(self, stamp: str, source: str) -> str:
        return hmac.new(self._key, f"{stamp}:{source}:{self.realm}".encode(), hashlib.sha256).hexdigest()[:32]

    def nonce(self, source: str) -> str:
        stamp = f"{int(self.clock()):x}"
        return f"{stamp}.{self._nonce_mac(stamp, source)}"

    def nonce_state(self, nonce: str, source: str) -> str:
        """``ok``, ``stale`` (ours, but too old) or ``bad`` (not ours, or given to another address)."""
        stamp, dot, mac = nonce.partition(".")
        if not dot or len(stamp) > 12 or not hmac.compare_digest(mac, self._nonce_mac(stamp, source)):
            return "bad"
        try:
            age = self.clock() - int(stamp, 16)
        except ValueError:
            return "bad"
        return "ok" if -5.0 <= age <= NONCE_TTL_S else "stale"

    def challenge(self, source: str, stale: bool = False) -> list[str]:
        """``WWW-Authenticate`` values, one per algorithm in order (RFC 8760: the one preferred first)."""
        nonce = self.nonce(source)
        tail = ", stale=true" if stale else ""
        return [f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={alg}, qop="auth"{tail}'
                for alg in self.algorithms]

    def check(self, header: str | None, method: str, source: str) -> str:
        """``ok``; else why not: ``missing``, ``malformed``, ``stale``, ``bad_nonce``, ``wrong`` (user, realm or
        response), ``replayed``."""
        if not header:
            return "missing"
        try:
            scheme, p = parse_auth(header)
        except ValueError:
            return "malformed"
        if scheme != "digest" or not all(k in p for k in ("username", "realm", "nonce", "uri", "response")):
            return "malformed"
        algorithm = p.get("algorithm", "MD5").upper()
        qop = p.get("qop", "")
        if algorithm not in self.algorithms or qop not in ("", "auth"):
            return "malformed"
        if qop and not (p.get("nc") and p.get("cnonce")):
            return "malformed"
        state = self.nonce_state(p["nonce"], source)
        if state != "ok":
            return "stale" if state == "stale" else "bad_nonce"
        if not (hmac.compare_digest(p["username"].encode(), self.username.encode()) and p["realm"] == self.realm):
            return "wrong"
        expected = digest_response(algorithm, self.username, self.realm, self.password, method, p["uri"], p["nonce"],
                                   qop, p.get("nc", ""), p.get("cnonce", ""))
        if not hmac.compare_digest(expected.encode(), p["response"].lower().encode()):
            return "wrong"
        key = (p["nonce"], p.get("nc", ""), p.get("cnonce", ""))
        if key in self._used:
            return "replayed"
        self._used[key] = None
        while len(self._used) > USED_KEPT:
            self._used.popitem(last=False)
        return "ok"


def authorization(challenge: str, method: str, uri: str, username: str, password: str, nc: int = 1) -> str | None:
    """The ``Authorization`` (or ``Proxy-Authorization``) value answering ``challenge``; None if we cannot."""
    try:
        scheme, p = parse_auth(challenge)
    except ValueError:
        return None
    algorithm = p.get("algorithm", "MD5").upper()
    if scheme != "digest" or "nonce" not in p or algorithm not in HASHES:
        return None
    realm, nonce = p.get("realm", ""), p["nonce"]
    qops = [q.strip() for q in p.get("qop", "").split(",") if q.strip()]
    qop = "auth" if "auth" in qops else ""
    if qops and not qop:
        return None
    cnonce, count = secrets.token_hex(8), f"{nc:08x}"
    response = digest_response(algorithm, username, realm, password, method, uri, nonce, qop, count, cnonce)
    parts = [f'username="{username}"', f'realm="{realm}"', f'nonce="{nonce}"', f'uri="{uri}"',
             f'response="{response}"', f"algorithm={algorithm}"]
    if qop:
        parts += [f"qop={qop}", f"nc={count}", f'cnonce="{cnonce}"']
    if "opaque" in p:
        parts.append(f'opaque="{p["opaque"]}"')
    return "Digest " + ", ".join(parts)


def pick_challenge(values: list[str]) -> str | None:
    """Of several challenges, the one we answer best: SHA-256 before MD5."""
    for want in ("SHA-256", "MD5"):
        for value in values:
            try:
                scheme, p = parse_auth(value)
            except ValueError:
                continue
            if scheme == "digest" and p.get("algorithm", "MD5").upper() == want:
                return value
    return None
