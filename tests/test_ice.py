"""ICE configuration, TURN REST credentials against a real coturn, and trickle ICE fragments."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from aiortc import RTCPeerConnection

from assistant.config import ConfigError, ICEConfig
from assistant.server.voice.ice import (
    browser_config,
    check_ice_config,
    ice_servers,
    link_headers,
    rtc_configuration,
    turn_rest_credential,
)
from assistant.server.voice.sdpfrag import FragmentError, build_sdpfrag, ice_credentials, parse_sdpfrag
from tests.webrtc_client import rtc_configuration_from_json

CAND = "candidate:1 1 udp 2122260223 192.0.2.1 61764 typ host generation 0"


def test_turn_rest_credential_is_coturns_hmac() -> None:
    username, credential = turn_rest_credential("s3cret", "alice", 600, now=1_700_000_000)
    assert username == "1700000600:alice"
    expected = base64.b64encode(hmac.new(b"s3cret", b"1700000600:alice", hashlib.sha1).digest()).decode()
    assert credential == expected


def test_browser_config_mints_credentials_and_keeps_the_secret() -> None:
    ice = ICEConfig(
        stun_urls=["stun:stun.example.org:3478"],
        turn_urls=["turn:turn.example.org:3478?transport=udp", "turns:turn.example.org:5349?transport=tcp"],
        turn_secret="s3cret",
        turn_ttl_s=300,
        transport_policy="relay",
    )
    body = browser_config(ice, "page-1", now=1000.0)
    assert body["iceTransportPolicy"] == "relay" and body["trickle"] is True and body["expires_at"] == 1300
    stun, turn = body["iceServers"]
    assert stun == {"urls": ["stun:stun.example.org:3478"]}
    assert turn["username"] == "1300:page-1" and turn["credential"] != "s3cret"
    assert "s3cret" not in repr(body)
    config = rtc_configuration_from_json(body)
    assert config.iceTransportPolicy.value == "relay" and config.iceServers[1].username == "1300:page-1"
    links = link_headers(ice_servers(ice, "sess", now=1000.0))
    assert links[0] == '<stun:stun.example.org:3478>; rel="ice-server"'
    assert links[1].startswith('<turn:turn.example.org:3478?transport=udp>; rel="ice-server"; username="1300:sess"')
    assert links[1].endswith('credential-type="password"') and len(links) == 3


def test_static_turn_credentials() -> None:
    ice = ICEConfig(turn_urls=["turn:t.example.org"], turn_username="u", turn_credential="p")
    (server,) = ice_servers(ice, "x")
    assert (server.username, server.credential) == ("u", "p")
    assert "expires_at" not in browser_config(ice, "x")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"transport_policy": "any"}, "transport_policy"),
        ({"transport_policy": "relay"}, "needs at least one TURN"),
        ({"stun_urls": ["turn:x.org"]}, "not a stun"),
        ({"turn_urls": ["http://x.org"]}, "not a turn"),
        ({"turn_urls": ["turn:x.org"]}, "needs credentials"),
        ({"turn_urls": ["turn:x.org"], "turn_secret": "s", "turn_ttl_s": 0}, "turn_ttl_s"),
        ({"stun_urls": ["stun:"]}, "malformed"),
    ],
)
def test_bad_ice_config_is_refused(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_ice_config(ICEConfig(**changes))


def test_parse_fragment_assigns_sections_and_end() -> None:
    text = build_sdpfrag("EsAw", "P2uYro0UCOQ4zxjKXaWCBui1", [("0", CAND), ("0", CAND.replace("61764", "61765"))], True)
    frag = parse_sdpfrag(text, 10)
    assert frag.ufrag == "EsAw" and frag.pwd == "P2uYro0UCOQ4zxjKXaWCBui1" and frag.end_of_candidates
    assert [(c.sdpMid, c.sdpMLineIndex, c.port) for c in frag.candidates] == [("0", 0, 61764), ("0", 0, 61765)]
    # a=mid after the candidates of its section still names them; a second m= section counts up.
    frag = parse_sdpfrag(f"m=audio 9 RTP/AVP 0\r\na={CAND}\r\na=mid:a\r\nm=application 9 x\r\na=mid:b\r\na={CAND}", 10)
    assert [(c.sdpMid, c.sdpMLineIndex) for c in frag.candidates] == [("a", 0), ("b", 1)]
    assert parse_sdpfrag("a=end-of-candidates", 10).end_of_candidates


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello world", "not an SDP line"),
        ("a=candidate:1 1 udp", "not an ICE candidate"),
        ("a=candidate:1 1 udp 1 192.0.2.1 5000 typ bogus", "candidate type"),
        ("a=candidate:1 1 sctp 1 192.0.2.1 5000 typ host", "udp or tcp"),
        ("a=candidate:1 1 udp 1 not-an-ip 5000 typ host", "not an IP"),
        ("a=candidate:1 1 udp 1 192.0.2.1 99999 typ host", "out of range"),
        ("a=ice-options:trickle", "no candidates"),
        ("\r\n".join([f"a={CAND}"] * 3), "more than 2"),
    ],
)
def test_bad_fragments_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(FragmentError, match=message):
        parse_sdpfrag(text, 2)


def test_ice_credentials_of_an_sdp() -> None:
    assert ice_credentials("v=0\r\na=ice-ufrag:abcd\r\na=ice-pwd:xyz\r\na=ice-ufrag:other\r\n") == ("abcd", "xyz")


async def _relay_candidates(ice: ICEConfig, name: str) -> list[str]:
    pc = RTCPeerConnection(rtc_configuration(ice_servers(ice, name), "relay"))
    try:
        pc.createDataChannel("probe")
        await pc.setLocalDescription(await pc.createOffer())
        return [line for line in pc.localDescription.sdp.splitlines() if " typ relay" in line]
    finally:
        await pc.close()


@pytest.mark.slow
async def test_coturn_grants_fresh_credentials_and_refuses_wrong_or_expired(turn_server) -> None:
    good = ICEConfig(turn_urls=[turn_server.url], turn_secret=turn_server.secret, transport_policy="relay")
    assert await _relay_candidates(good, "fresh"), "coturn gave no relay address for a fresh credential"
    wrong = ICEConfig(turn_urls=[turn_server.url], turn_secret="not-the-secret", transport_policy="relay")
    assert await _relay_candidates(wrong, "wrong") == []
    expired = ICEConfig(turn_urls=[turn_server.url], turn_secret=turn_server.secret, turn_ttl_s=-60)
    assert await _relay_candidates(expired, "expired") == []


def test_tls_settings_are_checked_before_serving(tmp_path) -> None:
    from assistant.config import ServerConfig
    from assistant.server.tls import ssl_context
    from tests.conftest import self_signed_cert

    assert ssl_context(ServerConfig()) is None  # TLS off by default
    cert, key = self_signed_cert(tmp_path)
    assert ssl_context(ServerConfig(tls_cert=str(cert), tls_key=str(key))) is not None
    with pytest.raises(ConfigError, match="both"):
        ssl_context(ServerConfig(tls_cert=str(cert)))
    with pytest.raises(ConfigError, match="no such file"):
        ssl_context(ServerConfig(tls_cert=str(cert), tls_key=str(tmp_path / "missing.pem")))
    with pytest.raises(ConfigError, match="cannot load"):
        ssl_context(ServerConfig(tls_cert=str(key), tls_key=str(cert)))  # swapped
