"""The ``events`` data channel: JSON messages telling the page what happens in the conversation.

Types (DESIGN.md): speech_start, speech_end, transcript (partial/final, with the ``language`` heard and, from the
ASR, its ``language_probability``), reply_text (once the turn is confirmed, as its audio), reply_audio_start,
reply_done, interrupted (``paused`` when the reply is only held while the user makes a sound over it),
reply_resumed (that sound was a backchannel: the reply goes on), turn_dropped (the user was not done: a committed
turn is taken back, ``heard`` says whether its reply had begun to play; its words are not in the conversation and
come again, whole, in the next turn), turn_metrics, voice_fallback (no voice speaks the reply's language: the
default one reads it), responder_fallback (the responder's engine is down, restarting or failed for good: another
responder answers this turn, and ``reason`` says why), timer (a timer, reminder or alarm of this call was ``set``,
``cancelled`` or is ``done``: ``timer`` is the one, ``timers`` every one still running, each ``{id, kind, label,
seconds, due_ms}``), responder (which model answers now and why: sent when a better model is swapped in during the
call), dtmf (a key pressed on a phone: ``digit``; the keys of one entry then reach the responder as a turn), error;
plus session (sent once on open, and again when the session's settings change) and close.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset(
    {
        "session",
        "speech_start",
        "speech_end",
        "transcript",
        "reply_text",
        "reply_audio_start",
        "reply_done",
        "interrupted",
        "reply_resumed",
        "turn_dropped",
        "turn_metrics",
        "voice_fallback",
        "responder_fallback",
        "timer",
        "responder",
        "dtmf",
        "error",
        "close",
    }
)
# Events kept while the data channel is not open yet; older ones are dropped first.
MAX_PENDING_EVENTS = 256


Event = dict[str, object]  # one event: {"type": kind, "t_ms": ..., fields...}, sent as JSON


class DataChannel(Protocol):
    """An RTC data channel (aiortc's ``RTCDataChannel``) as the events need it: its label and state, ``send``,
    and listeners (``open``; ``message``, called with a str or bytes)."""

    @property
    def label(self) -> str: ...

    @property
    def readyState(self) -> str: ...

    def send(self, data: str) -> None: ...

    def add_listener(self, event: str, f: Callable[..., None]) -> object: ...


def make_event(kind: str, **fields: object) -> Event:
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown event type {kind!r}")
    return {"type": kind, "t_ms": round(time.time() * 1000.0, 1), **fields}


class EventChannel:
    """Sends events on an RTC data channel once it is open; buffers (bounded) before that.

    Listeners (tests, metrics) can subscribe to every event regardless of the channel.
    """

    def __init__(self) -> None:
        self._channel: DataChannel | None = None
        self._pending: deque[str] = deque(maxlen=MAX_PENDING_EVENTS)
        self._listeners: list[Callable[[Event], None]] = []

    def attach(self, channel: DataChannel) -> None:
        self._channel = channel
        channel.add_listener("open", self._drain)
        if channel.readyState == "open":
            self._drain()

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``fn`` with every later event; returns what unsubscribes it."""
        self._listeners.append(fn)

        def unsubscribe() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)

        return unsubscribe

    def emit(self, kind: str, **fields: object) -> Event:
        event = make_event(kind, **fields)
        for fn in list(self._listeners):
            try:
                fn(event)
            except Exception:  # a listener must never break the conversation
                log.exception("event_listener_failed type=%s", kind)
        self._send(json.dumps(event, ensure_ascii=False))
        return event

    def _send(self, text: str) -> None:
        ch = self._channel
        if ch is not None and ch.readyState == "open":
            try:
                ch.send(text)
            except Exception as exc:  # closed under our feet: the session is going away
                log.debug("event_send_failed error=%s", exc)
        else:
            self._pending.append(text)

    def _drain(self) -> None:
        while self._pending and self._channel is not None and self._channel.readyState == "open":
            self._channel.send(self._pending.popleft())
