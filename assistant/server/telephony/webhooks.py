"""``POST /telephony/{twilio,telnyx}/voice``: a carrier asks what to do with an incoming call.

Only the carrier may ask: the request must carry its signature (``signatures.py``) over exactly this request,
seen for the first time, for a call not answered before (``answered.py``: a call id gets one token within a call's
longest life). The answer connects the call to our media stream (TwiML for Twilio, TeXML for Telnyx)
with a fresh per-call media token as the stream's parameter, or turns the call away busy when the server is
not ready, every session slot is taken, or ``telephony.max_pending_calls`` calls are still connecting. Anything
else (unsigned, a bad or replayed signature, a Telnyx timestamp outside the window, a body that is not the
carrier's form) is refused with a JSON 4xx and a log line that says why; nothing is kept for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import parse_qsl

from aiohttp import web
from aiohttp.typedefs import Handler

from assistant.server.http import CONFIG, HTTPJSONError, read_body
from assistant.server.limits import LIMITS
from assistant.server.openapi import documented, error
from assistant.server.services import SERVICES
from assistant.server.telephony.dialects import BUSY, MAX_ID_CHARS, TELNYX, TWILIO, Dialect
from assistant.server.telephony.signatures import telnyx_message_key, telnyx_valid, twilio_valid
from assistant.server.telephony.state import TELEPHONY
from assistant.server.voice.signaling import SESSIONS

log = logging.getLogger(__name__)

XML = "application/xml"
MAX_FIELDS = 200  # a carrier's webhook has a few dozen form parameters
TWILIO_SIGNATURE = "X-Twilio-Signature"
TELNYX_SIGNATURE, TELNYX_TIMESTAMP = "telnyx-signature-ed25519", "telnyx-timestamp"
CALL_ID = "CallSid"  # the call's id in both carriers' webhook forms (Telnyx: the call control id)


def refuse(request: web.Request, dialect: Dialect, status: int, reason: str, detail: str) -> HTTPJSONError:
    """Log and count a refused webhook; the error to raise."""
    state = request.config_dict
    client = state[LIMITS].client(request)
    log.info("webhook_refused carrier=%s client=%s reason=%s", dialect.name, client, reason)
    state[SERVICES].metrics.telephony_refusals_total.labels(carrier=dialect.name, reason=reason).inc()
    return HTTPJSONError(status, reason, detail)


def form(request: web.Request, dialect: Dialect, body: bytes) -> list[tuple[str, str]]:
    """The webhook's form parameters, in order (names may repeat)."""
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise refuse(request, dialect, 400, "bad_form", "the body must be UTF-8 form parameters") from None


async def answer(request: web.Request, dialect: Dialect, params: list[tuple[str, str]]) -> web.Response:
    """Connect the signed call to our media stream with a new token, or turn it away busy."""
    state = request.config_dict
    tel, services = state[TELEPHONY], state[SERVICES]
    call_id = dict(params).get(CALL_ID, "")
    if not call_id or len(call_id) > MAX_ID_CHARS:
        raise refuse(request, dialect, 400, "no_call_id", f"the form must name the call ({CALL_ID})")
    # Every signed webhook of a call, busy ones too; off the loop (answered.py).
    if not await tel.answered.first_answer_async(dialect.name, call_id):
        raise refuse(request, dialect, 403, "replayed", "this call was already answered")
    busy = ""
    if not services.ready:
        busy = "not_ready"
    elif len(state[SESSIONS]) >= state[CONFIG].server.max_sessions:
        busy = "no_session_slot"
    token = tel.tokens.mint(dialect.name, call_id) if not busy else None
    if token is None:
        busy = busy or "too_many_connecting"
        services.metrics.telephony_answers_total.labels(carrier=dialect.name, outcome="busy").inc()
        log.info("call_busy carrier=%s call=%s reason=%s", dialect.name, call_id[:64], busy)
        return web.Response(text=BUSY, content_type=XML)
    services.metrics.telephony_answers_total.labels(carrier=dialect.name, outcome="answered").inc()
    log.info("call_answered carrier=%s call=%s pending=%d", dialect.name, call_id[:64], len(tel.tokens))
    return web.Response(text=dialect.answer(tel.media_url(request, dialect), token), content_type=XML)


def webhook_doc(carrier: str, signature: str) -> Callable[[Handler], Handler]:
    return documented(
        f"{carrier}: answer an incoming call (signed webhook)", public=True,
        description=f"The carrier's voice webhook, signed with {signature} (no bearer token). Answers XML that "
                    "connects the call to this server's media stream with a one-time media token, or rejects it "
                    "busy when there is no room. Set the carrier's console to POST here (docs/telephony.md).",
        request={"application/x-www-form-urlencoded": {"schema": {
            "type": "object", "required": [CALL_ID], "properties": {CALL_ID: {"type": "string"}},
            "maxLength": lambda cfg: cfg.telephony.max_webhook_bytes}}},
        responses={"200": {"description": "the call's instructions (TwiML / TeXML)",
                           "content": {XML: {"schema": {"type": "string"}}}},
                   "400": error("not the carrier's form"), "403": error("unsigned, bad or replayed signature"),
                   "404": error("this carrier's calls are off"), "413": error("body too large"),
                   "415": error("not a form")},
    )


@webhook_doc("Twilio", "X-Twilio-Signature (HMAC-SHA1 keyed with telephony.twilio_auth_token)")
async def twilio_voice(request: web.Request) -> web.Response:
    """``POST /telephony/twilio/voice``."""
    state = request.config_dict
    tel = state[TELEPHONY]
    tel.require(TWILIO)
    body = await read_body(request, state[CONFIG].telephony.max_webhook_bytes)
    params = form(request, TWILIO, body)
    signature = request.headers.get(TWILIO_SIGNATURE, "")
    if not signature:
        raise refuse(request, TWILIO, 403, "unsigned", f"no {TWILIO_SIGNATURE} header")
    if not twilio_valid(state[CONFIG].telephony.twilio_auth_token, signature, tel.webhook_url(request), params):
        raise refuse(request, TWILIO, 403, "bad_signature", f"{TWILIO_SIGNATURE} does not match this request (behind "
                     "a proxy, telephony.public_url must be the URL Twilio calls)")
    if not tel.replays[TWILIO.name].first_time(signature):
        raise refuse(request, TWILIO, 403, "replayed", "this signed request was already answered")
    return await answer(request, TWILIO, params)


@webhook_doc("Telnyx", "telnyx-signature-ed25519 over telnyx-timestamp|body (telephony.telnyx_public_key)")
async def telnyx_voice(request: web.Request) -> web.Response:
    """``POST /telephony/telnyx/voice``."""
    state = request.config_dict
    tel = state[TELEPHONY]
    tel.require(TELNYX)
    window = state[CONFIG].telephony.replay_window_s
    body = await read_body(request, state[CONFIG].telephony.max_webhook_bytes)
    signature, stamp = request.headers.get(TELNYX_SIGNATURE, ""), request.headers.get(TELNYX_TIMESTAMP, "")
    if not signature or not stamp:
        raise refuse(request, TELNYX, 403, "unsigned", f"no {TELNYX_SIGNATURE} / {TELNYX_TIMESTAMP} header")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12) or abs(time.time() - int(stamp)) > window:
        raise refuse(request, TELNYX, 403, "stale_timestamp", f"{TELNYX_TIMESTAMP} is not within {window:g} s of now")
    if not telnyx_valid(tel.telnyx_key, signature, stamp, body):
        raise refuse(request, TELNYX, 403, "bad_signature", f"{TELNYX_SIGNATURE} does not match this request")
    if not tel.replays[TELNYX.name].first_time(telnyx_message_key(stamp, body), until=int(stamp) + window):
        raise refuse(request, TELNYX, 403, "replayed", "this signed request was already answered")
    return await answer(request, TELNYX, form(request, TELNYX, body))
