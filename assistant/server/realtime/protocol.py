"""One session's Realtime API: client events in, server events out, over the session's one ``Conversation``.

This module takes the client events; ``conversation_events.py`` sends what the conversation does, and
``responses.py`` opens and closes responses.

The layer translates; it does not run turns. Speech, turn-taking, ASR, the responder and the voice are the
session's conversation, the same as our page's and WHIP's: client events become calls on it (``feed``,
``respond_to``, ``cancel``, ``tune``, ``set_voice``, ``end_utterance``), and its events (``pipeline/events.py``:
speech_start, transcript, reply_text, interrupted, ...) become the reference's server events, in the reference's
order:

    speech_start  → input_audio_buffer.speech_started
    transcript    → conversation.item.input_audio_transcription.delta (each pass over the speech so far)
    speech_end    → input_audio_buffer.speech_stopped, .committed, conversation.item.added (user)
    transcript    → conversation.item.input_audio_transcription.delta (the rest), .completed,
                    conversation.item.done, response.created, rate_limits.updated (a turn with words gets a
                    response, unless create_response is off)
    reply_text    → response.output_item.added, conversation.item.added, response.content_part.added (once),
                    response.output_audio_transcript.delta
    tool calls    → response.output_item.added, conversation.item.added, response.function_call_arguments.delta
                    (as the arguments come), .done, response.output_item.done, conversation.item.done
    reply audio   → response.output_audio.delta (WebSocket; over WebRTC it is the track)
    reply_done    → response.output_audio.done, …_transcript.done, content_part.done, output_item.done,
                    conversation.item.done, response.done (usage always an object)
    interrupted   → conversation.item.truncated (at what was played, unless the client cut the item itself),
                    the same closing events, and response.done with status cancelled (turn_detected or
                    client_cancelled)
    turn_metrics  → assistant.turn_metrics (ours, only with ?extensions=1: every stage's marks and durations)

A turn's number ties the two sides together: the pipeline numbers its events by turn, and a response belongs
to one turn. Failures of one client event answer with an ``error`` event in the reference's shape and change
nothing; the session goes on. A ``session.update`` is taken field by field: each wrong field gets its own error,
the rest applies.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from assistant.audio import AudioChunk
from assistant.body import loads_bounded
from assistant.server.realtime.conversation_events import ConversationEvents, no_input_words
from assistant.server.realtime.formats import FormatError, InputDecoder, OutputEncoder, decode_clip
from assistant.server.realtime.input_audio import FEED_SLICE, PACE_BURST_S, PACE_SPEED, InputAudio, InputPace
from assistant.server.realtime.items import Item, ItemError, Items, history_of, new_id, parse_item
from assistant.server.realtime.responder import RealtimeResponder, ReplyContext
from assistant.server.realtime.responses import Responses
from assistant.server.realtime.settings import ResponseRequest, Settings, SettingsError, parse_response
from assistant.server.realtime.sink import StreamSink
from assistant.server.realtime.state import Outgoing, Send, SessionState
from assistant.server.voice.session import ConversationSession, choose_language, language_choices

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100  # the reference refuses to commit less audio than this
WAV_MAGIC = (b"RIFF", b"OggS", b"fLaC", b"ID3")  # containers sent where raw samples were declared
NOTICE_EVENT = "assistant.notice"  # ours (extensions on): something the session should know, said once


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
        send: Send,
        *,
        webrtc: bool,
        beta: bool = False,
        extensions: bool = False,
        voices: Callable[[str], Awaitable[str | None]],
        speed_check: Callable[[float], None] = lambda speed: None,
        transcribe: Callable[[np.ndarray], Awaitable[str]],
        max_event_bytes: int,
        max_buffer_s: float,
        max_items: int,
    ) -> None:
        self.session = session
        self.conversation = session.conversation
        self.beta = beta
        self.voices, self.speed_check = voices, speed_check
        self.max_event_bytes, self.max_buffer_s = max_event_bytes, max_buffer_s
        self.decoder = InputDecoder(settings.input_format)
        self.pace = InputPace()
        self.out = Outgoing(send, beta=beta, session_id=session.id, extensions=extensions)
        self.state = SessionState(
            conversation=self.conversation, sink=session.sink, settings=settings, context=context,
            vad=session.cfg.vad, items=Items(max_items, on_evict=self._evicted),
            input=InputAudio(self.conversation, max_buffer_s), encoder=OutputEncoder(settings.output_format),
            webrtc=webrtc, transcribe=transcribe)
        self.responses = Responses(self.state, self.out)
        self.events = ConversationEvents(self.state, self.out, self.responses)
        sink = session.sink
        if isinstance(sink, StreamSink):
            sink.send_audio = self.events.on_reply_audio
            sink.discard = not settings.audio_out
        context.history = self.state.items.history
        self.state.session_context()
        session.events.subscribe(self.events.on_event)

    # --- sending ---------------------------------------------------------------------------------------
    def error(self, message: str, *, code: str | None, param: str | None = None, event_id: object = None,
              kind: str = "invalid_request_error") -> None:
        """An ``error`` event in the reference's shape; ``event_id`` names the client event at fault."""
        self.out.error(message, code=code, param=param, event_id=event_id, kind=kind)

    def start(self) -> None:
        """The first event of every session, and the idle timeout's watch."""
        self.out.emit("session.created", session=self.state.settings.to_json(self.beta))
        self.session.spawn(self.events.watch_idle(), "realtime-idle")
        if self.state.settings.tools:
            self._tools_note()

    def attach(self, send: Send) -> Callable[[], None]:
        """A control socket beside the call (``GET /v1/realtime?call_id=``): it gets the session as it is now,
        then every event the call gets; returns what detaches it."""
        send({"type": "session.created", "event_id": new_id("event"), "session": self.state.settings.to_json()})
        return self.out.attach(send)

    def _evicted(self, item: Item) -> None:
        """An item that went past realtime.max_items: the client is told it is gone."""
        if item in self.state.pending:
            self.state.pending.remove(item)
        self.out.emit("conversation.item.deleted", item_id=item.id)

    def _tools_note(self) -> None:
        """Tools with a responder that cannot call them: accepted (the rest of the session works), said once."""
        if self._takes_tools() or "tools" in self.state.notices:
            return
        self.state.notices.add("tools")
        name = self._responder_name()
        log.warning("realtime_tools_unsupported session=%s responder=%s: tools accepted, never called",
                    self.session.id, name)
        self.out.emit(NOTICE_EVENT, code="tools_unsupported",
                      message=f"the responder {name!r} cannot call tools: they are kept but never called "
                              "(respond.engine = openai calls them)")

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
                              param="session.audio.input.transcription.language") from None

    async def _session_update(self, event: dict[str, Any]) -> None:
        old = self.state.settings
        new, errors, applied = old.apply(event.get("session"))
        for exc in errors:
            self.error(str(exc), code=exc.code, param=exc.param, event_id=event.get("event_id"))
        if new.speed != old.speed:
            try:
                self.speed_check(new.speed)
            except ClientError as exc:
                self.error(str(exc), code=exc.code, param=exc.param, event_id=event.get("event_id"))
                new.speed, applied = old.speed, applied - 1
        language: str | None = None
        if new.transcription != old.transcription:
            try:
                language = self._transcription_language(new)
            except ClientError as exc:
                self.error(str(exc), code=exc.code, param=exc.param, event_id=event.get("event_id"))
                new.transcription, applied = old.transcription, applied - 1
        voice_id: str | None = None
        if new.voice != old.voice or new.speed != old.speed:
            try:
                voice_id = await self.voices(new.voice)
            except ClientError as exc:
                self.error(str(exc), code=exc.code, param=exc.param, event_id=event.get("event_id"))
                new.voice, applied = old.voice, applied - 1
                voice_id = await self.voices(new.voice) if new.speed != old.speed else None
        if applied <= 0 and errors:
            return  # nothing of it could be taken: the errors said why
        self.state.settings = new
        if language is not None:
            self.conversation.set_language(language)
        if new.voice != old.voice or new.speed != old.speed:
            self.conversation.set_voice(voice_id, new.speed)
        if new.turn_detection != old.turn_detection:
            cfg = self.session.cfg
            self.state.vad = new.vad_config(cfg.vad)
            self.conversation.tune(vad=self.state.vad, turn=new.turn_config(cfg.turn))
            if (old.turn_detection is None) != (new.turn_detection is None):
                self.state.input.clear()
        if new.input_format != old.input_format:
            self.decoder = InputDecoder(new.input_format)
        if new.output_format != old.output_format:
            self.state.encoder = OutputEncoder(new.output_format)
        if isinstance(self.state.sink, StreamSink):
            self.state.sink.discard = not new.audio_out
        if self.responses.current is None or not self.responses.current.client:
            self.state.session_context()
        if new.tools and new.tools != old.tools:
            self._tools_note()
        self.out.emit("session.updated", session=new.to_json(self.beta))

    async def _append(self, event: dict[str, Any]) -> None:
        data = self.audio_bytes(event.get("audio"), "audio")
        fmt = self.decoder.format
        if not self.pace.take(len(data) / (fmt.rate * fmt.bytes_per_sample)):
            if self.pace.flooding and not self.session.closed:
                log.info("realtime_input_flood session=%s refused_s=%.0f", self.session.id, self.pace.refused_s)
                self.session.spawn(self.session.close("input_audio_flood"), "close")
            raise ClientError(f"audio is appended faster than {PACE_SPEED:g}x real time (past a burst of "
                              f"{PACE_BURST_S:g} s): this append was dropped", code="input_audio_too_fast",
                              param="audio")
        samples = self.decoder.decode(data)
        if self.state.settings.turn_detection is not None:
            for at in range(0, samples.size, FEED_SLICE):  # VAD runs inline: a long append lets the loop breathe
                if at:
                    await asyncio.sleep(0)
                self.state.input.feed(samples[at : at + FEED_SLICE])
        elif not self.state.input.hold(samples):
            raise ClientError(f"the input audio buffer holds at most {self.max_buffer_s:g} s: commit or clear it",
                              code="input_audio_buffer_full", param="audio")

    def on_track_audio(self, chunk: AudioChunk) -> None:
        """The peer's audio (WebRTC): to turn-taking, or to the input buffer while turn detection is off (what
        passes its size is dropped: a track cannot be refused)."""
        if self.state.settings.turn_detection is not None:
            self.state.input.feed_chunk(chunk)
        else:
            self.state.input.hold(chunk.samples)

    def audio_bytes(self, value: object, param: str) -> bytes:
        """Base64 audio in the session's input format (raw samples: a WAV or other container is refused)."""
        if not isinstance(value, str):
            raise ClientError(f"Missing required parameter: '{param}' (a base64 string of audio).",
                              code="missing_required_parameter", param=param)
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(f"Invalid '{param}': not valid base64", code="invalid_value", param=param) from None
        if data.startswith(WAV_MAGIC):
            fmt = self.state.settings.input_format.type
            raise ClientError(f"'{param}' holds a file (a container header), not raw {fmt} "
                              "samples: send the samples alone, in the session's input format",
                              code="invalid_audio_format", param=param)
        return data

    async def _commit(self, event: dict[str, Any]) -> None:
        """Turn detection off: the held audio becomes a user item. On: the speech in progress ends now (its turn
        follows as after any end of speech), or the audio since the last commit becomes a user item."""
        state = self.state
        if state.settings.turn_detection is not None:
            if self.conversation.end_utterance():
                return  # speech_stopped, committed and the item follow from the conversation's end of speech
            clip = state.input.take_uncommitted()
        else:
            clip = state.input.take()
        ms = clip.size * 1000 / 16_000
        if ms < MIN_COMMIT_MS:
            raise ClientError(f"Error committing input audio buffer: buffer too small. Expected at least "
                              f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio.",
                              code="input_audio_buffer_commit_empty")
        item = Item(id=new_id("item"), type="message", role="user", audio=True, clip=clip, audio_ms=ms)
        previous = state.items.add(item)
        state.pending.append(item)
        self.out.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.out.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))

    async def _clear(self, event: dict[str, Any]) -> None:
        if self.state.settings.turn_detection is not None and self.conversation.speaking:
            self.conversation.drop_utterance()  # the speech so far will not be a turn
            self.events.speech_item = None
        self.state.input.clear()
        self.out.emit("input_audio_buffer.cleared")

    async def _item_create(self, event: dict[str, Any]) -> None:
        item = parse_item(event.get("item"), self._decode_clip, self.max_buffer_s)
        after = event.get("previous_item_id")
        if after is not None and not isinstance(after, str):
            raise ClientError("'previous_item_id' must be a string", param="previous_item_id")
        previous = self.state.items.add(item, after)
        if item.role == "user":
            self.state.pending.append(item)
        self.out.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        if not self.beta:
            self.out.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.beta))

    def _decode_clip(self, value: object, param: str) -> np.ndarray:
        return decode_clip(self.audio_bytes(value, param), self.state.settings.input_format)

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item = self._item(event, "retrieving", "item_retrieve_invalid_item_id")
        self.out.emit("conversation.item.retrieved", item=item.to_json(self.beta))

    async def _item_delete(self, event: dict[str, Any]) -> None:
        item = self._item(event, "deleting", "item_delete_invalid_item_id")
        self.state.items.delete(item.id)
        if item in self.state.pending:
            self.state.pending.remove(item)
        self.out.emit("conversation.item.deleted", item_id=item.id)

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        """The client's cut of an assistant item's audio: clamped to the audio it was given, never an error for
        a cut past the end; it stands (the server does not cut that item again)."""
        item = self._item(event, "truncating", "item_truncate_invalid_item_id")
        if item.role != "assistant" or not item.audio:
            raise ClientError("only an assistant message with audio can be truncated", param="item_id")
        if event.get("content_index", 0) != 0:
            raise ClientError("content_index must be 0 (a message has one part)", param="content_index")
        end = event.get("audio_end_ms")
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise ClientError("'audio_end_ms' must be a non-negative integer", param="audio_end_ms")
        length = self.responses.audio_length(item)
        cut = min(end, int(length + 0.999)) if length else end
        item.cut(cut)
        item.client_cut = True
        self.out.emit("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=cut)

    def _item(self, event: dict[str, Any], doing: str, code: str) -> Item:
        item = self.state.items.get(event.get("item_id"))
        if item is None:
            raise ClientError(f"Error {doing} item: the item with id '{str(event.get('item_id'))[:64]}' does not "
                              "exist.", code=code, param="item_id")
        return item

    async def _response_create(self, event: dict[str, Any]) -> None:
        state = self.state
        if self.responses.current is not None:
            active = self.responses.current.id
            raise ClientError(f"Conversation already has an active response in progress: {active}. Wait "
                              "until the response is finished before creating a new one.",
                              code="conversation_already_has_active_response")
        req = parse_response(event.get("response"), state.settings)
        if req.tools:
            self._tools_note()
        if req.input is not None:
            self._respond_to_input(req)
            return
        if req.out_of_band:  # the conversation so far is its context; new items stay the next response's input
            self.responses.start(req, text=no_input_words(state, req.instructions, given=req.given_instructions),
                                 continuation=True)
            self.state.given_words.add(self.conversation.turns)
            return
        pending, state.pending = state.pending, []
        clips = [i for i in pending if i.audio and i.clip is not None]
        if clips:  # committed audio: transcribed as one, the last item gets the words
            audio = np.concatenate([i.clip for i in clips if i.clip is not None])
            resp = self.responses.start(req, audio=audio, inputs=clips,
                                        input_audio_ms=sum(i.audio_ms for i in clips))
            state.user_items[resp.turn] = clips[-1]
            for item in clips[:-1]:
                item.transcript = ""
            return
        said = [i for i in pending if i.words()]
        if said:
            self.responses.start(req, text="\n".join(i.words() or "" for i in said), inputs=said,
                                 input_audio_ms=sum(i.audio_ms for i in said if i.audio))
        else:  # no new input: the model answers from the instructions and the conversation so far
            self.responses.start(req, text=no_input_words(state, req.instructions, given=req.given_instructions),
                                 continuation=True)
        state.given_words.add(self.conversation.turns)

    def _respond_to_input(self, req: ResponseRequest) -> None:
        """A response with its own context (``response.input``): items given whole, or references to items."""
        items: list[Item] = []
        assert req.input is not None
        for k, raw in enumerate(req.input):
            if isinstance(raw, dict) and raw.get("type") == "item_reference":
                found = self.state.items.get(raw.get("id"))
                if found is None:
                    raise ClientError(f"Item with id '{str(raw.get('id'))[:64]}' not found.",
                                      param=f"response.input[{k}].id")
                items.append(found)
                continue
            try:
                item = parse_item(raw, self._decode_clip, self.max_buffer_s)
            except ItemError as exc:
                raise ClientError(str(exc), code=exc.code, param=f"response.input[{k}]") from None
            if item.clip is not None:
                raise ClientError("audio in response.input is not transcribed here: commit it (or create it as "
                                  "an item) and reference it", code="unsupported", param=f"response.input[{k}]")
            items.append(item)
        last = next((i.words() for i in reversed(items) if i.role == "user" and i.words()), None)
        words = req.instructions if req.given_instructions else (last or req.instructions)
        self.responses.start(req, text=words or None, continuation=True,
                             only=lambda tools: history_of(items, tools))
        self.state.given_words.add(self.conversation.turns)

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        resp = self.responses.current
        wanted = event.get("response_id")
        if resp is None or (wanted is not None and wanted != resp.id):
            raise ClientError("Cancellation failed: no active response found", code="response_cancel_not_active")
        if not self.conversation.cancel("client_cancelled"):
            self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})

    async def _output_clear(self, event: dict[str, Any]) -> None:
        if not self.state.webrtc:
            raise ClientError("output_audio_buffer.clear is for WebRTC sessions: over WebSocket the client holds "
                              "the audio; use response.cancel and conversation.item.truncate", code="unsupported")
        resp = self.responses.current
        if resp is not None and not self.conversation.cancel("client_cancelled"):
            self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": "client_cancelled"})
        target = resp or self.responses.last
        if target is not None and not target.cleared:  # one cleared per response, with its id
            target.cleared = True
            self.out.emit("output_audio_buffer.cleared", response_id=target.id)

    # --- helpers -------------------------------------------------------------------------------------------
    def _takes_tools(self) -> bool:
        responder = self.conversation.runner.deps.responder
        return isinstance(responder, RealtimeResponder) and responder.takes_tools

    def _responder_name(self) -> str:
        responder = self.conversation.runner.deps.responder
        return str(getattr(getattr(responder, "inner", responder), "name", "responder"))

    async def close(self) -> None:
        await self.responses.close()
        await self.events.close()


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
