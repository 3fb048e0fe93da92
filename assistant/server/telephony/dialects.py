"""The carriers' media-stream JSON, read into one set of events and written from one set of calls.

Both carriers open a WebSocket to us and speak the same conversation in different words: a ``connected``, one
``start`` (the call, the audio format, the parameters our webhook answer gave the stream), ``media`` every 20 ms
(base64 μ-law at 8 kHz), ``mark`` when audio we sent before a mark has been played (or dropped by a ``clear``),
``dtmf``, and a ``stop``. We send ``media``, ``mark`` and ``clear``.

- **Twilio Media Streams** (``<Connect><Stream>``, bidirectional): camelCase (``streamSid``, ``callSid``,
  ``mediaFormat``, ``customParameters``, ``sequenceNumber``); the format is ``audio/x-mulaw``, 8000 Hz, 1 channel;
  what we send names the ``streamSid``.
- **Telnyx media streaming** (TeXML ``<Connect><Stream bidirectionalMode="rtp">``): snake_case (``stream_id``,
  ``call_control_id``, ``media_format``, ``custom_parameters``, ``sequence_number``); the format is ``PCMU``,
  8000 Hz; it may also send an ``error`` frame; what we send names no stream.

Everything a carrier sends is checked here for shape, type and size before anything reads it: a message that is
not what the dialect says raises :class:`ProtocolError`, and the call is closed with that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

MAX_ID_CHARS = 128  # stream and call ids (Twilio's are 34 characters, Telnyx's call control ids about 60)
MAX_NAME_CHARS = 64  # mark names (ours are short) and DTMF digits
MAX_PARAMETERS = 16  # custom parameters of a stream (our answer sets one)
MAX_PARAMETER_CHARS = 256
TOKEN_PARAMETER = "token"  # the stream parameter that carries the call's media token
TELEPHONE_RATE = 8_000
DTMF_DIGIT = re.compile(r"[0-9*#A-Da-d]")


class ProtocolError(ValueError):
    """A carrier message that does not fit its dialect; ``reason`` is the close reason in the log."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# --- the events, whatever the carrier ---------------------------------------------------------------------
@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class Start:
    stream_id: str
    call_id: str
    encoding: str
    sample_rate: int
    channels: int
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Media:
    payload: str  # base64, as received
    track: str
    chunk: int | None
    timestamp_ms: int | None


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class CarrierError:
    """The carrier reports a failure on the stream (Telnyx's ``error`` frame)."""

    code: str
    detail: str


Event = Connected | Start | Media | Mark | Dtmf | Stop | CarrierError


# --- reading fields -----------------------------------------------------------------------------------------
def _object(message: dict[str, Any], key: str, event: str) -> dict[str, Any]:
    value = message.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(f"bad_{event}", f"'{key}' must be an object")
    return value


def _text(obj: dict[str, Any], key: str, event: str, limit: int = MAX_ID_CHARS, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value) or len(value) > limit:
        raise ProtocolError(f"bad_{event}", f"'{key}' must be a string of 1-{limit} characters")
    return value


def _count(obj: dict[str, Any], key: str, event: str) -> int | None:
    """A counter the carriers send as a decimal string (Twilio's chunk and timestamp) or a number; None if absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(f"bad_{event}", f"'{key}' must be a count")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        number = int(value)
    else:
        raise ProtocolError(f"bad_{event}", f"'{key}' must be a count")
    if number < 0:
        raise ProtocolError(f"bad_{event}", f"'{key}' must be a count")
    return number


def _parameters(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_PARAMETERS:
        raise ProtocolError("bad_start", f"custom parameters must be an object of at most {MAX_PARAMETERS} entries")
    out: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(text, str) or len(name) > MAX_PARAMETER_CHARS or len(text) > MAX_PARAMETER_CHARS:
            raise ProtocolError("bad_start", "a custom parameter must be a string")
        out[name] = text
    return out


def _media(message: dict[str, Any]) -> Media:
    media = _object(message, "media", "media")
    payload = media.get("payload")
    if not isinstance(payload, str):
        raise ProtocolError("bad_media", "'media.payload' must be a base64 string")
    track = media.get("track", "inbound")
    if not isinstance(track, str) or len(track) > MAX_NAME_CHARS:
        raise ProtocolError("bad_media", "'media.track' must be a string")
    return Media(payload, track, _count(media, "chunk", "media"), _count(media, "timestamp", "media"))


def _mark(message: dict[str, Any]) -> Mark:
    return Mark(_text(_object(message, "mark", "mark"), "name", "mark", MAX_NAME_CHARS))


def _dtmf(message: dict[str, Any]) -> Dtmf:
    digit = _text(_object(message, "dtmf", "dtmf"), "digit", "dtmf", MAX_NAME_CHARS)
    if not DTMF_DIGIT.fullmatch(digit):
        raise ProtocolError("bad_dtmf", "'dtmf.digit' must be one key: 0-9, *, #, A-D")
    return Dtmf(digit)


# --- the dialects -------------------------------------------------------------------------------------------
XML_HEAD = '<?xml version="1.0" encoding="UTF-8"?>'
BUSY = f'{XML_HEAD}<Response><Reject reason="busy"/></Response>'  # TwiML and TeXML alike: the caller hears busy


class Dialect:
    """One carrier's words for the media stream (see the module docstring): the names of its ``start`` fields,
    whether what we send names the stream, and the XML that connects a call to us."""

    name = ""
    encoding = ""  # the one media format we take, in the carrier's spelling
    stream_id_in_start = True  # the stream id sits in ``start`` (Twilio), or beside it (Telnyx)
    stream_id, call_id, media_format, sample_rate, parameters = "", "", "", "", ""
    stream_key_out = ""  # the key naming the stream in what we send ("": none)
    stream_attributes = ""  # extra attributes of the answer's <Stream>

    def parse(self, message: object) -> Event:
        """A decoded JSON message → an event, or :class:`ProtocolError`."""
        if not isinstance(message, dict):
            raise ProtocolError("bad_message", "a message is a JSON object")
        event = message.get("event")
        if event == "connected":
            return Connected()
        if event == "start":
            return self._start(message)
        if event == "media":
            return _media(message)
        if event == "mark":
            return _mark(message)
        if event == "dtmf":
            return _dtmf(message)
        if event == "stop":
            return Stop()
        return self._other(message, event)

    def _start(self, message: dict[str, Any]) -> Start:
        start = _object(message, "start", "start")
        fmt = _object(start, self.media_format, "start")
        rate, channels = _count(fmt, self.sample_rate, "start"), _count(fmt, "channels", "start")
        return Start(
            stream_id=_text(start if self.stream_id_in_start else message, self.stream_id, "start"),
            call_id=_text(start, self.call_id, "start"),
            encoding=_text(fmt, "encoding", "start", MAX_NAME_CHARS),
            sample_rate=rate or 0,
            channels=1 if channels is None else channels,
            parameters=_parameters(start.get(self.parameters)),
        )

    def _other(self, message: dict[str, Any], event: object) -> Event:
        raise ProtocolError("unknown_event", f"event {str(event)[:32]!r}")

    def format_problem(self, start: Start) -> str:
        """Why the stream's audio format is not one we take ("" when it is μ-law, 8 kHz, mono)."""
        if start.encoding != self.encoding or start.sample_rate != TELEPHONE_RATE or start.channels != 1:
            return (f"media format {start.encoding[:32]!r} {start.sample_rate} Hz {start.channels} ch; "
                    f"only {self.encoding} {TELEPHONE_RATE} Hz mono")
        return ""

    # What we send.
    def _out(self, event: str, stream_id: str, **body: Any) -> dict[str, Any]:
        named = {self.stream_key_out: stream_id} if self.stream_key_out else {}
        return {"event": event, **named, **body}

    def media(self, stream_id: str, payload: str) -> dict[str, Any]:
        return self._out("media", stream_id, media={"payload": payload})

    def mark(self, stream_id: str, name: str) -> dict[str, Any]:
        return self._out("mark", stream_id, mark={"name": name})

    def clear(self, stream_id: str) -> dict[str, Any]:
        return self._out("clear", stream_id)

    def answer(self, stream_url: str, token: str) -> str:
        """The webhook's XML answer: connect the call to our media stream, the token as its parameter."""
        parameter = f"<Parameter name={quoteattr(TOKEN_PARAMETER)} value={quoteattr(token)}/>"
        return (f"{XML_HEAD}<Response><Connect><Stream url={quoteattr(stream_url)}{self.stream_attributes}>"
                f"{parameter}</Stream></Connect></Response>")


class Twilio(Dialect):
    name = "twilio"
    encoding = "audio/x-mulaw"
    stream_id, call_id, media_format, sample_rate, parameters = (
        "streamSid", "callSid", "mediaFormat", "sampleRate", "customParameters")
    stream_key_out = "streamSid"


class Telnyx(Dialect):
    name = "telnyx"
    encoding = "PCMU"
    stream_id_in_start = False
    stream_id, call_id, media_format, sample_rate, parameters = (
        "stream_id", "call_control_id", "media_format", "sample_rate", "custom_parameters")
    # RTP mode (raw PCMU both ways, any chunk size): the default "mp3" mode takes whole files about once a second
    # and cannot carry a conversation.
    stream_attributes = (f' track="inbound_track" bidirectionalMode="rtp" bidirectionalCodec="PCMU"'
                         f' bidirectionalSamplingRate="{TELEPHONE_RATE}"')

    def _other(self, message: dict[str, Any], event: object) -> Event:
        if event == "error":
            payload = message.get("payload")
            payload = payload if isinstance(payload, dict) else {}
            detail = payload.get("detail") or payload.get("title") or ""
            return CarrierError(str(payload.get("code", ""))[:32], str(detail)[:200])
        return super()._other(message, event)


TWILIO = Twilio()
TELNYX = Telnyx()
DIALECTS = {d.name: d for d in (TWILIO, TELNYX)}
