"""The TTS API end to end: real HTTP and WebSocket clients against the app on 127.0.0.1, with the real Piper
engine (and a small fake cloning engine for what Piper cannot do: cloning, URLs, DSP speed, busy slots)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from assistant.audio import s16_to_float, write_wav_bytes
from assistant.config import Config
from assistant.server.local import serve_on_loopback
from assistant.server.services import SERVICES
from assistant.server.tts_api import service as tts_service
from assistant.tts import create_tts
from assistant.tts.base import LANGUAGES, ReferenceClip, TTSCapabilities, TTSRequest
from assistant.tts.effects import estimate_f0
from tests.conftest import serve as serve_app
from tests.conftest import tts_only_services
from tests.waiting import request_handlers, until

pytestmark = pytest.mark.timeout(120)

SHORT = "Hello there."
THREE = "The weather is sunny today. Tomorrow brings light rain. Remember your umbrella."


class Shared:
    """The module's Piper engine, shared by every app in this file (closing an app must not close it)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        return self._engine.synthesize(request)

    async def close(self) -> None:
        pass


class FakePrompt:
    def save(self, path: Path) -> None:
        Path(path).write_bytes(b"prompt")


class FakeCloner:
    """A cloning engine that says a 200 Hz tone: three 0.2 s chunks, ``delay`` seconds apart."""

    name = "fake"
    sample_rate = 16000
    capabilities = TTSCapabilities(voice_cloning=True, instruct=True, native_speed=False, native_pitch=False,
                                   languages=LANGUAGES)

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.requests: list[TTSRequest] = []
        self.prepared: dict[str, ReferenceClip] = {}
        self.loaded: list[str] = []
        self.forgotten: list[str] = []

    async def add_voice(self, voice_id: str, clip: ReferenceClip) -> FakePrompt:
        self.prepared[voice_id] = clip
        return FakePrompt()

    async def load_voice(self, voice_id: str, path: Path) -> FakePrompt:
        if Path(path).read_bytes() != b"prompt":
            raise ValueError("not a prompt file")
        self.loaded.append(voice_id)
        return FakePrompt()

    def forget_voice(self, voice_id: str) -> None:
        self.forgotten.append(voice_id)

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        self.requests.append(request)
        t = np.arange(int(0.2 * self.sample_rate)) / self.sample_rate
        for _ in range(3):
            await asyncio.sleep(self.delay)
            yield (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)

    async def warmup(self) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def piper() -> Shared:
    cfg = Config()
    cfg.tts.deterministic = True  # no sampling noise: lengths and pitch compare the same on every run
    engine = create_tts(cfg.tts)
    asyncio.run(engine.warmup())
    yield Shared(engine)
    asyncio.run(engine.close())


def make_cfg(tmp_path: Path, **sections: dict[str, Any]) -> Config:
    cfg = Config()
    cfg.server.data_dir = str(tmp_path / "data")
    cfg.tts_api.max_upload_bytes = 400_000
    cfg.tts_api.max_upload_seconds = 5.0
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


@contextlib.asynccontextmanager
async def serve(cfg: Config, engine: Any) -> AsyncIterator[tuple[str, web.Application]]:
    """The real app with stand-ins for the models this file does not need, on a free port."""
    async with serve_app(cfg, tts_only_services(cfg, engine)) as (url, app):
        yield url, app  # type: ignore[misc]


def wav_info(body: bytes) -> tuple[int, int, int, np.ndarray]:
    with wave.open(io.BytesIO(body)) as w:
        frames = w.readframes(w.getnframes())
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), s16_to_float(frames)


def tone_wav(seconds: float, sr: int = 16000) -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    return write_wav_bytes((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), sr)


async def say(http: aiohttp.ClientSession, base: str, **body: Any) -> np.ndarray:
    async with http.post(f"{base}/api/tts", json={"text": SHORT, **body}) as r:
        assert r.status == 200, await r.text()
        return wav_info(await r.read())[3]


async def ws_say(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """One request on a socket: the start message and all PCM up to END."""
    await ws.send_json(body)
    start = await ws.receive_json(timeout=30)
    assert start.get("type") == "start", start
    pcm = bytearray()
    while True:
        msg = await ws.receive(timeout=30)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        if msg.data == b"END":
            return start, bytes(pcm)
        pcm += msg.data


# --- audio out ---------------------------------------------------------------------------------------------
async def test_wav_pcm_and_resampled_output(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/tts", json={"text": SHORT}) as r:
            assert r.status == 200 and r.content_type == "audio/wav"
            body = await r.read()
            channels, width, sr, audio = wav_info(body)
            assert (channels, width, sr) == (1, 2, 22050)
            assert len(body) == 44 + 2 * len(audio)
            assert float(r.headers["X-Audio-Seconds"]) == pytest.approx(len(audio) / sr, abs=1e-3)
            assert 0.4 < len(audio) / sr < 2.5
        async with http.post(f"{base}/api/tts", json={"text": SHORT, "sample_rate": 16000}) as r:
            _, _, sr16, audio16 = wav_info(await r.read())
            assert sr16 == 16000 and r.headers["X-Sample-Rate"] == "16000"
            assert len(audio16) / 16000 == pytest.approx(len(audio) / 22050, abs=0.15)
        async with http.post(f"{base}/api/tts", json={"text": SHORT, "format": "pcm"}) as r:
            assert r.content_type == "application/octet-stream"
            assert r.headers["X-Sample-Rate"] == "22050" and r.headers["X-Channels"] == "1"
            assert len(await r.read()) % 2 == 0


async def test_http_streaming_sends_chunks_before_the_end(tmp_path, piper):
    """The first audio reaches the client before the engine has made the last: an ordering, not a timing."""
    made: list[int] = []  # the engine's chunks, as it makes them
    engine = piper._engine
    original = engine.synthesize

    async def counting(request: Any) -> AsyncIterator[np.ndarray]:
        async for chunk in original(request):
            made.append(len(chunk))
            yield chunk

    engine.synthesize = counting
    try:
        async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http, \
                http.post(f"{base}/api/tts", json={"text": THREE, "streaming": True}) as r:
            assert r.status == 200 and r.headers["X-Sample-Rate"] == "22050"
            assert r.headers.get("Transfer-Encoding") == "chunked"
            pcm, made_at_first = bytearray(), None
            async for chunk in r.content.iter_any():
                made_at_first = len(made) if made_at_first is None else made_at_first
                pcm += chunk
    finally:
        del engine.synthesize
    assert made_at_first is not None and made_at_first < len(made), (made_at_first, len(made))
    assert len(pcm) / 2 / 22050 > 2.0


# --- WebSocket -------------------------------------------------------------------------------------------
async def test_ws_end_errors_and_reuse(tmp_path, piper):
    async with (
        serve(make_cfg(tmp_path), piper) as (base, _),
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{base}/ws/tts?metadata=1&keep_open=1") as ws,
    ):
        start, pcm = await ws_say(ws, {"text": SHORT})
        assert start == {"type": "start", "sample_rate": 22050, "channels": 1, "format": "s16le"}
        assert len(pcm) > 22050  # > 0.5 s
        for bad, needle in [("{nope", "bad_json"), (json.dumps({"text": "hi", "speed": 7}), "'speed'"),
                            (json.dumps({"text": "hi", "colour": "red"}), "'colour'")]:
            await ws.send_str(bad)
            err = await ws.receive_json(timeout=10)
            assert needle in json.dumps(err) and set(err) == {"error", "detail"}
        await ws.send_bytes(b"\x00\x01")
        assert (await ws.receive_json(timeout=10))["error"] == "bad_request"
        start, pcm2 = await ws_say(ws, {"text": SHORT, "sample_rate": 16000})
        assert start["sample_rate"] == 16000 and len(pcm2) > 16000


async def test_ws_many_sockets_at_once(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        async def one(i: int) -> int:
            async with http.ws_connect(f"{base}/ws/tts?metadata=true") as ws:
                _, pcm = await ws_say(ws, {"text": f"Socket number {i}."})
                return len(pcm)

        sizes = await asyncio.gather(*(one(i) for i in range(4)))
        assert all(s > 11025 for s in sizes)


# --- effects ---------------------------------------------------------------------------------------------
async def test_pitch_energy_speed(tmp_path, piper):
    text = "Hello, how are you doing today?"
    async with serve(make_cfg(tmp_path), piper) as (base, _), aiohttp.ClientSession() as http:
        plain = await say(http, base, text=text)
        up = await say(http, base, text=text, pitch=12)
        f0, f0_up = estimate_f0(plain, 22050), estimate_f0(up, 22050)
        assert 1.75 < f0_up / f0 < 2.25, (f0, f0_up)
        assert len(up) == pytest.approx(len(plain), rel=0.15)

        loud = await say(http, base, text=text, energy=2.0)
        rms = lambda x: float(np.sqrt(np.mean(x**2)))  # noqa: E731
        assert rms(loud) > 1.3 * rms(plain)
        assert np.max(np.abs(loud)) < 32767 / 32768  # limited, not clipped

        fast = await say(http, base, text=text, speed=1.5)
        assert 0.55 < len(fast) / len(plain) < 0.8


async def test_dsp_speed_on_an_engine_without_native_speed(tmp_path):
    engine = FakeCloner()
    async with serve(make_cfg(tmp_path), engine) as (base, _), aiohttp.ClientSession() as http:
        plain = await say(http, base)
        fast = await say(http, base, speed=1.5)
        assert len(fast) / len(plain) == pytest.approx(1 / 1.5, rel=0.08)
        assert engine.requests[-1].speed == 1.0  # done by the service, not asked of the engine


# --- bad input --------------------------------------------------------------------------------------------
BAD_TTS = [
    (b"{not json", 400, "bad_json", "not valid JSON"),
    ({"text": "hi", "speed": 9}, 400, "bad_request", "'speed': 9 is out of range; allowed 0.25 to 4"),
    ({"text": "hi", "pitch": 20}, 400, "bad_request", "'pitch'"),
    ({"text": "hi", "colour": 1}, 400, "bad_request", "'colour': unknown field"),
    ({"text": "x" * 2001}, 413, "text_too_long", "limit is 2000"),
    ({"text": "hi", "language": "ko"}, 400, "unsupported", "language 'ko'"),  # the CPU voices speak en and ja
    ({"text": "hi", "language": "jp"}, 400, "bad_request", "'jp' is not a language code; did you mean 'ja'?"),
    ({"text": "hi", "instruct": "whisper"}, 400, "unsupported", "instruct"),
    ({"text": "hi", "speaker_wav": "http://example.com/a.wav"}, 400, "url_not_allowed", "url_allowlist"),
    ({"text": "hi", "speaker_wav": "file:///etc/passwd"}, 400, "url_not_allowed", "http or https"),
    ({"text": "hi", "speaker_wav": base64.b64encode(tone_wav(3)).decode()}, 400, "unsupported", "clone"),
    ({"text": "hi", "voice": "0123456789abcdef"}, 400, "unknown_voice", "no voice or file named '0123456789abcdef'"),
    ({"text": "hi", "voice": "nobody"}, 400, "unknown_voice", "engine piper voices: 'default', 'en_US-joe-medium'"),
    ({"text": "hi", "speaker_wav": "ref.wav"}, 400, "unknown_voice", "files in the voices folder: none"),
    ({"text": "hi", "speaker_wav": "../etc/passwd.wav"}, 400, "bad_request", "may not contain '..'"),
    ({"text": "hi", "speaker_wav": "/etc/x.wav"}, 400, "bad_request", "not absolute"),
    ({"text": "hi", "vocoder": "hifigan"}, 400, "unsupported", "engine piper has the vocoder 'vits'"),
    ({"text": "hi", "vocoder": 1}, 400, "bad_request", "'vocoder': must be a string"),
]


async def test_bad_requests_get_clear_errors_and_the_server_goes_on(tmp_path, piper):
    async with serve(make_cfg(tmp_path), piper) as (base, app), aiohttp.ClientSession() as http:
        for body, status, error, needle in BAD_TTS:
            kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
                else {"json": body}
            async with http.post(f"{base}/api/tts", **kw) as r:
                got = await r.json()
                assert (r.status, got["error"]) == (status, error), got
                assert needle in got["detail"], got
            await say(http, base)  # a good request right after each bad one

        form = aiohttp.FormData()
        form.add_field("request", json.dumps({"text": "hi"}))
        form.add_field("speaker_wav", b"\x00" * 400_001, filename="big.wav")
        async with http.post(f"{base}/api/tts", data=form) as r:
            assert r.status == 413 and (await r.json())["error"] == "too_large"
        await say(http, base)

        voice_cases = [
            ({"clip": (b"this is not audio at all" * 50, "x.wav"), "transcript": "hi"}, 400, "bad_audio"),
            ({"clip": (b"\x00" * 400_001, "x.wav"), "transcript": "hi"}, 413, "too_large"),
            ({"clip": (tone_wav(6.0), "x.wav"), "transcript": "hi"}, 413, "clip_too_long"),
            ({"clip": (tone_wav(0.3), "x.wav"), "transcript": "hi"}, 400, "clip_too_short"),
            ({"clip": (tone_wav(3.0), "x.wav")}, 400, "bad_request"),
            ({"clip": (tone_wav(3.0), "x.wav"), "transcript": "hi", "path": "../x"}, 400, "bad_request"),
        ]
        for parts, status, error in voice_cases:
            form = aiohttp.FormData()
            for name, value in parts.items():
                if isinstance(value, tuple):
                    form.add_field(name, value[0], filename=value[1], content_type="audio/wav")
                else:
                    form.add_field(name, value)
            async with http.post(f"{base}/api/voices", data=form) as r:
                got = await r.json()
                assert (r.status, got["error"]) == (status, error), got
            await say(http, base)

        async with http.delete(f"{base}/api/voices/..%2F..%2Fetc") as r:
            assert r.status == 404
        # A body of another media type is refused before it is read (the route table says what each takes).
        async with http.post(f"{base}/api/tts", data=b'{"text": "hi"}', headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415 and (await r.json())["error"] == "unsupported_media_type"
        metrics = app[SERVICES].metrics.render()[0].decode()
        assert 'assistant_tts_requests_total{outcome="ok"}' in metrics
        assert 'assistant_tts_requests_total{outcome="bad_request"}' in metrics
        assert "assistant_tts_first_chunk_seconds_count" in metrics


async def test_auth_token_covers_http_and_ws(tmp_path, piper):
    cfg = make_cfg(tmp_path, server={"auth_token": "s3cret"})
    async with serve(cfg, piper) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/tts", json={"text": SHORT}) as r:
            assert r.status == 401 and (await r.json())["error"] == "unauthorized"
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(f"{base}/ws/tts")
        assert err.value.status == 401
        async with http.post(f"{base}/api/tts", json={"text": SHORT},
                             headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
        async with http.ws_connect(f"{base}/ws/tts?token=s3cret&metadata=1") as ws:
            await ws_say(ws, {"text": SHORT})
        async with http.get(f"{base}/healthz") as r:
            assert r.status == 200


async def test_rate_limit_and_busy(tmp_path, monkeypatch):
    engine = FakeCloner(delay=0.3)
    cfg = make_cfg(tmp_path, tts_api={"rate_per_minute": 3}, tts={"max_concurrent": 1})
    monkeypatch.setattr(tts_service, "BUSY_WAIT_S", 0.05)
    async with serve(cfg, engine) as (base, _), aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{base}/ws/tts") as ws:
            await ws.send_json({"text": "long", "metadata": True})
            assert (await ws.receive_json(timeout=5))["type"] == "start"
            async with http.post(f"{base}/api/tts", json={"text": "hi"}) as r:
                assert r.status == 429 and (await r.json())["error"] == "busy"
            while (await ws.receive(timeout=5)).data != b"END":
                pass
        answers = []
        for _ in range(2):  # 3 per minute: the WS request and the busy one took two tokens
            async with http.post(f"{base}/api/tts", json={"text": "hi"}) as r:
                answers.append((r.status, r.headers.get("Retry-After"), await r.read()))
        assert [a[0] for a in answers] == [200, 429]
        assert json.loads(answers[1][2])["error"] == "rate_limited" and int(answers[1][1]) >= 1


# --- cloning: uploads, base64, URLs, voices ------------------------------------------------------------
async def test_cloning_paths_with_a_cloning_engine(tmp_path):
    engine = FakeCloner()
    clip = tone_wav(3.0)
    clip_server = web.Application()

    async def clip_handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=clip, content_type="audio/wav")

    async def away(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("http://localhost:1/clip.wav")

    clip_server.router.add_get("/clip.wav", clip_handler)
    clip_server.router.add_get("/away.wav", away)
    cfg = make_cfg(tmp_path, tts_api={"url_allowlist": ["127.0.0.1"]})
    async with serve_on_loopback(clip_server) as clip_base, serve(cfg, engine) as (base, _), \
            aiohttp.ClientSession() as http:
        await say(http, base, speaker_wav=base64.b64encode(clip).decode(), prompt_text="a tone")
        assert engine.requests[-1].reference.text == "a tone"
        await say(http, base, speaker_wav=f"{clip_base}/clip.wav")
        assert engine.requests[-1].reference.sample_rate == 16000
        async with http.post(f"{base}/api/tts", json={"text": "hi", "speaker_wav": f"{clip_base}/away.wav"}) as r:
            assert r.status == 400 and "another host" in (await r.json())["detail"]
        form = aiohttp.FormData()
        form.add_field("request", json.dumps({"text": "hi", "instruct": "Speak slowly."}))
        form.add_field("speaker_wav", clip, filename="me.wav", content_type="audio/wav")
        async with http.post(f"{base}/api/tts", data=form) as r:
            assert r.status == 200
        assert engine.requests[-1].reference is not None and engine.requests[-1].instruct == "Speak slowly."
        await say(http, base, text="[cheerful] Hi!")
        assert engine.requests[-1].text == "[cheerful] Hi!"  # instruct engines resolve the tag themselves

        form = aiohttp.FormData()
        form.add_field("clip", clip, filename="me.wav", content_type="audio/wav")
        form.add_field("transcript", "a tone")
        form.add_field("name", "Tone")
        async with http.post(f"{base}/api/voices", data=form) as r:
            assert r.status == 201
            voice = await r.json()
        assert voice["cloning"] is True and voice["name"] == "Tone"
        vid = voice["voice_id"]
        assert engine.prepared[vid].text == "a tone"
        assert (Path(cfg.server.data_dir) / "voices" / vid / "cache-fake.npz").read_bytes() == b"prompt"
        await say(http, base, voice=vid)
        assert engine.requests[-1].voice == vid

    fresh = FakeCloner()  # a restart: the engine loads the prepared voice it cached; nothing is recomputed
    async with serve(cfg, fresh) as (base, _), aiohttp.ClientSession() as http:
        await say(http, base, voice=vid)
        assert fresh.loaded == [vid] and vid not in fresh.prepared and fresh.requests[-1].voice == vid
        await say(http, base, voice="Tone")  # by name too
        assert fresh.requests[-1].voice == vid and fresh.loaded == [vid]
        async with http.delete(f"{base}/api/voices/{vid}") as r:
            assert r.status == 200
        assert fresh.forgotten == [vid]  # a deleted voice leaves the engine too
        async with http.post(f"{base}/api/tts", json={"text": "hi", "voice": vid}) as r:
            assert r.status == 400 and (await r.json())["error"] == "unknown_voice"


async def test_voices_survive_a_restart(tmp_path, piper):
    cfg = make_cfg(tmp_path)
    async with serve(cfg, piper) as (base, _), aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("clip", tone_wav(3.0), filename="me.wav", content_type="audio/wav")
        form.add_field("transcript", "a tone")
        async with http.post(f"{base}/api/voices", data=form) as r:
            assert r.status == 201
            voice = await r.json()
        assert voice["cloning"] is False  # stored; Piper cannot speak with it
        async with http.post(f"{base}/api/tts", json={"text": "hi", "voice": voice["voice_id"]}) as r:
            assert r.status == 400 and (await r.json())["error"] == "unsupported"

    async with serve(cfg, piper) as (base, _), aiohttp.ClientSession() as http:
        async with http.get(f"{base}/api/voices") as r:
            listed = await r.json()
        assert [v["voice_id"] for v in listed["voices"]] == [voice["voice_id"]]
        assert listed["voices"][0]["transcript"] == "a tone" and listed["cloning"] is False
        async with http.delete(f"{base}/api/voices/{voice['voice_id']}") as r:
            assert r.status == 200
        async with http.delete(f"{base}/api/voices/{voice['voice_id']}") as r:
            assert r.status == 404
        async with http.get(f"{base}/api/voices") as r:
            assert (await r.json())["voices"] == []


async def test_openapi_document(tmp_path, piper):
    async with (
        serve(make_cfg(tmp_path), piper) as (base, _),
        aiohttp.ClientSession() as http,
        http.get(f"{base}/api/openapi.json") as r,
    ):
        doc = await r.json()
    assert doc["openapi"].startswith("3.1")
    for path in ("/api/tts", "/ws/tts", "/api/voices", "/api/voices/{voice_id}", "/api/offer",
                 "/api/sessions/{session_id}", "/healthz", "/readyz"):
        assert path in doc["paths"], path
    assert doc["components"]["schemas"]["TTSRequest"]["properties"]["speed"]["maximum"] == 4.0
    for path in ("/v1/audio/speech", "/v1/models", "/v1/audio/voices"):
        assert path in doc["paths"], path
    assert "keep_open" in doc["components"]["schemas"]["WSRequest"]["properties"]


async def test_ws_cancel_ends_the_request_and_the_socket_stays_usable(tmp_path):
    engine = FakeCloner(delay=0.5)
    async with (
        serve(make_cfg(tmp_path), engine) as (base, _),
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{base}/ws/tts?keep_open=1&metadata=1") as ws,
    ):
        await ws.send_json({"text": "a long one"})
        assert (await ws.receive_json(timeout=5))["type"] == "start"
        await ws.send_json({"text": "too soon"})
        while (msg := await ws.receive(timeout=5)).type == aiohttp.WSMsgType.BINARY:
            pass  # audio of the running request may come first
        assert json.loads(msg.data)["error"] == "busy"
        made = len(engine.requests)
        await ws.send_json({"type": "cancel"})
        after = 0
        while (msg := await ws.receive(timeout=5)).data != b"END":
            assert msg.type == aiohttp.WSMsgType.BINARY
            after += 1
        assert after < 3 and len(engine.requests) == made  # cut short: not all three chunks, no new request
        engine.delay = 0.0
        _, pcm = await ws_say(ws, {"text": "again"})
        assert len(pcm) == 2 * 3 * 3200


async def test_a_file_voice_is_prepared_once_per_clip_content_and_locks_are_given_back(tmp_path):
    """The engine's voice for a clip file is keyed on what the clip holds and says (its own .txt), not on the
    request's prompt_text; and a preparation that fails leaves no lock behind."""
    from assistant.server.tts_api import TTS_SERVICE

    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "ref.wav").write_bytes(tone_wav(3.5))
    (folder / "same.wav").write_bytes(tone_wav(3.5))  # another name, the same clip
    engine = FakeCloner()
    async with serve(make_cfg(tmp_path, tts_api={"voices_dir": str(folder)}), engine) as (base, app), \
            aiohttp.ClientSession() as http:
        for name, text in (("ref.wav", "one"), ("ref.wav", "two"), ("ref.wav", ""), ("same.wav", "three")):
            await say(http, base, speaker_wav=name, prompt_text=text)
        assert len(engine.prepared) == 1  # four requests, two names, new texts: one preparation
        assert next(iter(engine.prepared.values())).text == "one"  # no .txt: the first request's text
        (folder / "ref.txt").write_text("a steady tone")  # the file now says what it says: a new voice
        await say(http, base, speaker_wav="ref.wav", prompt_text="ignored")
        assert len(engine.prepared) == 2 and engine.requests[-1].voice in engine.prepared
        assert engine.prepared[engine.requests[-1].voice].text == "a steady tone"

        async def failing(voice_id: str, clip: ReferenceClip) -> None:
            raise RuntimeError("engine fault")

        engine.add_voice = failing  # type: ignore[method-assign]
        (folder / "other.wav").write_bytes(tone_wav(4.0))
        async with http.post(f"{base}/api/tts", json={"text": SHORT, "speaker_wav": "other.wav"}) as r:
            assert r.status == 500
        assert len(app[TTS_SERVICE].sources._voice_locks) == 0


async def test_a_client_that_goes_away_mid_stream_is_one_info_line(tmp_path, caplog):
    """No traceback, no 500 after the headers: the request's own line says client_gone, and the slot is back."""
    import logging

    from assistant.server.tts_api import TTS_SERVICE

    engine = FakeCloner(delay=0.3)
    async with serve(make_cfg(tmp_path), engine) as (base, app):
        host, port = base.removeprefix("http://").split(":")
        body = json.dumps({"text": "a long one", "streaming": True}).encode()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"POST /api/tts HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            await reader.readuntil(b"\r\n\r\n")  # the headers are out; the audio is coming
            writer.transport.abort()  # the client vanishes (a reset, not a goodbye)
            svc = app[TTS_SERVICE]
            # Until the slot is back and aiohttp is done with the connection (its task has ended, so whatever it
            # was going to log is logged).
            await until(lambda: svc._slots._value == svc.max_slots and not request_handlers(),
                        "the aborted request to end", 30)
        text = caplog.text
        assert "Traceback" not in text and "Error handling request" not in text and "request_failed" not in text
        lines = [r for r in caplog.records if "client_gone" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]


async def test_the_japanese_voice_loads_on_the_first_request_for_it_once(tmp_path, caplog):
    """The default config routes Japanese to Kokoro, but nothing loads it until a request asks for Japanese
    (the ASR hears English alone): then it loads once, however many such requests arrive together."""
    import logging

    from assistant.tts.routing import LanguageRouter

    cfg = make_cfg(tmp_path)
    engine = create_tts(cfg.tts)  # what a server hearing English alone makes (nothing reachable but en)
    assert isinstance(engine, LanguageRouter)
    (kokoro,) = engine.voices_routed
    assert kokoro.engine is None and kokoro.languages == ["ja"]
    try:
        async with serve(cfg, engine) as (base, _), aiohttp.ClientSession() as http:
            assert len(await say(http, base)) > 0  # English: Piper, and still no Kokoro
            assert kokoro.engine is None
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="assistant.tts.routing"):
                spoken = await asyncio.gather(*(say(http, base, text="今日は晴れです。", language="ja")
                                                for _ in range(3)))
            assert [r.getMessage().split()[0] for r in caplog.records].count("tts.voice_loaded") == 1
            assert kokoro.engine is not None and kokoro.engine.name == "kokoro"
            assert all(0.5 < len(a) / 22050 < 5 for a in spoken), [len(a) for a in spoken]  # at Piper's rate
    finally:
        await engine.close()
