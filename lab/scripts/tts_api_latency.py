#!/usr/bin/env python3
"""First packet and total time of the TTS API (WebSocket, streamed HTTP, and OpenAI's /v1/audio/speech as raw
pcm and as mp3) against a running server.

    python lab/scripts/tts_api_latency.py --url http://127.0.0.1:8080 --text en_medium --runs 6

The first run of each transport is a warm-up and is not counted; medians of the rest are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp

TEXTS = Path(__file__).resolve().parents[3] / "shared/texts/bench_texts.json"


async def streamed(http: aiohttp.ClientSession, url: str, body: dict, runs: int) -> tuple[list[float], list[float]]:
    """First-byte and total ms of a streamed POST, the first run not counted."""
    firsts, totals = [], []
    for i in range(runs):
        t0, first = time.perf_counter(), None
        async with http.post(url, json=body) as resp:
            resp.raise_for_status()
            async for _ in resp.content.iter_any():
                first = first or time.perf_counter()
        if i and first:
            firsts.append((first - t0) * 1000)
            totals.append((time.perf_counter() - t0) * 1000)
    return firsts, totals


async def measure(url: str, text: str, runs: int) -> dict[str, float]:
    ws_first, ws_total = [], []
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{url}/ws/tts?metadata=1&keep_open=1") as ws:
            for i in range(runs):
                t0, first = time.perf_counter(), None
                await ws.send_json({"text": text})
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT and "error" in json.loads(msg.data):
                        raise RuntimeError(msg.data)
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        if msg.data == b"END":
                            break
                        first = first or time.perf_counter()
                if i and first:
                    ws_first.append((first - t0) * 1000)
                    ws_total.append((time.perf_counter() - t0) * 1000)
        http_first, http_total = await streamed(http, f"{url}/api/tts", {"text": text, "streaming": True}, runs)
        speech = {fmt: await streamed(http, f"{url}/v1/audio/speech", {"model": "tts-1", "voice": "alloy",
                                                                       "input": text, "response_format": fmt}, runs)
                  for fmt in ("pcm", "mp3")}
    md = statistics.median
    return {
        "ws_first_ms": md(ws_first),
        "ws_total_ms": md(ws_total),
        "http_first_ms": md(http_first),
        "http_total_ms": md(http_total),
        **{f"openai_{fmt}_{k}_ms": md(v) for fmt, (f, t) in speech.items() for k, v in (("first", f), ("total", t))},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--text", default="en_medium", help="a name in shared/texts/bench_texts.json, or the text")
    p.add_argument("--runs", type=int, default=6)
    args = p.parse_args()
    texts = json.loads(TEXTS.read_text(encoding="utf-8"))["texts"] if TEXTS.exists() else {}
    result = asyncio.run(measure(args.url.rstrip("/"), texts.get(args.text, args.text), max(2, args.runs)))
    print(" ".join(f"{k}={v:.0f}" for k, v in result.items()), f"(median of {max(2, args.runs) - 1})")


if __name__ == "__main__":
    main()
