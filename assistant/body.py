"""Reading a whole HTTP body under a cap, from anything with aiohttp's ``content``/``content_length`` face.

aiohttp's ``StreamReader.read(n)`` returns what is buffered (up to ``n`` bytes), not the whole body: over a real
network a body arrives in pieces, and one ``read`` sees only the first. :func:`read_capped` reads until the end
of the body, and stops one byte past the cap, so no body costs more memory than the cap allows. Servers (a
request), the dispatcher (a gateway's answer), URL clips and the OpenAI responder (a client response) all read
their bodies with it; ``server/http.read_body`` is its face for routes (413 ``too_large``).

JSON from outside (request bodies, WebSocket messages, a gateway's heartbeat) is parsed by :func:`loads_bounded`:
its nesting and its object members are bounded before the parser runs, so a document of ten thousand ``[`` is a
``ValueError`` like any other bad JSON, never a ``RecursionError``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Protocol


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


# --- JSON read from strangers -----------------------------------------------------------------------------
MAX_JSON_DEPTH = 64      # arrays and objects inside each other; a Realtime tool's JSON schema needs about 12
MAX_JSON_KEYS = 10_000   # object members in one document
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONTooComplex(ValueError):
    """A JSON document nested deeper, or with more object members, than :func:`loads_bounded` allows."""


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(itertools.accumulate(_STEP[c] for c in brackets), default=0)


def loads_bounded(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, max_keys: int = MAX_JSON_KEYS) -> Any:
    """``json.loads`` for text from outside: UTF-8 only, at most ``max_depth`` levels of nesting and ``max_keys``
    object members, else :class:`JSONTooComplex`. Every failure is a ``ValueError`` (``JSONDecodeError``,
    ``UnicodeDecodeError``, ``JSONTooComplex``): a deeply nested document never reaches the parser's recursion
    (``RecursionError``), nor the code that walks what it returns."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    if text.count("[") + text.count("{") > max_depth:  # cheap: most documents never need the scan
        depth = json_depth(text)
        if depth > max_depth:
            raise JSONTooComplex(f"JSON nested {depth} levels deep; at most {max_depth}")
    members = 0

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal members
        members += len(items)
        if members > max_keys:
            raise JSONTooComplex(f"JSON with over {max_keys} object members")
        return dict(items)

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:  # not reachable past the depth check; kept so no input can raise it
        raise JSONTooComplex(f"JSON nested over {max_depth} levels deep") from None
