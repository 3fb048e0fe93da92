"""The parts of a phone call, each on its own: G.711, the carriers' signatures, the replay guard, the media tokens,
the two dialects' JSON, the caller's audio checks, the reply sink's pacing by marks, and the reply's way down to
8 kHz (anti-aliased)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from assistant.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from assistant.server.telephony.answered import AnsweredCalls
from assistant.server.telephony.caller import MAX_LATE_FRAMES, CallerAudio
from assistant.server.telephony.dialects import (
    TELNYX,
    TWILIO,
    CarrierError,
    Connected,
    Dtmf,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
)
from assistant.server.telephony.signatures import (
    ReplayGuard,
    telnyx_key,
    telnyx_message_key,
    telnyx_valid,
    twilio_signature,
    twilio_valid,
)
from assistant.server.telephony.sink import FRAME, PIECE, CallSink
from assistant.server.telephony.tokens import CallTokens, TokenError
from tests import needs
from tests.waiting import until


# --- G.711 -----------------------------------------------------------------------------------------------------
def test_g711_matches_the_reference_codec_for_every_sample_and_code() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = needs.module("audioop")  # CPython's G.711 (3.13 on: the audioop-lts package)
    x = np.arange(-32768, 32768, dtype=np.int16)
    assert ulaw_encode(x) == audioop.lin2ulaw(x.tobytes(), 2)
    assert alaw_encode(x) == audioop.lin2alaw(x.tobytes(), 2)
    codes = bytes(range(256))
    assert np.array_equal(ulaw_decode(codes), np.frombuffer(audioop.ulaw2lin(codes, 2), "<i2"))
    assert np.array_equal(alaw_decode(codes), np.frombuffer(audioop.alaw2lin(codes, 2), "<i2"))


def test_g711_round_trip_keeps_speech_levels() -> None:
    t = np.arange(8000) / 8000
    x = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        y = dec(enc(x)).astype(np.float64)
        snr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((y - x) ** 2))
        assert snr > 30  # G.711's ~38 dB for a loud tone
    from assistant.server.realtime import formats  # the Realtime API codes with the same functions

    assert formats.ulaw_encode is ulaw_encode and formats.alaw_decode is alaw_decode


# --- signatures ----------------------------------------------------------------------------------------------
def test_twilio_signature_matches_the_example_in_twilios_security_docs() -> None:
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = [("CallSid", "CA1234567890ABCDE"), ("Caller", "+12349013030"), ("Digits", "1234"),
              ("From", "+12349013030"), ("To", "+18005551212")]
    assert twilio_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert twilio_valid("12345", "0/KCTR6DLpKmkAf8muzZqo1nDgQ=", url, list(reversed(params)))  # order-free
    assert not twilio_valid("12345", "0/KCTR6DLpKmkAf8muzZqo1nDgQ=", url, params[:-1])
    assert not twilio_valid("12345", "", url, params)
    assert not twilio_valid("", "0/KCTR6DLpKmkAf8muzZqo1nDgQ=", url, params)
    with_port = twilio_signature("12345", "https://mycompany.com:443/myapp.php?foo=1&bar=2", params)
    assert twilio_valid("12345", with_port, url, params)  # Twilio writes the default port out, or not
    assert not twilio_valid("12345", twilio_signature("12345", "http://mycompany.com/myapp.php?foo=1&bar=2",
                                                      params), url, params)


def test_telnyx_ed25519_signature_over_timestamp_and_body() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    public = telnyx_key(base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode())
    body = b"CallSid=v3%3Aabc&From=%2B1"
    signature = base64.b64encode(key.sign(b"1700000000|" + body)).decode()
    assert telnyx_valid(public, signature, "1700000000", body)
    assert not telnyx_valid(public, signature, "1700000001", body)
    assert not telnyx_valid(public, signature, "1700000000", body + b"&x=1")
    assert not telnyx_valid(public, "not base64!", "1700000000", body)
    with pytest.raises(ValueError):
        telnyx_key("c2hvcnQ=")


def test_replay_guard_refuses_a_signature_twice_within_its_window_and_stays_bounded() -> None:
    clock = [0.0]
    guard = ReplayGuard(300.0, clock=lambda: clock[0], limit=3)
    assert guard.first_time("a") and not guard.first_time("a")
    clock[0] = 301.0
    assert guard.first_time("a")  # the guard forgot it (the answered call ids still refuse it: AnsweredCalls)
    for name in "bcdef":
        guard.first_time(name)
    assert len(guard) == 3 and guard.evicted == 3


def test_a_telnyx_message_is_remembered_until_its_timestamp_leaves_the_window() -> None:
    clock = [1000.0]
    guard = ReplayGuard(300.0, clock=lambda: clock[0])
    key = telnyx_message_key("900", b"CallSid=v3%3Aabc")
    assert key == telnyx_message_key("900", b"CallSid=v3%3Aabc") != telnyx_message_key("901", b"CallSid=v3%3Aabc")
    assert guard.first_time(key, until=900 + 300) and not guard.first_time(key, until=900 + 300)
    clock[0] = 1199.0  # first seen at 1000, stamped 900: remembered until 1200, not 1300
    assert not guard.first_time(key, until=1200)
    clock[0] = 1200.0
    assert len(guard) == 1 and guard.first_time("other") and len(guard) == 1


def test_answered_call_ids_are_refused_again_for_their_memory_across_restarts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clock = [0.0]
    path = tmp_path / "answered.sqlite3"
    first = AnsweredCalls(path, memory_s=100.0, clock=lambda: clock[0])
    assert first.first_answer("twilio", "CA1") and not first.first_answer("twilio", "CA1")
    assert first.first_answer("telnyx", "CA1")  # per carrier
    first.close()
    clock[0] = 99.0
    again = AnsweredCalls(path, memory_s=100.0, clock=lambda: clock[0])  # a restart, or another gateway
    assert not again.first_answer("twilio", "CA1")
    clock[0] = 101.0
    assert again.first_answer("twilio", "CA1")  # past a call's longest life
    again.close()


def test_an_id_answered_while_the_shared_file_was_down_is_still_refused_when_it_is_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "telephony"
    blocker.write_text("a file where the folder should be")  # the folder cannot be made: the file is down
    calls = AnsweredCalls(blocker / "answered.sqlite3", memory_s=100.0, clock=lambda: 0.0)
    assert calls.first_answer("twilio", "CA1") and not calls.first_answer("twilio", "CA1")
    assert calls.failure
    blocker.unlink()  # back: the file knows nothing of CA1, this gateway's memory does
    assert not calls.first_answer("twilio", "CA1") and calls.failure == ""
    assert calls.first_answer("twilio", "CA2") and len(calls) == 2
    calls.close()


# --- media tokens -----------------------------------------------------------------------------------------------
def test_a_token_is_good_once_for_its_carrier_and_call_until_it_expires() -> None:
    clock = [0.0]
    tokens = CallTokens(30.0, limit=2, clock=lambda: clock[0])
    token = tokens.mint("twilio", "CA1")
    assert token is not None and len(token) >= 32
    tokens.redeem(token, "twilio", "CA1")
    with pytest.raises(TokenError, match="unknown_token"):
        tokens.redeem(token, "twilio", "CA1")  # single use
    for carrier, call, reason in (("telnyx", "CA1", "wrong_carrier"), ("twilio", "CA2", "wrong_call")):
        t = tokens.mint("twilio", "CA1")
        with pytest.raises(TokenError, match=reason):
            tokens.redeem(t, carrier, call)
    with pytest.raises(TokenError, match="no_token"):
        tokens.redeem(None, "twilio", "CA1")
    t = tokens.mint("twilio", "CA1")
    clock[0] = 31.0
    with pytest.raises(TokenError, match="expired_token"):
        tokens.redeem(t, "twilio", "CA1")
    assert tokens.mint("twilio", "A") and tokens.mint("twilio", "B")
    assert tokens.mint("twilio", "C") is None  # bounded: the call is turned away
    clock[0] = 62.0
    assert tokens.mint("twilio", "C") is not None  # the expired ones are swept first


# --- the dialects --------------------------------------------------------------------------------------------
TWILIO_START = {"event": "start", "sequenceNumber": "1", "start": {
    "accountSid": "AC1", "streamSid": "MZ1", "callSid": "CA1", "tracks": ["inbound"],
    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    "customParameters": {"token": "t"}}, "streamSid": "MZ1"}
TELNYX_START = {"event": "start", "sequence_number": "1", "stream_id": "S1", "start": {
    "user_id": "u", "call_control_id": "v3:c", "custom_parameters": {"token": "t"},
    "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}}


def test_twilio_and_telnyx_messages_read_into_the_same_events() -> None:
    for dialect, start, sid in ((TWILIO, TWILIO_START, "MZ1"), (TELNYX, TELNYX_START, "S1")):
        parsed = dialect.parse(start)
        assert isinstance(parsed, Start) and parsed.stream_id == sid and parsed.parameters == {"token": "t"}
        assert dialect.format_problem(parsed) == ""
        assert dialect.parse({"event": "connected", "protocol": "Call", "version": "1.0.0"}) == Connected()
        media = dialect.parse({"event": "media", "media": {"track": "inbound", "chunk": "2", "timestamp": "40",
                                                           "payload": "//8="}})
        assert media == Media("//8=", "inbound", 2, 40)
        assert dialect.parse({"event": "mark", "mark": {"name": "0.1"}}) == Mark("0.1")
        assert dialect.parse({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": "#"}}) == Dtmf("#")
        assert dialect.parse({"event": "stop", "stop": {}}) == Stop()
    assert TWILIO.parse(TWILIO_START).call_id == "CA1" and TELNYX.parse(TELNYX_START).call_id == "v3:c"
    error = TELNYX.parse({"event": "error", "payload": {"code": 100002, "title": "unknown_error", "detail": "x"}})
    assert error == CarrierError("100002", "x")
    # What we send, in each carrier's words.
    assert TWILIO.media("MZ1", "AA==") == {"event": "media", "streamSid": "MZ1", "media": {"payload": "AA=="}}
    assert TWILIO.mark("MZ1", "m") == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m"}}
    assert TWILIO.clear("MZ1") == {"event": "clear", "streamSid": "MZ1"}
    assert TELNYX.media("S1", "AA==") == {"event": "media", "media": {"payload": "AA=="}}
    assert TELNYX.clear("S1") == {"event": "clear"}
    assert 'bidirectionalMode="rtp"' in TELNYX.answer("wss://h/telephony/telnyx/media", "tok")
    twiml = ET.fromstring(TWILIO.answer('wss://h/x?a="1"&b', 'to"k<'))  # quoted, whatever the values hold
    stream = twiml.find("./Connect/Stream")
    assert stream is not None and stream.get("url") == 'wss://h/x?a="1"&b'
    assert [(p.get("name"), p.get("value")) for p in stream] == [("token", 'to"k<')]


@pytest.mark.parametrize("message, reason", [
    ([], "bad_message"),
    ({"event": "surprise"}, "unknown_event"),
    ({"event": "start", "start": "x"}, "bad_start"),
    ({"event": "start", "start": {**TWILIO_START["start"], "callSid": ""}}, "bad_start"),
    ({"event": "start", "start": {**TWILIO_START["start"], "callSid": "C" * 500}}, "bad_start"),
    ({"event": "start", "start": {**TWILIO_START["start"], "customParameters": {str(i): "v" for i in range(99)}}},
     "bad_start"),
    ({"event": "media", "media": {"payload": 5}}, "bad_media"),
    ({"event": "media", "media": {"payload": "", "chunk": "-1"}}, "bad_media"),
    ({"event": "media", "media": {"payload": "", "timestamp": "1e9"}}, "bad_media"),
    ({"event": "mark", "mark": {}}, "bad_mark"),
    ({"event": "dtmf", "dtmf": {"digit": "12"}}, "bad_dtmf"),
])
def test_malformed_messages_raise_a_protocol_error_naming_why(message: object, reason: str) -> None:
    with pytest.raises(ProtocolError) as exc:
        TWILIO.parse(message)
    assert exc.value.reason == reason


def test_a_format_other_than_mulaw_8k_mono_is_named() -> None:
    for fmt in ({"encoding": "audio/x-alaw", "sampleRate": 8000}, {"encoding": "audio/x-mulaw", "sampleRate": 16000},
                {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2}):
        start = TWILIO.parse({**TWILIO_START, "start": {**TWILIO_START["start"], "mediaFormat": fmt}})
        assert isinstance(start, Start) and "only audio/x-mulaw 8000 Hz mono" in TWILIO.format_problem(start)


# --- the caller's audio ------------------------------------------------------------------------------------------
def test_caller_audio_is_16k_on_one_clock_and_refuses_floods_size_and_disorder() -> None:
    caller = CallerAudio(max_payload_bytes=1600, clock=0.0)
    t = np.arange(8000) / 8000
    tone = ulaw_encode((8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16))
    out = []
    for k in range(50):  # 1 s in 20 ms messages, received over 1 s
        assert caller.accept_order(k + 1)
        chunk = caller.push(tone[k * 160 : (k + 1) * 160], arrived=0.0, now=k * 0.02)
        if chunk is not None:
            assert chunk.start == sum(len(c) for c in out)
            out.append(chunk.samples)
    total = sum(len(c) for c in out)
    assert caller.lag == 16_000 - total and caller.lag < 500  # the resampler's delay (~26 ms), accounted
    assert not caller.accept_order(50) and caller.late == 1  # a late one is dropped
    assert caller.accept_order(60) and caller.missing == 9
    for _ in range(MAX_LATE_FRAMES - 1):
        caller.accept_order(1)
    with pytest.raises(ProtocolError, match="media_out_of_order"):
        caller.accept_order(1)
    with pytest.raises(ProtocolError, match="media_too_large"):
        caller.push(b"\xff" * 1601, 0.0, now=1.0)
    flood = CallerAudio(max_payload_bytes=16000, clock=0.0)
    flood.push(b"\xff" * 16000, 0.0, now=0.5)  # 2 s arriving by 0.5 s: within the margin
    with pytest.raises(ProtocolError, match="media_flood"):
        flood.push(b"\xff" * 8000, 0.0, now=0.6)


# --- the reply sink ----------------------------------------------------------------------------------------------
class Carrier:
    """Collects what the sink sends; returns marks when told to."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    def sink(self, lead_ms: int = 300) -> CallSink:
        return CallSink(self.sent.append, lambda p: {"event": "media", "media": {"payload": p}},
                        lambda n: {"event": "mark", "mark": {"name": n}}, lambda: {"event": "clear"}, lead_ms)

    def media_samples(self) -> list[int]:
        return [len(base64.b64decode(m["media"]["payload"])) for m in self.sent if m["event"] == "media"]  # type: ignore[index]

    def marks(self) -> list[str]:
        return [m["mark"]["name"] for m in self.sent if m["event"] == "mark"]  # type: ignore[index]


async def test_the_sink_stays_within_the_lead_of_the_marks_and_counts_what_came_back() -> None:
    carrier = Carrier()
    sink = carrier.sink(lead_ms=300)
    reply = np.full(8000, 3000, dtype=np.int16)  # 1 s
    writer = asyncio.create_task(sink.write(reply))
    await asyncio.sleep(0.01)
    assert sum(carrier.media_samples()) == 3 * PIECE  # 300 ms out, then it waits for marks
    assert sink.unconfirmed == 3 * PIECE and sink.audible_frames_sent == 0
    sink.on_mark(carrier.marks()[1])  # marks come back in order: the first two pieces played
    await asyncio.sleep(0.01)
    assert sink.audible_frames_sent == 2 * PIECE // FRAME and sum(carrier.media_samples()) == 5 * PIECE
    sink.on_mark("9.99")  # never sent: ignored
    assert sink.marks_ignored == 1
    while not writer.done():
        for name in carrier.marks():
            sink.on_mark(name)
        await asyncio.sleep(0.01)
    assert await writer
    flushed = asyncio.create_task(sink.flush())
    await asyncio.sleep(0.01)
    for name in carrier.marks():
        sink.on_mark(name)
    assert await flushed
    assert sink.audible_frames_sent == 8000 // FRAME and sum(carrier.media_samples()) == 8000


async def test_pause_clears_and_resume_sends_the_unheard_audio_again_and_interrupt_drops_it() -> None:
    carrier = Carrier()
    sink = carrier.sink(lead_ms=300)
    gen = sink.generation
    writer = asyncio.create_task(sink.write(np.full(8000, 3000, dtype=np.int16)))
    await asyncio.sleep(0.01)
    sink.on_mark(carrier.marks()[0])
    sink.pause()
    assert carrier.sent[-1] == {"event": "clear"} and sink.clears == 1
    for name in carrier.marks():  # the carrier returns what the clear dropped: not heard
        sink.on_mark(name)
    assert sink.audible_frames_sent == PIECE // FRAME and sink.marks_ignored >= 1
    sent_before = sum(carrier.media_samples())
    sink.resume()
    assert sum(carrier.media_samples()) == sent_before + 2 * PIECE  # the two unheard pieces again
    assert carrier.marks()[-1].startswith("1.")  # a new epoch
    dropped = sink.interrupt()
    assert carrier.sent[-1] == {"event": "clear"} and dropped == 2 * PIECE // FRAME
    assert await writer is False and sink.generation == gen + 1
    assert await sink.write(np.ones(800, np.int16), gen) is False  # an old writer is not heard


async def test_a_carrier_that_never_returns_marks_does_not_hang_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    from assistant.server.telephony import sink as sink_module

    monkeypatch.setattr(sink_module, "MARK_GRACE_S", 0.05)
    carrier = Carrier()
    sink = carrier.sink(lead_ms=100)
    assert await asyncio.wait_for(sink.write(np.full(1600, 3000, dtype=np.int16)), 5)
    assert await asyncio.wait_for(sink.flush(), 5)
    assert sink.marks_overdue == 2 and sink.audible_frames_sent == 1600 // FRAME


async def test_after_the_first_overdue_mark_the_clock_paces_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A carrier that drops every mark, at the real grace: one gap of MARK_GRACE_S, then each piece goes out when
    the one before it is due to have played (the caller hears the rest at real time, not ~8 % of it)."""
    from types import SimpleNamespace

    from assistant.server.telephony import sink as sink_module

    now = [0.0]  # the sink's clock, moved by the test (the event loop keeps its own)
    monkeypatch.setattr(sink_module, "time", SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    monkeypatch.setattr(sink_module, "POLL_S", 0.005)
    carrier = Carrier()
    sink = carrier.sink(lead_ms=100)  # one piece in flight at a time
    writer = asyncio.create_task(sink.write(np.full(10 * PIECE, 3000, dtype=np.int16)))
    await until(lambda: len(carrier.media_samples()) == 1, "the first piece sent")
    now[0] = 0.1 + sink_module.MARK_GRACE_S + 0.01  # the first mark is overdue
    await until(lambda: len(carrier.media_samples()) == 2, "the second piece after the grace")
    assert sink.marks_overdue == 1
    for sent in range(3, 11):
        now[0] += PIECE / 8000 + 0.001  # the piece before is due to have played: no second grace
        await until(lambda n=sent: len(carrier.media_samples()) == n, f"piece {sent} sent at its time", timeout_s=5)
    assert await writer


async def test_a_partial_frame_waits_for_the_next_write_and_flush_pads_it() -> None:
    carrier = Carrier()
    sink = carrier.sink()
    await sink.write(np.full(250, 3000, dtype=np.int16))
    assert carrier.media_samples() == [160]
    flushed = asyncio.create_task(sink.flush())
    await asyncio.sleep(0.01)
    assert carrier.media_samples() == [160, 160]
    for name in carrier.marks():
        sink.on_mark(name)
    assert await flushed
    tail = ulaw_decode(base64.b64decode(carrier.sent[-2]["media"]["payload"]))  # type: ignore[index]
    assert np.count_nonzero(tail) == 90  # 90 samples of the reply, then silence


# --- the reply's way down ----------------------------------------------------------------------------------------
async def test_the_reply_is_made_at_8k_with_what_is_above_4k_filtered_out() -> None:
    from assistant.pipeline.synthesis import SynthesisPath
    from assistant.tts.base import TTSCapabilities, TTSRequest

    class Tones:
        name = "tones"
        sample_rate = 22_050
        capabilities = TTSCapabilities()

        async def synthesize(self, request: TTSRequest):  # type: ignore[no-untyped-def]
            t = np.arange(22_050) / 22_050
            freq = float(request.text.split()[0])
            yield (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)

        async def warmup(self) -> None: ...

        async def close(self) -> None: ...

    path = SynthesisPath(Tones(), 8000, timeout_s=10)  # type: ignore[arg-type]

    async def level(freq: int) -> float:
        out = np.concatenate([x async for x in path.speak(f"{freq} hertz.", TTSRequest(text=""))])
        assert abs(len(out) - 8000) < 50
        return float(np.sqrt(np.mean(out[1000:-1000] ** 2)))

    assert await level(1000) > 0.3  # passes (0.35 RMS in)
    assert await level(6000) < 0.002  # would alias to 2 kHz: filtered instead (> 45 dB down)


def test_messages_are_json_the_carriers_read() -> None:
    carrier = Carrier()
    sink = carrier.sink()
    sink.pause()  # nothing sent: nothing to clear
    assert carrier.sent == []
    json.dumps(TWILIO.answer("wss://h/p", "t"))
