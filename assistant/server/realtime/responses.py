"""The responses of one Realtime session: each one's lifecycle events, in the reference's order.

A response belongs to one turn of the conversation. It opens when the turn has words (or the client asks with
``response.create``), gets its assistant message on the first words or audio, its function calls as the
responder writes them (``response.function_call_arguments.delta`` as the arguments come), and closes with the
closing events and ``response.done`` (completed, cancelled or failed), whose ``usage`` is always an object: the
responder's own token counts where it gave them, estimates otherwise. An out-of-band response
(``conversation: "none"``) sends the same events but leaves the conversation as it was.

It reads and writes the session's shared state (``state.py``) and sends through its :class:`Outgoing`; this
module keeps which response is open and which turn each recent one belongs to.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from assistant.respond.base import Message, ToolCall, ToolCallDelta
from assistant.server.realtime.items import Item, new_id
from assistant.server.realtime.responder import Reply, ToolEvent
from assistant.server.realtime.settings import ResponseRequest
from assistant.server.realtime.state import Outgoing, SessionState

log = logging.getLogger(__name__)

TURNS_KEPT = 16  # turns whose late events (an interruption, a metrics event) still find their response
WATCH_S = 0.05  # how often an open response checks that its turn is still running
CONTINUE = "(continue)"  # the words of a turn that has none: the model goes on from the conversation
# Token estimates where the responder gives no count: text by OpenAI's rule of thumb (about four characters a
# token), audio by the reference's rates (about 10 tokens a second of input audio, 20 of output audio).
CHARS_PER_TOKEN = 4
INPUT_AUDIO_TOKENS_PER_S = 10
OUTPUT_AUDIO_TOKENS_PER_S = 20


def text_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclass
class Response:
    """One response: the turn it belongs to, what it said, and how far its events have gone."""

    id: str
    turn: int
    input_text: str = ""
    metadata: dict[str, str] | None = None
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
    out_of_band: bool = False  # conversation "none": nothing of it enters the conversation
    inputs: list[Item] = field(default_factory=list)  # the user items it answers (response.create)
    input_audio_ms: float = 0.0  # the user's audio it answers (for the usage estimate)
    calls: dict[str, Item] = field(default_factory=dict)  # its function calls by call id
    reply: Reply | None = None  # the responder's reply it claimed
    cleared: bool = False  # output_audio_buffer.cleared was sent for it
    closed: bool = False
    usage: dict[str, object] | None = None  # set when it is done

    def index(self, item: Item) -> int:
        return self.output.index(item)

    def to_json(self, status: str, details: dict[str, object] | None, beta: bool,
                output_format: str | dict[str, object], voice: str) -> dict[str, object]:
        out: dict[str, object] = {
            "object": "realtime.response", "id": self.id, "status": status, "status_details": details,
            "output": [i.to_json(beta) for i in self.output],
            "conversation_id": None if self.out_of_band else "conv_default",
            "usage": self.usage, "metadata": self.metadata,
        }
        if beta:
            out.update(modalities=self.modalities, voice=voice, output_audio_format=output_format)
        else:
            out.update(output_modalities=self.modalities, max_output_tokens="inf",
                       audio={"output": {"format": output_format, "voice": voice}})
        return out


class Responses:
    """Which response is open, the recent ones by turn, and the events that open and close them."""

    def __init__(self, state: SessionState, out: Outgoing) -> None:
        self.state = state
        self.out = out
        self.current: Response | None = None
        self.last: Response | None = None
        self.by_turn: dict[int, Response] = {}
        self.watcher: asyncio.Task[None] | None = None

    def emit(self, kind: str, **fields: object) -> None:
        self.out.emit(kind, **fields)

    # --- opening -------------------------------------------------------------------------------------
    def start(self, req: ResponseRequest, *, text: str | None = None, audio: np.ndarray | None = None,
              inputs: list[Item] | None = None, continuation: bool = False,
              only: Callable[[bool], list[Message]] | None = None, input_audio_ms: float = 0.0) -> Response:
        """A response the client asked for (or the idle timeout): its context set, its turn started now, on the
        words ``text`` or the audio ``audio`` (transcribed first), or on nothing new (``continuation``)."""
        ctx, conversation = self.state.context, self.state.conversation
        ctx.instructions, ctx.tools, ctx.tool_choice = req.instructions, req.tools, req.tool_choice
        ctx.max_tokens, ctx.temperature = req.max_output_tokens, req.temperature
        ctx.continuation, ctx.only = continuation, only
        ctx.client_text = (text or CONTINUE) if audio is None else None
        for item in inputs or []:
            item.current = True
        if audio is not None:
            conversation.respond_to(audio=audio)
            words = ""  # known once transcribed (the turn's transcript event)
        else:
            words = text or CONTINUE
            conversation.respond_to(text=words)
        resp = self.open(conversation.turns, client=True, input_text=words, req=req)
        resp.inputs = list(inputs or [])
        resp.input_audio_ms = input_audio_ms
        return resp

    def open(self, turn: int, *, client: bool, input_text: str, req: ResponseRequest | None = None) -> Response:
        if self.current is not None:
            self.finish(self.current, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
        settings = self.state.settings
        resp = Response(id=new_id("resp"), turn=turn, input_text=input_text, client=client,
                        modalities=list(req.modalities if req is not None else settings.output_modalities),
                        frames_base=self.state.sink.audible_frames_sent)
        if req is not None:
            resp.metadata, resp.out_of_band = req.metadata, req.out_of_band
        self.current = self.last = self.by_turn[turn] = resp
        for old in [t for t in self.by_turn if t < turn - TURNS_KEPT]:  # bounded: only recent turns get events
            self.by_turn.pop(old)
        for old in [t for t in self.state.user_items if t < turn - TURNS_KEPT]:
            self.state.user_items.pop(old)
        self.state.given_words = {t for t in self.state.given_words if t >= turn - TURNS_KEPT}
        if not client:
            self.state.session_context()
        self.emit("response.created", response=self._json(resp, "in_progress", None))
        self.emit("rate_limits.updated", rate_limits=self.state.rate_limits())
        if input_text:
            self.claim(resp, input_text)
        self.watcher = asyncio.get_running_loop().create_task(self._watch(resp), name=f"rt-watch-{turn}")
        return resp

    def claim(self, resp: Response, text: str) -> None:
        """The responder's reply to ``text`` is this response's: its tool calls come here."""
        resp.input_text = text
        resp.reply = self.state.context.claim(text, lambda event: self._tool_event(resp, event))

    async def _watch(self, resp: Response) -> None:
        """Close a response whose turn ended without a reply heard (no words, only tool calls, or dropped)."""
        quiet = 0
        while not resp.closed:
            await asyncio.sleep(WATCH_S)
            quiet = quiet + 1 if not self.state.conversation.responding else 0
            if quiet >= 2 and not resp.closed:
                if resp.speech_after and not resp.transcript:
                    self.finish(resp, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
                else:
                    self.finish(resp, "completed", None)

    # --- its output ----------------------------------------------------------------------------------
    def message(self, resp: Response) -> Item:
        """The response's assistant message: added to the output (and the conversation) on first use."""
        beta = self.out.beta
        if resp.message is None:
            audio = "audio" in resp.modalities
            item = Item(id=new_id("item"), type="message", role="assistant", status="in_progress", audio=audio,
                        transcript="" if audio else None, text=None if audio else "", current=True)
            resp.message = item
            resp.output.append(item)
            self.emit("response.output_item.added", response_id=resp.id, output_index=resp.index(item),
                      item=item.to_json(beta))
            if not resp.out_of_band:
                previous = self.state.items.add(item)
                self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(beta))
        if not resp.part_open:
            resp.part_open = True
            part = {"type": "audio", "transcript": ""} if resp.message.audio else {"type": "text", "text": ""}
            self.emit("response.content_part.added", response_id=resp.id, item_id=resp.message.id,
                      output_index=resp.index(resp.message), content_index=0, part=part)
        return resp.message

    def text(self, resp: Response, delta: str) -> None:
        """Words of the reply, as the responder writes them."""
        msg = self.message(resp)
        resp.transcript += delta
        if msg.audio:
            msg.spoken = resp.transcript
            if not msg.client_cut:  # a cut the client made stands
                msg.transcript = resp.transcript
        else:
            msg.text = resp.transcript
        kind = "response.output_audio_transcript.delta" if msg.audio else "response.output_text.delta"
        self.emit(kind, response_id=resp.id, item_id=msg.id, output_index=resp.index(msg), content_index=0,
                  delta=delta)

    def audio(self, resp: Response, data: bytes) -> None:
        """Reply audio in the session's output format (WebSocket)."""
        msg = self.message(resp)
        resp.audio_bytes += len(data)
        msg.made_ms = self.state.settings.output_format.duration_ms(resp.audio_bytes)
        if not msg.client_cut:
            msg.audio_ms = msg.made_ms
        self.emit("response.output_audio.delta", response_id=resp.id, item_id=msg.id, output_index=resp.index(msg),
                  content_index=0, delta=base64.b64encode(data).decode("ascii"))

    def played_ms(self, resp: Response) -> float:
        """Reply audio the listener has heard so far (the sink's count since the response began)."""
        return max(0, (self.state.sink.audible_frames_sent - resp.frames_base) * 20)

    def audio_length(self, item: Item) -> float:
        """The audio an assistant item holds now: over WebRTC, while its response plays, what was played."""
        resp = self.current
        if self.state.webrtc and resp is not None and resp.message is item and not item.client_cut:
            item.made_ms = max(item.made_ms, self.played_ms(resp))
        return max(item.made_ms, item.audio_ms)

    def _tool_event(self, resp: Response, event: ToolEvent) -> None:
        """A piece of a function call, or the whole call, from the responder's reply."""
        if resp.closed:
            return
        beta = self.out.beta
        item = resp.calls.get(event.call_id)
        if item is None:
            item = Item(id=new_id("item"), type="function_call", status="in_progress", call_id=event.call_id,
                        name=event.name, current=not resp.out_of_band)
            resp.calls[event.call_id] = item
            resp.output.append(item)
            self.emit("response.output_item.added", response_id=resp.id, output_index=resp.index(item),
                      item=item.to_json(beta))
            if not resp.out_of_band:
                previous = self.state.items.add(item)
                self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(beta))
        ids = {"response_id": resp.id, "item_id": item.id, "output_index": resp.index(item), "call_id": item.call_id}
        if isinstance(event, ToolCallDelta):
            if event.arguments:
                item.arguments += event.arguments
                self.emit("response.function_call_arguments.delta", delta=event.arguments, **ids)
            return
        assert isinstance(event, ToolCall)
        if event.arguments != item.arguments:  # pieces missed (a responder that streams none): the rest now
            rest = event.arguments[len(item.arguments):] if event.arguments.startswith(item.arguments) else ""
            if rest:
                self.emit("response.function_call_arguments.delta", delta=rest, **ids)
            item.arguments = event.arguments
        item.status = "completed"
        self.emit("response.function_call_arguments.done", name=item.name, arguments=item.arguments, **ids)
        self._item_done(resp, item)

    def _item_done(self, resp: Response, item: Item) -> None:
        item.current = False
        beta = self.out.beta
        self.emit("response.output_item.done", response_id=resp.id, output_index=resp.index(item),
                  item=item.to_json(beta))
        if not resp.out_of_band and not beta:
            self.emit("conversation.item.done", previous_item_id=self.state.items.previous_id(item),
                      item=item.to_json(beta))

    # --- closing -------------------------------------------------------------------------------------
    def finish(self, resp: Response, status: str, details: dict[str, object] | None) -> None:
        """The closing events of a response, in the reference's order, then ``response.done``."""
        if resp.closed:
            return
        resp.closed = True
        msg = resp.message
        if msg is not None and msg.audio and not resp.audio_bytes and status == "completed" and not msg.client_cut:
            msg.audio_ms = msg.made_ms = self.played_ms(resp)  # WebRTC: what the track played
        self._flush_audio(resp, status)
        if msg is not None:
            ids = {"response_id": resp.id, "output_index": resp.index(msg)}
            if resp.part_open:
                if msg.audio:
                    if "audio" in resp.modalities:
                        self.emit("response.output_audio.done", item_id=msg.id, content_index=0, **ids)
                    self.emit("response.output_audio_transcript.done", item_id=msg.id, content_index=0,
                              transcript=msg.transcript or "", **ids)
                    part: dict[str, object] = {"type": "audio", "transcript": msg.transcript or ""}
                else:
                    self.emit("response.output_text.done", item_id=msg.id, content_index=0, text=msg.text or "",
                              **ids)
                    part = {"type": "text", "text": msg.text or ""}
                self.emit("response.content_part.done", item_id=msg.id, content_index=0, part=part, **ids)
            msg.status = "completed" if status == "completed" else "incomplete"
            self._item_done(resp, msg)
        for call in resp.calls.values():
            if call.status == "in_progress":  # cut before the model finished writing it: not to be run
                call.status = "incomplete"
                self._item_done(resp, call)
        for item in resp.inputs:
            item.current = False
        user = self.state.user_items.get(resp.turn)
        if user is not None:
            user.current = False
        resp.usage = self._usage(resp)
        self.emit("response.done", response=self._json(resp, status, details))
        if self.state.webrtc and status == "completed" and resp.audio_started:
            self.emit("output_audio_buffer.stopped", response_id=resp.id)
        self.state.last_activity = time.monotonic()
        if self.current is resp:
            self.current = None
            self.state.session_context()
        log.info("realtime_response session=%s turn=%d status=%s chars=%d audio_bytes=%d calls=%d",
                 self.out.session_id, resp.turn, status, len(resp.transcript), resp.audio_bytes, len(resp.calls))

    def _flush_audio(self, resp: Response, status: str) -> None:
        """The end of a reply's audio: what the output resampler holds goes out (completed) or is dropped, so the
        next reply starts clean."""
        encoder = self.state.encoder
        if self.state.webrtc or not resp.audio_bytes:
            encoder.reset()
            return
        tail = encoder.flush() if status == "completed" else b""
        if status != "completed":
            encoder.reset()
        if tail and resp.message is not None and "audio" in resp.modalities:
            self.audio(resp, tail)

    def _usage(self, resp: Response) -> dict[str, object]:
        """What the response cost in tokens: the responder's count where it gave one, estimates otherwise; audio
        tokens from the durations heard and spoken."""
        reply = resp.reply or self.state.context.reply_to(resp.input_text)
        counted = reply.usage if reply is not None else None
        out_chars = len(resp.transcript) + sum(len(c.arguments) + len(c.name) for c in resp.calls.values())
        in_text = counted.input_tokens if counted is not None else text_tokens(
            reply.prompt_chars if reply is not None else len(resp.input_text))
        out_text = counted.output_tokens if counted is not None else text_tokens(out_chars)
        msg = resp.message
        spoken_ms = (msg.audio_ms if msg is not None and msg.audio else 0.0)
        in_audio = round(resp.input_audio_ms / 1000 * INPUT_AUDIO_TOKENS_PER_S)
        out_audio = round(spoken_ms / 1000 * OUTPUT_AUDIO_TOKENS_PER_S)
        return {
            "object": "realtime.response.usage",
            "total_tokens": in_text + in_audio + out_text + out_audio,
            "input_tokens": in_text + in_audio,
            "output_tokens": out_text + out_audio,
            "input_token_details": {"text_tokens": in_text, "audio_tokens": in_audio, "image_tokens": 0,
                                    "cached_tokens": 0,
                                    "cached_tokens_details": {"text_tokens": 0, "audio_tokens": 0, "image_tokens": 0}},
            "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio},
        }

    def _json(self, resp: Response, status: str, details: dict[str, object] | None) -> dict[str, object]:
        beta = self.out.beta
        return resp.to_json(status, details, beta, self.state.out_format(beta), self.state.settings.voice)

    async def close(self) -> None:
        if self.watcher is not None and not self.watcher.done():
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.watcher
