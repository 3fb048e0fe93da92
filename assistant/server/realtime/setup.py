"""What both transports do to start a Realtime session: its settings, its responder, its conversation's config,
voices by name, and the protocol over the session.

A session's conversation gets its own copy of the VAD and turn-taking settings (what ``turn_detection`` says),
made here; ``session.update`` changes them later through ``Conversation.tune``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from assistant.config import Config
from assistant.server.http import CONFIG
from assistant.server.realtime.protocol import ClientError, RealtimeProtocol
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.realtime.settings import REFERENCE_VOICES, Settings
from assistant.server.services import SERVICES, Services
from assistant.server.tts_api import TTS_SERVICE
from assistant.server.tts_api.request import TTSError
from assistant.server.voice.session import ConversationSession

DEFAULT_MODEL = "assistant"
TURN_METRICS_OFF = ("0", "false", "no", "off")


@dataclass
class Start:
    """A Realtime session about to open: its settings, the context and responder of its replies, the
    conversation's config, and the voice to speak with."""

    settings: Settings
    context: ReplyContext
    responder: RealtimeResponder
    cfg: Config
    voice_id: str | None = None


def voice_resolver(state: Mapping[Any, Any]) -> Callable[[str], Awaitable[str | None]]:
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


async def prepare(state: Mapping[Any, Any], model: str | None, session: object = None,
                  base: object = None) -> Start:
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
    responder = RealtimeResponder(services.responder_for(name), context)
    if settings.tools and not responder.takes_tools:
        raise ClientError(f"tools are not supported by the responder {responder.name!r}", code="unsupported",
                          param="session.tools")
    check_speed(services, settings.speed)
    voice_id = await voice_resolver(state)(settings.voice) if settings.voice != "default" else None
    own = replace(cfg, vad=settings.vad_config(cfg.vad), turn=settings.turn_config(cfg.turn))
    return Start(settings, context, responder, own, voice_id)


def check_speed(services: Services, speed: float) -> None:
    engine = services.tts
    if speed != 1.0 and engine is not None and not engine.capabilities.native_speed:
        raise ClientError(f"the voice engine {engine.name} cannot change its speed", code="unsupported",
                          param="session.audio.output.speed")


def make_protocol(state: Mapping[Any, Any], session: ConversationSession, start: Start,
                  send: Callable[[dict[str, Any]], None], *, webrtc: bool, beta: bool,
                  query: Mapping[str, str]) -> RealtimeProtocol:
    """The protocol over ``session``; the first event (``session.created``) is sent at once."""
    cfg: Config = state[CONFIG]
    rt = cfg.realtime
    services: Services = state[SERVICES]
    protocol = RealtimeProtocol(
        session, start.settings, start.context, send, webrtc=webrtc, beta=beta,
        turn_metrics=rt.turn_metrics and query.get("turn_metrics", "1").lower() not in TURN_METRICS_OFF,
        voices=voice_resolver(state), speed_check=lambda speed: check_speed(services, speed),
        max_event_bytes=rt.max_event_bytes, max_buffer_s=rt.max_buffer_s, max_items=rt.max_items,
    )
    if start.voice_id is not None or start.settings.speed != 1.0:
        session.conversation.set_voice(start.voice_id, start.settings.speed)
    protocol.start()
    return protocol
