"""The conversation's events as the Realtime API's server events: the "server events out" half of a session.

The session's conversation publishes what happens (``pipeline/events.py``); each event becomes the reference's
server events, in the reference's order (the table is in ``protocol.py``'s docstring). The user's audio items
are made here as speech starts and stops, and transcribed as the user speaks (each speculative pass's words as
``input_audio_transcription.delta``, then ``.completed``); the responses they lead to are ``responses.py``'s.
Speech the conversation takes no turn of (spoken over a reply that ``interrupt_response: false`` lets play on)
still becomes a transcribed item. The idle timeout (``turn_detection.idle_timeout_ms``) is watched here too.
It reads and writes the session's shared state (``state.py``) and nothing of the client-event half.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from assistant.audio import SPEECH_RATE
from assistant.pipeline.events import Event
from assistant.server.realtime.items import Item, new_id
from assistant.server.realtime.responses import CONTINUE, Response, Responses
from assistant.server.realtime.settings import parse_response
from assistant.server.realtime.state import Outgoing, SessionState

log = logging.getLogger(__name__)

METRICS_EVENT = "assistant.turn_metrics"
IDLE_CHECK_S = 0.1  # how often the idle timeout is looked at
# WebSocket: a barge-in's cut of the reply (our estimate of what was played) is announced this long after the
# interruption, unless the client truncated the item itself by then (as the reference's clients do on
# speech_started): one truncated event, and the client's cut stands.
CUT_GRACE_S = 1.0
TRAILING = ".,;:!?…。，；：！？、 "  # punctuation a pass puts at its end, held back until more words follow
PARTIALS_KEPT = 16  # user items whose partial transcript is remembered until their final one


V = TypeVar("V")


def ms(samples: int) -> int:
    return round(samples * 1000 / SPEECH_RATE)


def turn_of(event: Event) -> int:
    """The turn an event is about (the pipeline numbers turns with ints)."""
    turn = event["turn"]
    if isinstance(turn, bool) or not isinstance(turn, int):
        raise TypeError(f"{event.get('type')} event: turn {turn!r} is not a turn number")
    return turn


class ConversationEvents:
    """Translates one session's conversation events (see the module docstring)."""

    def __init__(self, state: SessionState, out: Outgoing, responses: Responses) -> None:
        self.state = state
        self.out = out
        self.responses = responses
        self.speech_item: str | None = None  # id of the user item the current speech will become
        self.speech_start_ms = 0.0
        self.partial = ""  # what the current speech's transcription deltas have said so far
        self.sent: dict[str, str] = {}  # user item → its transcription deltas so far (until its final words)
        self.spans: dict[str, tuple[int, int]] = {}  # user item → its audio on the input stream's clock
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def beta(self) -> bool:
        return self.out.beta

    def emit(self, kind: str, **fields: object) -> None:
        self.out.emit(kind, **fields)

    def on_event(self, event: Event) -> None:
        handler = PIPELINE.get(str(event["type"]))
        if handler is not None:
            handler(self, event)

    # --- the user's speech ---------------------------------------------------------------------------
    def _speech_start(self, event: Event) -> None:
        vad = self.state.vad
        self.speech_item, self.partial = new_id("item"), ""
        start = event.get("start_sample")
        if isinstance(start, int):  # where the speech starts, less the prefix padding the client asked for
            self.speech_start_ms = max(0.0, ms(start) - vad.speech_pad_ms)
        else:
            fed_ms = self.state.input.fed * 1000 / SPEECH_RATE
            self.speech_start_ms = max(0.0, fed_ms - vad.min_speech_ms - vad.speech_pad_ms)
        if self.responses.current is not None:
            self.responses.current.speech_after = True
        self.state.last_activity = time.monotonic()
        self.emit("input_audio_buffer.speech_started", audio_start_ms=round(self.speech_start_ms),
                  item_id=self.speech_item)

    def _speech_end(self, event: Event) -> None:
        turn = turn_of(event)
        duration = event.get("duration_ms", 0.0)
        item = Item(id=self.speech_item or new_id("item"), type="message", role="user", audio=True,
                    audio_ms=float(duration) if isinstance(duration, int | float) else 0.0)
        self.speech_item = None
        self._remember(self.sent, item.id, self.partial)
        start, end = event.get("start_sample"), event.get("end_sample")
        if isinstance(start, int) and isinstance(end, int):
            end_ms: float = ms(end)
            self._remember(self.spans, item.id, (start, start + round(item.audio_ms * SPEECH_RATE / 1000)))
            self.state.input.committed = max(self.state.input.committed, end)
        else:
            end_ms = self.speech_start_ms + self.state.vad.speech_pad_ms + item.audio_ms
            self.state.input.committed = self.state.input.fed
        self.state.last_activity = time.monotonic()
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=round(end_ms), item_id=item.id)
        for older, prior in list(self.state.user_items.items()):
            if older < turn and prior.transcript is None:  # its turn was dropped: the audio went into this one
                self._forget(older, prior)
        previous = self.state.items.add(item)
        self.state.user_items[turn] = item
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        asyncio.get_running_loop().call_soon(self._check_taken, turn, item)

    def _check_taken(self, turn: int, item: Item) -> None:
        """An utterance the conversation took no turn of (spoken over a reply that plays on): it stays in the
        conversation, transcribed by our ASR, and is the input of the next response."""
        if self.state.conversation.turns >= turn or item.transcript is not None:
            return
        self.state.user_items.pop(turn, None)
        span = self.spans.pop(item.id, None)
        clip = self.state.input.recent(*span) if span is not None else np.zeros(0, dtype=np.float32)
        task = asyncio.get_running_loop().create_task(self._transcribe_aside(item, clip))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _transcribe_aside(self, item: Item, clip: np.ndarray) -> None:
        try:
            text = (await self.state.transcribe(clip)).strip() if clip.size else ""
        except Exception as exc:  # the item stays, without words
            log.warning("realtime_transcribe_failed session=%s error=%s", self.out.session_id, type(exc).__name__)
            text = ""
        if self.state.items.get(item.id) is None:
            return  # deleted meanwhile
        self._words(item, text)
        if text:
            self.state.pending.append(item)

    def _forget(self, turn: int, item: Item) -> None:
        self.state.user_items.pop(turn, None)
        if self.state.items.delete(item.id) is not None:
            self.emit("conversation.item.deleted", item_id=item.id)

    def _transcript(self, event: Event) -> None:
        text = str(event.get("text", ""))
        if not event.get("final"):
            self._partial(text)
            return
        turn = turn_of(event)
        item = self.state.user_items.get(turn)
        if item is not None and turn not in self.state.given_words:
            # Ours beyond OpenAI's fields: the language the turn was heard in, and how sure the ASR is.
            heard = {k: event[k] for k in ("language", "language_probability") if event.get(k) is not None}
            self._words(item, text, heard)
            item.clip = None
            item.current = bool(text)
        resp = self.responses.by_turn.get(turn)
        if resp is not None and not resp.input_text:
            self.state.context.client_text = text  # a response to committed audio: its words are known now
            self.responses.claim(resp, text)
        elif text and resp is None and item is not None and turn not in self.state.given_words:
            if self.state.settings.server_responses:
                self.state.pending.clear()  # text items the client added before this turn are its history now
                resp = self.responses.open(turn, client=False, input_text=text)
                resp.input_audio_ms = item.audio_ms
            else:  # create_response off: the client asks for the response, with this as its input
                item.current = False
                self.state.pending.append(item)

    def _partial(self, text: str) -> None:
        """A pass over the speech so far: the words it adds to what the deltas said (a pass that changed an
        earlier word adds nothing: deltas are never taken back; the final transcript is whole in .completed)."""
        if self.speech_item is None or self.state.settings.transcription is None:
            return
        text = text.rstrip(TRAILING)  # a pass at a pause ends its sentence there; the speech may go on
        if text.startswith(self.partial) and len(text) > len(self.partial):
            delta, self.partial = text[len(self.partial):], text
            self.emit("conversation.item.input_audio_transcription.delta", item_id=self.speech_item,
                      content_index=0, delta=delta)

    def _words(self, item: Item, text: str, heard: dict[str, object] | None = None) -> None:
        """A user audio item's final transcript: the last delta, .completed, and the item done."""
        item.transcript = text
        if self.state.settings.transcription is not None:
            sent = self.sent.pop(item.id, "")
            rest = text[len(sent):] if text.startswith(sent) else ""
            if rest:
                self.emit("conversation.item.input_audio_transcription.delta", item_id=item.id, content_index=0,
                          delta=rest)
            usage = {"type": "duration", "seconds": round(item.audio_ms / 1000, 3)}
            self.emit("conversation.item.input_audio_transcription.completed", item_id=item.id, content_index=0,
                      transcript=text, usage=usage, **(heard or {}))
        if not self.beta:
            self.emit("conversation.item.done", previous_item_id=self.state.items.previous_id(item),
                      item=item.to_json(self.beta))

    @staticmethod
    def _remember(table: dict[str, V], key: str, value: V) -> None:
        table[key] = value
        while len(table) > PARTIALS_KEPT:
            table.pop(next(iter(table)))

    # --- the reply -----------------------------------------------------------------------------------
    def _reply_text(self, event: Event) -> None:
        resp = self.responses.by_turn.get(turn_of(event))
        if resp is not None and not resp.closed:
            self.responses.text(resp, str(event.get("delta", "")))

    def on_reply_audio(self, pcm: np.ndarray) -> None:
        """A chunk of reply audio from the WebSocket sink: a delta of the open response (else dropped)."""
        resp = self.responses.current
        if resp is None or resp.closed or "audio" not in resp.modalities:
            return
        data = self.state.encoder.encode(pcm)
        if data:
            self.responses.audio(resp, data)

    def _reply_audio_start(self, event: Event) -> None:
        resp = self.responses.by_turn.get(turn_of(event))
        if resp is None or resp.closed:
            return
        resp.audio_started = True
        self.responses.message(resp)
        if self.state.webrtc:
            self.emit("output_audio_buffer.started", response_id=resp.id)

    def _turn_metrics(self, event: Event) -> None:
        resp = self.responses.by_turn.get(turn_of(event))
        fields = {k: v for k, v in event.items() if k not in ("type", "t_ms")}
        self.emit(METRICS_EVENT, response_id=resp.id if resp is not None else None, **fields)

    def _reply_done(self, event: Event) -> None:
        resp = self.responses.by_turn.get(turn_of(event))
        if resp is not None:
            self.responses.finish(resp, "completed", None)

    def _interrupted(self, event: Event) -> None:
        if event.get("paused"):
            return  # a held reply (a backchannel check): not an interruption of the response yet
        resp = self.responses.by_turn.get(turn_of(event))
        if resp is None or resp.closed:
            return
        reason = "client_cancelled" if event.get("reason") == "client_cancelled" else "turn_detected"
        self.cleared(resp)
        msg = resp.message
        if msg is not None and msg.audio and not msg.client_cut:  # a cut the client made stands: no second one
            made = self.responses.audio_length(msg)
            heard_ms = min(self.responses.played_ms(resp), made) if made else self.responses.played_ms(resp)
            msg.cut(heard_ms, self._heard_text(resp))
            if self.state.webrtc:  # the server played it: its cut is the truth
                self._announce_cut(msg, int(heard_ms))
            else:
                asyncio.get_running_loop().call_later(CUT_GRACE_S, self._announce_cut, msg, int(heard_ms))
        self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": reason})

    def _turn_dropped(self, event: Event) -> None:
        """The user was not done: the conversation took the turn back, and its words come again, whole, in the next
        turn's item. Its response is cancelled, and its user item deleted, so that the client's conversation is the
        one the model answers from (a reply already heard stays, cut where it was: the client heard it)."""
        turn = turn_of(event)
        resp = self.responses.by_turn.get(turn)
        if resp is not None and not resp.closed:
            self.cleared(resp)
            self.responses.finish(resp, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
        item = self.state.user_items.pop(turn, None)
        if item is None:
            return
        if item in self.state.pending:
            self.state.pending.remove(item)
        if self.state.items.delete(item.id) is not None:
            self.emit("conversation.item.deleted", item_id=item.id)

    def _announce_cut(self, item: Item, end_ms: int) -> None:
        if not item.client_cut and self.state.items.get(item.id) is item:
            self.emit("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end_ms)

    def cleared(self, resp: Response) -> None:
        """WebRTC: the track stops playing the response (once)."""
        if self.state.webrtc and resp.audio_started and not resp.cleared:
            resp.cleared = True
            self.emit("output_audio_buffer.cleared", response_id=resp.id)

    def _heard_text(self, resp: Response) -> str | None:
        """What of the reply was heard, as the conversation's history recorded it at the interruption (the
        runner maps the frames played to the words they carried); None if it did not record this turn."""
        msgs = self.state.conversation.history.messages
        last_user = next((k for k in range(len(msgs) - 1, -1, -1) if msgs[k].role == "user"), None)
        if last_user is None or msgs[last_user].content != resp.input_text:
            return None
        return msgs[last_user + 1].content if last_user + 1 < len(msgs) else ""

    def _error(self, event: Event) -> None:
        turn = turn_of(event) if event.get("turn") is not None else None
        stage, message = str(event.get("stage", "turn")), str(event.get("message", "the reply failed"))
        resp = self.responses.by_turn.get(turn) if turn is not None else None
        item = self.state.user_items.get(turn) if turn is not None else None
        if resp is None and item is not None and item.transcript is None:
            item.transcript = ""
            self.emit("conversation.item.input_audio_transcription.failed", item_id=item.id, content_index=0,
                      error={"type": "server_error", "code": f"{stage}_failed", "message": message})
        self.out.error(message, code=f"{stage}_failed", kind="server_error")
        if resp is not None:
            error = {"type": "server_error", "code": f"{stage}_failed", "message": message}
            self.responses.finish(resp, "failed", {"type": "failed", "error": error})

    def _closed(self, event: Event) -> None:
        if self.responses.current is not None:
            self.responses.finish(self.responses.current, "cancelled",
                                  {"type": "cancelled", "reason": "client_cancelled"})

    # --- the idle timeout ----------------------------------------------------------------------------
    async def watch_idle(self) -> None:
        """``idle_timeout_ms``: nobody spoke that long after the last response (or speech) ended; the silent
        audio is committed as a user item and a response asked for, as the reference does."""
        state = self.state
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            timeout = state.settings.idle_timeout_ms
            now = time.monotonic()
            if (timeout is None or state.conversation.speaking or state.conversation.responding
                    or self.responses.current is not None):
                state.last_activity = now
                continue
            if (now - state.last_activity) * 1000 >= timeout:
                self._idle_timeout(timeout)

    def _idle_timeout(self, timeout_ms: int) -> None:
        state = self.state
        end = state.input.fed
        start = max(state.input.committed, end - timeout_ms * SPEECH_RATE // 1000)
        item = Item(id=new_id("item"), type="message", role="user", audio=True, transcript="",
                    audio_ms=(end - start) * 1000 / SPEECH_RATE)
        state.input.committed = end
        state.last_activity = time.monotonic()
        log.info("realtime_idle_timeout session=%s after_ms=%d", self.out.session_id, timeout_ms)
        self.emit("input_audio_buffer.timeout_triggered", audio_start_ms=ms(start), audio_end_ms=ms(end),
                  item_id=item.id)
        previous = state.items.add(item)
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.beta))
        if not self.beta:
            self.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.beta))
        if state.settings.server_responses:
            req = parse_response(None, state.settings)
            self.responses.start(req, text=no_input_words(state, req.instructions, given=False),
                                 continuation=True)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def no_input_words(state: SessionState, instructions: str, *, given: bool) -> str:
    """The words a responder that reads no conversation (echo, rules) is given for a response with no new input:
    the response's own instructions, else the user's latest words, else the session's instructions."""
    if given and instructions:
        return instructions
    last = next((i.words() for i in reversed(state.items.items) if i.role == "user" and i.words()), None)
    return last or instructions or CONTINUE


PIPELINE: dict[str, Callable[[ConversationEvents, Event], None]] = {
    "speech_start": ConversationEvents._speech_start,
    "speech_end": ConversationEvents._speech_end,
    "transcript": ConversationEvents._transcript,
    "reply_text": ConversationEvents._reply_text,
    "reply_audio_start": ConversationEvents._reply_audio_start,
    "turn_metrics": ConversationEvents._turn_metrics,
    "reply_done": ConversationEvents._reply_done,
    "interrupted": ConversationEvents._interrupted,
    "turn_dropped": ConversationEvents._turn_dropped,
    "error": ConversationEvents._error,
    "close": ConversationEvents._closed,
}
