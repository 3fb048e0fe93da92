"""Frames between the server and an engine's child process: a 4-byte big-endian length, then a pickle.

Both ends are this package's own code over a socket pair the parent made (nothing else can connect to it), so
pickle carries the dataclasses (messages, usage) as they are. A frame is bounded (``MAX_FRAME``): a longer one
means the other side is broken, and the connection ends.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

MAX_FRAME = 64 * 2**20
_LEN = struct.Struct(">I")

Frame = dict[str, Any]


class WireError(ConnectionError):
    """The other side sent something that is not a frame, or too much."""


def encode(frame: Frame) -> bytes:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame; ``None`` at a clean end of the stream."""
    try:
        head = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise WireError("the stream ended inside a frame's length") from exc
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise WireError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
    try:
        data = await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise WireError("the stream ended inside a frame") from exc
    frame = pickle.loads(data)
    if not isinstance(frame, dict):
        raise WireError(f"a frame is a dict, not {type(frame).__name__}")
    return frame
