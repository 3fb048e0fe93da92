"""Keys: who a caller is, and what it may do.

The server token (``server.auth_token``) is the admin key. It mints short-lived keys (``POST /api/keys``; for
OpenAI's Realtime clients ``POST /v1/realtime/client_secrets``, in the reference's shape) with scopes, an expiry
and, optionally, a cap on the sessions they hold at once. A browser page, a phone app or a partner gets such a
key from a server-side app that holds the token; the token itself never leaves that app.

A key is stateless: everything it grants is in it, signed. ::

    ek_<base64url(zlib(claims JSON))>.<base64url(HMAC-SHA256(signing key, "ek_<claims>"))>
    claims: {"v": 1, "kid": key id, "scope": ["call"], "iat": minted at, "exp": expires at (Unix s),
             "max": sessions at once (optional), "rt": a Realtime session configuration (optional),
             "grp": the capped key whose cap "max" counts against (optional: minted under a capped key)}
    signing key = HMAC-SHA256(server.auth_token, "assistant key v1")

Why signed rather than stored: a key minted on one gateway works on every gateway and on the dispatcher that
share the token (a client secret minted through the dispatcher opens a call on whichever gateway takes it),
it survives restarts, and there is nothing to store, replicate or clean up. Its price: one key cannot be revoked
alone. Rotating the server token revokes every key at once; short lifetimes (10 minutes by default) bound the
rest. The claims are readable (base64, not encrypted): a key carries nothing its holder may not see.

Scopes: ``call`` (open calls: the page's offer, WHIP, Realtime calls and WebSockets; ICE; one's own sessions),
``tts`` (the TTS API and the voice list), ``dial`` (outgoing SIP calls through the trunk: ``POST /api/sip/calls``
and the records of the calls it placed; never part of ``call``, since dialing out costs money), ``admin``
(everything: minting, every session, changing voices, readiness details, metrics). A key's expiry bounds what it can
start (open a session, list, synthesise, mint), not the calls it started: as the reference's client secrets, a
session lives on after its key expired, and the key may still trickle candidates into it and hang it up (its scope
still checked). A key minted by a minted key stays within its parent: no longer-lived, and under a capped parent no
more sessions than the parent's cap, counted together with the parent's (the ``grp`` claim).

Without a server token nothing is checked (every caller is the admin: only a loopback address may run so,
``server.allow_public_without_token`` aside); a key presented there is still read, for its Realtime session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
import time
import zlib
from dataclasses import dataclass, field, replace

from aiohttp import web

from assistant.body import loads_bounded
from assistant.server.http import CONFIG, HTTPJSONError, read_json
from assistant.server.openai_front import subprotocol_key
from assistant.server.openapi import documented, error, json_body

log = logging.getLogger(__name__)

PREFIX = "ek_"
CALL, TTS, DIAL, ADMIN = "call", "tts", "dial", "admin"
SCOPES = (CALL, TTS, DIAL, ADMIN)
ADMIN_ID = "admin"  # the owner of sessions the server token opens
MAX_KEY_CHARS = 6000  # an Authorization header fits 8 KB; the claims (a Realtime session with it) must fit this
MAX_CLAIMS_BYTES = 65_536
MIN_TTL_S = 10
_CONTEXT = b"assistant key v1"
wall_clock = time.time  # what expiry is read against (Unix time; keep the gateways' clocks right: NTP)


class BadKey(Exception):
    """A credential that names nobody: ``code`` says why (``unauthorized``, ``invalid_key``, ``key_expired``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the admin (the server token), a minted key, or nobody (no credential)."""

    id: str  # ADMIN_ID for the server token; a minted key's id; "" for nobody
    scopes: frozenset[str] = frozenset()
    expires_at: int | None = None
    expired: bool = False
    max_sessions: int | None = None  # sessions this key may hold open at once (None: no cap of its own)
    session: dict[str, object] | None = field(default=None, compare=False)  # a client secret's Realtime session
    cap_group: str = ""  # the capped key whose cap this one's sessions count against ("": its own)

    @property
    def group(self) -> str:
        """Whose sessions this key's cap counts: a capped key's, and every key minted under it."""
        return self.cap_group or self.id

    @property
    def admin(self) -> bool:
        return ADMIN in self.scopes and not self.expired

    @property
    def known(self) -> bool:
        return bool(self.id)

    def may(self, scope: str | None) -> bool:
        """Whether this caller may start what needs ``scope`` (None: any valid key)."""
        if not self.known or self.expired:
            return False
        return scope is None or self.admin or scope in self.scopes

    def owns(self, owner: str) -> bool:
        """Whether this caller may see and act on a session opened by ``owner`` (its own, or any as the admin)."""
        return self.admin or (self.known and owner == self.id)


ADMIN_PRINCIPAL = Principal(ADMIN_ID, frozenset({ADMIN}))
NOBODY = Principal("")
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)


def principal_of(request: web.Request) -> Principal:
    """Who sent ``request`` (set by the front's auth middleware; nobody when it did not run)."""
    return request.get(PRINCIPAL, NOBODY)


# --- the format ------------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_key(token: str) -> bytes:
    """The key minted keys are signed with: derived from the server token, so rotating the token revokes them."""
    return hmac.new(token.encode(), _CONTEXT, hashlib.sha256).digest()


def _mac(token: str, signed: str) -> bytes:
    return hmac.new(signing_key(token), signed.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Minted:
    value: str
    principal: Principal


def mint(token: str, scopes: list[str] | tuple[str, ...], ttl_s: int, *, max_sessions: int | None = None,
         session: dict[str, object] | None = None, now: float | None = None, cap_group: str = "") -> Minted:
    """A new key for ``scopes`` that expires ``ttl_s`` from ``now`` (ValueError: unknown scope, or too large);
    ``cap_group``: the capped key whose cap its sessions count against (:func:`within_parent`)."""
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(f"scope must be one or more of {', '.join(SCOPES)}; got {list(scopes)!r}")
    issued = int(wall_clock() if now is None else now)
    claims: dict[str, object] = {"v": 1, "kid": secrets.token_urlsafe(12), "scope": sorted(set(scopes)),
                              "iat": issued, "exp": issued + int(ttl_s)}
    if max_sessions is not None:
        claims["max"] = int(max_sessions)
    if session is not None:
        claims["rt"] = session
    if cap_group:
        claims["grp"] = cap_group
    packed = zlib.compress(json.dumps(claims, separators=(",", ":"), ensure_ascii=False).encode(), 9)
    signed = PREFIX + _b64(packed)
    value = f"{signed}.{_b64(_mac(token, signed))}"
    if len(value) > MAX_KEY_CHARS:
        raise ValueError(f"the key would be {len(value)} characters, over {MAX_KEY_CHARS}: make the session "
                         "configuration smaller (long instructions or tools can be sent with session.update)")
    return Minted(value, _principal(claims, issued))


def verify(token: str, value: str, now: float | None = None) -> Principal:
    """The principal a minted key names (``expired`` set once it is past its expiry), or :class:`BadKey`."""
    signed, dot, mac = value.rpartition(".")
    if len(value) > MAX_KEY_CHARS or not dot or not signed.startswith(PREFIX):
        raise BadKey("invalid_key", "malformed key")
    try:
        given = _unb64(mac)
    except (binascii.Error, ValueError):
        raise BadKey("invalid_key", "malformed key") from None
    if not hmac.compare_digest(given, _mac(token, signed)):
        # Signed with another token (rotated since), or forged.
        raise BadKey("invalid_key", "this key was not minted with the current server token (or was altered)")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(_unb64(signed[len(PREFIX):]), MAX_CLAIMS_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("claims too large")
        claims = loads_bounded(raw)
        principal = _principal(claims, int(wall_clock() if now is None else now))
    except (binascii.Error, zlib.error, ValueError, TypeError, KeyError):
        raise BadKey("invalid_key", "malformed key") from None
    return principal


def _principal(claims: object, now: int) -> Principal:
    if not isinstance(claims, dict) or claims.get("v") != 1:
        raise ValueError("unknown key version")
    scopes, exp, cap, session = claims["scope"], claims["exp"], claims.get("max"), claims.get("rt")
    group = claims.get("grp", "")
    if not isinstance(scopes, list) or not all(s in SCOPES for s in scopes) or not isinstance(exp, int):
        raise ValueError("bad claims")
    if (cap is not None and not isinstance(cap, int)) or (session is not None and not isinstance(session, dict)):
        raise ValueError("bad claims")
    if not isinstance(group, str):
        raise ValueError("bad claims")
    return Principal(str(claims["kid"]), frozenset(scopes), exp, now >= exp, cap, session, group)


# --- who sent a request ----------------------------------------------------------------------------------
def presented(request: web.Request) -> str | None:
    """The credential a request carries (None: none): ``Authorization: Bearer``; on a ``/ws/`` upgrade also
    ``?token=`` (browsers cannot set headers there); under ``/v1/`` also the subprotocol
    ``openai-insecure-api-key.<key>`` (OpenAI's browser clients)."""
    header = request.headers.get("Authorization")
    if header is None and request.path.startswith("/ws/") and "token" in request.query:
        header = f"Bearer {request.query['token']}"
    if header is None and request.path.startswith("/v1/"):
        header = subprotocol_key(request).decode("utf-8", "surrogateescape") or None
    if header is None:
        return None
    if not header.isascii():  # bytes that are not ASCII (aiohttp keeps them surrogate-escaped): no key is spelled so
        return ""
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def identify(request: web.Request, token: str) -> Principal:
    """Who ``request`` comes from, or :class:`BadKey`. With no server token everyone is the admin (a key presented
    is still verified, and its Realtime session kept)."""
    value = presented(request)
    if value is None:
        return NOBODY if token else ADMIN_PRINCIPAL
    if token and hmac.compare_digest(value.encode(), token.encode()):
        return ADMIN_PRINCIPAL
    if value.startswith(PREFIX):
        who = verify(token, value)
        return who if token else replace(who, scopes=who.scopes | {ADMIN})
    if token:
        raise BadKey("unauthorized", "missing or wrong bearer token")
    return ADMIN_PRINCIPAL  # no token: any bearer is accepted (SDKs always send one)


def refusal(who: Principal, scope: str | None, acts_on_own: bool) -> BadKey | None:
    """Why ``who`` may not call a protected route that needs ``scope`` (None: it may). ``acts_on_own``: the route
    acts on one session, which the handler checks is the caller's; an expired key may still do that."""
    if not who.known:
        return BadKey("unauthorized", "missing or wrong bearer token")
    if who.expired and not acts_on_own:
        return BadKey("key_expired", "this key has expired: ask the app that gave it for a new one")
    if not who.may(scope) and not (who.expired and (scope is None or ADMIN in who.scopes or scope in who.scopes)):
        return BadKey("forbidden_scope", f"this key's scope ({', '.join(sorted(who.scopes))}) does not allow this "
                      f"(needs {scope})")
    return None


# --- POST /api/keys --------------------------------------------------------------------------------------
def key_lifetime(value: object, default: int, longest: int, param: str) -> int:
    """A requested lifetime in seconds, checked (400 otherwise)."""
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_TTL_S <= value <= longest:
        raise HTTPJSONError(400, "bad_request", f"'{param}' must be a whole number of seconds from {MIN_TTL_S} to "
                            f"{longest}")
    return value


def within_parent(who: Principal, ttl_s: int, now: int) -> int:
    """A key minted by a minted admin key lives no longer than the key that minted it."""
    return ttl_s if who.expires_at is None else max(0, min(ttl_s, who.expires_at - now))


def cap_within_parent(who: Principal, cap: int | None) -> tuple[int | None, str]:
    """The session cap of a key minted by ``who`` and the group it counts against: under a capped parent, at most
    the parent's cap, shared with the parent and every key minted under it (else a capped admin key would mint
    uncapped keys, or many capped ones)."""
    if who.max_sessions is None:
        return cap, ""
    return (who.max_sessions if cap is None else min(cap, who.max_sessions)), who.group


KEY_REQUEST = {
    "type": "object",
    "properties": {
        "scope": {"type": "array", "items": {"enum": list(SCOPES)}, "description": "default [call]"},
        "ttl_s": {"type": "integer", "minimum": MIN_TTL_S, "description": "lifetime (default keys.default_ttl_s, at "
                  "most keys.max_ttl_s)"},
        "max_sessions": {"type": "integer", "minimum": 1, "description": "sessions it may hold open at once"},
    },
}
KEY_ANSWER = {
    "type": "object", "required": ["key", "key_id", "scope", "expires_at"],
    "properties": {"key": {"type": "string", "description": "ek_...: send as Authorization: Bearer"},
                   "key_id": {"type": "string", "description": "what session lists call its owner"},
                   "scope": {"type": "array", "items": {"type": "string"}},
                   "expires_at": {"type": "integer", "description": "Unix time"},
                   "max_sessions": {"type": ["integer", "null"]}},
}


@documented("Mint a short-lived key (admin): scopes call, tts, admin; an expiry; optionally a session cap",
            request={"application/json": {"schema": KEY_REQUEST}},
            responses={"200": json_body(KEY_ANSWER, "the key"), "400": error("bad scope, lifetime or cap"),
                       "403": error("the caller is not the admin")})
async def create_key(request: web.Request) -> web.Response:
    """``POST /api/keys``."""
    cfg = request.app[CONFIG]
    data = await read_json(request, cfg.server.max_body_bytes)
    scopes = data.get("scope", [CALL])
    if isinstance(scopes, str):
        scopes = [scopes]
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) and s in SCOPES for s in scopes):
        raise HTTPJSONError(400, "bad_request", f"'scope' must be a list of {', '.join(SCOPES)}")
    ttl = key_lifetime(data.get("ttl_s"), cfg.keys.default_ttl_s, cfg.keys.max_ttl_s, "ttl_s")
    cap = data.get("max_sessions")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise HTTPJSONError(400, "bad_request", "'max_sessions' must be a whole number of at least 1")
    unknown = sorted(set(data) - {"scope", "ttl_s", "max_sessions"})
    if unknown:
        raise HTTPJSONError(400, "bad_request", f"unknown field {unknown[0]!r}; known: scope, ttl_s, max_sessions")
    now = int(wall_clock())
    parent = principal_of(request)
    cap, group = cap_within_parent(parent, cap)
    minted = mint(cfg.server.auth_token, scopes, within_parent(parent, ttl, now), max_sessions=cap, now=now,
                  cap_group=group)
    who = minted.principal
    log.info("key_minted key=%s scope=%s ttl_s=%d max_sessions=%s", who.id, ",".join(sorted(who.scopes)),
             (who.expires_at or now) - now, cap)
    return web.json_response({"key": minted.value, "key_id": who.id, "scope": sorted(who.scopes),
                              "expires_at": who.expires_at, "max_sessions": cap},
                             headers={"Cache-Control": "no-store"})
