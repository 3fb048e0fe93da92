"""Phone calls (``[telephony]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class TelephonyConfig:
    """Phone calls through a carrier's media stream (``/telephony/...``): Twilio Media Streams, Telnyx."""

    twilio_auth_token: str = setting(
        "", "the Twilio account's auth token: Twilio signs its webhooks with it (X-Twilio-Signature); empty: the "
        "Twilio routes answer 404"
    )
    telnyx_public_key: str = setting(
        "", "the Telnyx account's public key (base64 Ed25519, Mission Control: Keys & Credentials): Telnyx signs its "
        "webhooks with the matching private key; empty: the Telnyx routes answer 404"
    )
    public_url: str = setting(
        "", "the base URL the carriers call (https://voice.example.com): a Twilio signature covers the exact URL, so "
        "behind a proxy or TLS terminator it must be set; it also names the media WebSocket (wss://...) in the "
        "answer; empty: the URL each request arrived at"
    )
    responder: str = setting("", "responder for phone calls (echo, rules or the configured one; empty: respond.engine)")
    voice: str = setting("", "voice of phone calls (a voice id; empty: the engine's default)")
    token_ttl_s: float = setting(
        30.0, "lifetime of a call's media token: the carrier opens the media stream within seconds of the webhook"
    )
    max_pending_calls: int = setting(
        64, "answered calls whose media stream has not started yet (tokens waiting, sockets before start); past it "
        "a call is turned away busy"
    )
    replay_window_s: float = setting(
        300.0, "a webhook whose signature was already seen this recently is refused (a replay); Telnyx webhooks "
        "stamped further from now than this are refused too"
    )
    max_call_s: float = setting(
        14_400.0, "the longest a phone call lasts (Twilio's own limit: 4 h); a longer one is closed, and each answered "
        "call id is remembered this long (server.data_dir/telephony/answered_calls.sqlite3), so a replayed webhook "
        "gets no media token"
    )
    start_timeout_s: float = setting(
        10.0, "a media socket that has not sent a valid start this long after it opened is closed"
    )
    media_timeout_s: float = setting(
        15.0, "a call whose carrier sent no media for this long is closed (carriers send 20 ms of audio, silence "
        "included, every 20 ms)"
    )
    audio_lead_ms: int = setting(
        400, "reply audio sent ahead of the last mark the carrier returned (what the caller is known to have heard): "
        "enough to ride out the network, little enough that what a clear drops was never heard"
    )
    max_media_bytes: int = setting(
        16_000, "largest audio payload in one media message (μ-law bytes; 2 s; carriers send 160, 20 ms); past it "
        "the call is closed"
    )
    dtmf_per_minute: int = setting(
        120, "DTMF key presses a call may send per minute (as a burst, refilled evenly); past it the call is closed"
    )
    max_webhook_bytes: int = setting(65_536, "largest webhook body accepted (a carrier's form parameters)")
