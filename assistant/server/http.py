"""What every route module shares: the config's app key, JSON errors, bounded body reading (raw, JSON,
multipart) and bounded writing (a streamed answer's writes, a WebSocket's outgoing messages).

Route modules (``app``, ``signaling``, ``tts_api/``, ``dispatch/``) import this, never each other, so the routes form
no cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from assistant.body import BodyTooLarge, JSONTooComplex, loads_bounded, read_capped
from assistant.config import Config

MULTIPART_SLACK = 65_536  # headers and boundaries around the parts of a multipart body
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
DEFAULT_BODY_TIMEOUT_S = 60.0


def json_error(status: int, error: str, detail: str = "", **extra: Any) -> web.Response:
    """A JSON error response ``{"error": ..., "detail": ...}``: what clients get instead of a traceback."""
    return web.json_response({"error": error, "detail": detail, **extra}, status=status)


class APIError(Exception):
    """A request a service refuses, independent of HTTP: a status, a short error code, a detail, and the field at
    fault. Each front turns it into its error shape (ours ``{error, detail}``; OpenAI's under ``/v1``)."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None,
                 param: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}
        self.param = param

    def to_json(self) -> dict[str, str]:
        return {"error": self.error, "detail": self.detail}


class HTTPJSONError(web.HTTPException):
    """Raise from a handler to answer ``status`` with a JSON error body."""

    def __init__(self, status: int, error: str, detail: str = "", headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        super().__init__(
            text=json.dumps({"error": error, "detail": detail}),
            content_type="application/json",
            headers=headers,
        )


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, however it arrives (in pieces, slowly), or 413 ``too_large`` past ``max_bytes`` (refused
    from its Content-Length when it says so, else after reading one byte more than allowed: never more), or 408
    ``body_timeout`` when it takes longer than ``server.body_timeout_s`` (a body trickled in forever would hold
    its handler forever)."""
    async with body_deadline(request):
        try:
            return await read_capped(request, max_bytes)
        except BodyTooLarge:
            raise HTTPJSONError(413, "too_large", f"request body over {max_bytes} bytes") from None


@contextlib.asynccontextmanager
async def body_deadline(request: web.Request) -> AsyncIterator[None]:
    """Read a body within ``server.body_timeout_s``, else 408 ``body_timeout``."""
    cfg = request.config_dict.get(CONFIG)
    timeout_s = cfg.server.body_timeout_s if cfg is not None else DEFAULT_BODY_TIMEOUT_S
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError:
        raise HTTPJSONError(408, "body_timeout", f"the request body took over {timeout_s:g} s to arrive") from None


async def read_json(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """Read a JSON object body, with a size cap and clear 4xx errors."""
    return json_object(await read_body(request, max_bytes), "body")


def json_object(raw: str | bytes, what: str = "body") -> dict[str, Any]:
    """A JSON object from outside (``body.loads_bounded``: bounded nesting and members), or 400 ``bad_json``."""
    try:
        data = loads_bounded(raw)
    except JSONTooComplex as exc:
        raise HTTPJSONError(400, "bad_json", f"{what} is too complex: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise HTTPJSONError(400, "bad_json", f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPJSONError(400, "bad_json", f"{what} must be a JSON object")
    return data


async def read_multipart(request: web.Request, limits: dict[str, int]) -> dict[str, bytes]:
    """Read a multipart body part by part, each bounded by ``limits[name]``, within the body deadline; unknown or
    repeated parts are refused."""
    total = sum(limits.values()) + MULTIPART_SLACK
    if request.content_length is not None and request.content_length > total:
        raise HTTPJSONError(413, "too_large", f"request body over {total} bytes")
    try:
        async with body_deadline(request):
            return await _read_parts(request, limits)
    except HTTPJSONError:
        raise
    except (ValueError, AssertionError, KeyError, HttpProcessingError) as exc:
        # HttpProcessingError: a part's headers are malformed (aiohttp raises InvalidHeader / LineTooLong).
        raise HTTPJSONError(400, "bad_multipart", f"malformed multipart body ({type(exc).__name__})") from None


async def _read_parts(request: web.Request, limits: dict[str, int]) -> dict[str, bytes]:
    reader = await request.multipart()
    out: dict[str, bytes] = {}
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader) or part.name not in limits:
            name = getattr(part, "name", None)
            raise HTTPJSONError(400, "bad_request", f"unexpected form part {name!r}; allowed: {', '.join(limits)}")
        if part.name in out:
            raise HTTPJSONError(400, "bad_request", f"form part {part.name!r} given twice")
        cap = limits[part.name]
        data = bytearray()
        while chunk := await part.read_chunk(65_536):
            data += chunk
            if len(data) > cap:
                what = "reference clip" if part.filename else f"form part {part.name!r}"
                raise HTTPJSONError(413, "too_large", f"{what} is over {cap} bytes")
        out[part.name] = bytes(data)
    return out


class WriteStalled(Exception):
    """A streamed answer's reader stopped reading: a write waited past its time limit and the connection was cut."""


async def write_within(request: web.Request, write: Awaitable[None], timeout_s: float) -> None:
    """Await one write of a streamed answer (HTTP or WebSocket), at most ``timeout_s``: a reader that stopped reading
    would otherwise hold the writer, and whatever it holds (a synthesis slot), for ever. Past it the connection is
    cut and :class:`WriteStalled` raised."""
    try:
        await asyncio.wait_for(write, timeout_s)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise WriteStalled(f"the reader took no data for {timeout_s:g} s") from None


class Outbox:
    """JSON messages to a WebSocket, in order, through one bounded queue that one task (:meth:`run`) writes out:
    code that cannot await (a callback, a plain call) can send, nothing is written from two places at once, and a
    peer that does not read is not buffered for without limit: past ``limit`` messages ``on_full`` is called once
    and the rest is dropped (the caller closes the socket)."""

    def __init__(self, ws: web.WebSocketResponse, limit: int, on_full: Callable[[], None]) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=limit)
        self.on_full = on_full
        self.full = False

    def put(self, message: dict[str, Any]) -> None:
        if self.full:
            return
        try:
            self.queue.put_nowait(json.dumps(message, ensure_ascii=False))
        except asyncio.QueueFull:
            self.full = True
            self.on_full()

    async def run(self) -> None:
        while True:
            text = await self.queue.get()
            if self.ws.closed:
                return
            try:
                await self.ws.send_str(text)
            except ConnectionResetError:  # the peer went away: whoever reads the socket ends the session
                return
