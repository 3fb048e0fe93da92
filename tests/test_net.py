"""Calls that connect from anywhere: a TURN-only call through a real coturn, a WHIP-only client, bad signaling
input, and HTTPS/WSS with a self-signed certificate. Real aiortc peers and the real app on loopback."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from assistant.bench.audio_source import UtteranceSource, load_utterance
from assistant.bench.v2v import BenchSession, ReplyListener, TurnSettings
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from assistant.server.voice.sdpfrag import build_sdpfrag, ice_credentials
from tests.conftest import self_signed_cert, serve, test_config
from tests.turnserver import TurnServer
from tests.waiting import until
from tests.webrtc_client import rtc_configuration_from_json

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)
TOKEN = "net-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _candidates(sdp: str) -> list[str]:
    return [line for line in sdp.splitlines() if line.startswith("a=candidate:")]


async def test_relay_only_call_through_coturn(services: Services, shared_audio: Path, turn_server: TurnServer) -> None:
    """Both peers on relay policy with TURN REST credentials: the call can only work through coturn."""
    cfg = test_config(
        ice={"turn_urls": [turn_server.url], "turn_secret": turn_server.secret, "transport_policy": "relay"}
    )
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/ice") as r:
            assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
            ice = await r.json()
        assert ice["iceTransportPolicy"] == "relay"
        (turn,) = ice["iceServers"]
        assert turn["urls"] == [turn_server.url] and int(turn["username"].split(":")[0]) > time.time()
        client = BenchSession(index=0, url=url, http=http, rtc_config=rtc_configuration_from_json(ice))
        await client.connect()
        try:
            session = app[SESSIONS][client.session_id]
            # Only relay candidates on either side: no host path exists to fall back on.
            for sdp in (client.pc.localDescription.sdp, session.pc.localDescription.sdp):
                assert _candidates(sdp) and all(" typ relay " in c for c in _candidates(sdp)), sdp
            result = await client.run_turn(load_utterance(shared_audio / "en_weather.wav"), 0, SETTINGS)
        finally:
            await client.close()
    assert result.status == "ok", result.reason
    assert "weather" in result.transcript.lower() and "weather" in result.reply_text.lower()
    assert result.columns["v2v_ms"] > 0  # an audible reply came back through the relay


class WhipClient:
    """A client that speaks WHIP only: SDP bodies, Location, PATCH with trickled candidates, DELETE. No data
    channel, so the server's events never reach it; it hears the reply on the audio track."""

    def __init__(self, base: str, http: aiohttp.ClientSession) -> None:
        self.base, self.http = base, http
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.source = UtteranceSource()
        self.listener = ReplyListener()
        self.location = self.etag = ""
        self.links: list[str] = []
        self._rx: asyncio.Task | None = None

        @self.pc.on("track")
        def _on_track(track) -> None:  # type: ignore[no-untyped-def]
            self._rx = asyncio.create_task(self.listener.run(track))

    async def connect(self) -> None:
        pc = self.pc
        pc.addTransceiver(self.source, direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers all candidates into the offer
        full = pc.localDescription.sdp
        # Trickle them instead: the offer goes without candidates, the candidates follow in a PATCH.
        bare = "".join(
            line + "\r\n"
            for line in full.splitlines()
            if not line.startswith("a=candidate:") and line != "a=end-of-candidates"
        )
        async with self.http.post(
            f"{self.base}/api/whip", data=bare, headers={**AUTH, "Content-Type": "application/sdp"}
        ) as r:
            assert r.status == 201, await r.text()
            assert r.content_type == "application/sdp"
            self.location, self.etag = r.headers["Location"], r.headers["ETag"]
            self.links = r.headers.getall("Link", [])
            answer = await r.text()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        ufrag, pwd = ice_credentials(full)
        mid = pc.getTransceivers()[0].mid
        frag = build_sdpfrag(ufrag, pwd, [(mid, c[2:]) for c in _candidates(full)], end_of_candidates=True)
        headers = {**AUTH, "Content-Type": "application/trickle-ice-sdpfrag", "If-Match": self.etag}
        async with self.http.patch(self.base + self.location, data=frag, headers=headers) as r:
            assert r.status == 204, await r.text()

    async def close(self) -> int:
        async with self.http.delete(self.base + self.location, headers=AUTH) as r:
            status = r.status
        self.source.stop()
        await self.pc.close()
        if self._rx is not None:
            self._rx.cancel()
        return status


async def test_whip_only_client_holds_a_turn(services: Services, shared_audio: Path, turn_server: TurnServer) -> None:
    cfg = test_config(
        server={"auth_token": TOKEN}, ice={"turn_urls": [turn_server.url], "turn_secret": turn_server.secret}
    )
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/whip", data="v=0\r\n", headers={"Content-Type": "application/sdp"}) as r:
            assert r.status == 401  # the bearer token applies to WHIP too
        client = WhipClient(url, http)
        await client.connect()
        session = app[SESSIONS][client.location.rsplit("/", 1)[1]]
        assert client.links and 'rel="ice-server"' in client.links[0] and "credential=" in client.links[0]
        utt = load_utterance(shared_audio / "en_weather.wav")
        client.source.play(utt, on_speech_end=client.listener.arm)
        await until(lambda: client.listener.heard_at is not None, "an audible reply at the WHIP client", 60)
        assert session.conversation.turns >= 1
        assert session.events._channel is None  # no events channel was offered, the reply came all the same
        assert await client.close() == 200
        assert session.closed and session.close_reason == "hangup"


async def test_bad_signaling_input_gets_4xx_and_spares_other_sessions(services: Services) -> None:
    cfg = test_config(server={"max_sdp_bytes": 4096}, ice={"max_fragment_bytes": 1024, "max_remote_candidates": 4})
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        other = BenchSession(index=0, url=url, http=http)
        await other.connect()
        try:
            bystander = app[SESSIONS][other.session_id]
            resource = f"{url}/api/sessions/{other.session_id}"

            async def call(method: str, path: str, body: str, ctype: str, **headers: str) -> tuple[int, dict]:
                async with http.request(method, path, data=body, headers={"Content-Type": ctype, **headers}) as r:
                    return r.status, await r.json(content_type=None)

            whip, sdp, frag = f"{url}/api/whip", "application/sdp", "application/trickle-ice-sdpfrag"
            assert (await call("POST", whip, "v=0\r\n", "application/json"))[0] == 415
            status, body = await call("POST", whip, "hello", sdp)
            assert status == 400 and body["error"] == "bad_offer"
            status, body = await call("POST", whip, "v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\n", sdp)
            assert status == 400 and "Traceback" not in str(body)
            assert (await call("POST", whip, "v=0\r\n" + "a=x\r\n" * 2000, sdp))[0] == 413
            status, body = await call("POST", f"{whip}?voice=../etc", "v=0\r\n", sdp)
            assert status == 400 and "voice" in body["detail"]
            good = build_sdpfrag("abcd", "x" * 22, [("0", "candidate:1 1 udp 1 127.0.0.1 9 typ host")])
            status, body = await call("PATCH", f"{url}/api/sessions/nope", good, frag)
            assert status == 404 and body["error"] == "unknown_session"
            assert (await call("PATCH", resource, good, "text/plain"))[0] == 415
            assert (await call("PATCH", resource, good + "a=x\r\n" * 400, frag))[0] == 413
            status, body = await call("PATCH", resource, "a=candidate:garbage", frag)
            assert status == 400 and body["error"] == "bad_fragment"
            status, body = await call("PATCH", resource, good, frag)  # not the offer's ufrag: an ICE restart
            assert status == 422 and body["error"] == "ice_restart_unsupported"
            assert (await call("PATCH", resource, good, frag, **{"If-Match": '"stale"'}))[0] == 412
            many = "\r\n".join(f"a=candidate:1 1 udp 1 127.0.0.1 {9 + i} typ host" for i in range(5))
            status, body = await call("PATCH", resource, many, frag)
            assert status == 400 and "more than 4" in body["detail"]
            few = "\r\n".join(f"a=candidate:1 1 udp 1 127.0.0.1 {9 + i} typ host" for i in range(3))
            assert (await call("PATCH", resource, few, frag))[0] == 204
            status, body = await call("PATCH", resource, few, frag)  # 6 in all: past the session's 4
            assert status == 422 and body["error"] == "too_many_candidates"
            # The session all this was aimed at, or beside, is untouched and still the only one.
            assert list(app[SESSIONS]) == [other.session_id]
            assert not bystander.closed and bystander.pc.connectionState == "connected"
        finally:
            await other.close()


async def test_https_and_wss_with_a_self_signed_certificate(services: Services, tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    cfg = test_config(server={"tls_cert": str(cert), "tls_key": str(key)})
    trust = ssl.create_default_context(cafile=str(cert))
    async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
        assert url.startswith("https://")
        async with http.get(f"{url}/healthz", ssl=trust) as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # not trusted without the certificate
            async with http.get(f"{url}/healthz") as r:
                pass
        wss = url.replace("https://", "wss://") + "/ws/tts"
        pcm, end = 0, False
        async with http.ws_connect(wss, ssl=trust) as ws:
            await ws.send_json({"text": "Hello over TLS."})
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY and msg.data == b"END":
                    end = True
                    break
                if msg.type == aiohttp.WSMsgType.TEXT:  # metadata; an error would say "error"
                    assert "error" not in msg.json(), msg.data
                    continue
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                pcm += len(msg.data)
        assert end and pcm > 8000  # real speech came back over WSS
