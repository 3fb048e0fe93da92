"""The Realtime API over WebRTC: the official SDK's ``client.realtime.calls.create()`` with an aiortc offer (a turn
heard on the track, its events on ``oai-events``), hang-up, ICE servers, and the bench's Realtime client."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from assistant.audio import SPEECH_RATE, resample
from assistant.bench.audio_source import UtteranceSource, load_utterance
from assistant.bench.realtime_client import RealtimeBenchSession
from assistant.bench.v2v import TurnSettings, frame_to_mono
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests import needs
from tests.conftest import serve, test_config

openai = needs.module("openai")
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


class Peer:
    """An aiortc client as the WebRTC guide builds one: the oai-events channel, a microphone, the reply track."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict[str, Any]] = []
        self.opened = asyncio.Event()
        self.mic = UtteranceSource()
        self.heard: list[np.ndarray] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.channel.on("open", self.opened.set)
        self.channel.on("message", lambda m: self.events.append(json.loads(m)))
        self.pc.on("track", self._on_track)
        self.pc.addTransceiver(self.mic, direction="sendrecv")

    def _on_track(self, track: Any) -> None:
        async def read() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                self.heard.append(resample(frame_to_mono(frame), frame.sample_rate, SPEECH_RATE))

        self.tasks.append(asyncio.ensure_future(read()))

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def wait(self, kind: str, timeout: float = 60.0, since: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events[since:]:
                if e["type"] == kind:
                    return e
            await asyncio.sleep(0.02)
        raise AssertionError(f"no {kind}; got {[e['type'] for e in self.events]}")

    async def close(self) -> None:
        self.mic.stop()
        await self.pc.close()
        for t in self.tasks:
            t.cancel()


async def test_sdk_call_turn_heard_on_track_events_on_oai_events(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, app):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        peer = Peer()
        try:
            raw = await client.realtime.calls.with_raw_response.create(
                sdp=await peer.offer(),
                session={"type": "realtime", "model": "echo", "instructions": "Answer briefly.",
                         "audio": {"output": {"voice": "alloy"}}},
                extra_query={"extensions": "1"},  # our per-turn metrics event too
            )
            assert raw.http_response.status_code == 201
            location = raw.headers["location"]
            call_id = location.rsplit("/", 1)[-1]
            assert location == f"/v1/realtime/calls/{call_id}" and call_id in app[SESSIONS]
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=raw.http_response.text, type="answer"))
            await asyncio.wait_for(peer.opened.wait(), 20)
            first = await peer.wait("session.created")
            assert peer.events[0] is first and first["session"]["instructions"] == "Answer briefly."

            peer.mic.play(load_utterance(shared_audio / "en_weather.wav"))
            done = await peer.wait("response.done")
            assert done["response"]["status"] == "completed", done
            await peer.wait("output_audio_buffer.stopped")
            types = [e["type"] for e in peer.events]
            for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                         "response.created", "output_audio_buffer.started", "response.output_audio_transcript.done",
                         "assistant.turn_metrics"):
                assert kind in types, (kind, types)
            assert "response.output_audio.delta" not in types  # over WebRTC the audio is on the track
            said = next(e for e in peer.events if e["type"] == "response.output_audio_transcript.done")
            assert "weather" in said["transcript"].lower()
            audio = np.concatenate(peer.heard)
            assert "weather" in (await services.asr.transcribe(audio[-8 * SPEECH_RATE:])).text.lower()

            await client.realtime.calls.hangup(call_id)
            assert call_id not in app[SESSIONS]
            with pytest.raises(openai.NotFoundError):
                await client.realtime.calls.hangup(call_id)
        finally:
            await peer.close()


async def test_ice_servers_and_bad_calls(services: Services) -> None:
    cfg = test_config(ice={"stun_urls": ["stun:stun.example.org:3478"], "turn_urls": ["turn:127.0.0.1:3478"],
                           "turn_secret": "s3cret"})
    async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/realtime/ice-servers") as r:
            body = await r.json()
        assert r.status == 200 and body["ice_servers"][0]["urls"] == ["stun:stun.example.org:3478"]
        assert body["ice_servers"][1]["username"] and body["expires_at"] > time.time()
        async with http.post(f"{url}/v1/realtime/calls", data="hello", headers={"Content-Type": "text/plain"}) as r:
            err = await r.json()
        assert r.status == 415 and set(err["error"]) == {"message", "type", "param", "code"}
        form = aiohttp.FormData()
        form.add_field("sdp", "v=0\r\n", content_type="application/sdp")
        form.add_field("session", json.dumps({"type": "realtime", "audio": {"output": {"format": {
            "type": "audio/mp3"}}}}), content_type="application/json")
        async with http.post(f"{url}/v1/realtime/calls", data=form) as r:
            err = await r.json()
        assert r.status == 400 and err["error"]["param"] == "session.audio.output.format.type", err


async def test_bench_realtime_client_measures_a_turn(services: Services, shared_audio) -> None:
    async with serve(test_config(), services) as (url, app), aiohttp.ClientSession() as http:
        client = RealtimeBenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            result = await client.run_turn(load_utterance(shared_audio / "en_timer.wav"), 0,
                                           TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300))
        finally:
            await client.close()
        assert not app[SESSIONS]  # hung up
    assert result.status == "ok", result.reason
    assert "timer" in result.transcript.lower() and "timer" in result.reply_text.lower()
    assert result.columns["v2v_ms"] > 0 and result.columns["server_v2v_ms"] > 0


async def test_truncate_clear_and_a_control_socket_beside_the_call(services: Services) -> None:
    """Over WebRTC a truncate during playback works (the item's length is what the track played), clearing the
    output cancels with one output_audio_buffer.cleared, and a server-side WebSocket attached with ?call_id= gets
    the call's events and drives it."""
    async with serve(test_config(), services) as (url, app), aiohttp.ClientSession() as http:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        peer = Peer()
        try:
            raw = await client.realtime.calls.with_raw_response.create(
                sdp=await peer.offer(), session={"type": "realtime", "model": "echo"})
            call_id = raw.headers["location"].rsplit("/", 1)[-1]
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=raw.http_response.text, type="answer"))
            await asyncio.wait_for(peer.opened.wait(), 20)
            await peer.wait("session.created")

            def send(event: dict[str, Any]) -> None:
                peer.channel.send(json.dumps(event))

            send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Tell me a short story about a cat who learns to play the piano"}]}})
            send({"type": "response.create"})
            started = await peer.wait("output_audio_buffer.started")
            item_id = (await peer.wait("response.output_item.added"))["item"]["id"]
            while sum(len(f) for f in peer.heard) < SPEECH_RATE * 0.6:  # the track has played a while
                await asyncio.sleep(0.05)
            since = len(peer.events)
            send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 400})
            cut = await peer.wait("conversation.item.truncated", since=since)
            assert cut["audio_end_ms"] == 400
            send({"type": "output_audio_buffer.clear"})
            done = await peer.wait("response.done", since=since)
            assert done["response"]["status"] == "cancelled"
            await asyncio.sleep(0.5)
            after = peer.events[since:]
            cleared = [e for e in after if e["type"] == "output_audio_buffer.cleared"]
            assert [e["response_id"] for e in cleared] == [started["response_id"]]
            assert [e["type"] for e in after].count("conversation.item.truncated") == 1  # the client's cut stands
            assert not [e for e in after if e["type"] == "error"]

            ws_url = url.replace("http", "ws", 1) + f"/v1/realtime?call_id={call_id}"
            async with http.ws_connect(ws_url) as ws:
                first = json.loads((await ws.receive(timeout=10)).data)
                assert first["type"] == "session.created" and first["session"]["type"] == "realtime"
                since = len(peer.events)
                await ws.send_str(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi there"}]}}))
                await ws.send_str(json.dumps({"type": "response.create"}))
                seen: list[str] = []
                while "response.done" not in seen:
                    seen.append(json.loads((await ws.receive(timeout=30)).data)["type"])
                assert "response.created" in seen
                assert (await peer.wait("response.done", since=since))["response"]["status"] == "completed"
                assert len(app[SESSIONS]) == 1  # the control socket is no session of its own
                await client.realtime.calls.hangup(call_id)
                closed = await ws.receive(timeout=10)
                while closed.type is aiohttp.WSMsgType.TEXT:  # the call's last events, then the close
                    closed = await ws.receive(timeout=10)
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            async with http.get(ws_url.replace("ws", "http", 1), headers={"Upgrade": "websocket",
                                                                          "Connection": "Upgrade"}) as r:
                assert r.status in (400, 404)
        finally:
            await peer.close()
