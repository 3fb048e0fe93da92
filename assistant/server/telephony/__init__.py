"""Phone calls: a carrier's media stream over the same conversation as every other session.

A call comes in at the carrier, which asks our webhook what to do (``webhooks.py``: signed by the carrier,
answered with XML that connects the call to our media WebSocket and a one-time media token). The carrier then
opens the media stream (``media.py``): the token lets it in, once, and the call becomes a session whose audio is
the caller's μ-law (``caller.py``) and whose reply sink paces μ-law back with marks and clears
(``sink.py``). Each carrier's JSON is a dialect of one protocol (``dialects.py``: Twilio Media Streams, Telnyx
media streaming). The layer translates; turn-taking, speculation, barge-in and the heard history are the
conversation's. Settings: ``[telephony]``; how to point each carrier here: ``docs/telephony.md``.
"""

from __future__ import annotations

from aiohttp import web

from assistant.server.http import CONFIG
from assistant.server.services import SERVICES
from assistant.server.telephony.state import TELEPHONY, Telephony, check_choices


def setup(app: web.Application) -> None:
    """The telephony state of one gateway (a ConfigError for bad ``[telephony]`` settings)."""
    check_choices(app[CONFIG], app[SERVICES])
    app[TELEPHONY] = Telephony.from_config(app[CONFIG])
