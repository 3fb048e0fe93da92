"""One session's Realtime API: client events in, server events out, over the session's one ``Conversation``.

This module takes the client events; ``conversation_events.py`` sends what the conversation does, and
``responses.py`` opens and closes responses.

The layer translates; it does not run turns. Speech, turn-taking, ASR, the responder and the voice are the
session's conversation, the same as our page's and WHIP's: client events become calls on it (``feed``,
``respond_to``, ``cancel``, ``tune``, ``set_voice``), and its events (``pipeline/events.py``: speech_start,
transcript, reply_text, interrupted, ...) become the reference's server events, in the reference's order:

    speech_start  → input_audio_buffer.speech_started
    speech_end    → input_audio_buffer.speech_stopped, .committed, conversation.item.added (user)
    transcript    → conversation.item.input_audio_transcription.delta, .completed, conversation.item.done,
                    response.created (a turn with words gets a response)
    reply_text    → response.output_item.added, conversation.item.added, response.content_part.added (once),
                    response.output_audio_transcript.delta
    reply audio   → response.output_audio.delta (WebSocket; over WebRTC it is the track)
    reply_done    → response.output_audio.done, …_transcript.done, content_part.done, output_item.done,
                    conversation.item.done, response.done
    interrupted   → conversation.item.truncated (at what was played), the same closing events, and
                    response.done with status cancelled (turn_detected or client_cancelled)
    turn_metrics  → assistant.turn_metrics (ours: every stage's marks and durations; clients ignore it)

A turn's number ties the two sides together: the pipeline numbers its events by turn, and a response belongs
to one turn. Failures of one client event answer with an ``error`` event in the reference's shape and change
nothing; the session goes on.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from assistant.audio import AudioChunk
from assistant.body import loads_bounded
from assistant.pipeline.reply import played_text
from assistant.server.realtime.conversation_events import ConversationEvents
from assistant.server.realtime.formats import FormatError, InputDecoder, OutputEncoder, decode_clip
from assistant.server.realtime.input_audio import InputAudio
from assistant.server.realtime.items import Item, ItemError, Items, new_id, parse_item
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.realtime.responses import Response, Responses
from assistant.server.realtime.settings import (
    Settings,
    SettingsError,
    parse_max_output_tokens,
    parse_temperature,
    parse_tools,
)
from assistant.server.realtime.sink import StreamSink
from assistant.server.voice.session import ConversationSession, choose_language, language_choices

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
MIN_COMMIT_MS = 100  # the reference refuses to commit less audio than this
CONTINUE = "(continue)"  # the words of a turn that has none: the model goes on after a tool's output
WAV_MAGIC = (b"RIFF", b"OggS", b"fLaC", b"ID3")  # containers sent where raw samples were declared


class ClientError(ValueError):
    """A client event this session refuses: the reference's error fields."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.param, self.kind = code, param, kind


class RealtimeProtocol:
    """The Realtime API of one session (see the module docstring).

    ``send`` takes each server event (a dict) in order; ``voices(name)`` resolves a ``voice`` to the engine's
    voice id (or raises :class:`ClientError`). Over WebSocket the session's sink is a :class:`StreamSink`, and
    this layer sends its audio as deltas; over WebRTC it is the peer's track.
    """

    def __init__(
        self,
        session: ConversationSession,
        settings: Settings,
        context: ReplyContext,
        send: Callable[[dict[str, Any]], None],
        *,
        webrtc: bool,
        beta: bool = False,
        turn_metrics: bool = True,
        voices: Callable[[str], Awaitable[str | None]],
        speed_check: Callable[[float], None] = lambda speed: None,
        max_event_bytes: int,
        max_buffer_s: float,
        max_items: int,
    ) -> None:
        self.session = session
        self.conversation = session.conversation
        self.settings = settings
        self.context = context
        self._send = send
        self.webrtc, self.beta, self.turn_metrics = webrtc, beta, turn_metrics
        self.voices, self.speed_check = voices, speed_check
        self.max_event_bytes, self.max_buffer_s = max_event_bytes, max_buffer_s
        self.items = Items(max_items)
        self.decoder = InputDecoder(settings.input_format)
        self.encoder = OutputEncoder(settings.output_format)
        self.input = InputAudio(self.conversation, max_buffer_s)
        self.pending: list[Item] = []  # user items created since the last response: its input
        self.user_items: dict[int, Item] = {}  # turn → its user audio item
        self.given_words: set[int] = set()  # turns whose words were given (no transcription events)
        self.sink = session.sink
        self.responses = Responses(self)
        self.events = ConversationEvents(self)
        if isinstance(self.sink, StreamSink):
            self.sink.send_audio = self.events.on_reply_audio
            self.sink.discard = not settings.audio_out
        context.history = self.items.history
        self.session_context()
        session.events.subscribe(self.events.on_event)

    # --- sending ---------------------------------------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> None:
        name = BETA_NAMES.get(kind, kind) if self.beta else kind
        self._send({"type": name, "event_id": new_id("event"), **fields})

    def error(self, message: str, *, code: str | None, param: str | None = None, event_id: Any = None,
              kind: str = "invalid_request_error") -> None:
        """An ``error`` event in the reference's shape; ``event_id`` names the client event at fault."""
        log.info("realtime_error session=%s code=%s param=%s", self.session.id, code, param)
        self.emit("error", error={"type": kind, "code": code, "message": message, "param": param,
                                  "event_id": event_id if isinstance(event_id, str) else None})

    def start(self) -> None:
        """The first event of every session."""
        self.emit("session.created", session=self.settings.to_json(self.beta))

    # --- client events ---------------------------------------------------------------------------------
    async def receive(self, text: str | bytes) -> None:
        """One client event; whatever is wrong with it answers an ``error`` event and changes nothing."""
        if isinstance(text, bytes):
            self.error("binary messages are not events: send JSON text", code="invalid_message")
            return
        if len(text.encode()) > self.max_event_bytes:
            self.error(f"event over {self.max_event_bytes} bytes (realtime.max_event_bytes)", code="event_too_large")
            return
        try:
            event = loads_bounded(text)  # nesting and members bounded: never a RecursionError
        except ValueError as exc:
            self.error(f"the event is not valid JSON: {exc}", code="invalid_json")
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.error("an event is a JSON object with a 'type'", code="invalid_event", param="type")
            return
        kind, event_id = event["type"], event.get("event_id")
        handler = HANDLERS.get(kind)
        if handler is None:
            self.error(f"Invalid value: {kind[:64]!r}. Supported values are: {', '.join(map(repr, HANDLERS))}.",
                       code="invalid_value", param="type", event_id=event_id)
            return
        try:
            await handler(self, event)
        except ClientError as exc:
            self.error(str(exc), code=exc.code, param=exc.param, event_id=event_id, kind=exc.kind)
        except (SettingsError, ItemError) as exc:
            self.error(str(exc), code=exc.code, param=exc.param, event_id=event_id)
        except FormatError as exc:
            self.error(str(exc), code="invalid_value", param=exc.param, event_id=event_id)
        except Exception:
            log.exception("realtime_event_failed session=%s type=%s", self.session.id, kind)
            self.error("the server could not handle this event", code="server_error", event_id=event_id,
                       kind="server_error")

    def _transcription_language(self, settings: Settings) -> str:
        """The language the input audio is heard in, from ``input_audio_transcription.language`` (none given:
        detected per turn, as OpenAI's API does, when the ASR can; else the configured one)."""
        language = (settings.transcription or {}).get("language")
        if language in (None, ""):
            return "auto" if "auto" in language_choices(self.session.services) else self.session.cfg.asr.language
        try:
            return choose_language(self.session.services, language)
        except ValueError as exc:
            raise ClientError(f"transcription language {exc}", code="invalid_value",
                              param="session.input_audio_transcription.language") from None

    async def _session_update(self, event: dict[str, Any]) -> None:
        new = self.settings.updated(event.get("session"))
        old = self.settings
        voice_id: str | None = None
        if new.speed != old.speed:
            self.speed_check(new.speed)
        if new.voice != old.voice or new.speed != old.speed:
            voice_id = await self.voices(new.voice)
        language = self._transcription_language(new) if new.transcription != old.transcription else None
        if new.tools and not self._takes_tools():
            raise ClientError(f"tools are not supported by the responder {self._responder_name()!r}: configure an "
                              "OpenAI-compatible responder (respond.engine = openai) that supports them",
                              code="unsupported", param="session.tools")
        self.settings = new
        if language is not None:
            self.conversation.set_language(language)
        if new.voice != old.voice or new.speed != old.speed:
            self.conversation.set_voice(voice_id, new.speed)
        if new.turn_detection != old.turn_detection:
            cfg = self.session.cfg
            self.conversation.tune(vad=new.vad_config(cfg.vad), turn=new.turn_config(cfg.turn))
            if (old.turn_detection is None) != (new.turn_detection is None):
                self.input.clear()
        if new.input_format != old.input_format:
            self.decoder = InputDecoder(new.input_format)
        if new.output_format != old.output_format:
            self.encoder = OutputEncoder(new.output_format)
        if isinstance(self.sink, StreamSink):
            self.sink.discard = not new.audio_out
        if self.responses.current is None or not self.responses.current.client:
            self.context.instructions = new.instructions
            self.context.tools, self.context.tool_choice = new.tools, new.tool_choice
            self.context.temperature, self.context.max_tokens = new.temperature, new.max_output_tokens
        self.emit("session.updated", session=new.to_json(self.beta))

    async def _append(self, event: dict[str, Any]) -> None:
        data = self.audio_bytes(event.get("audio"), "audio")
        samples = self.decoder.decode(data)
        if self.settings.turn_detection is not None:
            self.input.feed(samples)
        elif not self.input.hold(samples):
            raise ClientError(f"the input audio buffer holds at most {self.max_buffer_s:g} s: commit or clear it",
                              code="input_audio_buffer_full", param="audio")

    def on_track_audio(self, chunk: AudioChunk) -> None:
        """The peer's audio (WebRTC): to turn-taking, or to the input buffer while turn detection is off (what
        passes its size is dropped: a track cannot be refused)."""
        if self.settings.turn_detection is not None:
            self.input.feed_chunk(chunk)
        else:
            self.input.hold(chunk.samples)

    def audio_bytes(self, value: object, param: str) -> bytes:
        """Base64 audio in the session's input format (raw samples: a WAV or other container is refused)."""
        if not isinstance(value, str):
            raise ClientError(f"'{param}' must be a base64 string of audio", param=param)
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(f"Invalid '{param}': not valid base64", code="invalid_value", param=param) from None
        if data.startswith(WAV_MAGIC):
            raise ClientError(f"'{param}' holds a file (a container header), not raw {self.settings.input_format.type} "
                              "samples: send the samples alone, in the session's input format",
                              code="invalid_audio_format", param=param)
        return data

    async def _commit(self, event: dict[str, Any]) -> None:
        if self.settings.turn_detection is not None:
            raise ClientError("with turn detection on, the server commits the input at the end of speech; set "
                              "audio.input.turn_detection to null to commit it yourself",
                              code="input_audio_buffer_commit_empty")
        ms = self.input.held_ms
        if ms < MIN_COMMIT_MS:
            raise ClientError(f"buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, but buffer only has "
                              f"{ms:.2f}ms of audio.", code="input_audio_buffer_commit_empty")
        clip = self.input.take()
        item = Item(id=new_id("item"), type="message", role="user", audio=True, clip=clip, audio_ms=ms)
        previous = self.items.add(item)
        self.pending.append(item)
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))

    async def _clear(self, event: dict[str, Any]) -> None:
        self.input.clear()
        self.emit("input_audio_buffer.cleared")

    async def _item_create(self, event: dict[str, Any]) -> None:
        fmt = self.settings.input_format

        def decode(value: object, param: str) -> np.ndarray:
            return decode_clip(self.audio_bytes(value, param), fmt)

        item = parse_item(event.get("item"), decode, self.max_buffer_s)
        after = event.get("previous_item_id")
        if after is not None and not isinstance(after, str):
            raise ClientError("'previous_item_id' must be a string", param="previous_item_id")
        previous = self.items.add(item, after)
        if item.role == "user":
            self.pending.append(item)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        if not self.beta:
            self.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.beta))

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item = self._item(event)
        self.emit("conversation.item.retrieved", item=item.to_json(self.beta))

    async def _item_delete(self, event: dict[str, Any]) -> None:
        item = self._item(event)
        if item.current:
            raise ClientError("the item belongs to the response in progress: cancel it first", param="item_id")
        self.items.delete(item.id)
        if item in self.pending:
            self.pending.remove(item)
        self.emit("conversation.item.deleted", item_id=item.id)

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        item = self._item(event)
        if item.role != "assistant" or not item.audio:
            raise ClientError("only an assistant message with audio can be truncated", param="item_id")
        if event.get("content_index", 0) != 0:
            raise ClientError("content_index must be 0 (a message has one part)", param="content_index")
        end = event.get("audio_end_ms")
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise ClientError("'audio_end_ms' must be a non-negative integer", param="audio_end_ms")
        if end > item.audio_ms + 1:
            raise ClientError(f"audio content is only {item.audio_ms:.0f} ms long, cannot truncate at {end} ms",
                              param="audio_end_ms")
        self._cut(item, end)
        self.emit("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end)

    def _item(self, event: dict[str, Any]) -> Item:
        item = self.items.get(event.get("item_id"))
        if item is None:
            raise ClientError(f"Item with item_id not found: {str(event.get('item_id'))[:64]}", code="item_not_found",
                              param="item_id")
        return item

    async def _response_create(self, event: dict[str, Any]) -> None:
        if self.responses.current is not None:
            active = self.responses.current.id
            raise ClientError(f"Conversation already has an active response in progress: {active}. Wait "
                              "until the response is finished before creating a new one.",
                              code="conversation_already_has_active_response")
        params = event.get("response") or {}
        if not isinstance(params, dict):
            raise ClientError("'response' must be an object", param="response")
        allowed = {"instructions", "output_modalities", "modalities", "conversation", "input", "tools",
                   "tool_choice", "metadata", "max_output_tokens", "max_response_output_tokens", "temperature",
                   "voice", "audio", "prompt", "output_audio_format"}
        for key in params:
            if key not in allowed:
                raise ClientError(f"Unknown parameter: 'response.{key}'.", code="unknown_parameter",
                                  param=f"response.{key}")
        if params.get("conversation", "auto") != "auto":
            raise ClientError("out-of-band responses (conversation: none) are not supported", code="unsupported",
                              param="response.conversation")
        if "input" in params:
            raise ClientError("response.input is not supported: create the items, then response.create",
                              code="unsupported", param="response.input")
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ClientError("'instructions' must be a string", param="response.instructions")
        modalities = params.get("output_modalities", params.get("modalities", self.settings.output_modalities))
        if not isinstance(modalities, list) or not modalities or any(m not in ("audio", "text") for m in modalities):
            raise ClientError("output modalities must be ['audio'] or ['text']", param="response.output_modalities")
        tools = self.settings.tools
        if "tools" in params:
            tools = parse_tools(params["tools"], "response.tools")
            if tools and not self._takes_tools():
                raise ClientError(f"tools are not supported by the responder {self._responder_name()!r}",
                                  code="unsupported", param="response.tools")
        audio_in = [i for i in self.pending if i.audio and i.clip is not None]
        words = [i.words() or "" for i in self.pending if not i.audio]
        last = self.items.items[-1] if self.items.items else None
        continuation = not audio_in and not any(words) and last is not None and last.type == "function_call_output"
        if not audio_in and not any(words) and not continuation and not instructions:
            raise ClientError("nothing to respond to: append audio and commit it, create a user item, or give "
                              "response.instructions", code="response_create_no_input", param="response")
        try:
            temperature = (parse_temperature(params["temperature"], "response.temperature")
                           if "temperature" in params else self.settings.temperature)
            limit = params.get("max_output_tokens", params.get("max_response_output_tokens"))
            max_tokens = (parse_max_output_tokens(limit, "response.max_output_tokens")
                          if limit is not None else self.settings.max_output_tokens)
        except SettingsError as exc:
            raise ClientError(str(exc), param=exc.param) from None
        ctx = self.context
        ctx.temperature, ctx.max_tokens = temperature, max_tokens
        ctx.instructions = instructions if instructions is not None else self.settings.instructions
        ctx.tools, ctx.tool_choice = tools, params.get("tool_choice", self.settings.tool_choice)
        ctx.continuation = continuation or (not audio_in and not any(words))
        inputs, self.pending = self.pending, []
        for item in inputs:
            item.current = True
        if audio_in:
            clip = np.concatenate([i.clip for i in audio_in if i.clip is not None])
            self.conversation.respond_to(audio=clip)
            text = ""
        else:
            text = "\n".join(w for w in words if w) or (CONTINUE if continuation else instructions or CONTINUE)
            self.conversation.respond_to(text=text)
            self.given_words.add(self.conversation.turns)
        turn = self.conversation.turns
        if audio_in:
            self.user_items[turn] = audio_in[-1]
            for item in audio_in[:-1]:
                item.transcript = ""  # transcribed as one with the last
        resp = self.responses.open(turn, client=True, input_text=text)
        resp.metadata = params.get("metadata")
        resp.modalities = list(modalities)
        resp.inputs = inputs

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        resp = self.responses.current
        wanted = event.get("response_id")
        if resp is None or (wanted is not None and wanted != resp.id):
            raise ClientError("Cancellation failed: no active response found", code="response_cancel_not_active")
        if not self.conversation.cancel("client_cancelled"):
            self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})

    async def _output_clear(self, event: dict[str, Any]) -> None:
        if not self.webrtc:
            raise ClientError("output_audio_buffer.clear is for WebRTC sessions: over WebSocket the client holds "
                              "the audio; use response.cancel and conversation.item.truncate", code="unsupported")
        resp = self.responses.current
        if resp is not None and not self.conversation.cancel("client_cancelled"):
            self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})
        self.emit("output_audio_buffer.cleared", response_id=resp.id if resp is not None else None)

    # --- helpers -------------------------------------------------------------------------------------------
    def _heard_text(self, resp: Response) -> str | None:
        """What of the reply was heard, as the conversation's history recorded it at the interruption (the
        runner maps the frames played to the words they carried); None if it did not record this turn."""
        msgs = self.conversation.history.messages
        last_user = next((k for k in range(len(msgs) - 1, -1, -1) if msgs[k].role == "user"), None)
        if last_user is None or msgs[last_user].content != resp.input_text:
            return None
        return msgs[last_user + 1].content if last_user + 1 < len(msgs) else ""

    def _cut(self, item: Item, end_ms: float, heard: str | None = None) -> None:
        """Truncate an assistant item's audio at ``end_ms``: its transcript keeps only what that audio said."""
        total = item.audio_ms
        words = item.transcript or ""
        if heard is None:
            made = max(1, int(total))
            heard = played_text([(0, words)], made, int(min(end_ms, made)))
        item.transcript = heard
        item.audio_ms = min(total, float(end_ms)) if total else float(end_ms)

    def session_context(self) -> None:
        """The responder's context back to the session's settings (a server turn, or a client response done)."""
        ctx, settings = self.context, self.settings
        ctx.instructions, ctx.tools, ctx.tool_choice = settings.instructions, settings.tools, settings.tool_choice
        ctx.temperature, ctx.max_tokens = settings.temperature, settings.max_output_tokens
        ctx.continuation = False

    def out_format(self) -> dict[str, Any]:
        fmt = self.settings.output_format
        return fmt.beta_name if self.beta else fmt.to_json()  # type: ignore[return-value]

    def _takes_tools(self) -> bool:
        responder = self.conversation.runner.deps.responder
        return isinstance(responder, RealtimeResponder) and responder.takes_tools

    def _responder_name(self) -> str:
        responder = self.conversation.runner.deps.responder
        return str(getattr(getattr(responder, "inner", responder), "name", "responder"))

    async def close(self) -> None:
        await self.responses.close()


HANDLERS: dict[str, Callable[[RealtimeProtocol, dict[str, Any]], Awaitable[None]]] = {
    "session.update": RealtimeProtocol._session_update,
    "input_audio_buffer.append": RealtimeProtocol._append,
    "input_audio_buffer.commit": RealtimeProtocol._commit,
    "input_audio_buffer.clear": RealtimeProtocol._clear,
    "conversation.item.create": RealtimeProtocol._item_create,
    "conversation.item.retrieve": RealtimeProtocol._item_retrieve,
    "conversation.item.truncate": RealtimeProtocol._item_truncate,
    "conversation.item.delete": RealtimeProtocol._item_delete,
    "response.create": RealtimeProtocol._response_create,
    "response.cancel": RealtimeProtocol._response_cancel,
    "output_audio_buffer.clear": RealtimeProtocol._output_clear,
}
