"""OpenAI's Realtime API over our voice session: any Realtime client, over WebSocket or WebRTC, talks to our stack.

    websocket.py  GET /v1/realtime: a session without a peer (audio in append events, out in delta events)
    calls.py      POST /v1/realtime/calls (our peer Session with the oai-events channel), hangup, ice-servers
    setup.py      what both transports do to start one: settings, responder, the conversation's own config
    protocol.py   one session's Realtime API: client events → calls on the conversation
    conversation_events.py  the conversation's events → the reference's server events (user audio items)
    input_audio.py  the input audio: to turn-taking, or held for a commit while turn detection is off
    responses.py  each response's lifecycle: opened, its message and function calls, closed with response.done
    state.py      what those three share: the session's state and the way out (no half reaches into another)
    settings.py   the session object: session.update in the GA and beta shapes, and what turn_detection means
    items.py      the Realtime conversation's items: the responder's history
    responder.py  the configured responder, given the session's instructions, items and tools
    sink.py       the WebSocket's reply sink (the pipeline's ReplySink, paced by the client's playout)
    formats.py    PCM16 at 24 kHz, G.711 mu-law and A-law

The layer translates: turn-taking, ASR, the responder and the voice are the session's one ``Conversation``, as for
our page and WHIP. It uses the voice session (``session``, ``signaling``, ``ice``) and the TTS API's voice names.
docs/realtime.md has the support table.
"""
