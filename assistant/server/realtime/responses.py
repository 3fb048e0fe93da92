"""The responses of one Realtime session: each one's lifecycle events, in the reference's order.

A response belongs to one turn of the conversation. It opens when the turn has words (or the client asks with
``response.create``), gets its assistant message on the first words or audio, and closes with the closing events
and ``response.done`` (completed, cancelled or failed); function calls the responder made are output items of it.
It reads and writes the session's shared state (``state.py``) and sends through its :class:`Outgoing`; this
module keeps which response is open and which turn each recent one belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from assistant.server.realtime.items import Item, new_id
from assistant.server.realtime.state import Outgoing, SessionState

log = logging.getLogger(__name__)

TURNS_KEPT = 16  # turns whose late events (an interruption, a metrics event) still find their response
WATCH_S = 0.05  # how often an open response checks that its turn is still running


@dataclass
class Response:
    """One response: the turn it belongs to, what it said, and how far its events have gone."""

    id: str
    turn: int
    input_text: str = ""
    metadata: object = None
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

    def to_json(self, status: str, details: dict[str, object] | None, beta: bool,
                output_format: str | dict[str, object], voice: str) -> dict[str, object]:
        out: dict[str, object] = {
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


class Responses:
    """Which response is open, the recent ones by turn, and the events that open and close them."""

    def __init__(self, state: SessionState, out: Outgoing) -> None:
        self.state = state
        self.out = out
        self.current: Response | None = None
        self.by_turn: dict[int, Response] = {}
        self.watcher: asyncio.Task[None] | None = None

    def emit(self, kind: str, **fields: object) -> None:
        self.out.emit(kind, **fields)

    def open(self, turn: int, *, client: bool, input_text: str) -> Response:
        if self.current is not None:
            self.finish(self.current, "cancelled", {"type": "cancelled", "reason": "turn_detected"})
        resp = Response(id=new_id("resp"), turn=turn, input_text=input_text, client=client,
                        modalities=list(self.state.settings.output_modalities),
                        frames_base=self.state.sink.audible_frames_sent)
        self.current = self.by_turn[turn] = resp
        for old in [t for t in self.by_turn if t < turn - TURNS_KEPT]:  # bounded: only recent turns get events
            self.by_turn.pop(old)
        for old in [t for t in self.state.user_items if t < turn - TURNS_KEPT]:
            self.state.user_items.pop(old)
        self.state.given_words = {t for t in self.state.given_words if t >= turn - TURNS_KEPT}
        if not client:
            self.state.session_context()
        self.emit("response.created", response=self._json(resp, "in_progress", None))
        self.watcher = asyncio.get_running_loop().create_task(self._watch(resp), name=f"rt-watch-{turn}")
        return resp

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

    def message(self, resp: Response) -> Item:
        """The response's assistant message: added to the output and the conversation on first use."""
        if resp.message is None:
            audio = "audio" in resp.modalities
            item = Item(id=new_id("item"), type="message", role="assistant", status="in_progress", audio=audio,
                        transcript="" if audio else None, text=None if audio else "", current=True)
            resp.message = item
            resp.output.append(item)
            previous = self.state.items.add(item)
            self.emit("response.output_item.added", response_id=resp.id, output_index=0,
                      item=item.to_json(self.out.beta))
            self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.out.beta))
        if not resp.part_open:
            resp.part_open = True
            part = {"type": "audio", "transcript": ""} if resp.message.audio else {"type": "text", "text": ""}
            self.emit("response.content_part.added", response_id=resp.id, item_id=resp.message.id, output_index=0,
                      content_index=0, part=part)
        return resp.message

    def finish(self, resp: Response, status: str, details: dict[str, object] | None) -> None:
        """The closing events of a response, in the reference's order, then ``response.done``."""
        if resp.closed:
            return
        resp.closed = True
        msg = resp.message
        ids = {"response_id": resp.id, "output_index": 0}
        if msg is not None and msg.audio and not resp.audio_bytes and status == "completed":
            msg.audio_ms = max(0, (self.state.sink.audible_frames_sent - resp.frames_base) * 20)  # WebRTC: all played
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
            self.emit("response.output_item.done", response_id=resp.id, output_index=0,
                      item=msg.to_json(self.out.beta))
            if not self.out.beta:
                self.emit("conversation.item.done", previous_item_id=self.state.items.previous_id(msg),
                          item=msg.to_json(self.out.beta))
        if status != "failed":
            for call in self.state.context.take_calls(resp.input_text):
                self._function_call(resp, call.call_id, call.name, call.arguments)
        for item in resp.inputs:
            item.current = False
        user = self.state.user_items.get(resp.turn)
        if user is not None:
            user.current = False
        self.emit("response.done", response=self._json(resp, status, details))
        if self.state.webrtc and status == "completed" and resp.audio_started:
            self.emit("output_audio_buffer.stopped", response_id=resp.id)
        if self.current is resp:
            self.current = None
            self.state.session_context()
        log.info("realtime_response session=%s turn=%d status=%s chars=%d audio_bytes=%d", self.out.session_id,
                 resp.turn, status, len(resp.transcript), resp.audio_bytes)

    def _function_call(self, resp: Response, call_id: str, name: str, arguments: str) -> None:
        item = Item(id=new_id("item"), type="function_call", status="in_progress", call_id=call_id, name=name)
        index = len(resp.output)
        resp.output.append(item)
        previous = self.state.items.add(item)
        ids = {"response_id": resp.id, "output_index": index}
        self.emit("response.output_item.added", item=item.to_json(self.out.beta), **ids)
        self.emit("conversation.item.added", previous_item_id=previous, item=item.to_json(self.out.beta))
        self.emit("response.function_call_arguments.delta", item_id=item.id, call_id=call_id, delta=arguments, **ids)
        item.arguments, item.status = arguments, "completed"
        self.emit("response.function_call_arguments.done", item_id=item.id, call_id=call_id, name=name,
                  arguments=arguments, **ids)
        self.emit("response.output_item.done", item=item.to_json(self.out.beta), **ids)
        if not self.out.beta:
            self.emit("conversation.item.done", previous_item_id=previous, item=item.to_json(self.out.beta))

    def _json(self, resp: Response, status: str, details: dict[str, object] | None) -> dict[str, object]:
        beta = self.out.beta
        return resp.to_json(status, details, beta, self.state.out_format(beta), self.state.settings.voice)

    async def close(self) -> None:
        if self.watcher is not None and not self.watcher.done():
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.watcher
