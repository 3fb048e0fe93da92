"""What every route module shares: the config's app key, JSON errors and bounded body reading (raw, JSON,
multipart).

Route modules (``app``, ``signaling``, ``tts_api/``, ``dispatch/``) import this, never each other, so the routes form
no cycle.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from assistant.config import Config

MULTIPART_SLACK = 65_536  # headers and boundaries around the parts of a multipart body
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)


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
    """The whole body, or 413 ``too_large`` past ``max_bytes`` (refused from its Content-Length when it says so,
    else after reading one byte more than allowed: never more)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise HTTPJSONError(413, "too_large", f"request body over {max_bytes} bytes")
    raw = await request.content.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise HTTPJSONError(413, "too_large", f"request body over {max_bytes} bytes")
    return raw


async def read_json(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """Read a JSON object body, with a size cap and clear 4xx errors."""
    raw = await read_body(request, max_bytes)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HTTPJSONError(400, "bad_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPJSONError(400, "bad_json", "body must be a JSON object")
    return data


async def read_multipart(request: web.Request, limits: dict[str, int]) -> dict[str, bytes]:
    """Read a multipart body part by part, each bounded by ``limits[name]``; unknown parts are refused."""
    total = sum(limits.values()) + MULTIPART_SLACK
    if request.content_length is not None and request.content_length > total:
        raise HTTPJSONError(413, "too_large", f"request body over {total} bytes")
    try:
        reader = await request.multipart()
        out: dict[str, bytes] = {}
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name not in limits:
                name = getattr(part, "name", None)
                raise HTTPJSONError(400, "bad_request",
                                    f"unexpected form part {name!r}; allowed: {', '.join(limits)}")
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
    except HTTPJSONError:
        raise
    except (ValueError, AssertionError, KeyError, HttpProcessingError) as exc:
        # HttpProcessingError: a part's headers are malformed (aiohttp raises InvalidHeader / LineTooLong).
        raise HTTPJSONError(400, "bad_multipart", f"malformed multipart body ({type(exc).__name__})") from None
