"""The conversation's events as the Realtime API's server events: the "server events out" half of a session.

The session's conversation publishes what happens (``pipeline/events.py``); each event becomes the reference's
server events, in the reference's order (the table is in ``protocol.py``'s docstring). The user's audio items
are made here as speech starts and stops; the responses they lead to are ``responses.py``'s.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from assistant.audio import SPEECH_RATE
from assistant.server.realtime.items import Item, new_id

if TYPE_CHECKING:
    from assistant.server.realtime.protocol import RealtimeProtocol

METRICS_EVENT = "assistant.turn_metrics"


class ConversationEvents:
    """Translates one session's conversation events (see the module docstring)."""

    def __init__(self, owner: RealtimeProtocol) -> None:
        self.owner = owner
        self.speech_item: str | None = None  # id of the user item the current speech will become
        self.speech_start_ms = 0.0

    @property
    def beta(self) -> bool:
        return self.owner.beta

    def emit(self, kind: str, **fields: Any) -> None:
        self.owner.emit(kind, **fields)

    def on_event(self, event: dict[str, Any]) -> None:
        handler = PIPELINE.get(event["type"])
        if handler is not None:
            handler(self, event)

    def _speech_start(self, event: dict[str, Any]) -> None:
        cfg = self.owner.session.cfg.vad
        self.speech_item = new_id("item")
        fed_ms = self.owner.input.fed * 1000 / SPEECH_RATE
        self.speech_start_ms = max(0.0, fed_ms - cfg.min_speech_ms - cfg.speech_pad_ms)
        if self.owner.responses.current is not None:
            self.owner.responses.current.speech_after = True
        self.emit("input_audio_buffer.speech_started", audio_start_ms=round(self.speech_start_ms),
                  item_id=self.speech_item)

    def _speech_end(self, event: dict[str, Any]) -> None:
        turn = int(event["turn"])
        item = Item(id=self.speech_item or new_id("item"), type="message", role="user", audio=True,
                    audio_ms=float(event.get("duration_ms", 0.0)))
        self.speech_item = None
        end_ms = self.speech_start_ms + self.owner.session.cfg.vad.speech_pad_ms + item.audio_ms
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=round(end_ms), item_id=item.id)
        for older, prior in list(self.owner.user_items.items()):
            if older < turn and prior.transcript is None:  # its turn was dropped: the audio went into this one
                self._forget(older, prior)
        previous = self.owner.items.add(item)
        self.owner.user_items[turn] = item
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        asyncio.get_running_loop().call_soon(self._check_taken, turn, item)

    def _check_taken(self, turn: int, item: Item) -> None:
        """An utterance the conversation did not take as a turn (spoken over the reply with barge-in off)."""
        if self.owner.conversation.turns < turn and item.transcript is None:
            self._forget(turn, item)

    def _forget(self, turn: int, item: Item) -> None:
        self.owner.user_items.pop(turn, None)
        if self.owner.items.delete(item.id) is not None:
            self.emit("conversation.item.deleted", item_id=item.id)

    def _transcript(self, event: dict[str, Any]) -> None:
        if not event.get("final"):
            return
        turn, text = int(event["turn"]), str(event.get("text", ""))
        item = self.owner.user_items.get(turn)
        if item is not None and turn not in self.owner.given_words:
            item.transcript, item.clip = text, None
            item.current = bool(text)
            if self.owner.settings.transcription is not None:
                usage = {"type": "duration", "seconds": round(item.audio_ms / 1000, 3)}
                self.emit("conversation.item.input_audio_transcription.delta", item_id=item.id, content_index=0,
                          delta=text)
                # Ours beyond OpenAI's fields: the language the turn was heard in, and how sure the ASR is.
                heard = {k: event[k] for k in ("language", "language_probability") if event.get(k) is not None}
                self.emit("conversation.item.input_audio_transcription.completed", item_id=item.id,
                          content_index=0, transcript=text, usage=usage, **heard)
            if not self.beta:
                self.emit("conversation.item.done", previous_item_id=self.owner.items.previous_id(item),
                          item=item.to_json(self.beta))
        resp = self.owner.responses.by_turn.get(turn)
        if resp is not None and not resp.input_text:
            resp.input_text = text  # a response to committed audio: its words are known now
        elif text and resp is None:
            self.owner.pending.clear()  # text items the client added before this turn are its history now
            self.owner.responses.open(turn, client=False, input_text=text)

    def _reply_text(self, event: dict[str, Any]) -> None:
        resp = self.owner.responses.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        delta = str(event.get("delta", ""))
        self.owner.responses.message(resp)
        resp.transcript += delta
        if resp.message is not None:
            resp.message.transcript = resp.transcript if resp.message.audio else None
            if not resp.message.audio:
                resp.message.text = resp.transcript
        kind = "response.output_audio_transcript.delta" if "audio" in resp.modalities else "response.output_text.delta"
        self.emit(kind, response_id=resp.id, item_id=resp.message.id if resp.message else None, output_index=0,
                  content_index=0, delta=delta)

    def on_reply_audio(self, pcm: np.ndarray) -> None:
        """A chunk of reply audio from the WebSocket sink: a delta of the open response (else dropped)."""
        resp = self.owner.responses.current
        if resp is None or resp.closed or "audio" not in resp.modalities:
            return
        self.owner.responses.message(resp)
        data = self.owner.encoder.encode(pcm)
        if not data:
            return
        resp.audio_bytes += len(data)
        if resp.message is not None:
            resp.message.audio_ms = self.owner.settings.output_format.duration_ms(resp.audio_bytes)
        self.emit("response.output_audio.delta", response_id=resp.id, item_id=resp.message.id if resp.message
                  else None, output_index=0, content_index=0, delta=base64.b64encode(data).decode("ascii"))

    def _reply_audio_start(self, event: dict[str, Any]) -> None:
        resp = self.owner.responses.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        resp.audio_started = True
        self.owner.responses.message(resp)
        if self.owner.webrtc:
            self.emit("output_audio_buffer.started", response_id=resp.id)

    def _turn_metrics(self, event: dict[str, Any]) -> None:
        if not self.owner.turn_metrics:
            return
        resp = self.owner.responses.by_turn.get(int(event["turn"]))
        fields = {k: v for k, v in event.items() if k not in ("type", "t_ms")}
        self.emit(METRICS_EVENT, response_id=resp.id if resp is not None else None, **fields)

    def _reply_done(self, event: dict[str, Any]) -> None:
        resp = self.owner.responses.by_turn.get(int(event["turn"]))
        if resp is not None:
            self.owner.responses.finish(resp, "completed", None)

    def _interrupted(self, event: dict[str, Any]) -> None:
        if event.get("paused"):
            return  # a held reply (a backchannel check): not an interruption of the response yet
        resp = self.owner.responses.by_turn.get(int(event["turn"]))
        if resp is None or resp.closed:
            return
        reason = "client_cancelled" if event.get("reason") == "client_cancelled" else "turn_detected"
        heard_ms = max(0, (self.owner.sink.audible_frames_sent - resp.frames_base) * 20)
        if self.owner.webrtc and resp.audio_started:
            self.emit("output_audio_buffer.cleared", response_id=resp.id)
        if resp.message is not None and resp.message.audio:
            self.owner._cut(resp.message, heard_ms, self.owner._heard_text(resp))
            self.emit("conversation.item.truncated", item_id=resp.message.id, content_index=0,
                      audio_end_ms=int(heard_ms))
        self.owner.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": reason})

    def _error(self, event: dict[str, Any]) -> None:
        turn = event.get("turn")
        stage, message = str(event.get("stage", "turn")), str(event.get("message", "the reply failed"))
        resp = self.owner.responses.by_turn.get(int(turn)) if turn is not None else None
        item = self.owner.user_items.get(int(turn)) if turn is not None else None
        if resp is None and item is not None and item.transcript is None:
            item.transcript = ""
            self.emit("conversation.item.input_audio_transcription.failed", item_id=item.id, content_index=0,
                      error={"type": "server_error", "code": f"{stage}_failed", "message": message})
        self.owner.error(message, code=f"{stage}_failed", kind="server_error")
        if resp is not None:
            error = {"type": "server_error", "code": f"{stage}_failed", "message": message}
            self.owner.responses.finish(resp, "failed", {"type": "failed", "error": error})

    def _closed(self, event: dict[str, Any]) -> None:
        if self.owner.responses.current is not None:
            self.owner.responses.finish(self.owner.responses.current, "cancelled",
                                  {"type": "cancelled", "reason": "client_cancelled"})


PIPELINE: dict[str, Callable[[ConversationEvents, dict[str, Any]], None]] = {
    "speech_start": ConversationEvents._speech_start,
    "speech_end": ConversationEvents._speech_end,
    "transcript": ConversationEvents._transcript,
    "reply_text": ConversationEvents._reply_text,
    "reply_audio_start": ConversationEvents._reply_audio_start,
    "turn_metrics": ConversationEvents._turn_metrics,
    "reply_done": ConversationEvents._reply_done,
    "interrupted": ConversationEvents._interrupted,
    "error": ConversationEvents._error,
    "close": ConversationEvents._closed,
}
