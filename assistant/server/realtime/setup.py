"""What both transports do to start a Realtime session: its settings, its responder, its conversation's config,
voices by name, and the protocol over the session.

A session's conversation gets its own copy of the VAD and turn-taking settings (what ``turn_detection`` says),
made here; ``session.update`` changes them later through ``Conversation.tune``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from assistant.config import Config
from assistant.server.http import CONFIG
from assistant.server.realtime.protocol import ClientError, RealtimeProtocol
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.realtime.settings import REFERENCE_VOICES, Settings
from assistant.server.realtime.state import Send
from assistant.server.services import SERVICES, Services
from assistant.server.tts_api import TTS_SERVICE
from assistant.server.tts_api.request import TTSError
from assistant.server.voice.session import ConversationSession
from assistant.server.voice.signaling import AppState

DEFAULT_MODEL = "assistant"
YES = ("1", "true", "yes", "on")


@dataclass
class Start:
    """A Realtime session about to open: its settings, the context and responder of its replies, the
    conversation's config, and the voice to speak with."""

    settings: Settings
    context: ReplyContext
    responder: RealtimeResponder
    cfg: Config
    voice_id: str | None = None


def voice_resolver(state: AppState) -> Callable[[str], Awaitable[str | None]]:
    """``voice`` → the engine's voice id: our voices by name or id (Piper voices, registered and cloned ones);
    the reference's own names (alloy, marin, ...) and ``default`` speak in the default voice."""
    service = state[TTS_SERVICE]

    async def resolve(name: str) -> str | None:
        if name == "default" or name in REFERENCE_VOICES:
            return None
        try:
            return await service.engine_voice(name, "voice")
        except TTSError as exc:
            raise ClientError(exc.detail, code=exc.error, param="session.audio.output.voice") from None

    return resolve


async def prepare(state: AppState, model: str | None, session: object = None, base: object = None) -> Start:
    """Settings from our config, the session of the client secret the caller holds (``base``), and the client's
    ``session`` object (as in ``session.update``), and the rest.

    Raises :class:`ClientError` (or a settings error) for a session the client cannot have."""
    cfg: Config = state[CONFIG]
    services: Services = state[SERVICES]
    settings = Settings.defaults(cfg, model or DEFAULT_MODEL)
    if base is not None:
        settings = settings.updated(base)
    if session is not None:
        settings = settings.updated(session)
    if model is None and settings.model:
        model = settings.model
    # ``model`` may name one of our responders (echo, rules, the configured one); any other name is the default.
    name = model if model in services.allowed_responders() else None
    context = ReplyContext()
    # The skills beside the client's own tools (or the intent step in front of a model that calls none); no
    # timers: a Realtime client keeps its own.
    responder = RealtimeResponder(services.with_skills(services.responder_for(name), services.call_context(),
                                                       cfg.respond), context)
    check_speed(services, settings.speed)
    voice_id = await voice_resolver(state)(settings.voice) if settings.voice != "default" else None
    own = replace(cfg, vad=settings.vad_config(cfg.vad), turn=settings.turn_config(cfg.turn))
    return Start(settings, context, responder, own, voice_id)


def transcriber(services: Services, session_id: str) -> Callable[[np.ndarray], Awaitable[str]]:
    """Our ASR for audio the conversation made no turn of (its words still belong in the conversation)."""

    async def transcribe(audio: np.ndarray) -> str:
        assert services.asr is not None
        return (await services.asr.transcribe(audio, session=session_id)).text

    return transcribe


def check_speed(services: Services, speed: float) -> None:
    engine = services.tts
    if speed != 1.0 and engine is not None and not engine.capabilities.native_speed:
        raise ClientError(f"the voice engine {engine.name} cannot change its speed", code="unsupported",
                          param="session.audio.output.speed")


def wants_extensions(cfg: Config, query: Mapping[str, str]) -> bool:
    """Our own server events (``assistant.turn_metrics``, ``assistant.notice``): for every session with
    ``realtime.extensions``, else only for one that asks (``?extensions=1``; ``?turn_metrics=1`` as before)."""
    asked = query.get("extensions", query.get("turn_metrics", "")).lower()
    return cfg.realtime.extensions or asked in YES


def make_protocol(state: AppState, session: ConversationSession, start: Start,
                  send: Send, *, webrtc: bool, beta: bool,
                  query: Mapping[str, str]) -> RealtimeProtocol:
    """The protocol over ``session``; the first event (``session.created``) is sent at once."""
    cfg: Config = state[CONFIG]
    rt = cfg.realtime
    services: Services = state[SERVICES]
    protocol = RealtimeProtocol(
        session, start.settings, start.context, send, webrtc=webrtc, beta=beta,
        extensions=wants_extensions(cfg, query),
        voices=voice_resolver(state), speed_check=lambda speed: check_speed(services, speed),
        transcribe=transcriber(services, session.id),
        max_event_bytes=rt.max_event_bytes, max_buffer_s=rt.max_buffer_s, max_items=rt.max_items,
    )
    if start.voice_id is not None or start.settings.speed != 1.0:
        session.conversation.set_voice(start.voice_id, start.settings.speed)
    protocol.start()
    return protocol
