"""Frames between the server and an engine's child process: a 4-byte big-endian length, then a pickle.

The child is crash isolation, not a sandbox, but what it sends is read as data: a frame may hold plain values
(dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None), numpy arrays (audio), and only the types its
host names (:class:`Wire`: the responder's messages and usage, the ASR's transcript). A pickle that names any other
global (a function to call, a class to build) is refused before anything of it runs. Whatever does not decode (a
refused type, a broken pickle, a frame longer than ``MAX_FRAME``) raises :class:`WireError`: the other side is
broken, and the connection ends saying why, instead of the reader stopping in silence.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import struct
from collections.abc import Iterable
from typing import Any

MAX_FRAME = 64 * 2**20
_LEN = struct.Struct(">I")

Frame = dict[str, Any]

# numpy's own pickling of arrays and scalars (numpy 2 and 1): a float32 chunk of audio crosses as it is.
NUMPY = frozenset({
    "numpy:dtype", "numpy:ndarray",
    "numpy._core.numeric:_frombuffer", "numpy._core.multiarray:_reconstruct", "numpy._core.multiarray:scalar",
    "numpy.core.numeric:_frombuffer", "numpy.core.multiarray:_reconstruct", "numpy.core.multiarray:scalar",
})


class WireError(ConnectionError):
    """The other side sent something that is not a frame, too much, or a type that may not cross."""


def type_name(cls: type) -> str:
    """``module:qualname``: how a type is named on the wire's list."""
    return f"{cls.__module__}:{cls.__qualname__}"


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if f"{module}:{name}" not in self.allowed:
            raise WireError(f"a frame names {module}.{name}, which is not a type this engine sends")
        return super().find_class(module, name)


class Wire:
    """Encodes frames, and reads them back allowing plain values, numpy arrays and ``types`` (``module:qualname``
    names or the types themselves)."""

    def __init__(self, types: Iterable[type | str] = ()) -> None:
        self.types = tuple(sorted({t if isinstance(t, str) else type_name(t) for t in types}))
        self._allowed = NUMPY | frozenset(self.types)

    def decode(self, data: bytes) -> Frame:
        try:
            frame = _Unpickler(data, self._allowed).load()
        except WireError:
            raise
        except Exception as exc:  # a broken pickle: truncated, an unknown opcode, a type that fails to build
            raise WireError(f"a frame that does not decode ({type(exc).__name__}: {exc})") from exc
        if not isinstance(frame, dict):
            raise WireError(f"a frame is a dict, not {type(frame).__name__}")
        return frame

    async def read(self, reader: asyncio.StreamReader) -> Frame | None:
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
        return self.decode(data)


PLAIN = Wire()  # plain values and numpy arrays only (the hello, before the child knows its host's types)


def encode(frame: Frame) -> bytes:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader, wire: Wire = PLAIN) -> Frame | None:
    """The next frame, read by ``wire``'s rules; ``None`` at a clean end of the stream."""
    return await wire.read(reader)
