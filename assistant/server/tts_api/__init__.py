"""The TTS API: text to speech over HTTP, a WebSocket and OpenAI's speech API, with registered voices.

    routes.py         POST /api/tts, GET /ws/tts, /api/voices (HTTP and WebSocket handling only)
    openai_speech.py  POST /v1/audio/speech and the /v1 model and voice lists
    service.py        TTSService: a parsed request → audio (slots, timeouts, effects, resampling)
    outcome.py        around every synthesis route: its outcome counted and logged, a stream cut after its headers
    request.py        the request table: every field once (parser, error messages, OpenAPI schema)
    voice_lookup.py   what a ``voice`` name leads to (registered voice, engine voice, clip file)
    voice_prep.py     getting that voice ready in the engine (clips fetched and decoded, prepared forms cached)
    formats.py        audio files as they stream (wav, pcm, flac, opus, mp3, aac)

It depends on the shared server pieces (``http``, ``metrics``, ``services``, ``openapi``), never on the voice
session's modules. Its routes are rows of the one table in ``server/routes.py``.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from assistant.server.http import CONFIG
from assistant.server.services import SERVICES
from assistant.server.tts_api.service import TTSService
from assistant.tts.voice_store import ReferenceClipStore

TTS_SERVICE: web.AppKey[TTSService] = web.AppKey("tts_service", TTSService)


def setup(app: web.Application) -> None:
    """Make the app's TTS service (the engine is taken from ``Services`` once loaded); needs CONFIG and SERVICES."""
    cfg = app[CONFIG]
    services = app[SERVICES]
    store = ReferenceClipStore(Path(cfg.server.data_dir) / "voices", cfg.tts_api.max_voices)
    app[TTS_SERVICE] = TTSService(cfg, services.metrics, store, lambda: services.tts)
