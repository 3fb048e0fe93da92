"""The Realtime conversation: its items (messages, function calls and their outputs) in order, as the
reference keeps them, and the history the responder is given from them.

The items are the session's memory: ``conversation.item.create`` adds to it, ``.delete`` and ``.truncate``
change it, and every reply is written from it (so a deleted item is forgotten, and a reply cut by a barge-in
is remembered only as far as it was heard). The oldest items go once ``realtime.max_items`` is reached.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from assistant.audio import SPEECH_RATE
from assistant.pipeline.reply import played_text
from assistant.respond.base import Message, ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(12)}"


@dataclass
class Item:
    """One conversation item. Messages carry one content part (text, or audio with its transcript)."""

    id: str
    type: str  # "message", "function_call", "function_call_output"
    role: str | None = None  # messages: "user", "assistant", "system"
    status: str = "completed"  # "completed", "in_progress", "incomplete"
    text: str | None = None  # input_text / output_text content
    transcript: str | None = None  # audio content: what was said (None: not transcribed yet)
    audio: bool = False  # an audio part (input_audio / output_audio)
    clip: np.ndarray | None = field(default=None, repr=False)  # a user audio item's 16 kHz audio (until answered)
    audio_ms: float = 0.0  # its audio's length now (assistant: made so far, less what a truncation cut off)
    made_ms: float = 0.0  # assistant audio the client was given (a truncation is clamped to it)
    spoken: str | None = None  # an assistant item's whole transcript, before any truncation
    client_cut: bool = False  # the client truncated it: its cut stands (the server does not cut again)
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    current: bool = False  # the input or output of the response in progress: not history yet

    def words(self) -> str | None:
        """What the item says, for the history (None: nothing to say)."""
        return self.transcript if self.audio else self.text

    def cut(self, end_ms: float, heard: str | None = None) -> None:
        """Truncate an assistant item's audio at ``end_ms`` (within what was made): its transcript keeps only what
        that audio said (``heard``, when the conversation knows it; else the share of the whole reply's words the
        audio kept, so a later cut can give back what an earlier one took)."""
        made = max(self.made_ms, self.audio_ms)
        if self.spoken is None:
            self.spoken = self.transcript or ""
        end = min(float(end_ms), made) if made else float(end_ms)
        if heard is None:
            heard = played_text([(0, self.spoken)], max(1, int(made)), int(end)) if made else ""
        self.transcript = heard
        self.audio_ms = end

    def to_json(self, beta: bool = False) -> dict[str, object]:
        out: dict[str, object] = {"id": self.id, "object": "realtime.item", "type": self.type}
        if self.type == "message":
            out.update(status=self.status, role=self.role, content=[self._part(beta)])
        elif self.type == "function_call":
            out.update(status=self.status, call_id=self.call_id, name=self.name, arguments=self.arguments)
        else:
            out.update(call_id=self.call_id, output=self.output)
        return out

    def _part(self, beta: bool) -> dict[str, object]:
        if self.role == "assistant":
            if self.audio:
                return {"type": "audio" if beta else "output_audio", "transcript": self.transcript}
            return {"type": "text" if beta else "output_text", "text": self.text}
        if self.audio:
            return {"type": "input_audio", "transcript": self.transcript}
        return {"type": "input_text", "text": self.text}


class ItemError(ValueError):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class Items:
    """The items in conversation order, bounded: past ``max_items`` the oldest finished item goes, and
    ``on_evict`` hears of it (the client is told it was deleted)."""

    def __init__(self, max_items: int, on_evict: Callable[[Item], None] = lambda item: None) -> None:
        self.max_items = max_items
        self.on_evict = on_evict
        self.items: list[Item] = []

    def get(self, item_id: object) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def add(self, item: Item, after: str | None = None) -> str | None:
        """Insert ``item`` after the item ``after`` (``"root"``: first; None: last); returns the previous item's id."""
        if self.get(item.id) is not None:
            raise ItemError(f"Error adding item: the item with id '{item.id}' already exists.", "item.id",
                            "item_create_duplicate_item_id")
        if after is None:
            index = len(self.items)
        elif after == "root":
            index = 0
        else:
            found = next((k for k, i in enumerate(self.items) if i.id == after), None)
            if found is None:
                raise ItemError(f"Error adding item: the previous item with id '{after[:64]}' does not exist.",
                                "previous_item_id", "item_create_invalid_previous_item_id")
            index = found + 1
        self.items.insert(index, item)
        while len(self.items) > self.max_items:
            old = next((i for i in self.items if not i.current and i is not item), None)
            if old is None:
                break
            self.items.remove(old)
            self.on_evict(old)
        at = self.items.index(item)
        return self.items[at - 1].id if at > 0 else None

    def delete(self, item_id: str) -> Item | None:
        item = self.get(item_id)
        if item is not None:
            self.items.remove(item)
        return item

    def previous_id(self, item: Item) -> str | None:
        at = self.items.index(item) if item in self.items else len(self.items)
        return self.items[at - 1].id if at > 0 else None

    def history(self, tools: bool) -> list[Message]:
        """The conversation so far as messages, oldest first, without the response in progress and without
        audio nobody transcribed; function calls and outputs only for a responder that takes ``tools``."""
        return history_of([i for i in self.items if not i.current], tools)


def history_of(items: list[Item], tools: bool) -> list[Message]:
    """Items as the responder's messages (see :meth:`Items.history`)."""
    out: list[Message] = []
    for item in items:
        if item.type == "message":
            words = item.words()
            if words and item.role in ("user", "assistant", "system"):
                out.append(Message(item.role, words))  # type: ignore[arg-type]
        elif tools and item.type == "function_call":
            out.append(Message("assistant", "", tool_calls=(ToolCall(item.call_id, item.name, item.arguments),)))
        elif tools and item.type == "function_call_output":
            out.append(Message("tool", item.output, call_id=item.call_id))
    return out


def parse_item(raw: object, decode_audio: Callable[[object, str], np.ndarray], max_clip_s: float) -> Item:
    """A ``conversation.item.create`` item → :class:`Item` (user audio decoded by ``decode_audio(value, param)``)."""
    if not isinstance(raw, dict):
        raise ItemError("'item' must be an object", "item")
    kind = raw.get("type", "message")
    item_id = raw.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not re.fullmatch(r"[\w.-]{1,64}", item_id)):
        raise ItemError("'item.id' must be up to 64 letters, digits, '_', '-' or '.'", "item.id")
    item = Item(id=item_id or new_id("item"), type=kind)
    if kind == "function_call_output":
        call_id, output = raw.get("call_id"), raw.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            raise ItemError("a function_call_output needs 'call_id' and 'output' strings", "item")
        item.call_id, item.output = call_id, output
        return item
    if kind == "function_call":
        call_id, name, arguments = raw.get("call_id"), raw.get("name"), raw.get("arguments", "")
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
            raise ItemError("a function_call needs 'call_id', 'name' and 'arguments' strings", "item")
        item.call_id, item.name, item.arguments = call_id, name, arguments
        return item
    if kind != "message":
        raise ItemError(f"Invalid value: {kind!r}. Supported values are: 'message', 'function_call', "
                        "'function_call_output'.", "item.type")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise ItemError(f"Invalid value: {role!r}. Supported values are: 'user', 'assistant', 'system'.", "item.role")
    item.role = role
    content = raw.get("content")
    if not isinstance(content, list) or not content:
        raise ItemError("'item.content' must be a non-empty list", "item.content")
    texts: list[str] = []
    clips: list[np.ndarray] = []
    for k, part in enumerate(content):
        p = f"item.content[{k}]"
        if not isinstance(part, dict):
            raise ItemError("a content part is an object", p)
        ptype = part.get("type")
        allowed = {"user": ("input_text", "input_audio"), "system": ("input_text", "text"),
                   "assistant": ("output_text", "text", "output_audio", "audio")}[role]
        if ptype not in allowed:
            raise ItemError(f"Invalid value: {ptype!r}. A {role} message takes {', '.join(allowed)}.", f"{p}.type")
        if ptype == "input_audio":
            clip = decode_audio(part.get("audio"), f"{p}.audio")
            if clip.size > max_clip_s * SPEECH_RATE:
                raise ItemError(f"an audio part holds at most {max_clip_s:g} s", f"{p}.audio", "too_large")
            clips.append(clip)
            continue
        words = part.get("transcript") if ptype in ("output_audio", "audio") else part.get("text")
        if not isinstance(words, str):
            raise ItemError("a text part needs a 'text' string (audio parts of assistant messages a "
                            "'transcript')", p)
        texts.append(words)
    if clips:
        if texts:
            raise ItemError("a message mixes text and audio parts; send them as two items", "item.content")
        item.audio = True
        item.clip = np.concatenate(clips)
        item.audio_ms = item.clip.size * 1000 / SPEECH_RATE
    elif role == "assistant" and content[0].get("type") in ("output_audio", "audio"):
        item.audio, item.transcript = True, " ".join(texts)
    else:
        item.text = " ".join(texts)
    return item

