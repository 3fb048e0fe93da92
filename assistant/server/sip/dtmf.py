"""Key presses: RFC 4733 telephone-events in RTP (and SIP INFO's ``application/dtmf-relay``), turned into digits, and
digits into the text the responder is told.

One key press is many packets: the same event timestamp while the key is held, the end packet three times. A
digit counts once, on the first packet of its timestamp. Digits pressed close together are one entry
(:class:`DigitCollector`): the responder hears them when ``sip.dtmf_gap_ms`` passes without another, or at once
on ``#``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

EVENTS = "0123456789*#ABCD"  # event codes 0-15 (RFC 4733 3.2); 16 (flash) and up are not keys
MAX_DIGITS = 32  # one entry holds at most this many keys; past it the entry goes at once


def parse_event(payload: bytes) -> tuple[str, bool] | None:
    """A telephone-event payload → (the key, end of the event), or None for anything else."""
    if len(payload) < 4:
        return None
    event, flags, _duration = struct.unpack("!BBH", payload[:4])
    if event >= len(EVENTS):
        return None
    return EVENTS[event], bool(flags & 0x80)


def relay_digit(content_type: str, body: bytes) -> str | None:
    """The key of a SIP INFO (``application/dtmf-relay``: ``Signal=5``; ``application/dtmf``: ``5``), or None."""
    try:
        text = body.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if content_type == "application/dtmf-relay":
        for line in text.splitlines():
            name, _, value = line.partition("=")
            if name.strip().lower() == "signal":
                text = value.strip()
                break
        else:
            return None
    if content_type == "application/dtmf" and text.isdigit() and int(text) < len(EVENTS):
        return EVENTS[int(text)]
    return text.upper() if len(text) == 1 and text.upper() in EVENTS else None


class TelephoneEvents:
    """The digits in one stream of telephone-event packets (each key press once)."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None  # (ssrc, timestamp) of the event already counted

    def packet(self, ssrc: int, timestamp: int, payload: bytes) -> str | None:
        parsed = parse_event(payload)
        if parsed is None:
            return None
        key = (ssrc, timestamp)
        if key == self._last:
            return None
        self._last = key
        return parsed[0]


class DigitCollector:
    """Digits into entries: ``on_entry(digits)`` once ``gap_s`` passed after the last digit, or at once on ``#``."""

    def __init__(self, gap_s: float, on_entry: Callable[[str], None]) -> None:
        self.gap_s = gap_s
        self.on_entry = on_entry
        self.digits = ""
        self._timer: asyncio.TimerHandle | None = None

    def add(self, digit: str) -> None:
        self.digits += digit
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if digit == "#" or len(self.digits) >= MAX_DIGITS:
            self.flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(self.gap_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        digits, self.digits = self.digits, ""
        if digits:
            self.on_entry(digits)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.digits = ""
