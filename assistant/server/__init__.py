"""The HTTP side: one gateway's aiohttp app, in one room per product on a shared floor.

Shared floor: ``routes`` (the one route table), ``openapi``, ``http`` (app keys, errors, bounded bodies),
``front`` (middlewares, page, liveness), ``openai_front`` (the ``/v1`` error shape), ``metrics``, ``services`` (the
engines every session shares), ``local`` (an app on a loopback port, for tests and benches).
The voice session, at the top: ``app``, ``session``, ``signaling``, ``whip``, ``sdpfrag``, ``ice``, ``tls``.
Rooms of their own: ``tts_api/`` (the TTS service and its routes) and ``dispatch/`` (the front for several gateways).
"""
