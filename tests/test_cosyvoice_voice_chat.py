"""The tiny CosyVoice2 in the voice chat: the reply's text is chunked once and streams into the engine.

A real server and a real aiortc client; the tiny random-weight model with the tiny tokenizer, so text goes
through our front end end to end. The responder writes three sentences a few characters at a time, as an LLM
does, and holds its last delta until the engine has yielded reply audio: that audio must come (the engine
speaks the first sentence before the reply is whole; an order, not a duration), and each piece the engine
speaks must keep its spaces (no second chunker gluing sentences together).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from assistant.bench.audio_source import load_utterance
from assistant.bench.shared_data import shared_path
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.config import TTSConfig
from assistant.respond.base import Message
from assistant.server.services import Services
from assistant.tts.base import TTSRequest
from tests import needs
from tests.conftest import serve, test_config
from tests.waiting import until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

FIXTURES = shared_path("fixtures/cosyvoice2")
REPLY = "Sure, I can help with that. The weather in Tokyo is sunny today. Anything else?"
DELTA_CHARS = 4
DELTA_GAP_S = 0.05  # an LLM writing a few characters at a time
LAST_DELTA_HOLD_S = 45.0  # a guard only: how long the last delta waits for reply audio before giving up


class SlowWriter:
    """A responder that streams ``REPLY`` in 4-character deltas and holds the last one until ``audio`` is set
    (the engine yielded reply audio), noting whether it was."""

    name = "slow-writer"

    def __init__(self, audio: asyncio.Event) -> None:
        self.audio = audio
        self.audio_before_last_delta: bool | None = None

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        deltas = [REPLY[i : i + DELTA_CHARS] for i in range(0, len(REPLY), DELTA_CHARS)]
        for delta in deltas[:-1]:
            await asyncio.sleep(DELTA_GAP_S)
            yield delta
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.audio.wait(), LAST_DELTA_HOLD_S)
        self.audio_before_last_delta = self.audio.is_set()
        yield deltas[-1]


def tiny_model_dir(tmp: Path) -> Path:
    """The tiny model with the tiny tokenizer in its ``CosyVoice-BlankEN/``, as the fixture README says."""
    needs.shared("fixtures/cosyvoice2/tiny/llm.pt")
    model_dir = tmp / "tiny"
    shutil.copytree(FIXTURES / "tiny", model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny_tokenizer" / name, model_dir / "CosyVoice-BlankEN" / name)
    return model_dir


async def test_reply_streams_into_cosyvoice_chunked_once(services: Services, shared_audio, tmp_path) -> None:
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    spoken: list[str] = []
    audio = asyncio.Event()

    class RecordingEngine(CosyVoiceEngine):
        """The real engine, noting each piece of text it is handed and when it has yielded audio."""

        async def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest | None = None
                                    ) -> AsyncIterator[np.ndarray]:
            async def noted() -> AsyncIterator[str]:
                async for piece in pieces:
                    spoken.append(piece)
                    yield piece

            async for chunk in super().synthesize_stream(noted(), request):
                audio.set()
                yield chunk

    engine = RecordingEngine(TTSConfig(engine="cosyvoice2", model_dir=str(tiny_model_dir(tmp_path)),
                                       device="cpu", dtype="float32", max_concurrent=1, cuda_graphs=False))
    await engine.warmup()
    writer = SlowWriter(audio)
    saved = services.tts, services.responder
    services.tts, services.responder = engine, writer
    try:
        cfg = test_config(turn={"speculative": False}, tts={"timeout_s": 60.0})
        async with serve(cfg, services) as (url, _app), aiohttp.ClientSession() as http:
            client = BenchSession(index=0, url=url, http=http)
            await client.connect()
            try:
                result = await client.run_turn(load_utterance(shared_audio / "en_weather.wav"), 0,
                                               TurnSettings(timeout_s=60.0, silence_ms=1200, settle_ms=300))
                await until(lambda: any(e.body.get("type") == "reply_done" for e in client.events),
                            "the reply to finish", 60)
            finally:
                await client.close()
    finally:
        services.tts, services.responder = saved
        await engine.close()
    assert result.status == "ok", result.reason
    assert "first_frame_sent" in result.server_marks_ms
    assert writer.audio_before_last_delta, "first audio waited for the whole reply"
    assert spoken == ["Sure, I can help with that.", "The weather in Tokyo is sunny today.", "Anything else?"], spoken
