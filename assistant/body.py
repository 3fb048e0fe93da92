"""Reading a whole HTTP body under a cap, from anything with aiohttp's ``content``/``content_length`` face.

aiohttp's ``StreamReader.read(n)`` returns what is buffered (up to ``n`` bytes), not the whole body: over a real
network a body arrives in pieces, and one ``read`` sees only the first. :func:`read_capped` reads until the end
of the body, and stops one byte past the cap, so no body costs more memory than the cap allows. Servers (a
request), the dispatcher (a gateway's answer), URL clips and the OpenAI responder (a client response) all read
their bodies with it; ``server/http.read_body`` is its face for routes (413 ``too_large``).
"""

from __future__ import annotations

from typing import Protocol


class ByteStream(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class HasBody(Protocol):
    """An ``aiohttp.web.Request`` or an ``aiohttp.ClientResponse``."""

    @property
    def content(self) -> ByteStream: ...

    @property
    def content_length(self) -> int | None: ...


class BodyTooLarge(ValueError):
    """The body is over its cap (said by its Content-Length, or seen while reading)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"body over {max_bytes} bytes")
        self.max_bytes = max_bytes


async def read_capped(source: HasBody, max_bytes: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` past ``max_bytes``: refused from its Content-Length when that says
    so, else once one byte more than allowed has been read (never more)."""
    declared = source.content_length
    if declared is not None and declared > max_bytes:
        raise BodyTooLarge(max_bytes)
    stream = source.content
    buf = bytearray()
    while chunk := await stream.read(max_bytes + 1 - len(buf)):
        buf += chunk
        if len(buf) > max_bytes:
            raise BodyTooLarge(max_bytes)
    return bytes(buf)
