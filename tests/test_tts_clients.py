"""The clients people already have, against the live server on 127.0.0.1: the plain ``websockets`` client from
issue 12 (bytes until END, an exception on errors), and OpenAI's own ``openai`` SDK (a file, a streamed
response, SSE, errors); plus file-name voices, ``vocoder`` and emotion tags through every route."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest

from assistant.audio import s16_to_float
from assistant.config import Config
from assistant.tts import create_tts
from tests import needs
from tests.test_tts_api import SHORT, FakeCloner, Shared, make_cfg, serve, tone_wav

openai = needs.module("openai")
websockets = needs.module("websockets")

pytestmark = pytest.mark.timeout(120)
TAGGED = "[关心] 我知道你现在有点累，休息一会儿好吗？"
LONG_TAGGED = TAGGED + "明天还有很多事情要做。我们一起慢慢来，好不好？"


@pytest.fixture(scope="module")
def piper() -> Shared:
    engine = create_tts(Config().tts)
    asyncio.run(engine.warmup())
    yield Shared(engine)
    asyncio.run(engine.close())


def ws_url(base: str, query: str = "") -> str:
    return base.replace("http://", "ws://") + "/ws/tts" + query


def decode(data: bytes) -> tuple[np.ndarray, int, str]:
    """Any container → (float32 mono samples, rate, codec) with PyAV, as a player would."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(stream)]
        rate = stream.codec_context.sample_rate
        codec = stream.codec_context.name
    audio = np.concatenate(frames).astype(np.float32) if frames else np.zeros(0, np.float32)
    if audio.dtype.kind == "i" or np.abs(audio).max(initial=0) > 2:
        audio = audio / 32768
    return audio, rate, codec


def voices_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "ref.wav").write_bytes(tone_wav(3.0))
    (folder / "ref.txt").write_text("a steady tone", encoding="utf-8")
    (folder / "driver_voice.wav").write_bytes(tone_wav(3.5))
    (folder / "huge.wav").write_bytes(b"\0" * 400_001)  # over make_cfg's upload cap: never read whole
    return folder


# --- the plain WebSocket client of issue 12 ---------------------------------------------------------------
async def plain_client(uri: str, request: str) -> tuple[list[Any], Any]:
    """The client from the issue, verbatim in shape: send one JSON text, receive until b'END'."""
    received: list[Any] = []
    async with websockets.connect(uri) as ws:
        headers = ws.response.headers  # case-insensitive
        await ws.send(request)
        while True:
            chunk = await ws.recv()
            if chunk == b"END":
                break
            received.append(chunk)  # play_audio_chunk(chunk)
    return received, headers


async def test_plain_websocket_client_gets_only_bytes(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _):
        chunks, headers = await plain_client(ws_url(base), '{"text": "你好啊. Hello there.", "streaming": true}')
        assert chunks and all(isinstance(c, bytes) for c in chunks)
        assert headers["X-Sample-Rate"] == "22050" and headers["X-Sample-Format"] == "s16le"
        pcm = b"".join(chunks)
        assert len(pcm) % 2 == 0 and len(pcm) / 2 / 22050 > 0.5
        assert np.abs(s16_to_float(pcm)).max() > 0.05
        # Other requests of the same shape: speed and pitch, the DSP path for pitch.
        chunks, _ = await plain_client(ws_url(base), '{"text": "Faster and higher.", "speed": 1.3, "pitch": 1}')
        assert all(isinstance(c, bytes) for c in chunks) and len(b"".join(chunks)) > 2 * 22050 * 0.3

        # Two requests on one plain socket: each ends with END, nothing else arrives.
        async with websockets.connect(ws_url(base)) as ws:
            for text in ("One.", "Two."):
                await ws.send(json.dumps({"text": text}))
                while (msg := await ws.recv()) != b"END":
                    assert isinstance(msg, bytes)


@pytest.mark.slow
@pytest.mark.parametrize(("request_json", "code", "needle"), [
    ('{"text": "你好啊", "language": "zh"}', 4400, "language 'zh'"),
    ('{"text": "你好啊", "speaker_wav": "ref.wav", "streaming": true}', 4400, "unknown_voice"),
    ('{"text": "hi", "vocoder": "hifigan"}', 4400, "vits"),
    ('{"text": "hi", "speed": 9}', 4400, "'speed'"),
    ('{"text": "x' + "x" * 2000 + '"}', 4413, "text_too_long"),
    ("{not json", 4400, "bad_json"),
])
async def test_plain_client_error_ends_in_an_exception(tmp_path, piper, request_json, code, needle):
    async with serve(make_cfg(tmp_path), piper) as (base, _):
        # The server closes with the error at once: a hang would end in the guard's TimeoutError, not in this.
        with pytest.raises(websockets.exceptions.ConnectionClosedError) as err:
            await asyncio.wait_for(plain_client(ws_url(base), request_json), 60)
        assert err.value.rcvd.code == code and needle in err.value.rcvd.reason, err.value.rcvd

        # What arrived before the close: exactly one JSON error message naming the problem.
        async with websockets.connect(ws_url(base)) as ws:
            await ws.send(request_json)
            message = await ws.recv()
            assert isinstance(message, str) and set(json.loads(message)) == {"error", "detail"}
            with pytest.raises(websockets.exceptions.ConnectionClosedError):
                await ws.recv()


async def test_websocket_opt_ins(tmp_path, piper):
    """metadata (query or field) adds the start message; keep_open keeps the socket after an error."""
    async with serve(make_cfg(tmp_path), piper) as (base, _):
        async with websockets.connect(ws_url(base, "?metadata=1")) as ws:
            await ws.send(json.dumps({"text": SHORT}))
            start = json.loads(await ws.recv())
            assert start == {"type": "start", "sample_rate": 22050, "channels": 1, "format": "s16le"}
            while (msg := await ws.recv()) != b"END":
                assert isinstance(msg, bytes)
        async with websockets.connect(ws_url(base)) as ws:
            await ws.send(json.dumps({"text": SHORT, "metadata": True, "keep_open": True}))
            assert json.loads(await ws.recv())["type"] == "start"
            while await ws.recv() != b"END":
                pass
            await ws.send(json.dumps({"text": "hi", "language": "ko"}))  # no Korean CPU voice: error, socket stays
            assert json.loads(await ws.recv())["error"] == "unsupported"
            await ws.send(json.dumps({"text": SHORT}))  # metadata and keep_open stay for the socket
            assert json.loads(await ws.recv())["type"] == "start"
            while await ws.recv() != b"END":
                pass
        with pytest.raises(websockets.exceptions.InvalidStatus) as err:
            await websockets.connect(ws_url(base, "?metadata=maybe"))
        assert err.value.response.status_code == 400


# --- voices by file name, vocoder, tags through every route --------------------------------------------------
async def test_file_names_vocoder_and_tags_on_a_cloning_engine(tmp_path):
    engine = FakeCloner()
    engine.capabilities = type(engine.capabilities)(**{**engine.capabilities.__dict__,
                                                       "vocoders": ("hifigan", "hift")})
    folder = voices_folder(tmp_path)
    cfg = make_cfg(tmp_path, tts_api={"voices_dir": str(folder)})
    async with serve(cfg, engine) as (base, _), aiohttp.ClientSession() as http:
        chunks, _ = await plain_client(ws_url(base), '{"text": "你好啊", "speaker_wav": "ref.wav", "streaming": true}')
        assert chunks and all(isinstance(c, bytes) for c in chunks)
        first = engine.requests[-1].voice
        assert first.startswith("file-") and engine.prepared[first].text == "a steady tone"  # ref.txt
        await plain_client(ws_url(base), '{"text": "again", "speaker_wav": "ref.wav", "vocoder": "hifigan"}')
        assert engine.requests[-1].voice == first and len(engine.prepared) == 1  # prepared once, reused
        async with http.post(f"{base}/api/tts", json={"text": "hi", "voice": "driver_voice.wav",
                                                      "prompt_text": "what it says"}) as r:
            assert r.status == 200
        assert engine.prepared[engine.requests[-1].voice].text == "what it says"
        async with http.post(f"{base}/api/tts", json={"text": "hi", "speaker_wav": "huge.wav"}) as r:
            assert r.status == 413 and "huge.wav is over 400000 bytes" in (await r.json())["detail"]
        async with http.post(f"{base}/api/tts", json={"text": "hi", "voice": "nobody.wav"}) as r:
            body = await r.json()
        assert r.status == 400 and body["error"] == "unknown_voice"
        assert "'driver_voice.wav', 'huge.wav', 'ref.wav'" in body["detail"], body  # names what exists
        async with http.post(f"{base}/api/tts", json={"text": "hi", "vocoder": "griffinlim"}) as r:
            body = await r.json()
        assert r.status == 400 and "has the vocoder 'hifigan' (accepted names: hifigan, hift)" in body["detail"]

        # Emotion tags and instructions arrive at the engine the same way through every route, and a tag
        # holds for the whole text: the engine gets it on every piece the text is chunked into.
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

        async def via(route: Any) -> list[str]:
            n = len(engine.requests)
            await route()
            return [r.text for r in engine.requests[n:]]

        async def http_route() -> None:
            async with http.post(f"{base}/api/tts", json={"text": LONG_TAGGED}) as r:
                assert r.status == 200

        async def ws_route() -> None:
            await plain_client(ws_url(base), json.dumps({"text": LONG_TAGGED}))

        async def openai_route() -> None:
            await client.audio.speech.create(model="tts-1", voice="alloy", input=LONG_TAGGED, response_format="pcm")

        texts = [await via(route) for route in (http_route, ws_route, openai_route)]
        assert texts[0] == texts[1] == texts[2], texts
        assert len(texts[0]) >= 2 and all(t.startswith("[关心] ") for t in texts[0]), texts
        assert "".join(t.removeprefix("[关心] ") for t in texts[0]) == LONG_TAGGED.removeprefix("[关心] ")
        sound = await via(lambda: plain_client(ws_url(base), '{"text": "[breath] Hello. And then a second one."}'))
        assert sound[0].startswith("[breath]") and not any(t.startswith("[breath]") for t in sound[1:])
        await client.audio.speech.create(model="tts-1", voice="alloy", input="我知道你现在有点累",
                                         instructions="关心", response_format="pcm")
        async with http.post(f"{base}/api/tts", json={"text": "我知道你现在有点累", "instruct": "关心"}) as r:
            assert r.status == 200
        assert engine.requests[-1].instruct == engine.requests[-2].instruct == "关心"
        await client.close()


async def test_tags_are_dropped_the_same_way_on_piper(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/tts", json={"text": "[cheerful] Hello there.", "format": "pcm"}) as r:
            tagged = await r.read()
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        speech = await client.audio.speech.create(model="tts-1", voice="alloy", input="[cheerful] Hello there.",
                                                  response_format="pcm")
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", instructions="cheerful")
        assert err.value.body["param"] == "instructions" and err.value.body["code"] == "unsupported"
        await client.close()
        chunks, _ = await plain_client(ws_url(base), '{"text": "[cheerful] Hello there."}')
        # Piper speaks the words only; every route gives the same length of audio (±0.3 s of sampling noise).
        lengths = [len(tagged) / 2 / 22050, len(speech.content) / 2 / 24000, len(b"".join(chunks)) / 2 / 22050]
        assert max(lengths) - min(lengths) < 0.3 and min(lengths) > 0.5, lengths


async def test_speed_beyond_the_engines_range_is_stretched(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        sizes = {}
        for speed in (1.0, 3.0, 0.25):
            async with http.post(f"{base}/api/tts", json={"text": "One two three four five six.", "speed": speed,
                                                          "format": "pcm"}) as r:
                assert r.status == 200, await r.text()
                sizes[speed] = len(await r.read())
    assert 0.25 < sizes[3.0] / sizes[1.0] < 0.45, sizes
    assert 3.0 < sizes[0.25] / sizes[1.0] < 5.0, sizes


# --- OpenAI's SDK ------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_openai_sdk_file_stream_and_sse(tmp_path, piper):
    cfg = make_cfg(tmp_path, server={"auth_token": "s3cret"})
    async with serve(cfg, piper) as (base, _):
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="s3cret", max_retries=0)
        # A file, in every format PyAV writes here.
        for fmt, codec in [("mp3", "mp3"), ("wav", "pcm_s16le"), ("flac", "flac"), ("opus", "opus"), ("aac", "aac")]:
            speech = await client.audio.speech.create(model="tts-1", voice="alloy", input=SHORT,
                                                      response_format=fmt)
            audio, rate, got = decode(speech.content)
            assert got.startswith(codec) and rate in (24000, 48000), (fmt, got, rate)
            assert 0.4 < len(audio) / rate < 3.0 and np.abs(audio).max() > 0.05, fmt

        # A streamed response: raw 24 kHz s16le pieces as they are made.
        pieces = []
        async with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice={"id": "default"}, input="First sentence here. And a second one.",
            response_format="pcm", speed=1.25,
        ) as response:
            assert response.headers["content-type"] == "audio/pcm"
            async for piece in response.iter_bytes():
                pieces.append(piece)
        pcm = b"".join(pieces)
        assert len(pcm) % 2 == 0 and 0.8 < len(pcm) / 2 / 24000 < 5

        # SSE: speech.audio.delta events with base64 audio, then speech.audio.done with usage.
        events = []
        async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="en_US-joe-medium", input=SHORT, response_format="pcm", stream_format="sse",
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and len(events) >= 2
        assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] == len(SHORT)
        sse_pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert 0.4 < len(sse_pcm) / 2 / 24000 < 3

        models = await client.models.list()
        assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "piper"} <= {m.id for m in models.data}
        assert (await client.models.retrieve("tts-1")).id == "tts-1"
        voices = await client.get("/audio/voices", cast_to=object)
        kinds = {(v["id"], v["kind"]) for v in voices["voices"]}
        assert ("en_US-joe-medium", "engine") in kinds and ("alloy", "alias of default") in kinds

        with pytest.raises(openai.AuthenticationError) as err:
            await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        assert err.value.body["code"] == "invalid_api_key"
        await client.close()


BAD_SPEECH = [
    ({"input": "hi", "voice": "alloy"}, 400, "model", "bad_request"),
    ({"model": "tts-9", "input": "hi", "voice": "alloy"}, 404, "model", "model_not_found"),
    ({"model": "tts-1", "input": "", "voice": "alloy"}, 400, "input", "bad_request"),
    ({"model": "tts-1", "input": "x" * 2001, "voice": "alloy"}, 413, "input", "text_too_long"),
    ({"model": "tts-1", "input": "hi", "voice": "nobody"}, 400, "voice", "unknown_voice"),
    ({"model": "tts-1", "input": "hi", "voice": {"name": "x"}}, 400, "voice", "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "speed": 4.5}, 400, "speed", "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "speed": 0.1}, 400, "speed", "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "response_format": "ogg"}, 400, "response_format",
     "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "stream_format": "ws"}, 400, "stream_format",
     "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "temperature": 1}, 400, "temperature", "bad_request"),
    ({"model": "tts-1", "input": "hi", "voice": "alloy", "instructions": "whisper"}, 400, "instructions",
     "unsupported"),
]


async def test_openai_bad_inputs_get_openai_shaped_errors(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        for body, status, param, code in BAD_SPEECH:
            async with http.post(f"{base}/v1/audio/speech", json=body) as r:
                got = await r.json()
            assert r.status == status, (body, got)
            err = got["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], got
            assert (err["param"], err["code"]) == (param, code), got
            assert err["type"] == "invalid_request_error"
        json_type = {"Content-Type": "application/json"}
        async with http.post(f"{base}/v1/audio/speech", data=b"{nope", headers=json_type) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "bad_json"
        async with http.post(f"{base}/v1/audio/speech", data=b"{}") as r:  # not JSON by its Content-Type
            got = await r.json()
            assert r.status == 415 and got["error"]["code"] == "unsupported_media_type", got
        async with http.get(f"{base}/v1/audio/speech") as r:
            assert r.status == 405 and "error" in await r.json()
        async with http.get(f"{base}/v1/nope") as r:
            assert r.status == 404 and "no route GET /v1/nope" in (await r.json())["error"]["message"]
        async with http.get(f"{base}/v1/models/tts-9") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
