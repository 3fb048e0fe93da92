"""The voice session: the page's calls and WHIP, one aiortc peer and one conversation per session.

    session.py    Session (a peer, its inbound audio and reply track, one Conversation) and ConversationSession
                  (the same conversation without a peer: the Realtime WebSocket, phone calls)
    signaling.py  the session table, POST /api/offer, GET /api/sessions, trickle PATCH and hang-up
    whip.py       POST /api/whip (RFC 9725): the offer as application/sdp, the answer and Location
    sdpfrag.py    RFC 8840 trickle fragments: parsed and built
    ice.py        STUN/TURN servers, TURN REST credentials, GET /api/ice

It stands on the shared server floor (``http``, ``limits``, ``services``, ``openapi``); other products
(``realtime/``, ``telephony/``) run their sessions through it. Its routes are rows of ``server/routes.py``.
"""
