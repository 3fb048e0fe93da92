"""Run an aiohttp app on 127.0.0.1 with a free port, for as long as a block lasts: what tests, benchmarks and
scripts do to put a real server (ours, or a stand-in such as a fake LLM) on a real socket."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

LOOPBACK = "127.0.0.1"


@contextlib.asynccontextmanager
async def serve_on_loopback(app: web.Application, *, tls: ssl.SSLContext | None = None,
                            shutdown_timeout: float = 2.0) -> AsyncIterator[str]:
    """Yield the base URL (``http://127.0.0.1:PORT``, ``https`` with ``tls``); clean the app up after the block."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1]
        yield f"{'https' if tls else 'http'}://{LOOPBACK}:{port}"
    finally:
        await runner.cleanup()
