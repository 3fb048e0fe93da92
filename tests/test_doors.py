"""The doors the Realtime API, phone calls and minted keys opened (issue 40), attacked over real sockets against the
real app on 127.0.0.1: audio appended faster than anyone speaks, upgrades that fail after their slot was taken,
control sockets piling up on one call.

Every test waits on a condition, never a fixed time; what an attack costs in loop lag is the bench's to measure
(``python -m lab attacks``, docs/reliability.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from typing import Any

import aiohttp
import numpy as np
import pytest
from yarl import URL

from assistant.server.app import SESSIONS
from assistant.server.realtime import websocket as realtime_websocket
from assistant.server.services import Services
from tests.conftest import serve, test_config
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

RATE = 24_000  # the Realtime API's PCM16 rate
FLOOD_S = 180  # seconds of audio a flood sends: past the pace's burst and as much again refused


def ws_url(url: str, query: str = "model=echo") -> str:
    return url.replace("http", "ws", 1) + "/v1/realtime?" + query


def upgrade_request(url: str, path: str) -> bytes:
    host = url.split("://", 1)[1]
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: realtime\r\n\r\n").encode()


async def send_and_reset(url: str, path: str) -> None:
    """An upgrade request, then a TCP reset at once (SO_LINGER 0): the server's 101 has nowhere to go."""
    host, port = url.split("://", 1)[1].split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, upgrade_request(url, path))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def live(app: Any) -> list[Any]:
    return [s for s in app[SESSIONS].values() if not s.closed]


async def test_upgrades_reset_after_the_request_give_their_session_slot_back(services: Services) -> None:
    unlimited = test_config(server={"offers_per_minute": 0, "max_sessions_per_client": 0})  # one client resets all
    async with serve(unlimited, services) as (url, app):
        for _ in range(40):
            await send_and_reset(url, "/v1/realtime?model=echo")
        await until(lambda: not app[SESSIONS], "every reset upgrade's session gone from the table")
        # And the server still takes a real client.
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(url), protocols=("realtime",)) as ws:
            first = json.loads((await ws.receive(timeout=30)).data)
            assert first["type"] == "session.created"


async def test_a_session_whose_protocol_fails_to_start_gives_its_slot_back(services: Services,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("make_protocol failed")

    monkeypatch.setattr(realtime_websocket, "make_protocol", broken)
    async with serve(test_config(), services) as (url, app), aiohttp.ClientSession() as http:
        for _ in range(3):
            with pytest.raises((aiohttp.ClientError, asyncio.TimeoutError)):
                async with http.ws_connect(ws_url(url), protocols=("realtime",)) as ws:
                    msg = await ws.receive(timeout=30)
                    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                    raise aiohttp.ClientError("closed as it opened")
        await until(lambda: not app[SESSIONS], "the failed sessions gone from the table")


async def test_audio_appended_faster_than_the_pace_is_refused_and_a_flood_closed(services: Services) -> None:
    second = base64.b64encode(np.zeros(RATE, dtype="<i2").tobytes()).decode()  # 1 s of PCM16 silence
    event = json.dumps({"type": "input_audio_buffer.append", "audio": second})
    async with serve(test_config(), services) as (url, app), aiohttp.ClientSession() as http:
        ws = await http.ws_connect(ws_url(url), protocols=("realtime",), max_msg_size=0)
        assert json.loads((await ws.receive(timeout=30)).data)["type"] == "session.created"
        errors: list[str] = []

        async def read() -> None:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    if data["type"] == "error":
                        errors.append(data["error"]["code"])

        reader = asyncio.create_task(read())
        try:
            for _ in range(FLOOD_S):  # as fast as the socket takes it
                if ws.closed:
                    break
                await ws.send_str(event)
        except (ConnectionResetError, aiohttp.ClientError):
            pass  # the server closed it under us: what the test waits for below
        await asyncio.wait_for(reader, 60)
        assert "input_audio_too_fast" in errors
        assert ws.close_code == 1008, ws.close_code
        await until(lambda: not live(app), "the flooding session closed")


async def test_a_long_session_that_runs_ahead_now_and_then_is_not_a_flood() -> None:
    """Every ten minutes the client sends a 90 s recording at once (100 ms appends): the pace takes the burst's 60 s
    and refuses the rest each time. The refusals are forgotten as the pace refills, so the session is not closed on
    the third (their sum used to pass a burst's worth); a flood a little past twice the pace still is, at once."""
    from assistant.server.realtime.input_audio import PACE_BURST_S, PACE_SPEED, InputPace

    now = [0.0]
    pace = InputPace(clock=lambda: now[0])

    def send(seconds: float, speed: float) -> int:
        """``seconds`` of audio in 100 ms appends at ``speed`` x real time; how many were refused."""
        refused = 0
        for _ in range(round(seconds * 10)):
            now[0] += 0.1 / speed
            refused += not pace.take(0.1)
        return refused

    for _ in range(6):  # an hour
        assert send(600, speed=1.0) == 0  # live speech
        assert send(90, speed=1e6) > 0 and not pace.flooding  # a recording at once: partly refused, no flood
    send(PACE_BURST_S * 4, speed=2.5 * PACE_SPEED)  # past twice the pace for minutes: a flood
    assert pace.flooding


async def test_control_sockets_are_capped_per_call_and_leave_no_listener(services: Services) -> None:
    from assistant.server.realtime.calls import PROTOCOLS
    from assistant.server.realtime.websocket import CONTROLS, MAX_CONTROL_SOCKETS

    async with (serve(test_config(), services) as (url, app), aiohttp.ClientSession() as http,
                http.ws_connect(ws_url(url), protocols=("realtime",)) as call):
        assert json.loads((await call.receive(timeout=30)).data)["type"] == "session.created"
        (session,) = live(app)
        # A WebSocket session stands in for a WebRTC call: registered as POST /v1/realtime/calls registers one.
        PROTOCOLS[session.id] = next(p for p in _protocols() if p.session is session)
        listeners = len(session.events._listeners)
        opened = []
        for _ in range(MAX_CONTROL_SOCKETS):
            opened.append(await http.ws_connect(ws_url(url, f"call_id={session.id}")))
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url(url, f"call_id={session.id}"))
        assert refused.value.status == 429
        await until(lambda: len(session.events._listeners) == listeners + len(opened), "each control listening")
        for ws in opened:
            await ws.close()
        await until(lambda: len(session.events._listeners) == listeners, "every control's listener removed")
        await until(lambda: session.id not in CONTROLS, "the call's control sockets forgotten")


def _protocols() -> list[Any]:
    """Every live Realtime protocol (the one of a WebSocket session is held by its handler alone)."""
    import gc

    from assistant.server.realtime.protocol import RealtimeProtocol

    return [o for o in gc.get_objects() if isinstance(o, RealtimeProtocol)]


# --- replayed webhooks --------------------------------------------------------------------------------------------
TWILIO_AUTH = "test-auth-token-0123456789abcdef"


async def test_a_captured_twilio_webhook_gets_no_token_after_a_restart_or_at_another_gateway(
        services: Services, tmp_path: Any) -> None:
    from assistant.bench.telephony_client import TWILIO, dial, signed_headers, webhook_form

    cfg = test_config(server={"data_dir": str(tmp_path / "shared-data")},
                      telephony={"twilio_auth_token": TWILIO_AUTH, "public_url": "https://voice.example.com"})
    _, call_id = TWILIO.new_ids()
    hook = "https://voice.example.com/telephony/twilio/voice"
    headers = signed_headers(TWILIO, hook, webhook_form(TWILIO, call_id), b"", auth_token=TWILIO_AUTH)
    async with aiohttp.ClientSession() as http:
        async with serve(cfg, services) as (url, _app):
            first = await dial(http, url, TWILIO, call_id=call_id, headers=headers)
            assert first.status == 200 and first.parameters.get("token"), first
        async with serve(cfg, services) as (url, _app), serve(cfg, services) as (other, _):  # restarted; a 2nd gateway
            for base in (url, other):
                again = await dial(http, base, TWILIO, call_id=call_id, headers=headers)
                assert again.status == 403 and json.loads(again.body)["error"] == "replayed", again


async def test_a_telnyx_signature_respelled_in_base64_is_still_a_replay(services: Services, tmp_path: Any) -> None:
    from urllib.parse import urlencode

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from assistant.bench.telephony_client import TELNYX, dial, signed_headers, webhook_form

    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    cfg = test_config(server={"data_dir": str(tmp_path / "data")}, telephony={"telnyx_public_key": public})
    async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
        _, call_id = TELNYX.new_ids()
        form = webhook_form(TELNYX, call_id)
        headers = signed_headers(TELNYX, "", form, urlencode(form).encode(), telnyx_private_key=key)
        captured = headers["telnyx-signature-ed25519"]
        answers = []
        for spelling in respellings(captured):
            answers.append(await dial(http, url, TELNYX, call_id=call_id,
                                      headers={**headers, "telnyx-signature-ed25519": spelling}))
        assert len(answers) == 16 and len({a.parameters.get("token") for a in answers if a.status == 200}) == 1
        assert all(json.loads(a.body)["error"] == "replayed" for a in answers[1:])


def respellings(signature_b64: str) -> list[str]:
    """Every base64 spelling of the same 64 bytes: the last character's 4 unused bits, set any way."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body, last, pad = signature_b64[:-3], signature_b64[-3], signature_b64[-2:]
    base = alphabet.index(last) & ~0xF
    spellings = [body + alphabet[base | low] + pad for low in range(16)]
    assert all(base64.b64decode(s, validate=True) == base64.b64decode(signature_b64) for s in spellings)
    return spellings


async def test_a_twilio_webhook_url_with_an_escaped_query_is_checked_as_twilio_signed_it(services: Services,
                                                                                         tmp_path: Any) -> None:
    from urllib.parse import urlencode

    from assistant.bench.telephony_client import TWILIO, read_answer, signed_headers, webhook_form

    cfg = test_config(server={"data_dir": str(tmp_path / "data")},
                      telephony={"twilio_auth_token": TWILIO_AUTH, "public_url": "https://voice.example.com"})
    _, call_id = TWILIO.new_ids()
    form = webhook_form(TWILIO, call_id)
    path = "/telephony/twilio/voice?line=sales%2feu&who=%7Ea"  # Twilio signs the URL as it requests it
    headers = signed_headers(TWILIO, "https://voice.example.com" + path, form, b"", auth_token=TWILIO_AUTH)
    async with (serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http,
                http.post(URL(url + path, encoded=True), data=urlencode(form).encode(),  # sent as written
                          headers={"Content-Type": "application/x-www-form-urlencoded", **headers}) as resp):
        answer = read_answer(resp.status, await resp.text())
    assert answer.status == 200 and answer.parameters.get("token"), answer


# --- keys --------------------------------------------------------------------------------------------------------
TOKEN = "admin-s3cret"


def with_token(tmp_path: Any) -> Any:
    return test_config(server={"data_dir": str(tmp_path / "data"), "auth_token": TOKEN, "offers_per_minute": 0})


async def post_key(http: aiohttp.ClientSession, url: str, bearer: str, **body: Any) -> dict[str, Any]:
    async with http.post(f"{url}/api/keys", json=body, headers={"Authorization": f"Bearer {bearer}"}) as r:
        answer = await r.json()
        assert r.status == 200, answer
        return dict(answer)


async def test_a_capped_minted_key_mints_only_keys_within_its_cap(services: Services, tmp_path: Any) -> None:
    async with serve(with_token(tmp_path), services) as (url, app), aiohttp.ClientSession() as http:
        parent = await post_key(http, url, TOKEN, scope=["admin"], max_sessions=1)
        child = await post_key(http, url, parent["key"], scope=["call"])
        assert child["max_sessions"] == 1  # not uncapped
        wider = await post_key(http, url, parent["key"], scope=["call"], max_sessions=50)
        assert wider["max_sessions"] == 1
        # The children share the parent's one session: the second child is refused while the first holds it.
        first = await http.ws_connect(ws_url(url), headers={"Authorization": f"Bearer {child['key']}"})
        assert json.loads((await first.receive(timeout=30)).data)["type"] == "session.created"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url(url), headers={"Authorization": f"Bearer {wider['key']}"})
        assert refused.value.status == 429
        await first.close()
        await until(lambda: not app[SESSIONS], "the first child's session closed")


async def test_an_expired_key_is_still_held_to_its_scope_on_owner_routes(services: Services, tmp_path: Any) -> None:
    from assistant.server import keys

    expired = keys.mint(TOKEN, ["tts"], 60, now=keys.wall_clock() - 3600).value
    async with (serve(with_token(tmp_path), services) as (url, _app), aiohttp.ClientSession() as http,
                http.delete(f"{url}/api/sessions/s-none", headers={"Authorization": f"Bearer {expired}"}) as r):
        assert r.status == 403 and (await r.json())["error"] == "forbidden_scope"


# --- header bytes that are not UTF-8 -----------------------------------------------------------------------------
async def raw_request(url: str, head: bytes) -> tuple[int, bytes]:
    """One request written byte for byte (aiohttp's client would refuse these headers); the status and body."""
    host, port = url.split("://", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    try:
        head_in = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = next((int(line.split(b":", 1)[1]) for line in head_in.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
    return int(head_in.split(b" ", 2)[1]), body


async def test_header_bytes_that_are_not_utf8_are_refused_not_a_server_error(services: Services, tmp_path: Any,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    cfg = test_config(server={"data_dir": str(tmp_path / "data"), "auth_token": TOKEN},
                      telephony={"twilio_auth_token": TWILIO_AUTH})
    body = b"CallSid=CA1"
    async with serve(cfg, services) as (url, _app):
        host = url.split("://", 1)[1].encode()
        cases = {
            "bearer": b"GET /api/sessions HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer ek_\xff\xfe.x\r\n"
                      b"Connection: close\r\n\r\n",
            "admin-like": b"GET /api/sessions HTTP/1.1\r\nHost: " + host + b"\r\nAuthorization: Bearer \xc3\x28\r\n"
                          b"Connection: close\r\n\r\n",
            "subprotocol": b"GET /v1/realtime HTTP/1.1\r\nHost: " + host + b"\r\nUpgrade: websocket\r\n"
                           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: realtime, "
                           b"openai-insecure-api-key.\xff\xfe\r\n\r\n",
            "twilio": b"POST /telephony/twilio/voice HTTP/1.1\r\nHost: " + host
                      + b"\r\nX-Twilio-Signature: \xff\xfe=\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                      b"Content-Length: "
                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body,
        }
        statuses = {name: (await raw_request(url, head))[0] for name, head in cases.items()}
    assert statuses == {"bearer": 401, "admin-like": 401, "subprotocol": 401, "twilio": 403}, statuses
    assert not [r for r in caplog.records if r.exc_info], "a stack trace in the log"


# --- media sockets before their start -----------------------------------------------------------------------------
async def test_one_host_cannot_take_every_media_socket_place_and_a_page_cannot_open_one(services: Services,
                                                                                      tmp_path: Any) -> None:
    from assistant.server.telephony.media import PENDING_SHARE

    cfg = test_config(server={"data_dir": str(tmp_path / "data")}, telephony={"twilio_auth_token": TWILIO_AUTH})
    async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
        media = url.replace("http", "ws", 1) + "/telephony/twilio/media"
        share = cfg.telephony.max_pending_calls // PENDING_SHARE
        waiting = [await http.ws_connect(media) for _ in range(share)]  # sockets that never send their start
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(media)
        assert refused.value.status == 429
        with pytest.raises(aiohttp.WSServerHandshakeError) as page:
            await http.ws_connect(media, headers={"Origin": "https://evil.example"})
        assert page.value.status == 403
        for ws in waiting:
            await ws.close()
