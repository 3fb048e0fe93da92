"""SIP's parts on their own (``server/sip/``): messages (the RFC 4475 torture set in ``tests/data/sip_torture``, and
random bytes), addresses, digest authentication both ways, SDP offer/answer, key presses, the receive path's
timestamps. No sockets here; the calls themselves are in ``test_sip.py``."""

from __future__ import annotations

import base64
import contextlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assistant.server.sip.digest import DigestServer, authorization, digest_response, parse_auth, pick_challenge
from assistant.server.sip.dtmf import DigitCollector, TelephoneEvents, parse_event, relay_digit
from assistant.server.sip.message import (
    SipParseError,
    SipRequest,
    SipResponse,
    parse_message,
    response,
)
from assistant.server.sip.rtpsession import TimestampUnwrap
from assistant.server.sip.sdp import (
    OURS,
    Crypto,
    LocalDescription,
    SdpError,
    answer_codecs,
    negotiate,
    offer_codecs,
    parse_crypto,
    parse_sdp,
)
from assistant.server.sip.uri import AddressError, parse_name_addr, parse_uri
from tests.waiting import until

TORTURE = Path(__file__).parent / "data" / "sip_torture"
EXPECTED = json.loads((TORTURE / "expected.json").read_text())


@pytest.mark.parametrize("path", sorted((TORTURE / "valid").glob("*.sip")), ids=lambda p: p.stem)
def test_valid_torture_messages_parse(path: Path) -> None:
    message = parse_message(path.read_bytes())
    assert message.call_id and message.cseq.number >= 0
    again = parse_message(message.encode())  # what we write reads back the same
    assert type(again) is type(message) and again.call_id == message.call_id and again.cseq == message.cseq
    assert [v.branch for v in again.vias] == [v.branch for v in message.vias]
    assert again.body == message.body


@pytest.mark.parametrize("path", sorted((TORTURE / "invalid").glob("*.sip")), ids=lambda p: p.stem)
def test_invalid_torture_messages_are_refused_with_the_status_a_reply_would_carry(path: Path) -> None:
    with pytest.raises(SipParseError) as caught:
        parse_message(path.read_bytes())
    assert caught.value.status == EXPECTED[path.stem]


def test_the_torture_set_says_what_each_message_tests() -> None:
    assert set(EXPECTED) == {p.stem for p in (TORTURE / "invalid").glob("*.sip")}
    assert len(EXPECTED) >= 20 and len(list((TORTURE / "valid").glob("*.sip"))) >= 10


def test_the_tortuous_invite_reads_as_its_author_meant() -> None:
    m = parse_message((TORTURE / "valid" / "wsinv.sip").read_bytes())
    assert isinstance(m, SipRequest) and m.method == "INVITE"
    assert m.to.tag == "1918181833n" and m.from_.tag == "98asjd8"
    assert m.from_.display == 'J Rosenberg \\"'
    assert m.headers.get("Max-Forwards") == "0068" and m.cseq.number == 9
    assert [v.transport for v in m.vias] == ["UDP", "TCP", "UDP"]
    assert [v.branch for v in m.vias] == ["390skdjuw", "z9hG4bK9ikj8", "z9hG4bK30239"]
    assert m.contact is not None and m.contact.params == {"newparam": "newvalue", "secondparam": "", "q": "0.33"}
    assert m.headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    assert parse_sdp(m.body.decode()).audio is not None


def test_a_datagram_with_a_second_request_after_the_first_reads_only_the_first() -> None:
    m = parse_message((TORTURE / "valid" / "dblreq.sip").read_bytes())
    assert isinstance(m, SipRequest) and m.method == "REGISTER" and m.body == b""


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise_anything_but_a_parse_error(data: bytes) -> None:
    with contextlib.suppress(SipParseError):
        parse_message(data)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_mutated_request_never_raises_anything_but_a_parse_error(data: st.DataObject) -> None:
    base = bytearray((TORTURE / "valid" / "wsinv.sip").read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(base) - 1))
        base[at] = data.draw(st.sampled_from(b" \t\r\n:;,<>\"@=%\\x\x00\xff/0"))
    try:
        message = parse_message(bytes(base))
    except SipParseError:
        return
    message.encode()  # a message that parsed can be written back
    for name in ("vias", "from_", "to", "cseq", "contact"):
        getattr(message, name)


def test_a_response_copies_what_rfc_3261_says_and_tags_the_to() -> None:
    request = parse_message((TORTURE / "valid" / "esc01.sip").read_bytes())
    assert isinstance(request, SipRequest)
    ok = response(request, 200, to_tag="abc", headers=[("Contact", "<sip:me@192.0.2.9>")], body=b"v=0\r\n")
    again = parse_message(ok.encode())
    assert isinstance(again, SipResponse) and again.status == 200 and again.reason == "OK"
    assert again.to.tag == "abc" and again.from_.tag == "938" and again.cseq == request.cseq
    assert again.headers.get_all("Via") == request.headers.get_all("Via")
    assert again.content_type == "application/sdp" and again.body == b"v=0\r\n"
    trying = response(request, 100, to_tag="abc")
    assert parse_message(trying.encode()).to.tag == ""  # a 100 never carries a To tag


def test_uris_and_addresses() -> None:
    uri = parse_uri("sip:alice:secret@[2001:db8::1]:5070;transport=TCP;lr?subject=hi")
    assert (uri.user, uri.password, uri.host, uri.port) == ("alice", "secret", "2001:db8::1", 5070)
    assert uri.params == {"transport": "TCP", "lr": ""} and uri.transport == "tcp" and uri.headers == "subject=hi"
    assert parse_uri("sips:bob@example.com").transport == "tls"
    assert parse_uri("tel:+15551234").rest == "+15551234"
    addr = parse_name_addr('"A \\"quoted\\" name" <sip:a@example.com;lr>;tag=x1;expires=60')
    assert addr.display == 'A "quoted" name' and addr.tag == "x1" and addr.uri.params == {"lr": ""}
    assert str(parse_name_addr(str(addr))) == str(addr)
    for bad in ("sip:", "sip:a@", "sip:a@b@c", "sip:a@host:99999", "<sip:a@b>", "sip:a b@c", "nocolon"):
        with pytest.raises(AddressError):
            parse_uri(bad)


# --- digest ----------------------------------------------------------------------------------------------------
def test_digest_a_caller_that_knows_the_password_gets_in_once_per_answer() -> None:
    now = [1_000_000.0]
    server = DigestServer("assistant", "pbx", "s3cret", clock=lambda: now[0], algorithms=("SHA-256", "MD5"))
    challenges = server.challenge("192.0.2.7")
    assert [parse_auth(c)[1]["algorithm"] for c in challenges] == ["SHA-256", "MD5"]
    for challenge in challenges:
        answer = authorization(challenge, "INVITE", "sip:assistant@192.0.2.1", "pbx", "s3cret")
        assert answer is not None
        assert server.check(answer, "INVITE", "192.0.2.7") == "ok"
        assert server.check(answer, "INVITE", "192.0.2.7") == "replayed"  # the same answer twice
        assert server.check(answer, "INVITE", "192.0.2.8") == "bad_nonce"  # the nonce was given to another address
    wrong = authorization(challenges[1], "INVITE", "sip:assistant@192.0.2.1", "pbx", "guess")
    assert server.check(wrong, "INVITE", "192.0.2.7") == "wrong"
    late = authorization(challenges[1], "INVITE", "sip:x@y", "pbx", "s3cret")
    now[0] += 301
    assert server.check(late, "INVITE", "192.0.2.7") == "stale"
    assert server.check(None, "INVITE", "192.0.2.7") == "missing"
    assert server.check('Digest username="pbx"', "INVITE", "192.0.2.7") == "malformed"
    assert server.check("Basic cGJ4OnMzY3JldA==", "INVITE", "192.0.2.7") == "malformed"
    md5_only = DigestServer("assistant", "pbx", "s3cret", clock=lambda: now[0], algorithms=("MD5",))
    sha = authorization(md5_only.challenge("192.0.2.7")[0].replace("MD5", "SHA-256"), "INVITE", "sip:x", "pbx",
                        "s3cret")
    assert md5_only.check(sha, "INVITE", "192.0.2.7") == "malformed"  # an algorithm it did not offer


def test_digest_matches_rfc_2617s_worked_example() -> None:
    # RFC 2617 3.5 (the response the RFC prints), computed by our one function both sides use.
    assert digest_response("MD5", "Mufasa", "testrealm@host.com", "Circle Of Life", "GET", "/dir/index.html",
                           "dcd98b7102dd2f0e8b11d0f600bfb0c093", "auth", "00000001",
                           "0a4f113b") == "6629fae49393a05397450978507c4ef1"


def test_the_client_side_answers_the_strongest_challenge_it_is_given() -> None:
    md5 = 'Digest realm="r", nonce="n1", qop="auth"'
    sha = 'Digest realm="r", nonce="n2", algorithm=SHA-256, qop="auth,auth-int"'
    assert pick_challenge([md5, sha]) == sha
    value = authorization(sha, "REGISTER", "sip:trunk.example.com", "u", "p", nc=3)
    assert value is not None
    _, params = parse_auth(value)
    assert params["algorithm"] == "SHA-256" and params["qop"] == "auth" and params["nc"] == "00000003"
    assert authorization('Digest realm="r", nonce="n", qop="auth-int"', "INVITE", "sip:x", "u", "p") is None
    assert authorization('Digest realm="r", nonce="n", algorithm=MD5-sess', "INVITE", "sip:x", "u", "p") is None


# --- SDP ---------------------------------------------------------------------------------------------------------
OFFER = """v=0\r
o=- 1 1 IN IP4 192.0.2.10\r
s=-\r
c=IN IP4 192.0.2.10\r
t=0 0\r
m=audio 40000 RTP/AVP 8 0 111 101\r
a=rtpmap:111 opus/48000/2\r
a=fmtp:111 useinbandfec=1\r
a=rtpmap:101 telephone-event/8000\r
a=fmtp:101 0-16\r
a=ptime:20\r
a=sendrecv\r
m=video 40002 RTP/AVP 96\r
a=rtpmap:96 VP8/90000\r
"""


def test_an_offer_gets_our_first_preference_it_lists_and_telephone_events() -> None:
    offer = parse_sdp(OFFER)
    chosen = negotiate(offer, ["opus", "PCMU", "PCMA"])
    assert chosen.codec.name == "opus" and chosen.codec.payload_type == 111
    assert chosen.dtmf is not None and chosen.dtmf.payload_type == 101
    assert (chosen.address, chosen.port, chosen.rtcp_port, chosen.direction) == ("192.0.2.10", 40000, 40001,
                                                                                  "sendrecv")
    assert negotiate(offer, ["PCMU", "opus"]).codec.name == "PCMU"
    assert negotiate(offer, ["PCMA"]).codec.payload_type == 8
    answer = LocalDescription("192.0.2.1", 20000, 7).render(answer_codecs(chosen), chosen.direction, False,
                                                             offer.media)
    parsed = parse_sdp(answer)
    assert [m.port for m in parsed.media] == [20000, 0]  # the video line refused, in its place
    assert parsed.audio is not None and parsed.audio.formats == ["111", "101"]
    back = negotiate(parsed, ["opus"], offer=False)
    assert back.codec.name == "opus" and back.address == "192.0.2.1"


def test_hold_and_no_common_codec() -> None:
    held = negotiate(parse_sdp(OFFER.replace("a=sendrecv", "a=sendonly")), ["PCMU"])
    assert held.direction == "recvonly" and held.on_hold
    old_hold = negotiate(parse_sdp(OFFER.replace("c=IN IP4 192.0.2.10", "c=IN IP4 0.0.0.0")), ["PCMU"])
    assert old_hold.on_hold
    with pytest.raises(SdpError):
        negotiate(parse_sdp(OFFER.replace("RTP/AVP 8 0 111 101", "RTP/AVP 18")), ["opus", "PCMU", "PCMA"])
    with pytest.raises(SdpError):  # SRTP without a key
        negotiate(parse_sdp(OFFER.replace("RTP/AVP 8", "RTP/SAVP 8")), ["PCMU"])
    for bad in ("", "v=1\r\n", "v=0\r\nc=IN IP4 not-an-ip\r\n", "v=0\r\nm=audio 99999 RTP/AVP 0\r\n",
                "v=0\r\n" + "a=x\r\n" * 300):
        with pytest.raises(SdpError):
            parse_sdp(bad)


def test_srtp_offers_are_taken_with_an_sdes_key_and_refused_as_the_setting_says() -> None:
    key = bytes(range(30))
    line = f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(key).decode()}|2^31"
    savp = OFFER.replace("RTP/AVP 8 0 111 101", "RTP/SAVP 8 0 111 101").replace(
        "a=sendrecv", f"a=sendrecv\r\na=crypto:9 FOO_SUITE inline:AAAA\r\na=crypto:{line}")
    chosen = negotiate(parse_sdp(savp), ["PCMU"])
    assert chosen.crypto == Crypto("1", "AES_CM_128_HMAC_SHA1_80", key)
    with pytest.raises(SdpError):
        negotiate(parse_sdp(savp), ["PCMU"], srtp="off")
    with pytest.raises(SdpError):  # plain RTP when SRTP is required
        negotiate(parse_sdp(OFFER), ["PCMU"], srtp="required")
    with pytest.raises(SdpError):  # SRTP without a key we can use
        negotiate(parse_sdp(savp.replace(f"a=crypto:{line}", "")), ["PCMU"])
    for bad in ("1 AES_CM_128_HMAC_SHA1_80 inline:AAAA", "x AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40,
                f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(key).decode()}|2^20|1:4",
                f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(key).decode()} UNENCRYPTED_SRTP"):
        assert parse_crypto(bad) is None, bad
    answer = LocalDescription("192.0.2.1", 20000, 7, crypto=[Crypto("1", "AES_CM_128_HMAC_SHA1_80", key[::-1])])
    parsed = parse_sdp(answer.render(answer_codecs(chosen), chosen.direction))
    assert parsed.audio is not None and parsed.audio.proto == "RTP/SAVP"
    assert negotiate(parsed, ["PCMU"], offer=False).crypto == Crypto("1", "AES_CM_128_HMAC_SHA1_80", key[::-1])


def test_our_offer_lists_every_codec_we_take() -> None:
    offer = parse_sdp(LocalDescription("192.0.2.1", 20002, 1).render(offer_codecs(["opus", "PCMU", "PCMA"])))
    assert offer.audio is not None and offer.audio.codecs[111] == OURS["opus"]
    assert {c.name for c in offer.audio.codecs.values()} == {"opus", "PCMU", "PCMA", "telephone-event"}


# --- key presses -----------------------------------------------------------------------------------------------
def event(code: int, end: bool, duration: int = 160) -> bytes:
    return struct.pack("!BBH", code, (0x80 if end else 0) | 10, duration)


def test_a_key_press_counts_once_however_many_packets_carry_it() -> None:
    events = TelephoneEvents()
    packets = [(1, 8000, event(5, False)), (1, 8000, event(5, False, 320)), (1, 8000, event(5, True)),
               (1, 8000, event(5, True)), (1, 9600, event(11, False)), (1, 9600, event(11, True))]
    assert [d for s, t, p in packets if (d := events.packet(s, t, p))] == ["5", "#"]
    assert parse_event(event(16, False)) is None and parse_event(b"\x01") is None
    assert relay_digit("application/dtmf-relay", b"Signal=7\r\nDuration=160\r\n") == "7"
    assert relay_digit("application/dtmf", b"11") == "#"
    assert relay_digit("application/dtmf-relay", b"Signal=??") is None


async def test_digits_close_together_are_one_entry_and_hash_ends_it_at_once() -> None:
    entries: list[str] = []
    collector = DigitCollector(0.2, entries.append)
    for digit in "12":
        collector.add(digit)
    await until(lambda: entries == ["12"], "the entry after the gap", 5)
    for digit in "34#":
        collector.add(digit)
    assert entries == ["12", "34#"]  # on #, at once
    collector.add("9")
    collector.close()
    assert entries == ["12", "34#"]


def test_rtp_timestamps_become_one_clock_across_wraps_and_sources() -> None:
    clock = TimestampUnwrap()
    assert clock.pts(1, 2**32 - 160, 160) == 0
    assert clock.pts(1, 0, 160) == 160  # the 32-bit wrap
    assert clock.pts(1, 320, 160) == 480  # a lost packet leaves its gap in the clock
    assert clock.pts(2, 123456, 160) == 640  # another source goes on where the last frame ended
    assert clock.pts(2, 123456 + 160, 160) == 800


def test_the_bench_reads_the_sip_capacity_where_a_calls_p90_doubles() -> None:
    from assistant.bench.report import BenchResult, LevelResult, TurnResult
    from assistant.bench.v2v_cli import sip_capacity, sip_notes

    levels = {1: [500.0, 600.0, 700.0], 2: [600.0, 800.0, 900.0], 4: [700.0, 1000.0, 1300.0], 8: [2000.0, 3000.0],
              16: [900.0]}
    reading = sip_capacity(levels)  # 8 doubled it: 4 is the answer, whatever 16 did
    assert reading == "4 (p90 1240 ms against 680 ms with 1; at 8 calls it was 4.26x)", reading
    assert sip_capacity({1: [500.0], 2: [600.0]}).startswith("2 or more")

    def run(protocol: str, by_level: dict[int, list[float]]) -> BenchResult:
        result = BenchResult(url="x", same_host=True, threshold_dbfs=-40.0, window_ms=10, protocol=protocol,
                             settings={"codec": "PCMU"})
        for calls, values in by_level.items():
            result.levels.append(LevelResult(sessions=calls, turns=[
                TurnResult(session=0, index=k, file="x.wav", columns={"v2v_ms": v}) for k, v in enumerate(values)]))
        return result

    notes = sip_notes([run("page", {1: [450.0, 550.0]}), run("sip", levels)])
    assert notes[0] == f"SIP calls held at once before a call's v2v p90 doubles (PCMU): {reading}."
    assert notes[1].startswith("SIP (PCMU) minus page, medians: +100 ms")
