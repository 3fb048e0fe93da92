"""Every bound the server promises, checked by behaviour against the real app and real aiortc peers.

Session slots, body and SDP caps, TTS text and upload caps, the per-session queues (reply track ≤
``reply_queue_ms``, synthesis ahead of playout, text ahead of synthesis, inbound frames), reaping of idle,
half-open and never-connected peers, task ownership, and the security rules (bearer token, CORS, no stack
traces, voice ids that could be paths).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from assistant.audio import write_wav_bytes
from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession
from assistant.pipeline.turn_runner import PCM_AHEAD_CHUNKS, TTS_TEXT_QUEUE
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from assistant.server.voice.signaling import CONNECT_GRACE_S
from tests.conftest import serve, test_config
from tests.fault_engines import FaultyTTS, FloodResponder, ToneTTS

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

TRACE_MARKERS = ("Traceback", 'File "', "site-packages")


def cfg(tmp_path: Any, **sections: dict[str, Any]) -> Any:
    server = {"data_dir": str(tmp_path / "data"), **sections.pop("server", {})}
    return test_config(server=server, **sections)


def own_tasks() -> list[asyncio.Task[Any]]:
    """Tasks of the app and its sessions (not aiohttp's per-connection request handlers)."""
    return [t for t in asyncio.all_tasks() if "RequestHandler" not in repr(t.get_coro())]


async def wait_for(pred: Any, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


async def raw_offer(http: aiohttp.ClientSession, url: str, **body: Any) -> tuple[RTCPeerConnection, int, dict]:
    """Post a real browser-like offer and never connect (the peer exists only on paper)."""
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    payload = {"sdp": pc.localDescription.sdp, "type": "offer", **body}
    async with http.post(f"{url}/api/offer", json=payload) as r:
        return pc, r.status, await r.json(content_type=None)


def vanish(client: BenchSession) -> None:
    """From now on every packet the client would send is dropped: no BYE, no DTLS close, no ICE checks.

    That is a peer whose machine went away (a laptop lid closed, a network cut), not one that hung up.
    """
    ice = client.pc.sctp.transport.transport  # RTCSctpTransport → RTCDtlsTransport → RTCIceTransport

    async def _drop(*_: Any) -> None:
        return None

    for protocol in ice._connection._protocols:
        protocol.send_data = _drop
        protocol.send_stun = lambda *_: None
    client.source.stop()


def events(client: BenchSession, kind: str) -> list[dict]:
    return [e.body for e in client.events if e.body.get("type") == kind]


# --- sessions and bodies -------------------------------------------------------------------------------
async def test_sessions_past_max_get_503_with_a_reason(services: Services, tmp_path) -> None:
    c = cfg(tmp_path, server={"max_sessions": 2, "max_connecting_per_client": 4})
    async with serve(c, services) as (url, app), \
            aiohttp.ClientSession() as http:
        pcs = []
        for _ in range(2):
            pc, status, body = await raw_offer(http, url)
            pcs.append(pc)
            assert status == 200, body
        for session in app[SESSIONS].values():  # still connecting, and within the grace an offer cannot take
            session.created = time.monotonic() + 60
        pc, status, body = await raw_offer(http, url)
        pcs.append(pc)
        assert status == 503 and body["error"] == "busy" and "2 session slots" in body["detail"], body
        stale = next(iter(app[SESSIONS].values()))
        stale.created -= 120.0  # past the grace: a real call may take its slot
        pc, status, body = await raw_offer(http, url)
        pcs.append(pc)
        assert status == 200 and stale.close_reason == "connect_evicted", body
        assert len(app[SESSIONS]) == 2
        first = next(iter(app[SESSIONS]))
        async with http.delete(f"{url}/api/sessions/{first}") as r:
            assert r.status == 200
        pc, status, body = await raw_offer(http, url)  # a freed slot is usable at once
        pcs.append(pc)
        assert status == 200, body
        for pc in pcs:
            await pc.close()


async def test_body_and_sdp_caps_answer_413(services: Services, tmp_path) -> None:
    c = cfg(tmp_path, server={"max_body_bytes": 4096, "max_sdp_bytes": 1024})
    async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
        async def post(path: str, data: Any, ctype: str = "application/json") -> tuple[int, dict]:
            async with http.post(f"{url}{path}", data=data, headers={"Content-Type": ctype}) as r:
                return r.status, await r.json(content_type=None)

        big = b'{"sdp": "v=0' + b"x" * 5000 + b'", "type": "offer"}'
        assert (await post("/api/offer", big))[0] == 413

        async def chunked() -> Any:  # no Content-Length: the cap must hold on the bytes actually read
            for _ in range(10):
                yield b" " * 1000

        status, body = await post("/api/offer", chunked())
        assert status == 413 and body["error"] == "too_large", body
        sdp = "v=0\r\n" + "a=x\r\n" * 400  # 2 kB of SDP in a 2 kB body: under the body cap, over the SDP cap
        status, body = await post("/api/offer", json.dumps({"sdp": sdp, "type": "offer"}))
        assert status == 413 and "sdp over 1024" in body["detail"], body
        # The TTS JSON cap is the body cap plus room for a base64 reference clip, and no more.
        huge = b'{"text": "' + b"a" * (c.server.max_body_bytes + c.tts_api.max_upload_bytes * 2) + b'"}'
        assert (await post("/api/tts", huge))[0] == 413
        assert not app[SESSIONS]


async def test_tts_text_and_upload_caps(services: Services, tmp_path) -> None:
    c = cfg(tmp_path, tts={"max_text_chars": 40}, tts_api={"max_upload_bytes": 200_000, "max_upload_seconds": 5.0})
    sr = 16_000

    def clip(seconds: float) -> bytes:
        t = np.arange(int(seconds * sr)) / sr
        return write_wav_bytes((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), sr)

    async with serve(c, services) as (url, _), aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/tts", json={"text": "a" * 41}) as r:
            assert r.status == 413 and (await r.json())["error"] == "text_too_long"
        async with http.post(f"{url}/api/tts", json={"text": "Forty characters, said in one breath ok."}) as r:
            assert r.status == 200 and r.content_type == "audio/wav"
        cases = [
            ({"clip": b"\x00" * 200_001, "transcript": "hi"}, 413, "too_large"),
            ({"clip": clip(6.0), "transcript": "hi"}, 413, "clip_too_long"),
            ({"clip": clip(0.2), "transcript": "hi"}, 400, "clip_too_short"),
            ({"clip": clip(3.0), "transcript": "t" * 41}, 413, "too_large"),
        ]
        for parts, status, error in cases:
            form = aiohttp.FormData()
            form.add_field("clip", parts["clip"], filename="c.wav", content_type="audio/wav")
            form.add_field("transcript", parts["transcript"])
            async with http.post(f"{url}/api/voices", data=form) as r:
                got = await r.json()
                assert (r.status, got["error"]) == (status, error), got
        form = aiohttp.FormData()
        form.add_field("request", '{"text": "hi"}')
        form.add_field("speaker_wav", b"\x00" * 200_001, filename="big.wav")
        async with http.post(f"{url}/api/tts", data=form) as r:
            assert r.status == 413


# --- queues --------------------------------------------------------------------------------------------
async def test_queues_stay_bounded_while_a_fast_tts_floods_the_reply(services: Services, tmp_path, shared_audio):
    """An instant TTS and a responder with 400 sentences: everything between them and the peer stays small.

    ``tts.timeout_s`` is set below the length of one synthesis' audio on purpose: the limit is on the
    engine's time, not on the time the reply track's back-pressure holds the request.
    """
    tone = ToneTTS(chunk_s=0.1, chunks=40)  # 4 s of audio per request, produced instantly
    flood = FloodResponder(400)
    saved = services.tts, services.responder
    services.tts, services.responder = tone, flood
    # No speculative turns: a speculation dropped unheard would have its (instant) audio counted in tone.yielded_s
    # without ever playing, and read as the committed reply running ahead (CI saw 2.02 s once).
    c = cfg(tmp_path, tts={"timeout_s": 1.5}, turn={"speculative": False})
    reply_queue_ms = c.audio.reply_queue_ms
    try:
        async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
            await asyncio.sleep(0.2)
            baseline = len(own_tasks())
            client = BenchSession(0, url, http)
            await client.connect()
            session = next(iter(app[SESSIONS].values()))
            track = session.track
            client.source.play(load_utterance(shared_audio / "en_weather.wav"))
            assert await wait_for(lambda: events(client, "reply_audio_start"), 30), client.events
            worst = {"track_ms": 0, "ahead_s": 0.0, "text_ahead": 0, "inbound": 0}
            receiver_track = session.pc.getReceivers()[0].track
            t_end = time.monotonic() + 3.0  # twice tts.timeout_s
            while time.monotonic() < t_end:
                worst["track_ms"] = max(worst["track_ms"], track.queued_ms)
                played_s = track.audible_frames_sent * 0.020
                worst["ahead_s"] = max(worst["ahead_s"], tone.yielded_s - played_s)
                worst["text_ahead"] = max(worst["text_ahead"], flood.yielded - tone.requests)
                worst["inbound"] = max(worst["inbound"], receiver_track._queue.qsize())
                await asyncio.sleep(0.01)
            assert not events(client, "error"), events(client, "error")
            audible_before = track.audible_frames_sent
            await asyncio.sleep(0.3)
            assert track.audible_frames_sent > audible_before, "the reply stopped (a time limit cut it?)"
            assert worst["track_ms"] <= reply_queue_ms, worst
            # PCM queue + the chunk in the writer's hands + one waiting to be put + one the engine has handed
            # out and the resampler holds, + the track's queue.
            assert worst["ahead_s"] <= reply_queue_ms / 1000 + (PCM_AHEAD_CHUNKS + 3) * tone.chunk_s + 0.02, worst
            # Text pieces queue + one in synthesis + one the responder is blocked putting + the chunker's.
            assert worst["text_ahead"] <= TTS_TEXT_QUEUE + 3, worst
            assert worst["inbound"] <= 5, worst  # frames the server received but did not read yet
            assert flood.yielded < flood.sentences
            await client.close()
            assert await wait_for(lambda: not app[SESSIONS], 5)
            assert session.task_count == 0
            assert await wait_for(lambda: len(own_tasks()) <= baseline, 5), [t.get_name() for t in own_tasks()]
    finally:
        services.tts, services.responder = saved


# --- reaping -------------------------------------------------------------------------------------------
async def test_half_open_and_never_connected_peers_are_reaped(services: Services, tmp_path) -> None:
    c = cfg(tmp_path, server={"idle_timeout_s": 2.0, "connect_timeout_s": 2.0})
    async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
        await asyncio.sleep(0.2)
        baseline = len(own_tasks())
        gone = BenchSession(0, url, http)
        await gone.connect()
        stays = BenchSession(1, url, http)
        await stays.connect()
        by_id = dict(app[SESSIONS])
        ghost_pc, status, body = await raw_offer(http, url)  # offers, never applies the answer
        assert status == 200
        ghost = app[SESSIONS][body["session_id"]]
        await asyncio.sleep(0.5)
        vanish(gone)
        half_open = by_id[gone.session_id]
        assert await wait_for(lambda: half_open.closed and ghost.closed, 60)
        assert half_open.close_reason == "idle_timeout" and ghost.close_reason == "connect_timeout"
        assert not by_id[stays.session_id].closed  # the one that keeps sending outlives both
        # Both leave the session table once their close has finished (it frees the peer first); the peer that
        # keeps sending (silence) is left alone.
        assert await wait_for(lambda: list(app[SESSIONS]) == [stays.session_id], 5), list(app[SESSIONS])
        assert half_open.task_count == 0 and ghost.task_count == 0
        gone.session_id = ""
        for client in (gone, stays):
            await client.close()
        await ghost_pc.close()
        assert await wait_for(lambda: not app[SESSIONS], 5)
        assert await wait_for(lambda: len(own_tasks()) <= baseline, 5), [t.get_name() for t in own_tasks()]


# --- security ------------------------------------------------------------------------------------------
async def test_bearer_token_guards_api_and_ws(services: Services, tmp_path) -> None:
    async with serve(cfg(tmp_path, server={"auth_token": "s3cret"}), services) as (url, _), \
            aiohttp.ClientSession() as http:
        good = {"Authorization": "Bearer s3cret"}
        calls = [
            ("GET", "/api/sessions", None),
            ("GET", "/api/voices", None),
            ("POST", "/api/offer", {"sdp": "v=0", "type": "offer"}),
            ("POST", "/api/tts", {"text": "Hi."}),
            ("DELETE", "/api/sessions/abc", None),
            ("GET", "/api/openapi.json", None),
            ("GET", "/api/ice", None),
            ("POST", "/api/whip", None),
            ("PATCH", "/api/sessions/abc", None),
        ]
        for method, path, body in calls:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                async with http.request(method, f"{url}{path}", json=body, headers=headers) as r:
                    assert r.status == 401 and (await r.json())["error"] == "unauthorized", (method, path)
            async with http.request(method, f"{url}{path}", json=body, headers=good) as r:
                assert r.status != 401, (method, path)
                if method == "GET":
                    assert r.status == 200, (method, path)
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{url}/ws/tts")
        assert err.value.status == 401
        async with http.ws_connect(f"{url}/ws/tts?metadata=1", headers=good) as ws:
            await ws.send_json({"text": "Hi."})
            assert (await ws.receive_json(timeout=30))["type"] == "start"
        for path in ("/healthz", "/readyz", "/"):
            async with http.get(f"{url}{path}") as r:
                assert r.status == 200, path
        async with http.get(f"{url}/metrics") as r:  # the admin's (or a metrics listener's: tests/test_keys.py)
            assert r.status == 401
        async with http.get(f"{url}/metrics", headers=good) as r:
            assert r.status == 200


async def test_cors_only_for_allow_listed_origins(services: Services, tmp_path) -> None:
    ok, evil = "https://app.example", "https://evil.example"
    async with serve(cfg(tmp_path), services) as (url, _), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/voices", headers={"Origin": ok}) as r:
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
        async with http.options(f"{url}/api/tts", headers={"Origin": ok}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
    c = cfg(tmp_path, server={"cors_origins": [ok], "auth_token": "t"})
    async with serve(c, services) as (url, _), aiohttp.ClientSession() as http:
        auth = {"Authorization": "Bearer t"}
        async with http.get(f"{url}/api/voices", headers={"Origin": ok, **auth}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == ok
            assert r.headers["Vary"] == "Origin"
        async with http.options(f"{url}/api/tts", headers={"Origin": ok}) as r:  # preflight carries no token
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == ok
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        async with http.get(f"{url}/api/voices", headers={"Origin": evil, **auth}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with http.options(f"{url}/api/tts", headers={"Origin": evil}) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        # Errors reach an allowed page too (else the browser hides the reason behind a CORS failure).
        for method, path, headers in (("GET", "/api/voices", {}), ("POST", "/api/tts", auth)):
            headers |= {"Content-Type": "application/json"}
            async with http.request(method, f"{url}{path}", headers={"Origin": ok, **headers}, data=b"{") as r:
                assert r.status in (400, 401) and r.headers.get("Access-Control-Allow-Origin") == ok, r.status


async def test_no_stack_traces_in_error_bodies(services: Services, tmp_path) -> None:
    saved = services.tts
    services.tts = FaultyTTS(saved, {"explode": "raise"})
    try:
        async with serve(cfg(tmp_path), services) as (url, _), aiohttp.ClientSession() as http:
            requests = [
                ("POST", "/api/tts", {"json": {"text": "please explode now"}}),  # the engine raises: a 500
                ("POST", "/api/tts", {"data": b"\xff\xfe{"}),
                ("POST", "/api/offer", {"data": b'{"sdp": "v=0\\r\\nm=audio junk", "type": "offer"}'}),
                ("POST", "/api/offer", {"json": {"sdp": "v=0\r\n" + "a=\x00\r\n" * 50, "type": "offer"}}),
                ("POST", "/api/voices", {"data": b"--x\r\nContent-Disposition: form-data; name=clip\r\n\r\n",
                                         "headers": {"Content-Type": "multipart/form-data; boundary=x"}}),
                ("GET", "/nope/../../etc/passwd", {}),
                ("PUT", "/api/tts", {}),
            ]
            for method, path, kw in requests:
                async with http.request(method, f"{url}{path}", **kw) as r:
                    text = await r.text()
                    assert r.status >= 400, (path, r.status)
                    assert not any(m in text for m in TRACE_MARKERS), (path, text)
                    if r.content_type == "application/json":
                        assert set(await r.json()) >= {"error", "detail"}, text
            async with http.post(f"{url}/api/tts", json={"text": "please explode now"}) as r:
                assert r.status == 500 and (await r.json())["error"] == "synthesis_failed"
    finally:
        services.tts = saved


async def test_voice_ids_with_path_characters_are_refused(services: Services, tmp_path) -> None:
    bad_ids = ["../etc/passwd", "..", "a/b", "..\\x", "%2e%2e", "a\x00b", "voice id", "x" * 65]
    async with serve(cfg(tmp_path), services) as (url, app), aiohttp.ClientSession() as http:
        for vid in bad_ids:
            pc, status, body = await raw_offer(http, url, voice=vid)
            await pc.close()
            assert status == 400 and body["error"] == "bad_offer", (vid, body)
            async with http.post(f"{url}/api/tts", json={"text": "Hi.", "voice": vid}) as r:
                assert r.status in (400, 404, 413), (vid, r.status)
        for path in ("..%2F..%2Fetc", "%2e%2e", "..", "a%00b", "0123456789abcdef"):
            async with http.delete(f"{url}/api/voices/{path}") as r:
                assert r.status == 404, path
            async with http.get(f"{url}/api/voices/{path}") as r:
                assert 400 <= r.status < 500, path
        assert not app[SESSIONS]
        assert not any(p.name not in ("voices",) for p in (tmp_path / "data").glob("*")), list(tmp_path.rglob("*"))


# --- limits that see the real client ---------------------------------------------------------------------------
def _mocked(headers: dict[str, str], peer: str) -> Any:
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (peer, 1234) if name == "peername" else default
    return make_mocked_request("GET", "/api/ice", headers=headers, transport=transport)


async def test_the_client_is_the_peer_unless_a_trusted_proxy_names_it() -> None:
    from assistant.server.dispatch.forward import forward_headers
    from assistant.server.limits import LIMITS, Limits

    limits = Limits(test_config(server={"trusted_proxies": ["10.0.0.0/8", "::1/128"]}))
    xff = {"X-Forwarded-For": "6.6.6.6, 203.0.113.7, 10.0.0.3"}
    assert limits.client_address(_mocked(xff, "198.51.100.1")) == "198.51.100.1"  # not a proxy: headers ignored
    assert limits.client_address(_mocked(xff, "10.0.0.2")) == "203.0.113.7"  # past every trusted hop; 6.6.6.6 forged
    fwd = {"Forwarded": 'for=6.6.6.6, for="[2001:db8:1:2::9]:443";proto=https'}
    request = _mocked(fwd, "::1")
    assert limits.client_address(request) == "2001:db8:1:2::9"
    assert limits.client(request) == "2001:db8:1::/48"  # an IPv6 site is one client
    # Hopping addresses inside one /48 (65,536 /64s) does not multiply the budget.
    other = _mocked({"Forwarded": "for=\"[2001:db8:1:ffff::1]\""}, "::1")
    assert limits.client(other) == limits.client(request)
    wide = Limits(test_config(server={"trusted_proxies": ["::1/128"], "ipv6_client_prefix": 64}))
    assert wide.client(_mocked(fwd, "::1")) == "2001:db8:1:2::/64"  # an operator may choose /64 (and its cost)
    assert limits.client_address(_mocked({"X-Forwarded-For": "garbage"}, "10.0.0.2")) == "10.0.0.2"
    # The dispatcher passes on the address it worked out, never the client's own header.
    request = _mocked(xff, "10.0.0.2")
    request.app[LIMITS] = limits
    assert forward_headers(request)["X-Forwarded-For"] == "203.0.113.7"


async def test_an_origin_is_the_servers_own_only_with_its_scheme_host_and_port() -> None:
    from unittest import mock

    from aiohttp.test_utils import make_mocked_request

    from assistant.server.front import Guard
    from assistant.server.http import APIError
    from assistant.server.limits import Limits

    def origin_ok(origin: str, host: str, *, peer: str = "198.51.100.1", tls: bool = False, trusted: bool = False,
                  **headers: str) -> bool:
        c = test_config(server={"trusted_proxies": ["10.0.0.0/8"] if trusted else [], "auth_token": "t"})
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (
            (peer, 1234) if name == "peername" else (object() if name == "sslcontext" and tls else default))
        request = make_mocked_request("POST", "/api/offer", headers={"Origin": origin, "Host": host, **headers},
                                      transport=transport, sslcontext=mock.Mock() if tls else None)
        try:
            Guard(c.server, Limits(c)).check_origin(request)
        except APIError:
            return False
        return True

    assert origin_ok("http://voice.example:8080", "voice.example:8080")
    assert not origin_ok("https://voice.example:8080", "voice.example:8080")  # another scheme: another origin
    assert not origin_ok("http://voice.example:9999", "voice.example:8080")   # another port
    assert not origin_ok("http://voice.example:8080", "voice.example")        # Host without a port: port 80
    assert origin_ok("http://voice.example", "voice.example")
    assert origin_ok("https://voice.example", "voice.example", tls=True)
    assert not origin_ok("http://voice.example", "voice.example", tls=True)
    assert not origin_ok("null", "voice.example")
    # Behind a trusted proxy: its X-Forwarded-Proto and X-Forwarded-Host say what the browser used.
    proxied = {"peer": "10.0.0.2", "trusted": True}
    assert origin_ok("https://voice.example", "127.0.0.1:8080", **proxied, **{
        "X-Forwarded-Host": "voice.example", "X-Forwarded-Proto": "https"})
    assert not origin_ok("http://voice.example", "127.0.0.1:8080", **proxied, **{
        "X-Forwarded-Host": "voice.example", "X-Forwarded-Proto": "https"})
    # An untrusted peer's X-Forwarded-* is not believed.
    assert not origin_ok("https://voice.example", "127.0.0.1:8080", **{
        "X-Forwarded-Host": "voice.example", "X-Forwarded-Proto": "https"})


async def test_without_a_token_only_loopback_names_and_addresses_are_answered() -> None:
    from aiohttp.test_utils import make_mocked_request

    from assistant.server.front import Guard
    from assistant.server.http import APIError
    from assistant.server.limits import Limits

    def answered(host: str, **server: Any) -> bool:
        c = test_config(server={"host": "0.0.0.0", "allow_public_without_token": True, **server})
        try:
            Guard(c.server, Limits(c)).check_host(make_mocked_request("GET", "/", headers={"Host": host}))
        except APIError as exc:
            assert exc.status == 421
            return False
        return True

    # Listening on every interface with no token: a rebinding name is refused, addresses are fine.
    assert answered("192.0.2.10:8080") and answered("[2001:db8::1]:8080") and answered("localhost:8080")
    assert not answered("rebind.evil.example:8080")
    assert answered("voice.example", allowed_hosts=["voice.example"])
    assert answered("rebind.evil.example", auth_token="t")  # with a token a foreign page has nothing to send


async def test_offers_spend_a_per_client_budget_and_connecting_sessions_have_their_own(services, tmp_path) -> None:
    c = cfg(tmp_path, server={"offers_per_minute": 3, "max_connecting_per_client": 2})
    async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
        pcs, answers = [], []
        for _ in range(4):
            pc, status, body = await raw_offer(http, url)
            pcs.append(pc)
            answers.append((status, body.get("error")))
        # Two unconnected sessions per client; the third offer is refused for that, the fourth by the budget.
        assert answers == [(200, None), (200, None), (429, "too_many_connecting"), (429, "rate_limited")], answers
        async with http.post(f"{url}/api/offer", json={}) as r:
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert len(app[SESSIONS]) == 2
        for pc in pcs:
            await pc.close()
    # Unconnected sessions cannot hold the slots real calls need: past max_connecting, the oldest one older than
    # the grace period gives its place up.
    c = cfg(tmp_path, server={"max_connecting": 2, "max_connecting_per_client": 8})
    async with serve(c, services) as (url, app), aiohttp.ClientSession() as http:
        pcs = []
        for _ in range(2):
            pcs.append((await raw_offer(http, url))[0])
        for session in app[SESSIONS].values():  # within the grace (offers take seconds on a loaded machine)
            session.created = time.monotonic() + 60
        pc, status, body = await raw_offer(http, url)
        pcs.append(pc)
        assert (status, body.get("error")) == (503, "busy") and "still connecting" in body["detail"], body
        oldest = min(app[SESSIONS].values(), key=lambda s: s.created)
        # As if it had been waiting for its peer past the grace, yet short of connect_timeout_s (where the
        # session's own watchdog would close it first, as "connect_timeout").
        oldest.created = time.monotonic() - (CONNECT_GRACE_S + c.server.connect_timeout_s) / 2
        pc, status, body = await raw_offer(http, url)
        pcs.append(pc)
        assert status == 200 and oldest.closed and oldest.close_reason == "connect_evicted"
        for pc in pcs:
            await pc.close()


async def test_a_foreign_origin_and_a_rebound_host_are_refused(services, tmp_path) -> None:
    ok = "https://app.example"
    async with serve(cfg(tmp_path, server={"cors_origins": [ok]}), services) as (url, _), \
            aiohttp.ClientSession() as http:
        for origin, status in (("https://evil.example", 403), ("null", 403), (url, 400), (ok, 400), (None, 400)):
            headers = {"Content-Type": "application/json"} | ({"Origin": origin} if origin else {})
            async with http.post(f"{url}/api/offer", data=b"{", headers=headers) as r:
                body = await r.json()
                assert r.status == status, (origin, body)
                if status == 403:
                    assert body["error"] == "forbidden_origin"
        async with http.get(f"{url}/api/voices", headers={"Origin": "https://evil.example"}) as r:
            assert r.status == 200  # reading is not changing: the browser keeps the answer from that page
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{url}/ws/tts", headers={"Origin": "https://evil.example"})
        assert err.value.status == 403
        # DNS rebinding: a name that resolves to 127.0.0.1 is not a loopback name; the server answers 421.
        async with http.get(f"{url}/api/voices", headers={"Host": "rebind.evil.example"}) as r:
            assert r.status == 421 and (await r.json())["error"] == "wrong_host"
        async with http.post(f"{url}/api/offer", data=b"{}", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415 and (await r.json())["error"] == "unsupported_media_type"
    # Behind a trusted proxy (Caddy on the same machine) the public host and the page's origin are the proxy's.
    c = cfg(tmp_path, server={"trusted_proxies": ["127.0.0.1/32"]})
    async with serve(c, services) as (url, _), aiohttp.ClientSession() as http:
        public = {"Host": "voice.example.com", "X-Forwarded-Host": "voice.example.com",
                  "Origin": "https://voice.example.com", "Content-Type": "application/json"}
        async with http.post(f"{url}/api/offer", data=b"{", headers=public) as r:
            assert r.status == 400, await r.text()  # past the guard: the handler's bad_json
        async with http.post(f"{url}/api/offer", data=b"{", headers=public | {"Origin": "https://evil.example"}) as r:
            assert r.status == 403


async def test_tts_websockets_are_capped_per_client_and_idle_ones_closed(tmp_path) -> None:
    from tests.conftest import tts_only_services

    c = cfg(tmp_path, tts_api={"max_ws_per_client": 2, "ws_idle_timeout_s": 0.5})
    async with serve(c, tts_only_services(c, ToneTTS())) as (url, _), aiohttp.ClientSession() as http:
        a = await http.ws_connect(f"{url}/ws/tts")
        b = await http.ws_connect(f"{url}/ws/tts")
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{url}/ws/tts")
        assert err.value.status == 429
        msg = await a.receive(timeout=10)  # idle past ws_idle_timeout_s: closed with a reason
        assert msg.type == aiohttp.WSMsgType.CLOSE and a.close_code == 4408
        assert msg.extra.startswith("idle_timeout")
        await b.close()
        c2 = await http.ws_connect(f"{url}/ws/tts")  # the places are given back
        await c2.close()
