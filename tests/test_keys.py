"""Keys and ownership on one gateway: the server token mints scoped, short-lived keys; every session belongs to the
key that opened it; each client and each key holds no more sessions than its cap; every route that mints or
opens spends a budget; health without secrets.

Real app on loopback, real aiortc offers (the sessions are real, whether or not a peer connects), the official
``openai`` SDK for the Realtime client secrets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiortc import RTCPeerConnection

from assistant.server import keys
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from assistant.server.voice.sdpfrag import build_sdpfrag, ice_credentials
from tests import needs
from tests.conftest import serve, test_config
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)
aio = pytest.mark.asyncio(loop_scope="module")

TOKEN = "admin-s3cret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SDPFRAG = "application/trickle-ice-sdpfrag"


def cfg(tmp_path: Any, **server: Any) -> Any:
    return test_config(server={"data_dir": str(tmp_path / "data"), "auth_token": TOKEN, **server})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def mint(http: aiohttp.ClientSession, url: str, **body: Any) -> str:
    async with http.post(f"{url}/api/keys", json=body, headers=ADMIN) as r:
        answer = await r.json()
        assert r.status == 200, answer
    assert answer["key"].startswith("ek_") and answer["expires_at"] > time.time()
    return str(answer["key"])


class Offer:
    """A real aiortc offer posted with a key (the session is real; the peer never needs to connect)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.pc.createDataChannel("events")
        self.pc.addTransceiver("audio", direction="sendrecv")
        self.sdp = ""

    async def post(self, http: aiohttp.ClientSession, url: str, key: str) -> tuple[int, dict[str, Any]]:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.sdp = self.pc.localDescription.sdp
        async with http.post(f"{url}/api/offer", json={"sdp": self.sdp, "type": "offer"}, headers=bearer(key)) as r:
            return r.status, await r.json()

    def fragment(self) -> str:
        ufrag, pwd = ice_credentials(self.sdp)
        assert ufrag and pwd
        return build_sdpfrag(ufrag, pwd, [("0", "candidate:1 1 udp 2122260223 192.0.2.1 9999 typ host")])


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def listed(http: aiohttp.ClientSession, url: str, key: str) -> set[str]:
    async with http.get(f"{url}/api/sessions", headers=bearer(key)) as r:
        assert r.status == 200, await r.text()
        return {s["session_id"] for s in (await r.json())["sessions"]}


# --- the key format ------------------------------------------------------------------------------------------
def test_a_key_names_its_scopes_expiry_and_cap_and_nothing_else_can_forge_one() -> None:
    minted = keys.mint("tok", ["call"], 600, max_sessions=2, session={"instructions": "Be brief."}, now=1000)
    who = keys.verify("tok", minted.value, now=1500)
    assert (who.scopes, who.expires_at, who.max_sessions, who.expired) == ({"call"}, 1600, 2, False)
    assert who.session == {"instructions": "Be brief."} and who == minted.principal
    assert keys.verify("tok", minted.value, now=1600).expired  # expiry is exclusive
    with pytest.raises(keys.BadKey):  # the token was rotated: every key it signed is dead
        keys.verify("rotated", minted.value, now=1500)
    signed, _, mac = minted.value.rpartition(".")
    body = signed[len(keys.PREFIX):]
    forged = keys.PREFIX + body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac
    for bad in (forged, minted.value + "x", "ek_", "ek_abc.def", "ek_" + "A" * 7000 + ".x", minted.value[:-4]):
        with pytest.raises(keys.BadKey):
            keys.verify("tok", bad, now=1500)
    with pytest.raises(ValueError, match="scope"):
        keys.mint("tok", ["root"], 60)
    with pytest.raises(ValueError, match="characters"):  # a key must fit a header
        keys.mint("tok", ["call"], 60, session={"instructions": __import__("secrets").token_hex(4000)})


def test_scopes_what_an_expired_key_may_still_do() -> None:
    call = keys.Principal("k1", frozenset({"call"}))
    assert call.may("call") and not call.may("tts") and not call.may("admin") and call.may(None)
    assert call.owns("k1") and not call.owns("k2") and not call.owns("")
    assert keys.ADMIN_PRINCIPAL.owns("k2") and keys.ADMIN_PRINCIPAL.may("tts")
    expired = keys.Principal("k1", frozenset({"call", "admin"}), 10, expired=True)
    assert not expired.admin and not expired.may("call") and expired.owns("k1") and not expired.owns("k2")
    assert keys.refusal(expired, "call", acts_on_own=False).code == "key_expired"
    assert keys.refusal(expired, "call", acts_on_own=True) is None  # its own session: trickle and hang up
    assert keys.refusal(call, "tts", acts_on_own=False).code == "forbidden_scope"
    assert keys.refusal(keys.NOBODY, None, acts_on_own=False).code == "unauthorized"


# --- ownership on one gateway --------------------------------------------------------------------------------
@aio
async def test_two_clients_neither_sees_hangs_up_nor_trickles_into_the_others_call(services: Services, tmp_path,
                                                                                  http) -> None:
    async with serve(cfg(tmp_path), services) as (url, app):
        alice, bob = await mint(http, url), await mint(http, url)
        a, b = Offer(), Offer()
        try:
            (sa, ba), (sb, bb) = await a.post(http, url, alice), await b.post(http, url, bob)
            assert (sa, sb) == (200, 200), (ba, bb)
            ida, idb = ba["session_id"], bb["session_id"]
            assert await listed(http, url, alice) == {ida} and await listed(http, url, bob) == {idb}
            async with http.get(f"{url}/api/sessions", headers=ADMIN) as r:  # the admin sees both, and whose
                every = {s["session_id"]: s for s in (await r.json())["sessions"]}
            assert set(every) == {ida, idb} and every[ida]["owner"] != every[idb]["owner"]
            assert every[ida]["client"] == "127.0.0.1"
            # Bob cannot trickle into, nor hang up, Alice's call: to him it does not exist.
            frag = a.fragment()
            async with http.patch(f"{url}/api/sessions/{ida}", data=frag,
                                  headers={"Content-Type": SDPFRAG, **bearer(bob)}) as r:
                assert r.status == 404 and (await r.json())["error"] == "unknown_session"
            async with http.delete(f"{url}/api/sessions/{ida}", headers=bearer(bob)) as r:
                assert r.status == 404
            assert not app[SESSIONS][ida].closed
            # Alice can, with her own key.
            async with http.patch(f"{url}/api/sessions/{ida}", data=frag,
                                  headers={"Content-Type": SDPFRAG, **bearer(alice)}) as r:
                assert r.status == 204, await r.text()
            async with http.delete(f"{url}/api/sessions/{ida}", headers=bearer(alice)) as r:
                assert r.status == 200
            # The admin hangs up anyone's.
            async with http.delete(f"{url}/api/sessions/{idb}", headers=ADMIN) as r:
                assert r.status == 200
            assert not app[SESSIONS]
        finally:
            await a.pc.close()
            await b.pc.close()


@aio
async def test_whip_sessions_belong_to_their_key_and_the_location_is_the_capability(services: Services, tmp_path,
                                                                                   http) -> None:
    async with serve(cfg(tmp_path), services) as (url, _app):
        alice, bob = await mint(http, url), await mint(http, url)
        offer = Offer()
        try:
            await offer.pc.setLocalDescription(await offer.pc.createOffer())
            async with http.post(f"{url}/api/whip", data=offer.pc.localDescription.sdp,
                                 headers={"Content-Type": "application/sdp", **bearer(alice)}) as r:
                assert r.status == 201, await r.text()
                location = r.headers["Location"]
            assert len(location.rsplit("/", 1)[1]) >= 16  # unguessable: 96 random bits
            async with http.delete(url + location, headers=bearer(bob)) as r:
                assert r.status == 404
            async with http.delete(url + location, headers=bearer(alice)) as r:
                assert r.status == 200
        finally:
            await offer.pc.close()


@aio
async def test_expired_keys_start_nothing_but_may_end_their_own_calls(services: Services, tmp_path, http,
                                                                    monkeypatch) -> None:
    async with serve(cfg(tmp_path), services) as (url, app):
        key = await mint(http, url, ttl_s=60)
        offer = Offer()
        try:
            status, body = await offer.post(http, url, key)
            assert status == 200, body
            later = time.time() + 120
            monkeypatch.setattr(keys, "wall_clock", lambda: later)  # two minutes on: the key has expired
            for method, path in (("GET", "/api/sessions"), ("GET", "/api/ice"), ("POST", "/api/offer")):
                async with http.request(method, url + path, headers=bearer(key), json={}) as r:
                    assert (r.status, (await r.json())["error"]) == (401, "key_expired"), path
            # As the reference's client secrets: the call it opened goes on, and it may still hang it up.
            async with http.delete(f"{url}/api/sessions/{body['session_id']}", headers=bearer(key)) as r:
                assert r.status == 200
            assert not app[SESSIONS]
        finally:
            await offer.pc.close()


@aio
async def test_scopes_and_who_may_mint(services: Services, tmp_path, http) -> None:
    async with serve(cfg(tmp_path), services) as (url, _app):
        tts, call = await mint(http, url, scope=["tts"]), await mint(http, url, scope=["call"])
        for key, method, path, body, status in (
            (tts, "POST", "/api/offer", {"sdp": "v=0", "type": "offer"}, 403),
            (tts, "GET", "/api/ice", None, 403),
            (call, "GET", "/api/voices", None, 403),
            (call, "POST", "/v1/audio/speech", {"input": "hi", "voice": "alloy"}, 403),
            (call, "POST", "/api/keys", {}, 403),
            (call, "POST", "/v1/realtime/client_secrets", {}, 403),
            (tts, "GET", "/api/voices", None, 200),
            (call, "GET", "/api/ice", None, 200),
            (call, "GET", "/api/stages", None, 200),
        ):
            async with http.request(method, url + path, json=body, headers=bearer(key)) as r:
                answer = await r.json()
                assert r.status == status, (path, answer)
                if status == 403:
                    code = answer["error"]["code"] if path.startswith("/v1/") else answer["error"]
                    assert code == "forbidden_scope", answer
        # A key minted by a minted admin key lives no longer than the key that minted it.
        async with http.post(f"{url}/api/keys", json={"scope": ["admin"], "ttl_s": 60}, headers=ADMIN) as r:
            parent = await r.json()
        async with http.post(f"{url}/api/keys", json={"ttl_s": 3600}, headers=bearer(parent["key"])) as r:
            child = await r.json()
        assert r.status == 200 and child["expires_at"] <= parent["expires_at"]
        for body in ({"scope": ["root"]}, {"ttl_s": 5}, {"ttl_s": 10**9}, {"max_sessions": 0}, {"other": 1}):
            async with http.post(f"{url}/api/keys", json=body, headers=ADMIN) as r:
                assert r.status == 400, body
        # A key minted under another token (the token was rotated since) is refused.
        old = keys.mint("old-token", ["call"], 600).value
        async with http.get(f"{url}/api/ice", headers=bearer(old)) as r:
            assert (r.status, (await r.json())["error"]) == (401, "invalid_key")


# --- caps and budgets ----------------------------------------------------------------------------------------
@aio
async def test_one_client_cannot_hold_more_sessions_than_its_cap(services: Services, tmp_path, http) -> None:
    """Two at once per client (``server.max_sessions_per_client``): Realtime WebSockets (connected as soon as they
    open) and a page offer count alike, and the place comes back when one closes. A key's own cap too."""
    c = cfg(tmp_path, max_sessions_per_client=2)
    async with serve(c, services) as (url, app):
        key = await mint(http, url)
        ws1 = await http.ws_connect(f"{url}/v1/realtime", headers=bearer(key))
        ws2 = await http.ws_connect(f"{url}/v1/realtime", headers=bearer(key))
        assert (await ws1.receive_json(timeout=10))["type"] == "session.created"
        offer = Offer()
        try:
            status, body = await offer.post(http, url, key)
            assert (status, body["error"]) == (429, "too_many_sessions"), body
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"{url}/v1/realtime", headers=bearer(key))
            assert refused.value.status == 429
            assert len(app[SESSIONS]) == 2
            await ws1.close()
            await until(lambda: len(app[SESSIONS]) < 2, "the closed socket's session to leave the table")
            status, body = await offer.post(http, url, key)
            assert status == 200, body
        finally:
            await ws2.close()
            await offer.pc.close()
    # A key minted with max_sessions=1 holds one at a time, whatever its client's cap.
    async with serve(cfg(tmp_path), services) as (url, app):
        one = await mint(http, url, max_sessions=1)
        ws = await http.ws_connect(f"{url}/v1/realtime", headers=bearer(one))
        try:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"{url}/v1/realtime", headers=bearer(one))
            assert refused.value.status == 429
        finally:
            await ws.close()


@aio
async def test_a_loop_on_realtime_ice_servers_hits_the_budget(services: Services, tmp_path, http) -> None:
    async with serve(cfg(tmp_path, ice_per_minute=5), services) as (url, _app):
        statuses = []
        for _ in range(8):
            async with http.get(f"{url}/v1/realtime/ice-servers", headers=ADMIN) as r:
                statuses.append(r.status)
                if r.status == 429:
                    body = await r.json()
                    assert body["error"]["code"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        assert statuses == [200] * 5 + [429] * 3, statuses
        # /api/ice draws from the same budget: TURN credentials cannot be minted around it.
        async with http.get(f"{url}/api/ice", headers=ADMIN) as r:
            assert r.status == 429


@aio
async def test_minting_spends_a_budget(services: Services, tmp_path, http) -> None:
    c = test_config(server={"data_dir": str(tmp_path / "d"), "auth_token": TOKEN}, keys={"per_minute": 3})
    async with serve(c, services) as (url, _app):
        statuses = []
        for path in ("/api/keys", "/api/keys", "/v1/realtime/client_secrets", "/api/keys",
                     "/v1/realtime/client_secrets"):
            async with http.post(url + path, json={}, headers=ADMIN) as r:
                statuses.append(r.status)
        assert statuses == [200, 200, 200, 429, 429], statuses


# --- health without secrets --------------------------------------------------------------------------------
@aio
async def test_readiness_says_ready_and_nothing_more_to_the_public(services: Services, tmp_path, http) -> None:
    from assistant.bench.processes import free_port

    port = free_port()
    async with serve(cfg(tmp_path, metrics_port=port), services) as (url, _app):
        async with http.get(f"{url}/readyz") as r:
            assert r.status == 200 and await r.json() == {"status": "ready"}
        async with http.get(f"{url}/readyz", headers=ADMIN) as r:
            detail = await r.json()
        assert detail["status"] == "ready" and {"sessions", "max_sessions", "gateway"} <= set(detail)
        key = await mint(http, url, scope=["call", "tts"])
        for headers in ({}, bearer(key), bearer("wrong")):
            async with http.get(f"{url}/metrics", headers=headers) as r:
                assert r.status == 401, headers
        async with http.get(f"{url}/metrics", headers=ADMIN) as r:
            assert r.status == 200 and "assistant_sessions_active" in await r.text()
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:  # Prometheus' own listener: no token
            assert r.status == 200 and "assistant_sessions_active" in await r.text()


# --- the Realtime API's client secrets ------------------------------------------------------------------------
@aio
async def test_client_secrets_in_the_reference_shape_open_realtime_sessions(services: Services, tmp_path,
                                                                           http) -> None:
    openai = needs.module("openai")
    async with serve(cfg(tmp_path), services) as (url, app):
        server_side = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN)
        secret = await server_side.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 120},
            session={"type": "realtime", "instructions": "Answer like a pirate.", "model": "echo"})
        assert secret.value.startswith("ek_") and 100 <= secret.expires_at - time.time() <= 121
        assert secret.session.instructions == "Answer like a pirate."
        # A browser-side client holds only the client secret: its socket starts from the secret's session.
        browser_side = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=secret.value)
        async with browser_side.realtime.connect(model="echo") as conn:
            created = await asyncio.wait_for(conn.recv(), 10)
            assert created.type == "session.created" and created.session.instructions == "Answer like a pirate."
            await conn.send({"type": "session.update", "session": {"instructions": "Now plainly."}})
            updated = await asyncio.wait_for(conn.recv(), 10)
            assert updated.type == "session.updated" and updated.session.instructions == "Now plainly."
            # The session is the secret's: the admin sees it owned by that key; another key cannot hang it up.
            other = await mint(http, url)
            (sid,) = [s.id for s in app[SESSIONS].values()]
            async with http.delete(f"{url}/api/sessions/{sid}", headers=bearer(other)) as r:
                assert r.status == 404
        # JSON nested too deep on the socket: an error event, and the socket goes on (the SDK would not send it).
        async with http.ws_connect(f"{url}/v1/realtime", headers=bearer(secret.value)) as ws:
            assert (await ws.receive_json(timeout=10))["type"] == "session.created"
            await ws.send_str("[" * 50_000 + "]" * 50_000)
            error = await ws.receive_json(timeout=10)
            assert error["type"] == "error" and error["error"]["code"] == "invalid_json", error
            await ws.send_json({"type": "session.update", "session": {"instructions": "Still here."}})
            assert (await ws.receive_json(timeout=10))["type"] == "session.updated"
        # Wrong shapes are refused in the reference's error shape.
        for body in ({"expires_after": {"anchor": "now", "seconds": 60}}, {"expires_after": {"seconds": 5}},
                     {"session": {"type": "transcription"}}, {"session": {"voice": "no-such-voice"}},
                     {"session": {"turn_detection": {"type": "nope"}}}, {"extra": 1}):
            async with http.post(f"{url}/v1/realtime/client_secrets", json=body, headers=ADMIN) as r:
                answer = await r.json()
                assert r.status == 400 and set(answer["error"]) == {"message", "type", "param", "code"}, body
        # Without the token: refused.
        async with http.post(f"{url}/v1/realtime/client_secrets", json={}, headers=bearer(secret.value)) as r:
            assert r.status == 403


# --- through the dispatcher -------------------------------------------------------------------------------
@aio
async def test_ownership_and_caps_hold_through_the_dispatcher(services: Services, tmp_path, http) -> None:
    """Two gateways (in this process, sharing the engines) behind the dispatcher, all with one token: each caller's
    key goes through as it came, so each gateway binds, lists and guards by it; the caps hold across gateways."""
    import contextlib

    from assistant.server.dispatch.app import create_dispatch_app
    from assistant.server.local import serve_on_loopback

    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for gid in ("gA", "gB"):
            c = cfg(tmp_path / gid, gateway_id=gid, max_sessions=4, trusted_proxies=["127.0.0.1/32"])
            gateway, _app = await stack.enter_async_context(serve(c, services))
            urls.append(gateway)
        front_cfg = test_config(server={"auth_token": TOKEN, "max_sessions_per_client": 4},
                                dispatch={"gateways": urls, "poll_interval_s": 0.5})
        front = await stack.enter_async_context(serve_on_loopback(create_dispatch_app(front_cfg)))
        async with http.get(f"{front}/readyz") as r:  # the public learn ready, not the gateways' addresses
            assert r.status == 200 and await r.json() == {"status": "ready"}
        async with http.get(f"{front}/readyz", headers=ADMIN) as r:  # the heartbeat reached them with the token
            assert [g["state"] for g in (await r.json())["gateways"]] == ["ready", "ready"]
        alice, bob = await mint(http, front), await mint(http, front)  # minted on a gateway, good on all
        offers = [Offer() for _ in range(6)]
        try:
            (sa, ba), (sb, bb) = await offers[0].post(http, front, alice), await offers[1].post(http, front, bob)
            assert (sa, sb) == (200, 200), (ba, bb)
            ida, idb = ba["session_id"], bb["session_id"]
            assert {ida.split(".")[0], idb.split(".")[0]} == {"gA", "gB"}  # one on each gateway
            assert await listed(http, front, alice) == {ida} and await listed(http, front, bob) == {idb}
            async with http.get(f"{front}/api/sessions", headers=ADMIN) as r:
                assert {s["session_id"] for s in (await r.json())["sessions"]} == {ida, idb}
            frag = offers[0].fragment()
            async with http.patch(f"{front}/api/sessions/{ida}", data=frag,
                                  headers={"Content-Type": SDPFRAG, **bearer(bob)}) as r:
                assert r.status == 404
            async with http.delete(f"{front}/api/sessions/{ida}", headers=bearer(bob)) as r:
                assert r.status == 404
            async with http.patch(f"{front}/api/sessions/{ida}", data=frag,
                                  headers={"Content-Type": SDPFRAG, **bearer(alice)}) as r:
                assert r.status == 204, await r.text()
            # A key that may hold one session: its second is refused though the other gateway has room.
            one = await mint(http, front, max_sessions=1)
            status, body = await offers[2].post(http, front, one)
            assert status == 200, body
            status, body = await offers[3].post(http, front, one)
            assert (status, body["error"]) == (429, "key_session_limit"), body
            # This client (every caller here is 127.0.0.1) may hold 4 across both gateways, and no more.
            status, body = await offers[4].post(http, front, bob)
            assert status == 200, body
            status, body = await offers[5].post(http, front, alice)
            assert (status, body["error"]) == (429, "too_many_sessions"), body
            for sid, key in ((ida, alice), (idb, bob)):
                async with http.delete(f"{front}/api/sessions/{sid}", headers=bearer(key)) as r:
                    assert r.status == 200
        finally:
            for offer in offers:
                await offer.pc.close()


# --- starting on a public address -------------------------------------------------------------------------
def test_serve_on_a_public_address_without_a_token_exits_with_a_clear_message(tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    run = subprocess.run([sys.executable, "-m", "assistant", "serve", "--server.host", "0.0.0.0",
                          "--server.data_dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "ASSISTANT_SERVER__AUTH_TOKEN": ""})
    assert run.returncode == 2, run.stderr[-2000:]
    assert "0.0.0.0, a non-loopback address, and server.auth_token is empty" in run.stderr
    assert "server.allow_public_without_token" in run.stderr


def test_an_operator_who_means_it_gets_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from assistant.config import ConfigError
    from assistant.server.front import check_exposure

    server = test_config(server={"host": "0.0.0.0"}).server
    with pytest.raises(ConfigError):
        check_exposure(server)
    server.allow_public_without_token = True
    with caplog.at_level("WARNING"):
        check_exposure(server)
    assert "public_without_token" in caplog.text
    for host, token in (("127.0.0.1", ""), ("::1", ""), ("localhost", ""), ("0.0.0.0", "t")):
        check_exposure(test_config(server={"host": host, "auth_token": token}).server)
