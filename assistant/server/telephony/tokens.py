"""Per-call media tokens: what lets a carrier's media stream in, once, for the call it was made for.

A token is 24 random bytes (URL-safe base64), **stored** on this gateway with its carrier, the call's id and an
expiry (not HMAC-signed: single use needs a record of use anyway, and a stored token can be withdrawn). The
webhook mints one for the call it answers and puts it in the stream's parameters; the media stream's ``start``
must carry it within ``telephony.token_ttl_s``, for the same carrier and the same call id. Redeeming takes the
token out of the table, whatever the outcome: a token is never good twice. The table holds at most
``telephony.max_pending_calls`` tokens; expired ones are swept before a new one is refused.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

TOKEN_BYTES = 24


class TokenError(ValueError):
    """A token refused; ``reason`` is the log's word for why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Grant:
    carrier: str
    call_id: str
    expires: float


class CallTokens:
    """The tokens minted and not yet redeemed (see the module docstring)."""

    def __init__(self, ttl_s: float, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self.clock = clock
        self._grants: OrderedDict[str, Grant] = OrderedDict()  # in minting order: the oldest expire first

    def __len__(self) -> int:
        return len(self._grants)

    def _sweep(self, now: float) -> None:
        while self._grants:
            token, grant = next(iter(self._grants.items()))
            if grant.expires > now:
                break
            del self._grants[token]

    def mint(self, carrier: str, call_id: str) -> str | None:
        """A new token for this call, or None when ``limit`` tokens are waiting (the call is turned away)."""
        now = self.clock()
        self._sweep(now)
        if len(self._grants) >= self.limit:
            return None
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._grants[token] = Grant(carrier, call_id, now + self.ttl_s)
        return token

    def redeem(self, token: object, carrier: str, call_id: str) -> None:
        """Use the token for this carrier's call (it is gone afterwards), or raise :class:`TokenError`."""
        if not isinstance(token, str) or not token:
            raise TokenError("no_token")
        grant = self._grants.pop(token, None)
        if grant is None:
            raise TokenError("unknown_token")  # never minted, already used, or swept after expiry
        if grant.expires <= self.clock():
            raise TokenError("expired_token")
        if grant.carrier != carrier:
            raise TokenError("wrong_carrier")
        if grant.call_id != call_id:
            raise TokenError("wrong_call")
