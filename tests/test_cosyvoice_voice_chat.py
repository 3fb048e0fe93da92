"""The tiny CosyVoice2 in the voice chat: the reply's text is chunked once and streams into the engine.

A real server and a real aiortc client; the tiny random-weight model with the tiny tokenizer, so text goes
through our front end end to end. The responder writes three sentences a few characters at a time, as an LLM
does: the first reply audio must leave the server before the responder's last delta, and each piece the
engine speaks must keep its spaces (no second chunker gluing sentences together).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.config import TTSConfig
from assistant.respond.base import Message
from assistant.server.services import Services
from assistant.tts.base import TTSRequest
from tests.conftest import serve, test_config

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared/fixtures/cosyvoice2"
REPLY = "Sure, I can help with that. The weather in Tokyo is sunny today. Anything else?"
DELTA_CHARS = 4
DELTA_GAP_S = 0.15  # an LLM writing ~25 characters a second: the reply takes ~3 s to write


class SlowWriter:
    """A responder that streams ``REPLY`` in 4-character deltas, noting when it sent the last one."""

    name = "slow-writer"

    def __init__(self) -> None:
        self.last_delta_at = 0.0

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        for i in range(0, len(REPLY), DELTA_CHARS):
            await asyncio.sleep(DELTA_GAP_S)
            self.last_delta_at = time.time()
            yield REPLY[i : i + DELTA_CHARS]


def tiny_model_dir(tmp: Path) -> Path:
    """The tiny model with the tiny tokenizer in its ``CosyVoice-BlankEN/``, as the fixture README says."""
    if not (FIXTURES / "tiny" / "llm.pt").is_file():
        pytest.skip(f"CosyVoice2 fixtures not found at {FIXTURES}")
    pytest.importorskip("torch")
    model_dir = tmp / "tiny"
    shutil.copytree(FIXTURES / "tiny", model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny_tokenizer" / name, model_dir / "CosyVoice-BlankEN" / name)
    return model_dir


async def test_reply_streams_into_cosyvoice_chunked_once(services: Services, shared_audio, tmp_path) -> None:
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    spoken: list[str] = []

    class RecordingEngine(CosyVoiceEngine):
        """The real engine, noting each piece of text it is handed."""

        async def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest | None = None
                                    ) -> AsyncIterator[np.ndarray]:
            async def noted() -> AsyncIterator[str]:
                async for piece in pieces:
                    spoken.append(piece)
                    yield piece

            async for chunk in super().synthesize_stream(noted(), request):
                yield chunk

    engine = RecordingEngine(TTSConfig(engine="cosyvoice2", model_dir=str(tiny_model_dir(tmp_path)),
                                       device="cpu", dtype="float32", max_concurrent=1, cuda_graphs=False))
    await engine.warmup()
    writer = SlowWriter()
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
                deadline = time.monotonic() + 60
                while not any(e.body.get("type") == "reply_done" for e in client.events):
                    assert time.monotonic() < deadline, "the reply never finished"
                    await asyncio.sleep(0.05)
            finally:
                await client.close()
    finally:
        services.tts, services.responder = saved
        await engine.close()
    assert result.status == "ok", result.reason
    first_sent_ms = result.server_marks_ms["first_frame_sent"]
    assert first_sent_ms < writer.last_delta_at * 1000, "first audio waited for the whole reply"
    assert spoken == ["Sure, I can help with that.", "The weather in Tokyo is sunny today.", "Anything else?"], spoken
