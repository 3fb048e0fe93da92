"""Who may call the webhooks: each carrier's request signature, and a guard against the same request twice.

- **Twilio** (``X-Twilio-Signature``): HMAC-SHA1, keyed with the account's auth token, over the full URL Twilio
  requested (scheme, host, path, query) followed by every POST parameter's name and value, the parameters sorted
  by name, with no separators; base64. Twilio sometimes signs an ``https`` URL with its default port written out
  and sometimes without, so both spellings are tried (as Twilio's own libraries do).
- **Telnyx** (``telnyx-signature-ed25519``, ``telnyx-timestamp``): an Ed25519 signature, made with the account's
  private key, over ``"{timestamp}|{raw body}"``; base64. We hold only the public key, so nothing here can sign.

A valid signature is not enough: a captured request would be valid again. :class:`ReplayGuard` remembers what it
accepted and refuses the same again: a Twilio signature for ``telephony.replay_window_s`` after it was first seen;
a Telnyx request by its signed message (:func:`telnyx_message_key`: the timestamp and body, not the base64 spelling
of the signature, which has 16 spellings of one 64-byte signature) until its timestamp leaves the window, after
which the timestamp check refuses it. Neither outlives the process: the call ids already answered
(``answered.py``) are what refuses a replay after the window, a restart, or at another gateway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

MAX_REMEMBERED = 100_000  # signatures kept for the replay window; past it the oldest go first (logged by the caller)
DEFAULT_PORTS = {"https": 443, "http": 80}


def twilio_signature(auth_token: str, url: str, params: Iterable[tuple[str, str]]) -> str:
    """The ``X-Twilio-Signature`` of a request to ``url`` with these form parameters."""
    data = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def url_spellings(url: str) -> list[str]:
    """``url`` as given, and with its scheme's default port added (or removed, if it was written out)."""
    parts = urlsplit(url)
    default = DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if default is None or not host:
        return [url]
    host = f"[{host}]" if ":" in host else host
    if parts.port is None:
        other = parts._replace(netloc=f"{host}:{default}")
    elif parts.port == default:
        other = parts._replace(netloc=host)
    else:
        return [url]
    return [url, urlunsplit(other)]


def twilio_valid(auth_token: str, signature: str, url: str, params: list[tuple[str, str]]) -> bool:
    """Whether ``signature`` is Twilio's for this request (constant-time compare)."""
    if not auth_token or not signature or not signature.isascii():  # base64 is ASCII; other bytes never match
        return False
    given = signature.encode()
    return any(hmac.compare_digest(twilio_signature(auth_token, u, params).encode(), given)
               for u in url_spellings(url))


class PublicKeyError(ValueError):
    """A Telnyx public key that is not 32 bytes of base64."""


def telnyx_key(public_key_b64: str) -> bytes:
    """The raw 32-byte Ed25519 public key from its base64 form (as the Telnyx portal shows it)."""
    try:
        raw = base64.b64decode(public_key_b64.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise PublicKeyError("telephony.telnyx_public_key is not base64") from None
    if len(raw) != 32:
        raise PublicKeyError(f"telephony.telnyx_public_key is {len(raw)} bytes; an Ed25519 public key is 32")
    return raw


def telnyx_valid(public_key: bytes, signature_b64: str, timestamp: str, body: bytes) -> bool:
    """Whether ``signature_b64`` is Telnyx's Ed25519 signature of ``timestamp|body``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, timestamp.encode() + b"|" + body)
    except InvalidSignature:
        return False
    return True


def telnyx_message_key(timestamp: str, body: bytes) -> str:
    """What a Telnyx signature signs, as the replay guard's key: one per signed message, however it is spelled."""
    return hashlib.sha256(timestamp.encode() + b"|" + body).hexdigest()


class ReplayGuard:
    """Keys accepted and not yet expired (by default ``window_s`` after first sight): :meth:`first_time` is False
    for one seen before."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic,
                 limit: int = MAX_REMEMBERED) -> None:
        self.window_s = window_s
        self.clock = clock
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()  # key → when it is forgotten, in order of first sight
        self.evicted = 0  # remembered ones pushed out before their window ended (a flood of signed requests)

    def first_time(self, key: str, until: float | None = None) -> bool:
        """Remember ``key`` until ``until`` (on this guard's clock; default ``window_s`` from now); False when it
        is remembered already."""
        now = self.clock()
        while self._seen:
            oldest, expiry = next(iter(self._seen.items()))
            if expiry > now:
                break
            del self._seen[oldest]
        known = self._seen.get(key)
        if known is not None and known > now:
            return False
        self._seen[key] = now + self.window_s if until is None else until
        self._seen.move_to_end(key)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)
            self.evicted += 1
        return True

    def __len__(self) -> int:
        return len(self._seen)
