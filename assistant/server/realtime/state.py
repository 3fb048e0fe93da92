"""What the three halves of one Realtime session share: the way out (:class:`Outgoing`) and the session's state
(:class:`SessionState`).

The client events (``protocol.py``), the conversation's events (``conversation_events.py``) and the responses
(``responses.py``) each take these two objects and nothing more, so none of them reaches into another: the
import arrows run protocol → conversation_events → responses → state, one way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from assistant.config import VADConfig
from assistant.pipeline.conversation import Conversation
from assistant.pipeline.reply import ReplySink
from assistant.server.realtime.formats import OutputEncoder
from assistant.server.realtime.input_audio import InputAudio
from assistant.server.realtime.items import Item, Items, new_id
from assistant.server.realtime.responder import ReplyContext
from assistant.server.realtime.settings import Settings

log = logging.getLogger(__name__)

# GA server event names → the beta names clients of the beta API listen for (the rest are the same).
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
# Our own server events (not the reference's): sent only to a session that asked for them (``?extensions=1``).
EXTENSION_PREFIX = "assistant."

Send = Callable[[dict[str, object]], None]


class Outgoing:
    """Server events to the client, in order, named in its dialect (GA or beta); our own events (``assistant.*``)
    only when ``extensions`` is on. A control socket beside a call (``GET /v1/realtime?call_id=``) is attached
    and gets the same events."""

    def __init__(self, send: Send, *, beta: bool, session_id: str, extensions: bool = False) -> None:
        self._sends: list[Send] = [send]
        self.beta = beta
        self.session_id = session_id
        self.extensions = extensions

    def emit(self, kind: str, **fields: object) -> None:
        if kind.startswith(EXTENSION_PREFIX) and not self.extensions:
            return
        name = BETA_NAMES.get(kind, kind) if self.beta else kind
        event = {"type": name, "event_id": new_id("event"), **fields}
        for send in list(self._sends):
            send(event)

    def error(self, message: str, *, code: str | None, param: str | None = None, event_id: object = None,
              kind: str = "invalid_request_error") -> None:
        """An ``error`` event in the reference's shape; ``event_id`` names the client event at fault."""
        log.info("realtime_error session=%s code=%s param=%s", self.session_id, code, param)
        self.emit("error", error={"type": kind, "code": code, "message": message, "param": param,
                                  "event_id": event_id if isinstance(event_id, str) else None})

    def attach(self, send: Send) -> Callable[[], None]:
        """Send every later event to ``send`` too; returns what detaches it."""
        self._sends.append(send)

        def detach() -> None:
            if send in self._sends:
                self._sends.remove(send)

        return detach


@dataclass
class SessionState:
    """One session's Realtime state, read and written by the three halves (see the module docstring)."""

    conversation: Conversation
    sink: ReplySink
    settings: Settings
    context: ReplyContext
    vad: VADConfig  # the conversation's VAD settings now (turn_detection changes them)
    items: Items
    input: InputAudio
    encoder: OutputEncoder
    webrtc: bool
    transcribe: Callable[[np.ndarray], Awaitable[str]]  # our ASR, for speech no turn was made of
    rate_limits: Callable[[], list[dict[str, object]]] = lambda: []  # the limits this session's responses spend
    pending: list[Item] = field(default_factory=list)  # user items created since the last response: its input
    user_items: dict[int, Item] = field(default_factory=dict)  # turn → its user audio item
    given_words: set[int] = field(default_factory=set)  # turns whose words were given (no transcription events)
    notices: set[str] = field(default_factory=set)  # things said once per session (a responder without tools)
    last_activity: float = field(default_factory=time.monotonic)  # the latest speech or response (idle timeout)

    def session_context(self) -> None:
        """The responder's context back to the session's settings (a server turn, or a client response done)."""
        ctx, settings = self.context, self.settings
        ctx.instructions, ctx.tools, ctx.tool_choice = settings.instructions, settings.tools, settings.tool_choice
        ctx.max_tokens, ctx.temperature = settings.max_output_tokens, settings.temperature
        ctx.continuation, ctx.only, ctx.client_text = False, None, None
        ctx.server_replies = settings.turn_detection is None or settings.server_responses

    def out_format(self, beta: bool) -> str | dict[str, object]:
        """The output format as the client's dialect writes it."""
        fmt = self.settings.output_format
        return fmt.beta_name if beta else fmt.to_json()
