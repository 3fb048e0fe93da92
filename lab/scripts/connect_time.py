#!/usr/bin/env python3
"""Connect time of the voice chat page: offer → first audio packet, with and without trickle ICE.

    python lab/scripts/connect_time.py --runs 5

Runs the real server in-process (the default CPU stack), a throw-away coturn on loopback (Debian's
``turnserver``) and headless Chromium (``/usr/bin/chromium``). The page measures itself: ``performance.now()``
just before ``createOffer`` → the answer arrives → the reply track's first RTP packet (its ``unmute``).
Everything is on 127.0.0.1, so these are lower bounds; a real network adds its round trips.

Scenarios, each with trickle on and off:
- host: host candidates only (what a LAN sees);
- slow candidate: the browser is also given a STUN server that never answers (a UDP socket on loopback that
  reads and stays silent), as on a network where one candidate is slow; without trickle the page waits for
  gathering (capped at 2 s), with trickle the offer goes at once;
- TURN relay: both peers on ``relay`` policy with TURN REST credentials, so only the coturn path exists.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from assistant.bench.figures import provenance, write_markdown  # noqa: E402
from assistant.config import load_config  # noqa: E402
from assistant.server.app import create_app, wait_ready  # noqa: E402
from assistant.server.local import serve_on_loopback  # noqa: E402
from assistant.server.services import Services  # noqa: E402
from tests.turnserver import run_turnserver  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def _browser_only_stun(url: str) -> Any:
    """Middleware: add a STUN server to the page's ICE configuration only (the server's peer never sees it)."""

    @web.middleware
    async def add_stun(request: web.Request, handler: Any) -> web.StreamResponse:
        resp = await handler(request)
        if request.path == "/api/ice" and isinstance(resp, web.Response) and resp.status == 200:
            body = json.loads(resp.body)  # type: ignore[arg-type]
            body["iceServers"].append({"urls": [url]})
            return web.json_response(body, headers={"Cache-Control": "no-store"})
        return resp

    return add_stun


@contextlib.asynccontextmanager
async def serve(services: Services, ice: dict[str, Any], extra_middleware: Any = None) -> AsyncIterator[str]:
    cfg = load_config(overrides={"ice": ice} if ice else None, environ={})
    app = create_app(cfg, services)
    if extra_middleware is not None:
        app.middlewares.insert(0, extra_middleware)
    async with serve_on_loopback(app) as url:
        await wait_ready(app)
        yield url


async def measure(browser: Any, url: str, trickle: bool) -> tuple[float, float]:
    """One connect: (offer → answer, offer → first audio packet) in ms, as the page measured them."""
    page = await browser.new_page()
    try:
        await page.goto(f"{url}/?trickle={int(trickle)}")
        await page.click("#connect")
        await page.wait_for_function("() => window.assistantState.connectMs != null", timeout=30_000)
        times = await page.evaluate("window.assistantState.connectTimes")
        await page.click("#hangup")
        await page.wait_for_function("() => window.assistantState.hangupStatus !== undefined", timeout=10_000)
        return times["answer"] - times["offer"], times["firstPacket"] - times["offer"]
    finally:
        await page.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="connects per scenario (plus one warm-up)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    args = parser.parse_args()
    origin = provenance()  # the machine's load as the run starts
    from playwright.async_api import async_playwright

    services = Services(load_config(environ={}))
    await services.load()
    blackhole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a STUN server that never answers
    blackhole.bind(("127.0.0.1", 0))
    silent_stun = f"stun:127.0.0.1:{blackhole.getsockname()[1]}"
    rows: list[tuple[str, str, list[float], list[float]]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, run_turnserver() as turn:
            mic = Path(tmp) / "silence.wav"
            sf.write(mic, np.zeros(48_000 * 2, dtype=np.float32), 48_000, subtype="PCM_16")
            relay = {"turn_urls": [turn.url], "turn_secret": turn.secret, "transport_policy": "relay"}
            scenarios = [
                ("host", {}, None),
                ("slow candidate", {}, _browser_only_stun(silent_stun)),
                ("TURN relay", relay, None),
            ]
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=CHROMIUM,
                    headless=True,
                    args=[
                        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                        "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
                        "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={mic}",
                    ],
                )  # fmt: skip
                try:
                    for name, ice, middleware in scenarios:
                        async with serve(services, ice, middleware) as url:
                            for trickle in (True, False):
                                answers, firsts = [], []
                                for i in range(args.runs + 1):
                                    answer, first = await measure(browser, url, trickle)
                                    if i:  # the first connect of each is a warm-up
                                        answers.append(answer)
                                        firsts.append(first)
                                rows.append((name, "on" if trickle else "off", answers, firsts))
                                print(f"{name:15s} trickle {'on ' if trickle else 'off'}  done", file=sys.stderr)
                finally:
                    await browser.close()
    finally:
        blackhole.close()
        await services.close()
    print(f"\nconnect time of the page, {args.runs} runs each (ms, loopback; median [min-max])")
    print(f"{'candidates':15s} {'trickle':7s} {'offer→answer':>20s} {'offer→first audio packet':>28s}")
    for name, mode, answers, firsts in rows:
        a = f"{statistics.median(answers):.0f} [{min(answers):.0f}-{max(answers):.0f}]"
        f = f"{statistics.median(firsts):.0f} [{min(firsts):.0f}-{max(firsts):.0f}]"
        print(f"{name:15s} {mode:7s} {a:>20s} {f:>28s}")
    if args.markdown is not None:
        def spread(values: list[float]) -> str:
            return f"{statistics.median(values):.0f} [{min(values):.0f}–{max(values):.0f}]"

        lines = ["| candidates | trickle | offer → answer | offer → first audio packet |",
                 "| --- | --- | ---: | ---: |"]
        lines += [f"| {name} | {mode} | {spread(answers)} | {spread(firsts)} |"
                  for name, mode, answers, firsts in rows]
        lines += ["", f"Median [min–max] of {args.runs} connects after one warm-up, ms, loopback."]
        docs = write_markdown(args.markdown, "\n".join(lines), origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
