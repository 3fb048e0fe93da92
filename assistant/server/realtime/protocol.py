"""One session's Realtime API: client events in, server events out, over the session's one ``Conversation``.

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

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assistant.audio import SPEECH_RATE, AudioChunk
from assistant.pipeline.reply import played_text
from assistant.server.realtime.formats import FormatError, InputDecoder, OutputEncoder, decode_clip
from assistant.server.realtime.items import Item, ItemError, Items, new_id, parse_item
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.realtime.settings import Settings, SettingsError, parse_tools
from assistant.server.realtime.sink import StreamSink
from assistant.server.session import ConversationSession

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
METRICS_EVENT = "assistant.turn_metrics"
MIN_COMMIT_MS = 100  # the reference refuses to commit less audio than this
CONTINUE = "(continue)"  # the words of a turn that has none: the model goes on after a tool's output
TURNS_KEPT = 16  # turns whose late events (an interruption, a metrics event) still find their response
WATCH_S = 0.05  # how often an open response checks that its turn is still running
WAV_MAGIC = (b"RIFF", b"OggS", b"fLaC", b"ID3")  # containers sent where raw samples were declared


class ClientError(ValueError):
    """A client event this session refuses: the reference's error fields."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.param, self.kind = code, param, kind


@dataclass
class Response:
    """One response: the turn it belongs to, what it said, and how far its events have gone."""

    id: str
    turn: int
    input_text: str = ""
    metadata: Any = None
    modalities: list[str] = field(default_factory=lambda: ["audio"])
    output: list[Item] = field(default_factory=list)
    message: Item | None = None  # the assistant message item, once it has words or audio
    part_open: bool = False
    transcript: str = ""
    audio_bytes: int = 0
    frames_base: int = 0  # the sink's heard-frame count when the response began
    audio_started: bool = False
    speech_after: bool = False  # the user started speaking while it was open
    client: bool = False  # asked for with response.create (its context is the response's own)
    inputs: list[Item] = field(default_factory=list)  # the user items it answers (response.create)
    closed: bool = False

    def to_json(self, status: str, details: dict[str, Any] | None, beta: bool, output_format: dict[str, Any],
                voice: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "object": "realtime.response", "id": self.id, "status": status, "status_details": details,
            "output": [i.to_json(beta) for i in self.output], "conversation_id": "conv_default",
            "usage": None, "metadata": self.metadata,
        }
        if beta:
            out.update(modalities=self.modalities, voice=voice, output_audio_format=output_format)
        else:
            out.update(output_modalities=self.modalities, max_output_tokens="inf",
                       audio={"output": {"format": output_format, "voice": voice}})
        return out


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
        self.buffer: list[np.ndarray] = []  # appended audio while turn detection is off (16 kHz)
        self.buffer_samples = 0
        self.fed = 0  # 16 kHz samples given to the conversation (the input stream's clock)
        self.pending: list[Item] = []  # user items created since the last response: its input
        self.speech_item: str | None = None  # id of the user item the current speech will become
        self.speech_start_ms = 0.0
        self.user_items: dict[int, Item] = {}  # turn → its user audio item
        self.given_words: set[int] = set()  # turns whose words were given (no transcription events)
        self.response: Response | None = None
        self.by_turn: dict[int, Response] = {}
        self._watcher: asyncio.Task[None] | None = None
        self.sink = session.sink
        if isinstance(self.sink, StreamSink):
            self.sink.send_audio = self._on_reply_audio
            self.sink.discard = not settings.audio_out
        context.instructions = settings.instructions
        context.history = self.items.history
        context.tools, context.tool_choice = settings.tools, settings.tool_choice
        session.events.subscribe(self._on_pipeline_event)

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
            event = json.loads(text)
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

    async def _session_update(self, event: dict[str, Any]) -> None:
        new = self.settings.updated(event.get("session"))
        old = self.settings
        voice_id: str | None = None
        if new.speed != old.speed:
            self.speed_check(new.speed)
        if new.voice != old.voice or new.speed != old.speed:
            voice_id = await self.voices(new.voice)
        if new.tools and not self._takes_tools():
            raise ClientError(f"tools are not supported by the responder {self._responder_name()!r}: configure an "
                              "OpenAI-compatible responder (respond.engine = openai) that supports them",
                              code="unsupported", param="session.tools")
        self.settings = new
        if new.voice != old.voice or new.speed != old.speed:
            self.conversation.set_voice(voice_id, new.speed)
        if new.turn_detection != old.turn_detection:
            cfg = self.session.cfg
            self.conversation.tune(vad=new.vad_config(cfg.vad), turn=new.turn_config(cfg.turn))
            if (old.turn_detection is None) != (new.turn_detection is None):
                self._clear_buffer()
        if new.input_format != old.input_format:
            self.decoder = InputDecoder(new.input_format)
        if new.output_format != old.output_format:
            self.encoder = OutputEncoder(new.output_format)
        if isinstance(self.sink, StreamSink):
            self.sink.discard = not new.audio_out
        if self.response is None or not self.response.client:
            self.context.instructions = new.instructions
            self.context.tools, self.context.tool_choice = new.tools, new.tool_choice
        self.emit("session.updated", session=new.to_json(self.beta))

    async def _append(self, event: dict[str, Any]) -> None:
        data = self.audio_bytes(event.get("audio"), "audio")
        samples = self.decoder.decode(data)
        if self.settings.turn_detection is None:
            if (self.buffer_samples + samples.size) / SPEECH_RATE > self.max_buffer_s:
                raise ClientError(f"the input audio buffer holds at most {self.max_buffer_s:g} s: commit or clear it",
                                  code="input_audio_buffer_full", param="audio")
            self.buffer.append(samples)
            self.buffer_samples += samples.size
            return
        self.feed(samples)

    def feed(self, samples: np.ndarray, arrived: float = 0.0) -> None:
        """16 kHz audio to the conversation's turn-taking (WebSocket appends; the track over WebRTC)."""
        if samples.size:
            chunk = AudioChunk(self.fed, samples, arrived or time.time())
            self.fed += samples.size
            self.conversation.feed(chunk)

    def on_track_audio(self, chunk: AudioChunk) -> None:
        """The peer's audio (WebRTC): to turn-taking, or to the input buffer while turn detection is off."""
        if self.settings.turn_detection is not None:
            self.fed = chunk.end
            self.conversation.feed(chunk)
        elif (self.buffer_samples + chunk.samples.size) / SPEECH_RATE <= self.max_buffer_s:
            self.buffer.append(chunk.samples)
            self.buffer_samples += chunk.samples.size

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
        ms = self.buffer_samples * 1000 / SPEECH_RATE
        if ms < MIN_COMMIT_MS:
            raise ClientError(f"buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, but buffer only has "
                              f"{ms:.2f}ms of audio.", code="input_audio_buffer_commit_empty")
        clip = np.concatenate(self.buffer)
        self._clear_buffer()
        item = Item(id=new_id("item"), type="message", role="user", audio=True, clip=clip, audio_ms=ms)
        previous = self.items.add(item)
        self.pending.append(item)
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))

    async def _clear(self, event: dict[str, Any]) -> None:
        self._clear_buffer()
        self.emit("input_audio_buffer.cleared")

    def _clear_buffer(self) -> None:
        self.buffer.clear()
        self.buffer_samples = 0

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
        if self.response is not None:
            raise ClientError(f"Conversation already has an active response in progress: {self.response.id}. Wait "
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
        ctx = self.context
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
        resp = self._open(turn, client=True, input_text=text)
        resp.metadata = params.get("metadata")
        resp.modalities = list(modalities)
        resp.inputs = inputs

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        resp = self.response
        wanted = event.get("response_id")
        if resp is None or (wanted is not None and wanted != resp.id):
            raise ClientError("Cancellation failed: no active response found", code="response_cancel_not_active")
        if not self.conversation.cancel("client_cancelled"):
            self._finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})

    async def _output_clear(self, event: dict[str, Any]) -> None:
        if not self.webrtc:
            raise ClientError("output_audio_buffer.clear is for WebRTC sessions: over WebSocket the client holds "
                              "the audio; use response.cancel and conversation.item.truncate", code="unsupported")
        resp = self.response
        if resp is not None and not self.conversation.cancel("client_cancelled"):
            self._finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})
        self.emit("output_audio_buffer.cleared", response_id=resp.id if resp is not None else None)

    # --- the conversation's events ----------------------------------------------------------------------
    def _on_pipeline_event(self, event: dict[str, Any]) -> None:
        handler = PIPELINE.get(event["type"])
        if handler is not None:
            handler(self, event)

    def _speech_start(self, event: dict[str, Any]) -> None:
        cfg = self.session.cfg.vad
        self.speech_item = new_id("item")
        self.speech_start_ms = max(0.0, self.fed * 1000 / SPEECH_RATE - cfg.min_speech_ms - cfg.speech_pad_ms)
        if self.response is not None:
            self.response.speech_after = True
        self.emit("input_audio_buffer.speech_started", audio_start_ms=round(self.speech_start_ms),
                  item_id=self.speech_item)

    def _speech_end(self, event: dict[str, Any]) -> None:
        turn = int(event["turn"])
        item = Item(id=self.speech_item or new_id("item"), type="message", role="user", audio=True,
                    audio_ms=float(event.get("duration_ms", 0.0)))
        self.speech_item = None
        end_ms = self.speech_start_ms + self.session.cfg.vad.speech_pad_ms + item.audio_ms
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=round(end_ms), item_id=item.id)
        for older, prior in list(self.user_items.items()):
            if older < turn and prior.transcript is None:  # its turn was dropped: the audio went into this one
                self._forget(older, prior)
        previous = self.items.add(item)
        self.user_items[turn] = item
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        asyncio.get_running_loop().call_soon(self._check_taken, turn, item)

    def _check_taken(self, turn: int, item: Item) -> None:
        """An utterance the conversation did not take as a turn (spoken over the reply with barge-in off)."""
        if self.conversation.turns < turn and item.transcript is None:
            self._forget(turn, item)

    def _forget(self, turn: int, item: Item) -> None:
        self.user_items.pop(turn, None)
        if self.items.delete(item.id) is not None:
            self.emit("conversation.item.deleted", item_id=item.id)

    def _transcript(self, event: dict[str, Any]) -> None:
        if not event.get("final"):
            return
        turn, text = int(event["turn"]), str(event.get("text", ""))
        item = self.user_items.get(turn)
        if item is not None and turn not in self.given_words:
            item.transcript, item.clip = text, None
            item.current = bool(text)
            if self.settings.transcription is not None:
                usage = {"type": "duration", "seconds": round(item.audio_ms / 1000, 3)}
                self.emit("conversation.item.input_audio_transcription.delta", item_id=item.id, content_index=0,
                          delta=text)
                self.emit("conversation.item.input_audio_transcription.completed", item_id=item.id,
                          content_index=0, transcript=text, usage=usage)
            if not self.beta:
                self.emit("conversation.item.done", previous_item_id=self.items.previous_id(item),
                          item=item.to_json(self.beta))
        resp = self.by_turn.get(turn)
        if resp is not None and not resp.input_text:
            resp.input_text = text  # a response to committed audio: its words are known now
        elif text and resp is None:
            self.pending.clear()  # text items the client added before this turn are its history now
            self._open(turn, client=False, input_text=text)

    def _reply_text(self, event: dict[str, Any]) -> None:
        resp = self.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        delta = str(event.get("delta", ""))
        self._message(resp)
        resp.transcript += delta
        if resp.message is not None:
            resp.message.transcript = resp.transcript if resp.message.audio else None
            if not resp.message.audio:
                resp.message.text = resp.transcript
        kind = "response.output_audio_transcript.delta" if "audio" in resp.modalities else "response.output_text.delta"
        self.emit(kind, response_id=resp.id, item_id=resp.message.id if resp.message else None, output_index=0,
                  content_index=0, delta=delta)

    def _on_reply_audio(self, pcm: np.ndarray) -> None:
        """A chunk of reply audio from the WebSocket sink: a delta of the open response (else dropped)."""
        resp = self.response
        if resp is None or resp.closed or "audio" not in resp.modalities:
            return
        self._message(resp)
        data = self.encoder.encode(pcm)
        if not data:
            return
        resp.audio_bytes += len(data)
        if resp.message is not None:
            resp.message.audio_ms = self.settings.output_format.duration_ms(resp.audio_bytes)
        self.emit("response.output_audio.delta", response_id=resp.id, item_id=resp.message.id if resp.message
                  else None, output_index=0, content_index=0, delta=base64.b64encode(data).decode("ascii"))

    def _reply_audio_start(self, event: dict[str, Any]) -> None:
        resp = self.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        resp.audio_started = True
        self._message(resp)
        if self.webrtc:
            self.emit("output_audio_buffer.started", response_id=resp.id)

    def _turn_metrics(self, event: dict[str, Any]) -> None:
        if not self.turn_metrics:
            return
        resp = self.by_turn.get(int(event["turn"]))
        fields = {k: v for k, v in event.items() if k not in ("type", "t_ms")}
        self.emit(METRICS_EVENT, response_id=resp.id if resp is not None else None, **fields)

    def _reply_done(self, event: dict[str, Any]) -> None:
        resp = self.by_turn.get(int(event["turn"]))
        if resp is not None:
            self._finish(resp, "completed", None)

    def _interrupted(self, event: dict[str, Any]) -> None:
        if event.get("paused"):
            return  # a held reply (a backchannel check): not an interruption of the response yet
        resp = self.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        reason = "client_cancelled" if event.get("reason") == "client_cancelled" else "turn_detected"
        heard_ms = max(0, (self.sink.audible_frames_sent - resp.frames_base) * 20)
        if self.webrtc and resp.audio_started:
            self.emit("output_audio_buffer.cleared", response_id=resp.id)
        if resp.message is not None and resp.message.audio:
            self._cut(resp.message, heard_ms, self._heard_text(resp))
            self.emit("conversation.item.truncated", item_id=resp.message.id, content_index=0,
                      audio_end_ms=int(heard_ms))
        self._finish(resp, "cancelled", {"type": "cancelled", "reason": reason})

    def _error(self, event: dict[str, Any]) -> None:
        turn = event.get("turn")
        stage, message = str(event.get("stage", "turn")), str(event.get("message", "the reply failed"))
        resp = self.by_turn.get(int(turn)) if turn is not None else None
        item = self.user_items.get(int(turn)) if turn is not None else None
        if resp is None and item is not None and item.transcript is None:
            item.transcript = ""
            self.emit("conversation.item.input_audio_transcription.failed", item_id=item.id, content_index=0,
                      error={"type": "server_error", "code": f"{stage}_failed", "message": message})
        self.error(message, code=f"{stage}_failed", kind="server_error")
        if resp is not None:
            self._finish(resp, "failed", {"type": "failed", "error": {"type": "server_error",
                                                                       "code": f"{stage}_failed", "message": message}})

    def _closed(self, event: dict[str, Any]) -> None:
        if self.response is not None:
            self._finish(self.response, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})

    # --- responses -----------------------------------------------------------------------------------------
    def _open(self, turn: int, *, client: bool, input_text: str) -> Response:
        if self.response is not None:
            self._finish(self.response, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
        resp = Response(id=new_id("resp"), turn=turn, input_text=input_text, client=client,
                        modalities=list(self.settings.output_modalities),
                        frames_base=self.sink.audible_frames_sent)
        self.response = self.by_turn[turn] = resp
        for old in [t for t in self.by_turn if t < turn - TURNS_KEPT]:  # bounded: only recent turns get events
            self.by_turn.pop(old)
        for old in [t for t in self.user_items if t < turn - TURNS_KEPT]:
            self.user_items.pop(old)
        self.given_words = {t for t in self.given_words if t >= turn - TURNS_KEPT}
        if not client:
            self.context.instructions = self.settings.instructions
            self.context.tools, self.context.tool_choice = self.settings.tools, self.settings.tool_choice
            self.context.continuation = False
        self.emit("response.created", response=resp.to_json("in_progress", None, self.beta, self._out_format(),
                                                           self.settings.voice))
        self._watcher = asyncio.get_running_loop().create_task(self._watch(resp), name=f"rt-watch-{turn}")
        return resp

    async def _watch(self, resp: Response) -> None:
        """Close a response whose turn ended without a reply heard (no words, only tool calls, or dropped)."""
        quiet = 0
        while not resp.closed:
            await asyncio.sleep(WATCH_S)
            quiet = quiet + 1 if not self.conversation.responding else 0
            if quiet >= 2 and not resp.closed:
                if resp.speech_after and not resp.transcript:
                    self._finish(resp, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
                else:
                    self._finish(resp, "completed", None)

    def _message(self, resp: Response) -> Item:
        """The response's assistant message: added to the output and the conversation on first use."""
        if resp.message is None:
            audio = "audio" in resp.modalities
            item = Item(id=new_id("item"), type="message", role="assistant", status="in_progress", audio=audio,
                        transcript="" if audio else None, text=None if audio else "", current=True)
            resp.message = item
            resp.output.append(item)
            previous = self.items.add(item)
            self.emit("response.output_item.added", response_id=resp.id, output_index=0, item=item.to_json(self.beta))
            self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        if not resp.part_open:
            resp.part_open = True
            part = {"type": "audio", "transcript": ""} if resp.message.audio else {"type": "text", "text": ""}
            self.emit("response.content_part.added", response_id=resp.id, item_id=resp.message.id, output_index=0,
                      content_index=0, part=part)
        return resp.message

    def _finish(self, resp: Response, status: str, details: dict[str, Any] | None) -> None:
        """The closing events of a response, in the reference's order, then ``response.done``."""
        if resp.closed:
            return
        resp.closed = True
        msg = resp.message
        ids = {"response_id": resp.id, "output_index": 0}
        if msg is not None and msg.audio and not resp.audio_bytes and status == "completed":
            msg.audio_ms = max(0, (self.sink.audible_frames_sent - resp.frames_base) * 20)  # WebRTC: all played
        if msg is not None:
            if resp.part_open:
                if msg.audio:
                    if "audio" in resp.modalities:
                        self.emit("response.output_audio.done", item_id=msg.id, content_index=0, **ids)
                    self.emit("response.output_audio_transcript.done", item_id=msg.id, content_index=0,
                              transcript=msg.transcript or "", **ids)
                    part = {"type": "audio", "transcript": msg.transcript or ""}
                else:
                    self.emit("response.output_text.done", item_id=msg.id, content_index=0, text=msg.text or "",
                              **ids)
                    part = {"type": "text", "text": msg.text or ""}
                self.emit("response.content_part.done", item_id=msg.id, content_index=0, part=part, **ids)
            msg.status = "completed" if status == "completed" else "incomplete"
            msg.current = False
            self.emit("response.output_item.done", response_id=resp.id, output_index=0, item=msg.to_json(self.beta))
            if not self.beta:
                self.emit("conversation.item.done", previous_item_id=self.items.previous_id(msg),
                          item=msg.to_json(self.beta))
        if status != "failed":
            for call in self.context.take_calls(resp.input_text):
                self._function_call(resp, call.call_id, call.name, call.arguments)
        for item in resp.inputs:
            item.current = False
        user = self.user_items.get(resp.turn)
        if user is not None:
            user.current = False
        self.emit("response.done", response=resp.to_json(status, details, self.beta, self._out_format(),
                                                        self.settings.voice))
        if self.webrtc and status == "completed" and resp.audio_started:
            self.emit("output_audio_buffer.stopped", response_id=resp.id)
        if self.response is resp:
            self.response = None
            ctx = self.context
            ctx.instructions = self.settings.instructions
            ctx.tools, ctx.tool_choice, ctx.continuation = self.settings.tools, self.settings.tool_choice, False
        log.info("realtime_response session=%s turn=%d status=%s chars=%d audio_bytes=%d", self.session.id,
                 resp.turn, status, len(resp.transcript), resp.audio_bytes)

    def _function_call(self, resp: Response, call_id: str, name: str, arguments: str) -> None:
        item = Item(id=new_id("item"), type="function_call", status="in_progress", call_id=call_id, name=name)
        index = len(resp.output)
        resp.output.append(item)
        previous = self.items.add(item)
        ids = {"response_id": resp.id, "output_index": index}
        self.emit("response.output_item.added", item=item.to_json(self.beta), **ids)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        self.emit("response.function_call_arguments.delta", item_id=item.id, call_id=call_id, delta=arguments, **ids)
        item.arguments, item.status = arguments, "completed"
        self.emit("response.function_call_arguments.done", item_id=item.id, call_id=call_id, name=name,
                  arguments=arguments, **ids)
        self.emit("response.output_item.done", item=item.to_json(self.beta), **ids)
        if not self.beta:
            self.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.beta))

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

    def _out_format(self) -> dict[str, Any]:
        fmt = self.settings.output_format
        return fmt.beta_name if self.beta else fmt.to_json()  # type: ignore[return-value]

    def _takes_tools(self) -> bool:
        responder = self.conversation.runner.deps.responder
        return isinstance(responder, RealtimeResponder) and responder.takes_tools

    def _responder_name(self) -> str:
        responder = self.conversation.runner.deps.responder
        return str(getattr(getattr(responder, "inner", responder), "name", "responder"))

    async def close(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher


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
PIPELINE: dict[str, Callable[[RealtimeProtocol, dict[str, Any]], None]] = {
    "speech_start": RealtimeProtocol._speech_start,
    "speech_end": RealtimeProtocol._speech_end,
    "transcript": RealtimeProtocol._transcript,
    "reply_text": RealtimeProtocol._reply_text,
    "reply_audio_start": RealtimeProtocol._reply_audio_start,
    "turn_metrics": RealtimeProtocol._turn_metrics,
    "reply_done": RealtimeProtocol._reply_done,
    "interrupted": RealtimeProtocol._interrupted,
    "error": RealtimeProtocol._error,
    "close": RealtimeProtocol._closed,
}
