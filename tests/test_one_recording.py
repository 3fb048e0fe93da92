"""One recording, one transcript: the same speech files give the same words whichever way they reach the server —
our page protocol, WHIP, the Realtime WebSocket (PCM16 at 24 kHz, and G.711 μ-law at 8 kHz) and the Realtime API
over WebRTC. Each path is its real client on loopback, streaming in real time; the words compared are what the
server transcribed (the turn's final transcript)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import aiohttp
import numpy as np
import pytest

from assistant.audio import float_to_s16, resample
from assistant.bench.audio_source import Utterance, load_utterance
from assistant.bench.realtime_client import RealtimeBenchSession, ws_turn
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.g711 import ulaw_encode
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_net import TOKEN, WhipClient

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

FILES = ("en_weather.wav", "en_timer.wav", "en_story.wav")
SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)
WORD = re.compile(r"[\w']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


async def page(url: str, http: aiohttp.ClientSession, _app: Any, utt: Utterance) -> str:
    client = BenchSession(index=0, url=url, http=http, token=TOKEN)
    await client.connect()
    try:
        return (await client.run_turn(utt, 0, SETTINGS)).transcript
    finally:
        await client.close()


async def whip(url: str, http: aiohttp.ClientSession, app: Any, utt: Utterance) -> str:
    """WHIP has no events channel: the words are the session's own transcript event."""
    client = WhipClient(url, http)
    await client.connect()
    heard: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "transcript" and event.get("final") and not heard.done():
            heard.set_result(str(event.get("text", "")))

    app[SESSIONS][client.location.rsplit("/", 1)[1]].events.subscribe(on_event)
    try:
        client.source.play(utt)
        return await asyncio.wait_for(heard, 40)
    finally:
        await client.close()


async def realtime_ws_pcm16(url: str, http: aiohttp.ClientSession, _app: Any, utt: Utterance) -> str:
    turn = await ws_turn(http, url, utt, token=TOKEN)
    assert not turn.error, turn
    return turn.transcript


async def realtime_ws_g711(url: str, http: aiohttp.ClientSession, _app: Any, utt: Utterance) -> str:
    """μ-law at 8 kHz, 20 ms an append, in real time, as a telephone gateway sends it."""
    x = resample(utt.pcm.astype(np.float32) / 32768, 48_000, 8_000)
    data = ulaw_encode(float_to_s16(np.concatenate([x, np.zeros(8_000 * 5 // 2, dtype=np.float32)])))
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=echo"
    async with http.ws_connect(ws_url, headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send_str(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcmu"}}}}}))

        async def stream() -> None:
            t0 = time.monotonic()
            for k, at in enumerate(range(0, len(data), 160)):
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
                await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(data[at: at + 160]).decode()}))

        sender = asyncio.create_task(stream())
        try:
            async with asyncio.timeout(40):
                async for msg in ws:
                    event = json.loads(msg.data)
                    if event["type"] == "conversation.item.input_audio_transcription.completed":
                        return str(event["transcript"])
        finally:
            sender.cancel()
    raise AssertionError("no transcript over G.711")


async def realtime_webrtc(url: str, http: aiohttp.ClientSession, _app: Any, utt: Utterance) -> str:
    client = RealtimeBenchSession(index=0, url=url, http=http, token=TOKEN)
    await client.connect()
    try:
        return (await client.run_turn(utt, 0, SETTINGS)).transcript
    finally:
        await client.close()


PATHS = {"page": page, "whip": whip, "realtime-ws-pcm16": realtime_ws_pcm16, "realtime-ws-g711": realtime_ws_g711,
         "realtime-webrtc": realtime_webrtc}


@pytest.mark.parametrize("name", FILES)
async def test_one_recording_one_transcript(services: Services, shared_audio, name: str) -> None:
    utt = load_utterance(shared_audio / name)
    heard: dict[str, str] = {}
    async with serve(test_config(server={"auth_token": TOKEN}), services) as (url, app), \
            aiohttp.ClientSession() as http:
        for path, run in PATHS.items():
            heard[path] = await run(url, http, app, utt)
    texts = {path: " ".join(words(text)) for path, text in heard.items()}
    assert len(set(texts.values())) == 1, texts
    said = set(words(utt.text))
    assert len(said & set(words(heard["page"]))) >= len(said) // 2, (utt.text, heard)  # and it is what was said
