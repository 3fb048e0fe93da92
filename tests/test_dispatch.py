"""Several gateways behind ``assistant dispatch``: two real gateway processes (``assistant serve`` with a
gateway_id, one session slot each), the real dispatcher app, real aiortc peers talking through it on loopback.

The gateways load once per module (faster-whisper tiny.en, Silero, Smart Turn and Piper each). The last test
kills one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio
import websockets
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from assistant.bench.audio_source import UtteranceSource, load_utterance
from assistant.bench.processes import AssistantProcess, free_port, start_assistant, stop, wait_ready
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.cli import main
from assistant.config import ConfigError, check_gateway_id
from assistant.server.dispatch.app import create_dispatch_app
from assistant.server.local import serve_on_loopback
from assistant.server.voice.sdpfrag import build_sdpfrag, ice_credentials
from assistant.server.voice.session import new_session_id
from tests.conftest import REPO, test_config

SETTINGS = TurnSettings(timeout_s=40.0, silence_ms=1200, settle_ms=300)
GATEWAYS = ("gA", "gB")
SDPFRAG = "application/trickle-ice-sdpfrag"
DISPATCH = {"poll_interval_s": 0.5}


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, AssistantProcess]]:
    """``python -m assistant serve`` twice, as an operator starts them on one node (loopback ICE for the test)."""
    folder = tmp_path_factory.mktemp("gateways")
    started: dict[str, AssistantProcess] = {}
    try:
        for gid in GATEWAYS:
            started[gid] = start_assistant(gid, "serve", [
                "--server.gateway_id", gid, "--server.max_sessions", "1", "--server.idle_timeout_s", "30",
                "--server.data_dir", str(folder / gid), "--tts_api.rate_per_minute", "0",
                "--respond.engine", "echo"], folder, cwd=REPO)
        wait_ready(list(started.values()), timeout_s=150)
        yield started
    finally:
        stop(list(started.values()))


@contextlib.asynccontextmanager
async def dispatcher(
    urls: list[str], server: dict[str, object] | None = None, **dispatch: object
) -> AsyncIterator[tuple[str, web.Application]]:
    """The dispatcher app on a free port in front of the gateways at ``urls`` (it polls them once at start)."""
    cfg = test_config(dispatch={"gateways": urls, **DISPATCH, **dispatch}, server=server or {})
    app = create_dispatch_app(cfg)  # type: ignore[arg-type]
    async with serve_on_loopback(app) as url:
        yield url, app


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def front(gateways: dict[str, AssistantProcess]) -> AsyncIterator[str]:
    async with dispatcher([g.url for g in gateways.values()]) as (url, _app):
        async with aiohttp.ClientSession() as http, http.get(f"{url}/readyz") as r:
            body = await r.json()
        assert r.status == 200 and [g["state"] for g in body["gateways"]] == ["ready", "ready"], body
        yield url


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def wait_idle(http: aiohttp.ClientSession, front: str) -> None:
    """Until the dispatcher's heartbeat has seen every live gateway with no session (earlier tests' are closed)."""
    for _ in range(100):
        async with http.get(f"{front}/readyz") as r:
            body = await r.json()
        if all(g["sessions"] == 0 for g in body["gateways"] if g["state"] == "ready"):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"sessions left open: {body}")


async def connect(url: str, http: aiohttp.ClientSession, index: int = 0) -> BenchSession:
    client = BenchSession(index=index, url=url, http=http)
    await client.connect()
    return client


async def gateway_sessions(http: aiohttp.ClientSession, g: AssistantProcess) -> set[str]:
    async with http.get(f"{g.url}/api/sessions") as r:
        return {s["session_id"] for s in (await r.json())["sessions"]}


async def offer_sdp() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver(UtteranceSource(), direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def counter(http: aiohttp.ClientSession, url: str, sample: str) -> float:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


# --- without processes -----------------------------------------------------------------------------------
def test_gateway_id_names_sessions_and_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    sid = new_session_id("gA")
    assert sid.startswith("gA.") and sid.count(".") == 1  # token_urlsafe has no dot: the first dot ends the id
    assert "." not in new_session_id()
    assert check_gateway_id("node-3_b") == "node-3_b"
    for bad in ("g.A", "a" * 33, "g A", "gé"):
        with pytest.raises(ConfigError, match="gateway_id"):
            check_gateway_id(bad)
    assert main(["serve", "--server.gateway_id", "bad.id"]) == 2  # refused before anything loads
    assert "server.gateway_id" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "dispatch.gateways is empty"),
        (["--dispatch.gateways", "ftp://10.0.0.5:21"], "http:// or https://"),
        (["--dispatch.gateways", "http://a:1,http://a:1/"], "named twice"),
        (["--dispatch.gateways", "http://a:1?x=1"], "base URL"),
        (["--dispatch.gateways", "http://a:1", "--dispatch.request_timeout_s", "10"], "must exceed"),
    ],
)
def test_dispatch_config_is_checked(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dispatch", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.asyncio(loop_scope="module")
async def test_dispatcher_guards_like_the_server() -> None:
    """Token, CORS and the page as on a gateway; nothing answers at the one gateway URL: not_ready, not a crash."""
    token, origin = "s3cret", "https://app.example"
    server = {"auth_token": token, "cors_origins": [origin]}
    async with dispatcher([f"http://127.0.0.1:{free_port()}"], server) as (url, _app), aiohttp.ClientSession() as http:
        for path in ("/", "/healthz", "/static/app.js"):
            async with http.get(url + path) as r:
                assert r.status == 200, path
        async with http.get(f"{url}/readyz") as r:  # the public learn only that it is not ready
            assert r.status == 503 and await r.json() == {"status": "no_gateway"}
        auth = {"Authorization": f"Bearer {token}"}
        async with http.get(f"{url}/readyz", headers=auth) as r:
            body = await r.json()
        assert r.status == 503 and body["gateways"][0]["state"] == "down"
        for method, path in (("POST", "/api/offer"), ("GET", "/api/ice"), ("GET", "/v1/models"), ("GET", "/ws/tts")):
            async with http.request(method, url + path) as r:
                error = (await r.json())["error"]
                assert r.status == 401, path
                assert (error["code"] if path.startswith("/v1/") else error) in ("unauthorized", "invalid_api_key")
        async with http.post(f"{url}/api/offer", json={"sdp": "v=0", "type": "offer"}, headers=auth) as r:
            assert r.status == 503 and (await r.json())["error"] == "not_ready" and "Retry-After" in r.headers
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # the token by query, as the page sends it
            await http.ws_connect(f"{url}/ws/tts?token={token}")
        assert refused.value.status == 503
        async with http.options(f"{url}/api/offer", headers={"Origin": origin}) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == origin


# --- through the dispatcher ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_gateway_readyz_reports_its_load(gateways, http) -> None:
    async with http.get(f"{gateways['gA'].url}/readyz") as r:
        body = await r.json()
    assert r.status == 200 and body["status"] == "ready"
    assert (body["gateway"], body["sessions"], body["max_sessions"]) == ("gA", 0, 1)


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_two_peers_land_on_different_gateways_and_hear_replies(front, http, shared_audio) -> None:
    await wait_idle(http, front)
    clients = [await connect(front, http, i) for i in range(2)]
    try:
        assert {c.session_id.split(".")[0] for c in clients} == {"gA", "gB"}, [c.session_id for c in clients]
        files = {"en_weather.wav": "weather", "en_timer.wav": "timer"}
        results = await asyncio.gather(*(
            c.run_turn(load_utterance(shared_audio / name), 0, SETTINGS)
            for c, name in zip(clients, files, strict=True)
        ))
    finally:
        for c in clients:
            await c.close()
    for result, word in zip(results, files.values(), strict=True):
        assert result.status == "ok", result.reason
        assert word in result.transcript.lower(), result.transcript
        assert word in result.reply_text.lower()  # the echo responder, heard on this session's own track
        assert result.columns["v2v_ms"] > 0  # an audible reply sample arrived


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_sessions_route_by_prefix_and_all_full_is_busy(front, gateways, http) -> None:
    await wait_idle(http, front)
    clients = [await connect(front, http, i) for i in range(2)]
    pc, sdp = await offer_sdp()
    try:
        owner = {c.session_id.split(".")[0]: c.session_id for c in clients}
        async with http.get(f"{front}/api/sessions") as r:
            listed = {s["session_id"] for s in (await r.json())["sessions"]}
        assert listed == set(owner.values())  # both gateways' lists, merged
        # Both gateways hold their one session: the dispatcher answers busy itself.
        async with http.post(f"{front}/api/offer", json={"sdp": sdp, "type": "offer"}) as r:
            body = await r.json()
        assert r.status == 503 and body["error"] == "busy" and int(r.headers["Retry-After"]) > 0, body
        # DELETE through the dispatcher reaches the gateway the id names, and only that one.
        async with http.delete(f"{front}/api/sessions/{owner['gA']}") as r:
            assert r.status == 200, await r.text()
        clients[[c.session_id for c in clients].index(owner["gA"])].session_id = ""  # already hung up
        assert await gateway_sessions(http, gateways["gA"]) == set()
        assert await gateway_sessions(http, gateways["gB"]) == {owner["gB"]}
        # The freed slot takes the next offer at once, before any heartbeat.
        async with http.post(f"{front}/api/offer", json={"sdp": sdp, "type": "offer"}) as r:
            body = await r.json()
        assert r.status == 200 and body["session_id"].startswith("gA."), body
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        async with http.delete(f"{front}/api/sessions/{body['session_id']}") as r:
            assert r.status == 200
    finally:
        await pc.close()
        for c in clients:
            await c.close()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_full_gateway_answers_busy_and_the_offer_moves_on(front, gateways, http) -> None:
    await wait_idle(http, front)
    # A second dispatcher whose view goes stale (no heartbeat after the first): it believes gA is free.
    async with dispatcher([g.url for g in gateways.values()], poll_interval_s=3600) as (stale, _app):
        direct = await connect(gateways["gA"].url, http)  # gA's one slot, taken behind the dispatcher's back
        try:
            moved = await connect(stale, http, 1)
            try:
                assert moved.session_id.startswith("gB."), moved.session_id
            finally:
                await moved.close()
            assert await counter(http, stale, 'assistant_dispatch_offers_total{gateway="gA",outcome="busy"}') == 1
            assert await counter(http, stale, 'assistant_dispatch_offers_total{gateway="gB",outcome="ok"}') == 1
        finally:
            await direct.close()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_whip_and_trickle_through_the_dispatcher(front, http) -> None:
    await wait_idle(http, front)
    pc, full = await offer_sdp()
    try:
        bare = "".join(line + "\r\n" for line in full.splitlines()
                       if not line.startswith("a=candidate:") and line != "a=end-of-candidates")
        async with http.post(f"{front}/api/whip", data=bare, headers={"Content-Type": "application/sdp"}) as r:
            assert r.status == 201, await r.text()
            location, etag = r.headers["Location"], r.headers["ETag"]
            assert r.content_type == "application/sdp" and r.headers["Accept-Patch"] == SDPFRAG
            answer = await r.text()
        assert location.startswith("/api/sessions/g"), location
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        ufrag, pwd = ice_credentials(full)
        mid = pc.getTransceivers()[0].mid
        candidates = [(mid, line[2:]) for line in full.splitlines() if line.startswith("a=candidate:")]
        frag = build_sdpfrag(ufrag, pwd, candidates, end_of_candidates=True)
        # A stale ETag is the owner's 412, relayed; the right one is taken.
        async with http.patch(front + location, data=frag, headers={"Content-Type": SDPFRAG, "If-Match": '"x"'}) as r:
            assert r.status == 412
        async with http.patch(front + location, data=frag, headers={"Content-Type": SDPFRAG, "If-Match": etag}) as r:
            assert r.status == 204, await r.text()
        for _ in range(200):  # the trickled candidates reached the owner: the peer connects to it directly
            if pc.connectionState == "connected":
                break
            await asyncio.sleep(0.05)
        assert pc.connectionState == "connected"
        for unknown in ("gZ.abc", "nodot"):
            async with http.patch(f"{front}/api/sessions/{unknown}", data=frag, headers={"Content-Type": SDPFRAG}) as r:
                assert r.status == 404 and (await r.json())["error"] == "unknown_session"
        async with http.delete(front + location) as r:
            assert r.status == 200
    finally:
        await pc.close()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_oversize_bodies_are_refused_before_forwarding(front, http) -> None:
    before = await counter(http, front, "assistant_dispatch_offers_total{")
    big = {"sdp": "v=0\r\n" + "a=x\r\n" * 60_000, "type": "offer"}  # over server.max_body_bytes (256 KiB)
    async with http.post(f"{front}/api/offer", json=big) as r:
        assert r.status == 413 and (await r.json())["error"] == "too_large"
    async with http.post(f"{front}/api/whip", data="v=0\r\n" + "a=x\r\n" * 20_000,
                         headers={"Content-Type": "application/sdp"}) as r:  # over server.max_sdp_bytes
        assert r.status == 413
    assert await counter(http, front, "assistant_dispatch_offers_total{") == before  # no gateway was asked


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_tts_http_and_websocket_through_the_dispatcher(front, http) -> None:
    async with http.post(f"{front}/api/tts", json={"text": "Hello there, how are you?"}) as r:
        wav = await r.read()
        assert r.status == 200 and r.content_type == "audio/wav", wav[:200]
    assert wav[:4] == b"RIFF" and len(wav) > 22_050  # over half a second of 22 kHz s16
    async with http.post(f"{front}/api/tts", json={"text": "Streaming now.", "streaming": True}) as r:
        pcm = await r.read()
        assert r.status == 200 and len(pcm) > 8_000
    async with http.get(f"{front}/api/stages") as r:
        assert r.status == 200 and (await r.json())["stages"]
    ws_url = front.replace("http://", "ws://") + "/ws/tts"
    chunks: list[bytes] = []
    async with websockets.connect(ws_url) as ws:  # the plain client of issue 12, through the proxy
        assert int(ws.response.headers["X-Sample-Rate"]) > 0
        await ws.send(json.dumps({"text": "Hello through the dispatcher."}))
        while (chunk := await ws.recv()) != b"END":
            chunks.append(chunk)
    assert chunks and all(isinstance(c, bytes) for c in chunks) and sum(map(len, chunks)) > 8_000
    # The gateway's close (code and reason) reaches the client through the proxy.
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"text": ""}))
        error = json.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert error["error"] and closed.value.rcvd is not None and closed.value.rcvd.code == 4400


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_realtime_websocket_through_the_dispatcher(gateways, http) -> None:
    """OpenAI's Realtime WebSocket through the front: the subprotocols the client offers reach the gateway (the
    beta marker picks the beta dialect), the one it picks comes back, and a browser's key as a subprotocol passes
    the front's token check."""
    token = "s3cret-front"
    async with dispatcher([g.url for g in gateways.values()], server={"auth_token": token}) as (url, _app):
        ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url, protocols=("realtime",))
        assert refused.value.status == 401
        offered = ("realtime", "openai-beta.realtime-v1", f"openai-insecure-api-key.{token}")
        async with http.ws_connect(ws_url, protocols=offered) as ws:
            assert ws.protocol == "realtime"
            first = await ws.receive_json(timeout=30)
            assert first["type"] == "session.created", first
            assert "turn_detection" in first["session"]  # the beta dialect's flat session object
            await ws.send_json({"type": "no.such.event"})
            error = await ws.receive_json(timeout=30)
            assert error["type"] == "error", error
        # A call's control socket goes to the gateway its call id names: an id no gateway holds is refused here.
        with pytest.raises(aiohttp.WSServerHandshakeError) as unknown:
            await http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime?call_id=gZ.nope",
                                  headers={"Authorization": f"Bearer {token}"})
        assert unknown.value.status == 404
        with pytest.raises(aiohttp.WSServerHandshakeError) as gone:  # gA's own answer: it holds no such call
            await http.ws_connect(url.replace("http://", "ws://") + "/v1/realtime?call_id=gA.nope",
                                  headers={"Authorization": f"Bearer {token}"})
        assert gone.value.status == 404


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_down_gateway_is_skipped(front, gateways, http) -> None:
    """Last: kills gB. Offers land on gA whether the dispatcher has noticed yet or not."""
    await wait_idle(http, front)
    gateways["gB"].proc.kill()
    gateways["gB"].proc.wait(10)
    for _ in range(2):
        client = await connect(front, http)
        try:
            assert client.session_id.startswith("gA."), client.session_id
        finally:
            await client.close()
    async with http.get(f"{front}/readyz") as r:
        body = await r.json()
    assert r.status == 200 and {g["gateway"]: g["state"] for g in body["gateways"]} == {"gA": "ready", "gB": "down"}
    assert await counter(http, front, "assistant_dispatch_gateways_up ") == 1
    async with http.get(f"{front}/api/sessions") as r:
        assert r.status == 200 and (await r.json())["sessions"] == []
