"""Hearing and answering in the speaker's language, end to end: a real server with the multilingual CPU stack
(base with asr.language = auto, Piper for English, Kokoro for Japanese), real aiortc peers speaking the page's
protocol, and the reply audio transcribed again to check which language it was spoken in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import soxr

from assistant.bench.audio_source import Utterance, load_utterance
from assistant.bench.v2v import BenchSession, ReplyListener, TurnSettings, frame_to_mono
from assistant.languages import script_language
from assistant.server.services import Services
from assistant.tts.base import TTSRequest
from tests.conftest import serve, test_config
from tests.test_limits import events
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SETTINGS = TurnSettings(timeout_s=60.0, silence_ms=1500, settle_ms=300)
WEBRTC_RATE = 48_000


def multilingual_config() -> Any:
    return test_config(server={"idle_timeout_s": 60.0}, asr={"language": "auto"}, respond={"engine": "rules"})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services() -> AsyncIterator[Services]:
    svc = Services(multilingual_config())
    await svc.load()
    yield svc
    await svc.close()


class RecordingListener(ReplyListener):
    """The bench's listener, keeping what it hears after each arm (the reply) to transcribe it."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[np.ndarray] = []

    def arm(self, at: float) -> None:
        super().arm(at)
        self.recorded = []

    def on_frame(self, frame: Any, received_at: float) -> None:
        super().on_frame(frame, received_at)
        if self.armed_at is not None and received_at >= self.armed_at:
            self.recorded.append(frame_to_mono(frame))

    def reply_16k(self) -> np.ndarray:
        audio = np.concatenate(self.recorded) if self.recorded else np.zeros(0, np.float32)
        return soxr.resample(audio, WEBRTC_RATE, 16_000).astype(np.float32)


async def japanese_utterance(services: Services, text: str) -> Utterance:
    """A Japanese question spoken offline by the Kokoro voice, as a microphone would send it (48 kHz, silence
    around it)."""
    chunks = [c async for c in services.tts.synthesize(TTSRequest(text=text, language="ja"))]  # type: ignore[union-attr]
    rate = services.tts.sample_rate  # type: ignore[union-attr]
    speech = soxr.resample(np.concatenate(chunks), rate, WEBRTC_RATE)
    lead, tail = np.zeros(WEBRTC_RATE // 2, np.float32), np.zeros(int(1.5 * WEBRTC_RATE), np.float32)
    pcm = (np.clip(np.concatenate([lead, speech, tail]), -1, 1) * 32767).astype(np.int16)
    return Utterance(name="ja_time", text=text, pcm=pcm, speech_end_sample=len(lead) + len(speech))


def heard_language(services: Services, audio: np.ndarray) -> tuple[str, str]:
    engine = services.asr.engine  # type: ignore[union-attr]
    result = engine.transcribe(audio, language="auto")
    return result.language, result.text


async def _client(url: str, http: aiohttp.ClientSession) -> BenchSession:
    client = BenchSession(index=0, url=url, http=http)
    client.listener = RecordingListener()
    await client.connect()
    return client


def _finals(client: BenchSession, start: int) -> list[dict[str, Any]]:
    return [e.body for e in client.events[start:] if e.body.get("type") == "transcript" and e.body.get("final")]


async def test_a_conversation_switches_language_turn_by_turn(services: Services, shared_audio) -> None:
    (kokoro,) = services.tts.voices_routed  # type: ignore[union-attr]
    assert kokoro.engine is not None  # the ASR hears Japanese: its voice was loaded (and warmed) at start
    ja_question = "今何時ですか？"
    ja = await japanese_utterance(services, ja_question)
    async with serve(multilingual_config(), services) as (url, _app), aiohttp.ClientSession() as http:
        client = await _client(url, http)
        listener = client.listener
        assert isinstance(listener, RecordingListener)
        try:
            # The server announces the session when the channel reaches it; that message can land after ours opens.
            await until(lambda: events(client, "session"), "the session event")
            session = events(client, "session")[0]
            assert session["language"] == "auto" and session["languages"][:3] == ["auto", "en", "zh"]
            turns = []
            for utt in (load_utterance(shared_audio / "en_weather.wav"), ja):
                start = len(client.events)
                result = await client.run_turn(utt, len(turns), SETTINGS)
                assert result.status == "ok", result.reason
                turns.append((result, _finals(client, start), listener.reply_16k()))
        finally:
            await client.close()
    (en, en_finals, en_audio), (jp, jp_finals, jp_audio) = turns
    # Each turn is heard in its own language, and says so in its transcript event.
    assert en_finals[-1]["language"] == "en" and en_finals[-1]["language_probability"] > 0.5
    assert "weather" in en.transcript.lower()
    assert jp_finals[-1]["language"] == "ja" and jp_finals[-1]["language_probability"] > 0.5
    # "What time": whisper writes the word in kanji or in kana (何時 / なんじ) as the CPU's numerics fall.
    assert "何時" in jp.transcript or "なんじ" in jp.transcript, jp.transcript
    # Each is answered in its own language (rules: the English greeting, the Japanese time)...
    assert en.reply_text.startswith("Hello!")
    assert jp.reply_text.startswith("今は午") and script_language(jp.reply_text) == "ja"
    # ...by voice: the reply audio, transcribed again, is in that language.
    assert heard_language(services, en_audio)[0] == "en", heard_language(services, en_audio)
    language, text = heard_language(services, jp_audio)
    assert language == "ja", text
    assert "今" in text or "時" in text, text


async def test_a_language_with_no_voice_gets_the_default_voice_and_an_event(services: Services, shared_audio) -> None:
    async with serve(multilingual_config(), services) as (url, _app), aiohttp.ClientSession() as http:
        client = await _client(url, http)
        try:
            channel = client.channel  # the page's events channel: it carries the page's asks too
            channel.send(json.dumps({"type": "language", "language": "klingon"}))
            channel.send(json.dumps({"type": "language", "language": "zh"}))  # heard in Mandarin from now on
            await until(
                lambda: [e for e in events(client, "session") if e["language"] == "zh"],
                "the language change announced",
            )
            result = await client.run_turn(load_utterance(shared_audio / "en_timer.wav"), 0, SETTINGS)
        finally:
            await client.close()
    errors = events(client, "error")
    assert errors and errors[0]["stage"] == "language" and "must be one of auto, en, zh, ja, ko" in errors[0]["message"]
    final = next(e.body for e in client.events if e.body.get("type") == "transcript" and e.body.get("final"))
    assert final["language"] == "zh"  # the session asked for Mandarin, so the turn is heard (and answered) in it
    fallback = events(client, "voice_fallback")
    assert fallback and fallback[0]["language"] == "zh" and fallback[0]["voice"] == "default", client.events
    # Not silence, not an error: the default voice reads the reply.
    assert result.status == "ok" and result.columns["v2v_ms"] is not None, result.reason


async def test_offer_language_is_checked_server_side(services: Services) -> None:
    async with serve(multilingual_config(), services) as (url, _app), aiohttp.ClientSession() as http:
        body = {"sdp": "v=0\r\n", "type": "offer", "language": "tlh"}
        async with http.post(f"{url}/api/offer", json=body) as resp:
            assert resp.status == 400
            answer = await resp.json()
    assert answer["error"] == "bad_language" and "auto, en, zh, ja, ko" in answer["detail"]
