"""Bad input to the Realtime API: each mistake gets an ``error`` event in the reference's shape, the session goes on,
and a session next to it is untouched. Plus the token (header, or the browser's subprotocol) and the beta dialect."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.test_realtime_ws import append, connected, pcm24

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

MAX_EVENT = 65_536


class Socket:
    """A raw WebSocket client of /v1/realtime: events as the server sends them."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        if isinstance(event, bytes):
            await self.ws.send_bytes(event)
        else:
            await self.ws.send_str(event if isinstance(event, str) else json.dumps(event))

    async def next(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"socket ended ({msg.type}, {self.ws.close_code}) waiting for {kind}")
            event = json.loads(msg.data)
            self.events.append(event)
            if event["type"] == kind:
                return event

    async def error_for(self, event: dict[str, Any] | str | bytes) -> dict[str, Any]:
        await self.send(event)
        err = await self.next("error")
        assert set(err) == {"type", "event_id", "error"}, err
        assert set(err["error"]) == {"type", "code", "message", "param", "event_id"}, err
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"]
        return err["error"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_each_mistake_gets_an_error_and_the_session_goes_on(services: Services, shared_audio) -> None:
    cfg = test_config(realtime={"max_event_bytes": MAX_EVENT})
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        ws_url = url.replace("http", "ws") + "/v1/realtime?model=echo"
        # A second session holds a spoken turn all the while (the official SDK).
        async with connected(url) as (conn, ev), http.ws_connect(ws_url, max_msg_size=0) as ws:
            other = asyncio.create_task(append(conn, pcm24(shared_audio / "en_weather.wav", 2.5), speed=1.0))
            s = Socket(ws)
            await s.next("session.created")

            e = await s.error_for({"type": "input_audio_buffer.make_coffee", "event_id": "evt_1"})
            assert (e["code"], e["param"], e["event_id"]) == ("invalid_value", "type", "evt_1")
            assert (await s.error_for("{not json"))["code"] == "invalid_json"
            assert (await s.error_for(b"\x00\x01"))["code"] == "invalid_message"
            e = await s.error_for({"type": "input_audio_buffer.append", "audio": "%%% not base64 %%%"})
            assert e["param"] == "audio"
            wav = io.BytesIO()
            sf.write(wav, np.zeros(2400, dtype=np.float32), 24_000, format="WAV")
            e = await s.error_for({"type": "input_audio_buffer.append", "audio": b64(wav.getvalue())})
            assert e["code"] == "invalid_audio_format"
            e = await s.error_for({"type": "session.update", "session": {
                "audio": {"input": {"format": {"type": "audio/mp3"}}}}})
            assert e["param"] == "session.audio.input.format.type"
            e = await s.error_for({"type": "session.update", "session": {
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})
            assert e["param"] == "session.audio.input.format.rate"
            e = await s.error_for({"type": "session.update", "session": {"input_audio_format": "mp3"}})
            assert e["param"] == "session.input_audio_format"
            e = await s.error_for({"type": "session.update", "session": {"colour": "blue"}})
            assert (e["code"], e["param"]) == ("unknown_parameter", "session.colour")
            big = b64(bytes(MAX_EVENT))  # base64 makes it 4/3 of the limit: over it, under the hard limit
            assert (await s.error_for({"type": "input_audio_buffer.append", "audio": big}))["code"] == \
                "event_too_large"
            assert (await s.error_for({"type": "response.cancel"}))["code"] == "response_cancel_not_active"
            assert (await s.error_for({"type": "input_audio_buffer.commit"}))["code"] == \
                "input_audio_buffer_commit_empty"
            for kind, code in (("delete", "item_delete_invalid_item_id"), ("retrieve", "item_retrieve_invalid_item_id"),
                               ("truncate", "item_truncate_invalid_item_id")):
                e = await s.error_for({"type": f"conversation.item.{kind}", "item_id": "nope", "audio_end_ms": 5})
                assert (e["code"], e["param"]) == (code, "item_id"), e
            e = await s.error_for({"type": "response.create", "response": {"metadata": {"k": 7}}})
            assert e["param"] == "response.metadata.k"
            e = await s.error_for({"type": "output_audio_buffer.clear"})
            assert e["code"] == "unsupported"  # WebRTC only

            # The session goes on: a typed turn is answered, in μ-law now (the formats the reference has).
            await s.send({"type": "session.update", "session": {"audio": {"output": {"format": {
                "type": "audio/pcmu"}}}}})
            updated = await s.next("session.updated")
            assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
            await s.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "still here"}]}})
            await s.send({"type": "response.create"})
            done = await s.next("response.done")
            assert done["response"]["status"] == "completed"
            deltas = [base64.b64decode(x["delta"]) for x in s.events if x["type"] == "response.output_audio.delta"]
            assert sum(map(len, deltas)) > 8000 * 0.5  # over half a second at 8 kHz, one byte a sample

            # A message far over the limit closes this socket alone (1009); the other session finishes its turn.
            await s.send({"type": "input_audio_buffer.append", "audio": b64(bytes(5 * MAX_EVENT))})
            msg = await ws.receive(timeout=10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and ws.close_code == 1009
            await other
            other_done = await ev.wait("response.done")
            assert other_done["response"]["status"] == "completed"
            assert "weather" in other_done["response"]["output"][0]["content"][0]["transcript"].lower()
            assert not ev.of("error")
            for _ in range(100):
                if len(app[SESSIONS]) == 1:
                    break
                await asyncio.sleep(0.05)
            assert len(app[SESSIONS]) == 1  # the closed socket's session is gone, the other is still there


async def test_token_by_header_or_browser_subprotocol_and_the_beta_dialect(services: Services) -> None:
    cfg = test_config(server={"auth_token": "t0ken"})
    async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
        ws_url = url.replace("http", "ws") + "/v1/realtime?model=echo"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url)
        assert refused.value.status == 401
        async with http.ws_connect(ws_url, headers={"Authorization": "Bearer t0ken"}) as ws:
            assert (await Socket(ws).next("session.created"))["session"]["type"] == "realtime"
        protocols = ("realtime", "openai-insecure-api-key.t0ken", "openai-beta.realtime-v1")
        async with http.ws_connect(ws_url, protocols=protocols) as ws:
            assert ws.protocol == "realtime"
            s = Socket(ws)
            created = await s.next("session.created")
            assert created["session"]["input_audio_format"] == "pcm16"  # the beta session shape
            await s.send({"type": "session.update", "session": {"modalities": ["text"], "voice": "verse"}})
            assert (await s.next("session.updated"))["session"]["modalities"] == ["text"]
            await s.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi there"}]}})
            await s.next("conversation.item.created")  # the beta name
            await s.send({"type": "response.create"})
            await s.next("response.done")
            kinds = [e["type"] for e in s.events]
            assert "response.text.delta" in kinds and "response.audio.delta" not in kinds
