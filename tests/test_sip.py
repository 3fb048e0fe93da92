"""SIP calls end to end: the real app on 127.0.0.1 with the default CPU stack and its SIP listener, called by real
SIP peers on loopback (``tests/sip_peers.py``: Debian's SIPp running the scenarios of ``tests/data/sip``, and the
baresip softphone). Nothing is mocked at the SIP or RTP boundary.

- SIPp calls with digest authentication, plays a recorded request as G.711 RTP, and our ASR hears the spoken reply in
  the RTP the server sends back; SIPp's BYE ends the call and frees its ports;
- the server hangs up (its BYE), RTP from a foreign address is dropped; hold, resume and a codec change by
  re-INVITE; the session timer both ways; every way a call can end leaves the port range empty;
- baresip calls with Opus only: the reply is heard in Opus, a key press reaches the responder, its BYE ends it;
- outgoing calls through a trunk: one that answers (after a digest challenge SIPp checks), one that is busy, one to
  a destination the allow-list refuses; registration with the trunk;
- the RFC 4475 torture messages and floods of INVITE, REGISTER and OPTIONS from unknown sources: nothing escapes,
  nothing is kept, and a real call goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from assistant.audio import SPEECH_RATE, resample, s16_to_float
from assistant.bench.audio_source import load_utterance
from assistant.bench.sip_client import SipPhone
from assistant.bench.sip_client import now as phone_now
from assistant.g711 import ulaw_decode
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from assistant.server.sip.call import SipCall
from assistant.server.sip.state import SIP, SipService
from tests.conftest import self_signed_cert, serve, test_config
from tests.sip_peers import LOOPBACK, Sipp, baresip, ear, pcm48_wav, sipp, ulaw_wav
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]

USER, PASSWORD = "pbx", "s3cret-pbx"
RTP_RANGE = {"rtp_port_min": 42_000, "rtp_port_max": 42_199}


def config(**sip: Any) -> Any:
    return test_config(sip={"enabled": True, "port": 0, "responder": "echo", **RTP_RANGE, **sip},
                       server={"max_silence_s": 120.0})


def service(app: Any) -> SipService:
    return app[SIP]


def target(app: Any) -> str:
    return f"{LOOPBACK}:{service(app).port()}"


def calls(app: Any) -> list[SipCall]:
    return [s for s in app[SESSIONS].values() if isinstance(s, SipCall)]


async def only_call(app: Any, timeout_s: float = 30.0) -> SipCall:
    await until(lambda: len(calls(app)) == 1, "the SIP call to be up", timeout_s)
    return calls(app)[0]


async def heard_text(services: Services, pcm: np.ndarray, rate: int) -> str:
    """What our ASR hears in the audio a peer received."""
    return (await services.asr.transcribe(resample(s16_to_float(pcm), rate, SPEECH_RATE))).text


def said(call: SipCall, role: str = "user") -> list[str]:
    return [m.content for m in call.conversation.history.messages if m.role == role]


def counted(services: Services, outcome: str, direction: str = "inbound") -> float:
    """``assistant_sip_calls_total`` for one outcome (the module's apps share the services and their metrics)."""
    return float(services.metrics.sip_calls_total.labels(direction=direction, outcome=outcome)._value.get())


async def ports_free(app: Any) -> None:
    await until(lambda: not service(app).ports.in_use, "every RTP port back in the range", 10)


@pytest.fixture
def weather_ulaw(tmp_path: Path, shared_audio: Path) -> Path:
    out = tmp_path / "weather_ulaw.wav"
    ulaw_wav(shared_audio / "en_weather.wav", out)
    return out


async def test_a_caller_with_credentials_hears_a_spoken_reply_and_its_bye_frees_the_ports(
        services: Services, tmp_path: Path, weather_ulaw: Path) -> None:
    cfg = config(username=USER, password=PASSWORD, symmetric_rtp=False)
    async with serve(cfg, services) as (_url, app), ear() as listener:
        closed: list[str] = []
        async with sipp("uac_auth_call", tmp_path, target(app), user=USER, password=PASSWORD,
                        values={"ear": str(listener.port), "wav": str(weather_ulaw), "hold_ms": "16000"}) as peer:
            call = await only_call(app)
            call.events.subscribe(lambda e: closed.append(str(e.get("reason"))) if e["type"] == "close" else None)
            assert call.transport == "sip" and call.codec == "PCMU/8000" and call.owner == ""
            assert await peer.wait() == 0, peer.log()
        await until(lambda: call.closed, "the call to end on SIPp's BYE")
        assert closed == ["bye"]
        await ports_free(app)
        assert not service(app).agent.calls  # the dialog is forgotten
    heard = [p for p in listener.payloads(0)]
    assert heard and len({len(p) for p in heard}) == 1 and len(heard[0]) == 160  # 20 ms packets of PCMU
    pcm = ulaw_decode(b"".join(heard))
    assert call.rtp is not None and call.rtp.counters.received > 100  # SIPp's G.711 reached the conversation
    assert any("weather" in s.lower() for s in said(call)), said(call)
    reply = said(call, "assistant")
    assert reply and "weather" in reply[0].lower()
    text = await heard_text(services, pcm, 8000)
    assert "weather" in text.lower(), (reply, text)


async def test_a_call_without_an_offer_gets_ours_and_takes_the_answer_from_the_ack(
        services: Services, tmp_path: Path, weather_ulaw: Path) -> None:
    cfg = config(allow_from=["127.0.0.1/32"], symmetric_rtp=False)
    async with serve(cfg, services) as (_url, app), ear() as listener:
        async with sipp("uac_late_offer", tmp_path, target(app), values={
                "ear": str(listener.port), "wav": str(weather_ulaw), "hold_ms": "12000"}) as peer:
            call = await only_call(app)
            await until(lambda: call.rtp is not None and call.rtp.negotiated is not None, "the answer in the ACK")
            assert call.rtp is not None and call.rtp.negotiated is not None
            assert call.rtp.negotiated.codec.name == "PCMU" and call.rtp.negotiated.port == listener.port
            assert await peer.wait() == 0, peer.log()  # it found all our codecs offered in the 200
        await until(lambda: call.closed, "the call to end on SIPp's BYE")
        await ports_free(app)
    assert any("weather" in s.lower() for s in said(call)), said(call)
    assert len(listener.payloads(0)) > 100  # the reply went to where the ACK's answer said


def rtp_packet(seq: int, payload_type: int = 0) -> bytes:
    return struct.pack("!BBHII", 0x80, payload_type, seq, seq * 160, 0x1234) + bytes([0xFF]) * 160


async def test_the_server_hangs_up_and_rtp_from_a_foreign_address_is_dropped(
        services: Services, tmp_path: Path, weather_ulaw: Path) -> None:
    cfg = config(allow_from=["127.0.0.1/32"], symmetric_rtp=False)
    media = f'<nop><action><exec rtp_stream="{weather_ulaw},-1,0"/></action></nop>'
    async with serve(cfg, services) as (url, app), ear() as listener, aiohttp.ClientSession() as http:
        async with sipp("uac_wait_bye", tmp_path, target(app), values={
                "ear": str(listener.port), "media": media, "session_expires": "1800", "wait_ms": "60000"}) as peer:
            call = await only_call(app)
            rtp = call.rtp
            assert rtp is not None
            await until(lambda: rtp.counters.received > 10, "SIPp's RTP to arrive")
            before = rtp.counters.received, rtp.counters.foreign
            strangers = []
            for host in ("127.0.0.2", LOOPBACK):  # another address, then the call's address from another port
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind((host, 0))
                strangers.append(s)
                for seq in range(50):
                    s.sendto(rtp_packet(seq), (LOOPBACK, rtp.port))
            await until(lambda: rtp.counters.foreign >= before[1] + 100, "the strangers' packets to be dropped")
            for s in strangers:
                s.close()
            assert rtp.counters.malformed == 0 and rtp.counters.flooded == 0
            async with http.delete(f"{url}/api/sessions/{call.id}") as resp:
                assert resp.status == 200
            assert await peer.wait() == 0, peer.log()  # SIPp got our BYE and answered it
        assert call.close_reason == "hangup"
        await ports_free(app)


async def test_every_way_a_call_ends_gives_its_ports_back(services: Services, tmp_path: Path,
                                                          weather_ulaw: Path) -> None:
    """CANCEL while it rings, no common codec (488), no media, a session timer nobody refreshes, shutdown: each
    leaves the port range empty (the peer's BYE and our hang-up are the tests above)."""
    cfg = config(allow_from=["127.0.0.1/32"], ring_ms=1500, media_timeout_s=2.0, min_session_expires_s=2)
    streaming = f'<nop><action><exec rtp_stream="{weather_ulaw},-1,0"/></action></nop>'
    ends: list[str] = []

    def watch(call: SipCall) -> None:
        call.events.subscribe(lambda e: ends.append(str(e.get("reason"))) if e["type"] == "close" else None)

    last = Sipp("uac_wait_bye", tmp_path)  # the call up when the server shuts down; it calls once the server listens

    async def answered_the_shutdown() -> None:  # after the app below is gone (a stack unwinds in reverse)
        try:
            await last.wait(30)
        finally:
            await last.stop()

    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(answered_the_shutdown)
        _url, app = await stack.enter_async_context(serve(cfg, services))
        listener = await stack.enter_async_context(ear())
        cancelled = counted(services, "cancelled")
        async with sipp("uac_cancel", tmp_path, target(app)) as peer:
            assert await peer.wait() == 0, peer.log()  # 200 to its CANCEL, 487 to its INVITE
        assert counted(services, "cancelled") == cancelled + 1
        await ports_free(app)  # taken while it rang, given back
        assert not calls(app)

        async with sipp("uac_no_codec", tmp_path, target(app)) as peer:
            assert await peer.wait() == 0, peer.log()
        assert not calls(app) and not service(app).ports.in_use

        for media, expires, reason in (("", "1800;refresher=uac", "media_timeout"),
                                       (streaming, "3;refresher=uac", "session_expired")):
            async with sipp("uac_wait_bye", tmp_path, target(app), values={
                    "ear": str(listener.port), "media": media, "session_expires": expires,
                    "wait_ms": "60000"}) as peer:
                watch(await only_call(app))
                assert await peer.wait() == 0, peer.log()  # our BYE came, and was answered
            await until(lambda r=reason: ends[-1:] == [r], f"the call to end on {reason}")
            await ports_free(app)

        last.remote = target(app)
        last.values = {"ear": str(listener.port), "media": streaming, "session_expires": "1800", "wait_ms": "60000"}
        await last.start()
        call = await only_call(app)
        watch(call)
        await until(lambda: call.rtp is not None and call.rtp.counters.received > 0, "the call answered and talking")
        sip = service(app)
    # The app is gone: its shutdown closed the call (BYE, which SIPp answered) and gave the ports back.
    assert last.process is not None and last.process.returncode == 0, last.log()
    assert ends[-1] == "server_shutdown" and not sip.ports.in_use


async def test_hold_resume_and_a_codec_change_by_re_invite(services: Services, tmp_path: Path) -> None:
    cfg = config(allow_from=["127.0.0.1/32"], symmetric_rtp=False, codecs=["PCMU", "PCMA"])
    async with serve(cfg, services) as (_url, app), ear() as listener:
        async with sipp("uac_hold", tmp_path, target(app), values={"ear": str(listener.port),
                                                                    "hold_ms": "1500"}) as peer:
            call = await only_call(app)
            rtp = call.rtp
            assert rtp is not None
            seen: list[tuple[str, str]] = []
            await until(lambda: rtp.negotiated is not None, "the offer taken")

            def note() -> bool:
                neg = rtp.negotiated
                state = (neg.codec.name, neg.direction) if neg else ("", "")
                if not seen or seen[-1] != state:
                    seen.append(state)
                return peer.process is not None and peer.process.returncode is not None

            await until(note, "SIPp's scenario to end", 60, step_s=0.005)
            assert await peer.wait() == 0, peer.log()  # its checks: recvonly while held, PCMA after
        assert seen == [("PCMU", "sendrecv"), ("PCMU", "recvonly"), ("PCMA", "sendrecv")], seen
        await ports_free(app)
    kinds = [pt for _, pt, _, _ in listener.packets]
    assert kinds[0] == 0 and kinds[-1] == 8 and set(kinds) == {0, 8}  # PCMU, nothing while held, then PCMA
    switch = kinds.index(8)
    assert all(k == 0 for k in kinds[:switch]) and all(k == 8 for k in kinds[switch:])
    quiet = max(b[0] - a[0] for a, b in zip(listener.packets, listener.packets[1:], strict=False))
    assert quiet >= 1.0  # the held stretch: no RTP went out (1.5 s in the scenario)


async def test_the_server_refreshes_the_session_timer_when_it_is_the_refresher(services: Services,
                                                                                tmp_path: Path,
                                                                                weather_ulaw: Path) -> None:
    cfg = config(allow_from=["127.0.0.1/32"], min_session_expires_s=2)
    streaming = f'<nop><action><exec rtp_stream="{weather_ulaw},-1,0"/></action></nop>'
    async with serve(cfg, services) as (url, app), ear() as listener, aiohttp.ClientSession() as http:
        async with sipp("uac_wait_bye", tmp_path, target(app), values={
                "ear": str(listener.port), "media": streaming, "session_expires": "3;refresher=uas",
                "wait_ms": "60000"}) as peer:
            call = await only_call(app)
            assert call.session_expires == 3 and call.we_refresh
            await until(lambda: call.refreshes >= 3, "three refreshes (UPDATE) taken by SIPp")
            assert not call.closed  # past its 3 s: kept alive by the refreshes
            async with http.delete(f"{url}/api/sessions/{call.id}") as resp:
                assert resp.status == 200
            assert await peer.wait() == 0, peer.log()
        await ports_free(app)


async def test_baresip_with_opus_hears_the_reply_and_a_key_press_reaches_the_responder(
        services: Services, tmp_path: Path, shared_audio: Path) -> None:
    audio = tmp_path / "weather48.wav"
    pcm48_wav(shared_audio / "en_weather.wav", audio, silence_s=30.0)  # baresip hangs up at its end
    cfg = config(username=USER, password=PASSWORD, dtmf_gap_ms=300)
    async with serve(cfg, services) as (_url, app), baresip(tmp_path / "phone", audio, codecs=("opus.so",),
                                                               auth=(USER, PASSWORD)) as phone:
        await phone.command("dial", f"sip:assistant@{target(app)}")
        call = await only_call(app)
        keys: list[str] = []
        call.events.subscribe(lambda e: keys.append(str(e["digit"])) if e["type"] == "dtmf" else None)
        await until(lambda: phone.saw("CALL_ESTABLISHED"), "baresip to say the call is up")
        assert call.codec == "opus/48000/2"
        await until(lambda: len(said(call, "assistant")) == 1 and not call.conversation.responding,
                    "the spoken turn answered and its reply played", 60)
        assert "weather" in said(call)[0].lower()
        await phone.command("sndcode", "5")  # a key press, sent as RFC 4733 telephone-events
        await until(lambda: len(said(call)) == 2, "the key press to reach the responder as a turn")
        assert keys == ["5"] and "pressed 5" in said(call)[1]
        await until(lambda: len(said(call, "assistant")) == 2, "the responder's answer to it")
        assert "5" in said(call, "assistant")[1]
        await phone.command("hangup")
        await until(lambda: call.closed, "baresip's BYE to end the call")
        assert call.close_reason == "bye"
        await ports_free(app)
        pcm, rate = phone.heard()
    assert rate == 48_000 and len(pcm) > rate  # what the phone decoded from our Opus
    text = await heard_text(services, pcm, rate)
    assert "weather" in text.lower(), text


async def test_a_call_over_sip_tls_with_srtp(services: Services, tmp_path: Path, shared_audio: Path) -> None:
    """SIP over TLS (our certificate given to baresip as its CA file) and SRTP with SDES keys (baresip's srtp module,
    mandatory: RTP/SAVP only): the spoken reply is heard through libsrtp on both sides, and plain RTP is refused."""
    cert, key = self_signed_cert(tmp_path)
    audio = tmp_path / "weather48.wav"
    pcm48_wav(shared_audio / "en_weather.wav", audio, silence_s=30.0)
    cfg = config(allow_from=["127.0.0.1/32"], transports=["udp", "tls"], tls_port=0, tls_cert=str(cert),
                 tls_key=str(key), srtp="required")
    async with serve(cfg, services) as (_url, app):
        async with baresip(tmp_path / "plain", audio, codecs=("g711.so",)) as plain:  # no SRTP: 488
            await plain.command("dial", f"sip:assistant@{LOOPBACK}:{service(app).port()}")
            await until(lambda: plain.saw("CALL_CLOSED"), "the plain RTP call refused")
        assert not calls(app)
        async with baresip(tmp_path / "phone", audio, codecs=("g711.so", "srtp.so"), cafile=cert,
                           mediaenc="srtp-mand") as phone:
            await phone.command("dial", f"sip:assistant@{LOOPBACK}:{service(app).port('tls')};transport=tls")
            call = await only_call(app)
            await until(lambda: phone.saw("CALL_ESTABLISHED"), "baresip to say the call is up")
            assert call.dialog is not None and call.dialog.flow.transport == "tls"
            assert call.rtp is not None and call.rtp.negotiated is not None and call.rtp.negotiated.crypto is not None
            await until(lambda: len(said(call, "assistant")) == 1 and not call.conversation.responding,
                        "the spoken turn answered and its reply played", 60)
            assert "weather" in said(call)[0].lower() and call.rtp.counters.malformed == 0
            await phone.command("hangup")
            await until(lambda: call.closed, "baresip's BYE to end the call")
            assert call.close_reason == "bye"
            await ports_free(app)
            pcm, rate = phone.heard()
    text = await heard_text(services, pcm, rate)
    assert "weather" in text.lower(), text


async def sse_events(http: aiohttp.ClientSession, url: str, headers: dict[str, str], until_type: str,
                     timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """An outgoing call's Server-Sent Events, read until one of ``until_type`` (or the stream's end)."""
    events: list[dict[str, Any]] = []
    async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == until_type:
                    break
    return events


TOKEN = "admin-token-for-the-sip-tests-0123456789"


async def mint(http: aiohttp.ClientSession, url: str, scope: list[str]) -> dict[str, str]:
    async with http.post(f"{url}/api/keys", json={"scope": scope},
                         headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200, await resp.text()
        return {"Authorization": f"Bearer {(await resp.json())['key']}"}


async def test_an_outgoing_call_through_the_trunk_is_answered_after_a_challenge_and_hung_up(
        services: Services, tmp_path: Path) -> None:
    async with sipp("uas_answer", tmp_path, values={"user": "trunkuser", "password": "trunk-pass",
                                                    "wait_ms": "60000"}) as trunk:
        allowed = f"sip:bob@{trunk.uri_host}"
        cfg = test_config(sip={"enabled": True, "port": 0, "responder": "echo", **RTP_RANGE,
                               "trunk": f"sip:{trunk.uri_host}", "trunk_username": "trunkuser",
                               "trunk_password": "trunk-pass", "dial_allow": [allowed, "+1555*"]},
                          server={"auth_token": TOKEN})
        async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
            dialer = await mint(http, url, ["dial", "call"])
            browser = await mint(http, url, ["call"])
            async with http.post(f"{url}/api/sip/calls", json={"to": allowed}, headers=browser) as resp:
                assert resp.status == 403  # a page's key cannot dial out
            for refused in (f"sip:mallory@{trunk.uri_host}", "+4420123456", "sip:bob@evil.example.com"):
                async with http.post(f"{url}/api/sip/calls", json={"to": refused}, headers=dialer) as resp:
                    assert resp.status == 403 and (await resp.json())["error"] == "destination_refused", refused
            async with http.post(f"{url}/api/sip/calls", json={"to": allowed}, headers=dialer) as resp:
                assert resp.status == 202, await resp.text()
                record = await resp.json()
            events = await sse_events(http, f"{url}{record['events_url']}", dialer, "answered")
            assert [e["type"] for e in events] == ["dialing", "ringing", "answered"], events
            session_id = events[-1]["session_id"]
            call = next(c for c in calls(app) if c.id == session_id)
            assert call.direction == "outbound" and call.codec == "PCMU/8000" and call.owner
            other = await mint(http, url, ["dial"])
            async with http.get(f"{url}/api/sip/calls/{record['call_id']}", headers=other) as resp:
                assert resp.status == 404  # another key's call is no call at all
            async with http.get(f"{url}/api/sessions", headers=dialer) as resp:
                assert [s["session_id"] for s in (await resp.json())["sessions"]] == [session_id]
            async with http.delete(f"{url}/api/sessions/{session_id}", headers=dialer) as resp:
                assert resp.status == 200
            assert await trunk.wait() == 0, trunk.log()  # it checked our credentials, and got our BYE
            async with http.get(f"{url}/api/sip/calls/{record['call_id']}", headers=dialer) as resp:
                done = await resp.json()
            assert done["state"] == "ended" and done["events"][-1]["reason"] == "hangup", done
            await ports_free(app)


async def test_an_outgoing_call_to_a_busy_phone_says_busy(services: Services, tmp_path: Path) -> None:
    async with sipp("uas_busy", tmp_path) as trunk:
        cfg = config(trunk=f"sip:{trunk.uri_host}", dial_allow=["+1555*"])
        async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
            async with http.post(f"{url}/api/sip/calls", json={"to": "+15551234567"}) as resp:
                assert resp.status == 202, await resp.text()
                record = await resp.json()
            events = await sse_events(http, f"{url}{record['events_url']}", {}, "busy")
            assert [e["type"] for e in events] == ["dialing", "busy"] and events[-1]["status"] == 486
            assert await trunk.wait() == 0, trunk.log()  # the INVITE named the number, and our ACK came
            assert "INVITE sip:+15551234567@127.0.0.1" in trunk.log()
            await ports_free(app)
            assert not calls(app)


async def test_an_outgoing_call_nobody_picks_up_is_cancelled_as_no_answer(services: Services,
                                                                           tmp_path: Path) -> None:
    async with sipp("uas_ring", tmp_path) as trunk:
        cfg = config(trunk=f"sip:{trunk.uri_host}", dial_allow=["+1555*"], ring_timeout_s=1.0)
        async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
            async with http.post(f"{url}/api/sip/calls", json={"to": "+15550001111"}) as resp:
                record = await resp.json()
            events = await sse_events(http, f"{url}{record['events_url']}", {}, "no_answer")
            assert [e["type"] for e in events] == ["dialing", "ringing", "no_answer"] and events[-1]["status"] == 487
            assert await trunk.wait() == 0, trunk.log()  # our CANCEL, then the ACK of its 487
            await ports_free(app)


async def test_the_server_registers_with_the_trunk(services: Services, tmp_path: Path) -> None:
    async with sipp("uas_register", tmp_path, values={"user": "trunkuser", "password": "trunk-pass",
                                                      "expires": "120"}) as registrar:
        cfg = config(trunk=f"sip:{registrar.uri_host}", register=True, trunk_username="trunkuser",
                     trunk_password="trunk-pass", user="frontdesk")
        async with serve(cfg, services) as (_url, app):
            registration = service(app).registration
            assert registration is not None
            await until(lambda: registration.state == "registered", "the trunk to accept the registration")
            assert await registrar.wait() == 0, registrar.log()
            assert "REGISTER sip:127.0.0.1" in registrar.log() and "<sip:frontdesk@" in registrar.log()


TORTURE = Path(__file__).parent / "data" / "sip_torture"


def flood_request(method: str, n: int, host: str) -> bytes:
    """A scanner's request: well formed, a new call each time, no credentials."""
    return (f"{method} sip:100@{LOOPBACK} SIP/2.0\r\nVia: SIP/2.0/UDP {host}:5060;branch=z9hG4bK{n:08d}\r\n"
            f"From: <sip:100@{host}>;tag={n}\r\nTo: <sip:100@{LOOPBACK}>\r\nCall-ID: flood-{n}@{host}\r\n"
            f"CSeq: 1 {method}\r\nMax-Forwards: 70\r\nUser-Agent: friendly-scanner\r\nContent-Length: 0\r\n\r\n"
            ).encode()


async def ask_over_udp(sock: socket.socket, request: bytes, server: tuple[str, int], timeout_s: float = 32.0) -> bytes:
    """The answer to a non-INVITE request sent as a SIP client sends one over UDP (RFC 3261 17.1.2.2): again after
    T1 (0.5 s), then twice as long each time up to T2 (4 s), until an answer comes or Timer F (64·T1). A flood fills
    the server's socket buffer and the kernel drops what comes next (~3,000 of the test's 4,000 datagrams on a
    2-core machine): a request sent once after it was lost about half the time."""
    loop = asyncio.get_running_loop()
    deadline, interval = loop.time() + timeout_s, 0.5
    while True:
        sock.sendto(request, server)
        try:
            return await asyncio.wait_for(loop.sock_recv(sock, 4096), max(0.0, min(interval, deadline - loop.time())))
        except TimeoutError:
            if loop.time() >= deadline:
                raise
            interval = min(2 * interval, 4.0)


def dropped(services: Services) -> dict[str, float]:
    return {s.labels["reason"]: s.value for m in services.metrics.sip_dropped_total.collect() for s in m.samples
            if s.name.endswith("_total")}


async def test_torture_messages_and_floods_from_unknown_addresses_are_cheap_and_a_call_goes_on(
        services: Services, tmp_path: Path, weather_ulaw: Path) -> None:
    cfg = config(allow_from=["127.0.0.1/32"], username=USER, password=PASSWORD, symmetric_rtp=False)
    before = dropped(services)
    async with serve(cfg, services) as (url, app), ear() as listener, aiohttp.ClientSession() as http:
        agent = service(app).agent
        assert agent is not None
        server = (LOOPBACK, service(app).port())
        torturer, flooder = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
        torturer.bind(("127.0.0.2", 0))
        flooder.bind(("127.0.0.3", 0))
        sent = 0

        async def attack() -> None:
            nonlocal sent
            for path in sorted(TORTURE.glob("*/*.sip")):
                torturer.sendto(path.read_bytes(), server)
            for n in range(4000):
                flooder.sendto(flood_request(("INVITE", "REGISTER", "OPTIONS", "INVITE")[n % 4], n, "127.0.0.3"),
                               server)
                sent += 1
                if n % 200 == 0:
                    await asyncio.sleep(0.005)  # in bursts, so that a real call's INVITE comes amid them

        streaming = f'<nop><action><exec rtp_stream="{weather_ulaw},-1,0"/></action></nop>'
        attacking = asyncio.get_running_loop().create_task(attack())
        async with sipp("uac_wait_bye", tmp_path, target(app), values={
                "ear": str(listener.port), "media": streaming, "session_expires": "1800",
                "wait_ms": "60000"}) as peer:
            call = await only_call(app)
            await attacking
            # A barrier: an OPTIONS from the trusted address after the attack is answered once all of it was read
            # (what the kernel kept of it: the flood overflows the socket's buffer, so the OPTIONS is retransmitted).
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as pinger:
                pinger.bind((LOOPBACK, 0))
                pinger.setblocking(False)
                pong = await ask_over_udp(pinger, flood_request("OPTIONS", 99_999, LOOPBACK), server)
                assert pong.startswith(b"SIP/2.0 200"), pong
            answers = []
            for s in (torturer, flooder):
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    while True:
                        answers.append((s.getsockname()[0], s.recv(65_536)))
                s.close()
            assert sent == 4000
            # Each unknown address got at most its budget of answers (challenges), and nothing else.
            for host in ("127.0.0.2", "127.0.0.3"):
                mine = [a for h, a in answers if h == host]
                assert len(mine) <= cfg.sip.refusals_per_minute, (host, len(mine))
                assert all(a[8:11] in (b"401", b"405", b"481", b"501") for a in mine), mine[:3]
            now = dropped(services)
            assert now.get("handler_error", 0) == before.get("handler_error", 0)  # nothing escaped a handler
            assert now.get("malformed", 0) - before.get("malformed", 0) >= len(list(TORTURE.glob("invalid/*")))
            # Nothing was kept for any of it: no transaction, dialog, session or port but the real call's.
            assert all(tx.flow.host == LOOPBACK for tx in agent.server_tx.entries.values())
            assert list(agent.calls.values()) == [call] and calls(app) == [call]
            assert service(app).ports.in_use == {call.rtp.port} if call.rtp else False
            rtp = call.rtp
            assert rtp is not None
            heard = rtp.counters.received
            await until(lambda: rtp.counters.received > heard + 25, "the real call's audio to go on")
            async with http.delete(f"{url}/api/sessions/{call.id}") as resp:
                assert resp.status == 200
            assert await peer.wait() == 0, peer.log()
        await ports_free(app)


async def test_barge_in_stops_the_reply_within_a_frame_as_on_a_browser_call(services: Services,
                                                                              shared_audio: Path) -> None:
    """The browser test's bound (test_voice_chat.test_barge_in_stops_the_reply_at_once), over SIP: once the server
    decides to interrupt (the ``interrupted`` event), not one more audible reply frame leaves it; the phone hears at
    most the one packet already on its way."""
    story = load_utterance(shared_audio / "en_story.wav")
    timer = load_utterance(shared_audio / "en_timer.wav")
    async with serve(config(allow_from=["127.0.0.1/32"]), services) as (_url, app):
        phone = SipPhone((LOOPBACK, service(app).port()), codec="PCMU")
        await phone.dial()
        try:
            call = await only_call(app)
            track = call.track
            at_interrupt: list[tuple[int, float, float]] = []
            kinds: list[str] = []

            def note(event: dict[str, Any]) -> None:
                kinds.append(event["type"])
                if event["type"] == "interrupted":
                    at_interrupt.append((track.audible_frames_sent, track.last_audible_sent_at, phone_now()))

            call.events.subscribe(note)
            phone.say(story, tail_s=0.0)
            await until(lambda: track.audible_frames_sent > 0, "the reply to start playing", 60)
            playing = track.audible_frames_sent
            await until(lambda: track.audible_frames_sent >= playing + 25, "half a second of the reply to play", 60)
            over = phone.say(timer)
            await until(lambda: at_interrupt, "the reply to be interrupted", 60)
            await asyncio.wait_for(over, 60)  # the caller is done talking over it
            frames_after, last_sent = track.audible_frames_sent, track.last_audible_sent_at
        finally:
            await phone.hang_up()
    (frames_at, sent_at, decided), *_ = at_interrupt
    assert "reply_done" not in kinds[: kinds.index("interrupted")], kinds
    assert (frames_after, last_sent) == (frames_at, sent_at), (
        f"{frames_after - frames_at} audible reply frames went out after the interruption")
    assert phone.audible_since(decided) <= 1, phone.audible_since(decided)
