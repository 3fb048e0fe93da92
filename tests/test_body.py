"""Bodies read whole under their cap (``assistant/body.py``, ``server/http.read_body``), however they arrive.

aiohttp's ``StreamReader.read(n)`` returns what is buffered: a body sent in pieces was cut at the first. These
tests send bodies in pieces over a real socket, with pauses between them, so the handler runs before the rest
has come (``tests/test_open_internet.py`` does the same from another process against ``assistant serve``).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from assistant.body import BodyTooLarge, read_capped
from assistant.server.http import read_body
from assistant.server.local import serve_on_loopback

pytestmark = pytest.mark.asyncio

CAP = 300_000


async def _echo_length(request: web.Request) -> web.Response:
    body = await read_body(request, CAP)
    return web.json_response({"bytes": len(body), "json": json.loads(body)["k"] if body[:1] == b"{" else None})


async def _send_in_pieces(url: str, head: str, body: bytes, piece: int, pause_s: float) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode())
    await writer.drain()
    for i in range(0, len(body), piece):
        writer.write(body[i:i + piece])
        await writer.drain()
        await asyncio.sleep(pause_s)
    status = int((await reader.readline()).split()[1])
    answer = await reader.read()
    writer.close()
    return status, answer.split(b"\r\n\r\n", 1)[1]


async def test_a_body_sent_in_pieces_is_read_whole() -> None:
    app = web.Application()
    app.router.add_post("/", _echo_length)
    body = json.dumps({"k": "v", "pad": " " * 250_000}).encode()
    async with serve_on_loopback(app) as url:
        head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        status, answer = await _send_in_pieces(url, head, body, 8192, 0.002)
        assert status == 200 and json.loads(answer) == {"bytes": len(body), "json": "v"}
        # Chunked, past the cap: 413 after one byte more than allowed, never the rest read.
        big = b"x" * (CAP + 50_000)
        chunks = b"".join(f"{len(big[i:i + 8192]):x}\r\n".encode() + big[i:i + 8192] + b"\r\n"
                          for i in range(0, len(big), 8192)) + b"0\r\n\r\n"
        head = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        status, answer = await _send_in_pieces(url, head, chunks, 8192, 0.0)
        assert status == 413 and json.loads(answer)["error"] == "too_large"


async def test_a_client_response_is_read_whole_under_its_cap() -> None:
    async def slow_answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(b"y" * 1000)
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", slow_answer)
    async with serve_on_loopback(app) as url, aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert await read_capped(r, 10_000) == b"y" * 10_000
        async with http.get(url) as r:
            with pytest.raises(BodyTooLarge):
                await read_capped(r, 9_999)


async def test_a_body_that_never_finishes_arriving_is_refused_in_time() -> None:
    from assistant.config import Config
    from assistant.server.http import CONFIG

    cfg = Config()
    cfg.server.body_timeout_s = 0.3
    app = web.Application()
    app[CONFIG] = cfg
    app.router.add_post("/", _echo_length)
    async with serve_on_loopback(app) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"k\"")
        await writer.drain()  # ... and the rest never comes
        status = int((await asyncio.wait_for(reader.readline(), 10)).split()[1])
        body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
        writer.close()
        assert status == 408 and json.loads(body)["error"] == "body_timeout"
