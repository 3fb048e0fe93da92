"""Phone calls end to end: the real app on 127.0.0.1 with the default CPU stack, and a simulated carrier
(``bench/telephony_client.py``) that signs its webhook and speaks the Media Streams protocol byte for byte: μ-law
speech from ../shared/audio in real time, reply media played out at 8 kHz, marks returned as they play, a clear
that drops what has not played.

- a spoken turn gets μ-law reply audio, and our ASR hears the reply text in it;
- speech over the reply gets a ``clear``, and the history keeps the reply up to the last mark that came back;
- unsigned, replayed and badly signed webhooks, wrong or reused tokens and malformed streams are refused while a
  good call goes on;
- the same turn over Telnyx's dialect; calls are sessions (listed, counted, hung up, timed out);
- with no auth token the routes answer 404; behind a proxy the signature covers ``telephony.public_url``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import numpy as np
import pytest

from assistant.audio import SPEECH_RATE, resample, s16_to_float
from assistant.bench.audio_source import load_utterance
from assistant.bench.telephony_client import (
    FRAME,
    RATE,
    SILENCE_FRAME,
    TELNYX,
    TWILIO,
    Carrier,
    PhoneCall,
    dial,
    now,
    phone_turn,
    signed_headers,
    stream_path,
    utterance_ulaw,
    webhook_form,
)
from assistant.pipeline.reply import played_text
from assistant.server.app import SESSIONS
from assistant.server.limits import LIMITS
from assistant.server.services import Services
from assistant.server.telephony.media import CallSession
from assistant.server.telephony.sink import CallSink
from assistant.server.telephony.state import TELEPHONY
from lab.narrowband import word_error_rate
from tests.conftest import serve, test_config
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]

AUTH = "test-auth-token-0123456789abcdef"


def config(**telephony: Any) -> Any:
    return test_config(telephony={"twilio_auth_token": AUTH, "responder": "echo", **telephony})


def say(c: PhoneCall, path: Path, silence_s: float = 2.5) -> asyncio.Future[float]:
    """Say a speech file as a phone line carries it, ``silence_s`` of silence after it; the future is when the
    frame holding its last speech sample (the manifest's) was sent."""
    data, end_frame = utterance_ulaw(load_utterance(path))
    return c.say(data + SILENCE_FRAME * int(silence_s * RATE / FRAME), end_frame)


async def heard(services: Services, pcm8k: np.ndarray) -> str:
    """What our ASR hears in 8 kHz reply audio."""
    return (await services.asr.transcribe(resample(s16_to_float(pcm8k), RATE, SPEECH_RATE))).text


@contextlib.asynccontextmanager
async def call(http: aiohttp.ClientSession, url: str, carrier: Carrier = TWILIO, **dial_kw: Any
               ) -> AsyncIterator[PhoneCall]:
    """A call answered by the server's webhook, its media stream open (hung up after the block)."""
    _, call_id = carrier.new_ids()
    answer = await dial(http, url, carrier, call_id=call_id, auth_token=AUTH, **dial_kw)
    assert answer.status == 200 and answer.stream_url, answer
    phone_call = PhoneCall(http, answer.stream_url, carrier, call_id, answer.parameters,
                           connect_url=url.replace("http", "ws", 1) + stream_path(answer.stream_url))
    await phone_call.open()
    try:
        yield phone_call
    finally:
        await phone_call.hang_up()


async def only_call(app: Any) -> CallSession:
    """The one call in the session table, once its start has been read."""
    def calls() -> list[CallSession]:
        return [s for s in app[SESSIONS].values() if isinstance(s, CallSession)]
    await until(lambda: len(calls()) == 1, "the call's start read")
    return calls()[0]


async def metric(http: aiohttp.ClientSession, url: str, series: str) -> float:
    """One series of ``/metrics`` (the services, and so the counters, are shared by the module's apps)."""
    for line in (await (await http.get(f"{url}/metrics")).text()).splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_spoken_turn_gets_mulaw_reply_audio_that_says_the_reply(services: Services, shared_audio) -> None:
    async with serve(config(), services) as (url, app), aiohttp.ClientSession() as http, call(http, url) as c:
        session = await only_call(app)
        assert session.carrier == "twilio" and isinstance(session.sink, CallSink)
        speech_end = await say(c, shared_audio / "en_weather.wav")
        assert await c.reply_done(speech_end), c.messages[-5:]
        # The reply came as media messages of μ-law, each followed by a mark, all naming the stream.
        media = [m for m in c.messages if m["event"] == "media"]
        assert media and all(m["streamSid"] == c.stream_id and set(m["media"]) == {"payload"} for m in media)
        kinds = [m["event"] for m in c.messages]
        assert kinds[:2] == ["media", "mark"] and kinds.count("mark") == len(media)
        said = session.conversation.history.messages[-1].content
        assert said.lower().startswith("you said") and "weather" in said.lower()
        audio = c.heard_pcm(speech_end)
        assert len(audio) > RATE  # more than a second of speech
        text = await heard(services, audio)
        assert word_error_rate(said, text) <= 0.35, (said, text)
        # Every mark came back as played; what the server counts as heard is all of it.
        await until(lambda: session.sink.unconfirmed == 0, "every mark back")
        sent = sum(len(base64.b64decode(m["media"]["payload"])) for m in media)
        assert session.sink.audible_frames_sent * 160 == sent
        assert not c.clears and c.marks_cleared == []


async def test_barge_in_clears_and_the_history_ends_at_the_last_mark_that_came_back(services: Services,
                                                                                    shared_audio) -> None:
    async with serve(config(), services) as (url, app), aiohttp.ClientSession() as http, call(http, url) as c:
        session = await only_call(app)
        sink = session.sink
        assert isinstance(sink, CallSink)
        speech_end = await say(c, shared_audio / "en_story.wav", silence_s=0.0)
        assert await c.wait_for(lambda: c.first_audible(speech_end) is not None, 30)
        turn = session.conversation.runner.current
        assert turn is not None
        first = c.first_audible(speech_end)
        assert first is not None
        await c.wait_for(lambda: now() >= first + 1.2, 5)  # a second and more of the reply plays
        confirmed_at_clear: list[int] = []
        over = say(c, shared_audio / "en_timer.wav")
        assert await c.wait_for(lambda: bool(c.clears), 15), "no clear after the caller spoke over the reply"
        confirmed_at_clear.append(sink.audible_frames_sent)
        await over
        # The interrupted turn is in the history with what was heard, then the new turn is answered.
        assert await c.wait_for(lambda: len(session.conversation.history.messages) >= 4, 30)
        history = session.conversation.history.messages
        assert history[0].role == "user" and "story" in history[0].content.lower()
        kept = history[1].content
        # What the caller played up to the last mark it returned before the clear: the media before that mark.
        played = 0
        samples = 0
        clear_at = next(i for i, m in enumerate(c.messages) if m["event"] == "clear")
        returned = set(c.marks_played)
        for m in c.messages[:clear_at]:
            if m["event"] == "media":
                samples += len(base64.b64decode(m["media"]["payload"]))
            elif m["event"] == "mark" and m["mark"]["name"] in returned:
                played = samples
        base = turn.reply.frames_base or 0
        heard_samples = (confirmed_at_clear[0] - base) * 160
        # A mark in flight when the clear went out counts as not heard: at most one piece (100 ms) short.
        assert played - 800 <= heard_samples <= played, (played, heard_samples)
        assert kept == played_text(turn.reply.spoken, turn.reply.samples_made, heard_samples)
        assert kept and turn.reply.text.startswith(kept) and len(kept) < len(turn.reply.text), (kept, turn.reply.text)
        assert c.marks_cleared, "the carrier returned the dropped marks"
        assert sink.clears >= 1 and sink.marks_ignored >= len(c.marks_cleared)
        assert "timer" in history[2].content.lower()


async def test_bad_webhooks_tokens_and_streams_are_refused_while_a_good_call_goes_on(services: Services,
                                                                                      shared_audio) -> None:
    cfg = config(start_timeout_s=2.0, dtmf_per_minute=20)
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        tel = app[TELEPHONY]
        ws_base = url.replace("http", "ws", 1)
        refusals = 'assistant_telephony_refusals_total{carrier="twilio",reason="%s"}'
        before = {r: await metric(http, url, refusals % r) for r in ("replayed", "dtmf_flood", "unknown_token")}

        async def good_call() -> str:
            async with call(http, url) as c:
                speech_end = await say(c, shared_audio / "en_weather.wav")
                assert await c.reply_done(speech_end, timeout_s=60), "the good call got no reply"
                return await heard(services, c.heard_pcm(speech_end))

        async def refused_stream(reason: str, *, token: str | None = None, call_id: str = "", start: bool = True,
                                 media_format: dict[str, Any] | None = None, then: Any = None) -> None:
            """A stream that the server must close with ``reason``."""
            _, own = TWILIO.new_ids()
            if token is None:
                answer = await dial(http, url, TWILIO, call_id=own, auth_token=AUTH)
                token = answer.parameters["token"]
            c = PhoneCall(http, "", TWILIO, call_id or own, {"token": token}, connect_url=f"{ws_base}/telephony/"
                          "twilio/media", media_format=media_format)
            c.ws = await http.ws_connect(c.url)
            if start:
                await c.send(c.carrier.connected())
                await c.send(c._start_with_format() if media_format else
                             c.carrier.start(1, c.stream_id, c.call_id, c.parameters))
            c._tasks = [asyncio.create_task(c._receive())]
            if then is not None:
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                    await then(c)
            assert await c.wait_for(lambda: c.closed.is_set(), 15), f"not closed: expected {reason}"
            assert c.close_reason == reason, (c.close_code, c.close_reason, reason)
            await c.close()

        async def attacks() -> None:
            await asyncio.sleep(1.0)  # the good call is under way
            _, cid = TWILIO.new_ids()
            # Webhooks: unsigned, wrongly signed, signed for another URL, replayed.
            unsigned = await dial(http, url, TWILIO, call_id=cid, headers={})
            assert unsigned.status == 403 and json.loads(unsigned.body)["error"] == "unsigned"
            forged = await dial(http, url, TWILIO, call_id=cid, auth_token="not-the-token")
            assert forged.status == 403 and json.loads(forged.body)["error"] == "bad_signature"
            elsewhere = await dial(http, url, TWILIO, call_id=cid, auth_token=AUTH,
                                   signed_url="https://evil.example/telephony/twilio/voice")
            assert elsewhere.status == 403
            hook = f"{url}/telephony/twilio/voice"
            headers = signed_headers(TWILIO, hook, webhook_form(TWILIO, cid), b"", auth_token=AUTH)
            first = await dial(http, url, TWILIO, call_id=cid, headers=headers)
            again = await dial(http, url, TWILIO, call_id=cid, headers=headers)
            assert first.status == 200 and again.status == 403 and json.loads(again.body)["error"] == "replayed"
            # Tokens: made up, used twice, for another call.
            await refused_stream("unknown_token", token="made-up")
            _, own = TWILIO.new_ids()
            answer = await dial(http, url, TWILIO, call_id=own, auth_token=AUTH)
            used = PhoneCall(http, "", TWILIO, own, answer.parameters,
                             connect_url=f"{ws_base}/telephony/twilio/media")
            await used.open()
            await used.hang_up()
            await refused_stream("unknown_token", token=answer.parameters["token"], call_id=own)
            await refused_stream("wrong_call", call_id="CA" + "f" * 32)
            await refused_stream("no_token", token="")
            # Streams: no start in time, a wrong format, malformed JSON, a binary frame, an unknown event.
            await refused_stream("start_timeout", token="never-sent", start=False)
            await refused_stream("unsupported_media_format",
                                 media_format={"encoding": "audio/x-alaw", "sampleRate": 8000, "channels": 1})
            await refused_stream("malformed_json", then=lambda c: c.send("{not json"))
            await refused_stream("binary_frame", then=lambda c: c.ws.send_bytes(b"\x00" * 160))
            await refused_stream("unknown_event", then=lambda c: c.send({"event": "surprise"}))
            await refused_stream("second_start", then=lambda c: c.send(
                c.carrier.start(9, c.stream_id, c.call_id, c.parameters)))

            async def oversized(c: PhoneCall) -> None:
                await c.send(c.carrier.media(2, c.stream_id, 1, 0, b"\xff" * 17_000))

            await refused_stream("media_too_large", then=oversized)

            async def backwards(c: PhoneCall) -> None:
                for k in range(60):
                    await c.send(c.carrier.media(2 + k, c.stream_id, 100 - k, 0, SILENCE_FRAME))

            await refused_stream("media_out_of_order", then=backwards)

            async def flood(c: PhoneCall) -> None:
                for k in range(300):  # 6 s of audio at once
                    await c.send(c.carrier.media(2 + k, c.stream_id, k + 1, 20 * k, SILENCE_FRAME))

            await refused_stream("media_flood", then=flood)

            async def keys(c: PhoneCall) -> None:
                for k in range(40):
                    await c.send(c.carrier.dtmf(2 + k, c.stream_id, "5"))

            await refused_stream("dtmf_flood", then=keys)

        text, _ = await asyncio.gather(good_call(), attacks())
        assert "weather" in text.lower(), text
        # Nothing kept for the refused: the call table is empty, nothing waits for a start.
        await until(lambda: not app[SESSIONS], "the session table empty")
        assert not app[LIMITS]._held.get("telephony_start")
        assert len(tel.tokens) <= 1  # the replay test's first (answered, never used) token, until it expires
        after = {r: await metric(http, url, refusals % r) for r in before}
        assert {r: after[r] - before[r] for r in before} == {"replayed": 1, "dtmf_flood": 1, "unknown_token": 2}


async def test_telnyx_holds_the_same_spoken_turn(services: Services, shared_audio) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    cfg = config(twilio_auth_token="", telnyx_public_key=public)
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
        utt = load_utterance(shared_audio / "en_weather.wav")
        async with call(http, url, TELNYX, telnyx_private_key=key) as c:
            session = await only_call(app)
            assert session.carrier == "telnyx"
            turn = await phone_turn(c, utt)
            assert turn.v2v_ms is not None and turn.v2v_ms > 0, turn
            media = [m for m in c.messages if m["event"] == "media"]
            assert media and all(set(m) == {"event", "media"} for m in media)  # Telnyx: no stream id on ours
            assert "weather" in (await heard(services, c.heard_pcm())).lower()
        # Twilio is off here, and a Telnyx webhook signed with another key, or too old, is refused.
        _, cid = TELNYX.new_ids()
        assert (await dial(http, url, TWILIO, call_id="CA1", auth_token=AUTH)).status == 404
        other = Ed25519PrivateKey.generate()
        assert (await dial(http, url, TELNYX, call_id=cid, telnyx_private_key=other)).status == 403
        body = urlencode(webhook_form(TELNYX, cid)).encode()
        old = signed_headers(TELNYX, "", [], body, telnyx_private_key=key, timestamp=1_000_000_000)
        stale = await dial(http, url, TELNYX, call_id=cid, headers=old)
        assert stale.status == 403 and json.loads(stale.body)["error"] == "stale_timestamp"


async def test_a_call_is_a_session_listed_counted_hung_up_and_timed_out(services: Services, shared_audio) -> None:
    async with serve(config(media_timeout_s=1.5), services) as (url, app), aiohttp.ClientSession() as http:
        opened = await metric(http, url, "assistant_sessions_total")
        v2v = 'assistant_stage_seconds_count{stage="server_v2v"}'
        turns = await metric(http, url, v2v)
        async with call(http, url) as c:
            session = await only_call(app)
            listed = await (await http.get(f"{url}/api/sessions")).json()
            assert [s["session_id"] for s in listed["sessions"]] == [session.id]
            speech_end = await say(c, shared_audio / "en_weather.wav")
            assert await c.reply_done(speech_end)
            assert await metric(http, url, "assistant_sessions_active") == 1
            assert await metric(http, url, v2v) == turns + 1  # the call's turn is in the latency breakdown
            hung = await http.delete(f"{url}/api/sessions/{session.id}")
            assert hung.status == 200
            assert await c.wait_for(lambda: c.closed.is_set(), 5)
            assert (c.close_code, c.close_reason) == (1000, "hangup")
        await until(lambda: not app[SESSIONS], "the session table empty")
        # A carrier whose media stops is closed after telephony.media_timeout_s; a stop ends a call at once.
        async with call(http, url) as c:
            await c.wait_for(lambda: len(app[SESSIONS]) == 1, 5)
            for task in c._tasks:
                if task.get_name() == "carrier-tx":
                    task.cancel()
            assert await c.wait_for(lambda: c.closed.is_set(), 10)
            assert c.close_reason == "media_timeout"
        async with call(http, url) as c:
            await c.wait_for(lambda: len(app[SESSIONS]) == 1, 5)
            await c.send(c.carrier.stop(99, c.stream_id, c.call_id))
            assert await c.wait_for(lambda: c.closed.is_set(), 5)
            assert (c.close_code, c.close_reason) == (1000, "stop")
        await until(lambda: not app[SESSIONS], "the session table empty")
        assert await metric(http, url, "assistant_sessions_active") == 0
        assert await metric(http, url, "assistant_sessions_total") == opened + 3


async def test_with_no_auth_token_the_routes_answer_404(services: Services) -> None:
    async with serve(test_config(), services) as (url, _app), aiohttp.ClientSession() as http:
        answer = await dial(http, url, TWILIO, call_id="CA" + "0" * 32, auth_token="anything")
        assert answer.status == 404 and json.loads(answer.body)["error"] == "telephony_off"
        resp = await http.get(f"{url}/telephony/twilio/media")
        assert resp.status == 404
        assert (await http.get(f"{url}/telephony/telnyx/media")).status == 404


async def test_behind_a_proxy_the_signature_covers_the_public_url(services: Services) -> None:
    public = "https://voice.example.com/assistant"
    async with serve(config(public_url=public), services) as (url, _app), aiohttp.ClientSession() as http:
        _, cid = TWILIO.new_ids()
        direct = await dial(http, url, TWILIO, call_id=cid, auth_token=AUTH)
        assert direct.status == 403  # signed for the URL it was posted to, not the one Twilio calls
        hook = public + "/telephony/twilio/voice"
        answer = await dial(http, url, TWILIO, call_id=cid, auth_token=AUTH, signed_url=hook)
        assert answer.status == 200
        assert answer.stream_url == "wss://voice.example.com/assistant/telephony/twilio/media"
        assert set(answer.parameters) == {"token"} and len(answer.parameters["token"]) >= 32
        # Twilio may sign an https URL with its port written out.
        port = await dial(http, url, TWILIO, call_id=cid + "x", auth_token=AUTH,
                          signed_url="https://voice.example.com:443/assistant/telephony/twilio/voice")
        assert port.status == 200


async def test_bench_v2v_over_twilio_measures_each_turn_of_a_call(services: Services, shared_audio: Path,
                                                                   tmp_path: Path, capsys: Any) -> None:
    """``assistant bench v2v --protocol twilio``: the simulated carrier's turns, measured, written, as Markdown."""
    from assistant.bench.v2v_cli import run_v2v
    from assistant.cli import build_parser

    async with serve(config(), services) as (url, _app):
        args = build_parser("v2v").parse_args(
            ["bench", "v2v", "--url", url, "--protocol", "twilio", "--twilio-auth-token", AUTH, "--audio",
             str(shared_audio / "en_weather.wav"), str(shared_audio / "en_timer.wav"), "--out", str(tmp_path),
             "--markdown", str(tmp_path / "phone.md")])
        assert await run_v2v(args) == 0
    out = capsys.readouterr().out
    assert "left out: the stage columns: a phone call's media stream carries no events" in out
    data = json.loads((tmp_path / "v2v.json").read_text())
    assert data["protocol"] == "twilio" and data["server"] == "assistant"
    turns = data["levels"][0]["turns"]
    assert [t["file"] for t in turns] == ["en_weather.wav", "en_timer.wav"]
    for t in turns:
        cols = t["columns"]
        assert t["status"] == "ok" and cols["v2v_ms"] > 0 and 0 < cols["first_audio_ms"] <= cols["v2v_ms"], t
        assert set(cols) == {"v2v_ms", "first_audio_ms", "onset_ms"}, cols
    markdown = (tmp_path / "phone.md").read_text()
    assert "_Measured with `" in markdown and "`v2v_ms` |" in markdown and "Left out: the stage columns" in markdown


async def test_a_call_takes_a_session_slot_and_a_full_server_answers_busy(services: Services) -> None:
    cfg = config()
    cfg.server.max_sessions = 1
    async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http, call(http, url):
        await only_call(app)
        _, cid = TWILIO.new_ids()
        busy = await dial(http, url, TWILIO, call_id=cid, auth_token=AUTH)
        assert busy.status == 200 and busy.rejected == "busy"  # the caller hears a busy tone
        assert len(app[TELEPHONY].tokens) == 0  # no token for a call turned away
        resp = await http.post(f"{url}/telephony/twilio/voice", data=b"{}",
                               headers={"Content-Type": "application/json"})
        assert resp.status == 415  # the route's row: carriers post forms


async def test_the_dispatcher_sends_carriers_to_a_gateway() -> None:
    from assistant.server.dispatch.app import create_dispatch_app
    from assistant.server.local import serve_on_loopback

    cfg = config()
    cfg.dispatch.gateways = ["http://127.0.0.1:9"]
    async with serve_on_loopback(create_dispatch_app(cfg)) as url, aiohttp.ClientSession() as http:
        answer = await dial(http, url, TWILIO, call_id="CA" + "0" * 32, auth_token=AUTH)
        assert answer.status == 501 and "point the carrier at a gateway" in json.loads(answer.body)["detail"]


HOLD_LOCK = """
import sys
from pathlib import Path
from assistant.server.telephony.answered import AnsweredCalls
calls = AnsweredCalls(Path(sys.argv[1]), 600.0)
calls.first_answer("twilio", "CA-another-gateways-call")
calls._db.execute("BEGIN EXCLUSIVE")  # another gateway, in the middle of its write
print("locked", flush=True)
sys.stdin.read()
"""


async def test_another_gateways_lock_on_the_answers_file_delays_that_call_only(services: Services,
                                                                               tmp_path: Path) -> None:
    """The gateways of a deployment share the answered-calls file; one holds its write lock. The webhook waits for
    it on a worker thread: the server answers everything else meanwhile (before, the event loop itself waited, every
    call on the gateway with it); when the lock goes, the call is answered and recorded in the shared file."""
    import sqlite3
    import subprocess
    import sys

    from assistant.server.telephony.answered import FILE

    path = tmp_path / FILE
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == b"locked\n"
        cfg = test_config(server={"data_dir": str(tmp_path)}, telephony={"twilio_auth_token": AUTH})
        async with serve(cfg, services) as (url, app), aiohttp.ClientSession() as http:
            answered = app[TELEPHONY].answered
            answered.busy_timeout_s = 120.0  # the other gateway's write outlasts the usual wait: this call waits it out
            _, call_id = TWILIO.new_ids()
            pending = asyncio.create_task(dial(http, url, TWILIO, call_id=call_id, auth_token=AUTH))
            await until(answered._lock.locked, "the webhook to be waiting for the file's lock", 60)
            async with http.get(f"{url}/healthz") as health:
                assert health.status == 200
            assert not pending.done()  # still waiting for the other gateway, while the server answered
            holder.stdin.close()
            answer = await pending
        assert answer.status == 200 and answer.stream_url, answer
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    with sqlite3.connect(path) as db:
        ids = {row[0] for row in db.execute("SELECT call_id FROM answered")}
    assert ids == {"CA-another-gateways-call", call_id}
