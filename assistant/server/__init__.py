"""The HTTP side: one gateway's aiohttp app, in one room per product on a shared floor.

Shared floor: ``app`` (the gateway's app: every product's routes, startup and shutdown), ``routes`` (the one route
table), ``openapi``, ``http`` (app keys, errors, bounded bodies), ``front`` (middlewares, page, liveness),
``openai_front`` (the ``/v1`` error shape), ``limits``, ``metrics``, ``services`` (the engines every session
shares), ``tls``, ``local`` (an app on a loopback port, for tests and benches).
Rooms, one per product: ``voice/`` (the page's sessions: signaling, WHIP, ICE, one peer per session), ``tts_api/``
(the TTS service and its routes), ``realtime/`` (OpenAI's Realtime API over the voice session) and ``dispatch/``
(the front for several gateways).
"""
