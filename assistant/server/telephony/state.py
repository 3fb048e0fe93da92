"""What the telephony routes share on one gateway: which carriers are on, their keys, the media tokens waiting,
the replay guards, and the URLs the carriers are told to use."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from assistant.config import Config, ConfigError
from assistant.server.http import HTTPJSONError
from assistant.server.services import Services
from assistant.server.telephony.answered import FILE as ANSWERED_FILE
from assistant.server.telephony.answered import AnsweredCalls
from assistant.server.telephony.dialects import TELNYX, TWILIO, Dialect
from assistant.server.telephony.signatures import PublicKeyError, ReplayGuard, telnyx_key
from assistant.server.telephony.tokens import CallTokens
from assistant.server.voice.signaling import VOICE_ID

log = logging.getLogger(__name__)

MEDIA_PATH = "/telephony/{carrier}/media"


@dataclass
class Telephony:
    cfg: Config
    tokens: CallTokens
    answered: AnsweredCalls
    replays: dict[str, ReplayGuard] = field(default_factory=dict)
    telnyx_key: bytes = b""

    @classmethod
    def from_config(cls, cfg: Config) -> Telephony:
        tel = cfg.telephony
        check_public_url(tel.public_url)
        key = b""
        if tel.telnyx_public_key:
            try:
                key = telnyx_key(tel.telnyx_public_key)
            except PublicKeyError as exc:
                raise ConfigError(str(exc)) from None
        # Telnyx's guard runs on the wall clock: each signed message is remembered until its timestamp leaves the
        # window (then the timestamp check refuses it), not for a window from first sight.
        replays = {TWILIO.name: ReplayGuard(tel.replay_window_s),
                   TELNYX.name: ReplayGuard(tel.replay_window_s, time.time)}
        answered = AnsweredCalls(Path(cfg.server.data_dir) / ANSWERED_FILE, tel.max_call_s + tel.token_ttl_s)
        return cls(cfg, CallTokens(tel.token_ttl_s, tel.max_pending_calls), answered, replays, key)

    def enabled(self, dialect: Dialect) -> bool:
        """A carrier's routes are on when its secret is set (Twilio's auth token, Telnyx's public key)."""
        if dialect is TWILIO:
            return bool(self.cfg.telephony.twilio_auth_token)
        if dialect is TELNYX:
            return bool(self.telnyx_key)
        return False

    def require(self, dialect: Dialect) -> None:
        """404 for a carrier that is off: its routes exist in the table but answer nothing else."""
        if not self.enabled(dialect):
            setting = "twilio_auth_token" if dialect is TWILIO else "telnyx_public_key"
            raise HTTPJSONError(404, "telephony_off", f"{dialect.name} calls are off on this server "
                                f"(telephony.{setting} is not set)")

    def webhook_url(self, request: web.Request) -> str:
        """The URL the carrier requested, as it signed it: ``telephony.public_url`` + the path, or the request's."""
        base = self.cfg.telephony.public_url.rstrip("/")
        return base + request.raw_path if base else str(request.url)  # as sent: Twilio signs it undecoded

    def media_url(self, request: web.Request, dialect: Dialect) -> str:
        """Where the carrier opens the call's media stream (``wss://`` from an ``https`` public URL)."""
        base = self.cfg.telephony.public_url.rstrip("/")
        path = MEDIA_PATH.format(carrier=dialect.name)
        if base:
            scheme, rest = base.split("://", 1)
            return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}"
        return f"{'wss' if request.secure else 'ws'}://{request.host}{path}"


def check_public_url(url: str) -> None:
    """``telephony.public_url``: empty, or ``http(s)://host[:port][/prefix]`` with no query or fragment."""
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(f"telephony.public_url must look like https://voice.example.com (got {url!r})")


def check_choices(cfg: Config, services: Services) -> None:
    """The calls' responder must be one a session may use (never a module path from elsewhere); the voice an id."""
    name, voice = cfg.telephony.responder, cfg.telephony.voice
    if name and name not in services.allowed_responders():
        raise ConfigError(f"telephony.responder must be one of {services.allowed_responders()} (got {name!r})")
    if voice and not VOICE_ID.fullmatch(voice):
        raise ConfigError(f"telephony.voice must be a voice id: letters, digits, - and _ (got {voice!r})")


TELEPHONY: web.AppKey[Telephony] = web.AppKey("telephony", Telephony)
