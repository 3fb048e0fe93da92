"""PiperEngine with the real joe voice: streaming per sentence, cancellation, refusals, factory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from assistant.config import TTSConfig
from assistant.tts import create_tts
from assistant.tts.base import AHEAD_BUFFER_S, ReferenceClip, TTSEngine, TTSRequest, TTSUnsupported
from assistant.tts.piper_engine import PiperEngine
from tests.waiting import until


@pytest.fixture(scope="module")
def engine() -> Iterator[PiperEngine]:
    eng = create_tts(TTSConfig(engine="piper", max_concurrent=2, voices={}))  # Piper alone, no voice per language
    assert isinstance(eng, PiperEngine)
    yield eng
    asyncio.run(eng.close())


async def test_protocol_and_capabilities(engine: PiperEngine) -> None:
    assert isinstance(engine, TTSEngine)
    assert engine.sample_rate == 22050
    caps = engine.capabilities
    assert caps.native_speed and not caps.voice_cloning and not caps.instruct and caps.languages == ("en",)
    await engine.warmup()


async def test_two_sentences_stream_as_two_chunks(engine: PiperEngine) -> None:
    chunks = [c async for c in engine.synthesize(TTSRequest(text="Hello world. How are you?"))]
    assert len(chunks) >= 2
    for c in chunks:
        assert c.dtype == np.float32 and c.ndim == 1
        assert np.sqrt(np.mean(c**2)) > 0.02 and np.abs(c).max() <= 1.0
    seconds = sum(len(c) for c in chunks) / engine.sample_rate
    assert 0.8 < seconds < 4.0


async def test_speed_is_native(engine: PiperEngine) -> None:
    async def dur(speed: float) -> float:
        req = TTSRequest(text="This sentence is spoken at two different speeds.", speed=speed)
        return sum([len(c) async for c in engine.synthesize(req)]) / engine.sample_rate

    # Piper's duration noise (noise_w) moves single runs by ±15 %: compare medians of three.
    normal = sorted([await dur(1.0) for _ in range(3)])[1]
    fast = sorted([await dur(2.0) for _ in range(3)])[1]
    assert 0.4 < fast / normal < 0.7


async def test_cancel_after_first_chunk_stops_worker(engine: PiperEngine) -> None:
    text = " ".join(f"This is sentence number {i} of a long answer." for i in range(12))
    before = engine.sentences_made
    gen = engine.synthesize(TTSRequest(text=text))
    first = await gen.__anext__()
    assert len(first) > 0
    await gen.aclose()
    # The worker leaves the table of active syntheses as it returns: once the slot is free, nothing runs on.
    await until(lambda: engine.active == 0, "the worker to stop")
    made = engine.sentences_made - before
    assert made <= 1 + 3 + 1  # first + the bounded queue + the one in progress, not all 12


async def test_task_cancel_stops_worker(engine: PiperEngine) -> None:
    text = " ".join(f"Sentence {i} goes on for a little while." for i in range(12))
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.synthesize(TTSRequest(text=text)):
            got.set()
            await asyncio.sleep(10)  # a slow listener, then barge-in

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: engine.active == 0, "the worker to stop")


@pytest.mark.parametrize(("request_", "needle"), [
    (TTSRequest(text="hi", reference=ReferenceClip(np.zeros(16000, np.float32), 16000)), "reference"),
    (TTSRequest(text="hi", instruct="sound happy"), "instruct"),
    (TTSRequest(text="你好", language="zh"), "language 'zh'"),
    (TTSRequest(text="hi", voice="someone-else"), "someone-else"),
])
async def test_unsupported_options(engine: PiperEngine, request_: TTSRequest, needle: str) -> None:
    with pytest.raises(TTSUnsupported, match=needle):
        _ = [c async for c in engine.synthesize(request_)]


async def test_bad_values(engine: PiperEngine) -> None:
    with pytest.raises(ValueError, match="speed"):
        _ = [c async for c in engine.synthesize(TTSRequest(text="hi", speed=5.0))]
    with pytest.raises(ValueError, match="too long"):
        _ = [c async for c in engine.synthesize(TTSRequest(text="a" * 5000))]
    assert [c async for c in engine.synthesize(TTSRequest(text="   "))] == []
    assert [c async for c in engine.synthesize(TTSRequest(text="ok", language="en", voice="default"))]


def test_missing_voice_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nobody.onnx"
    with pytest.raises(FileNotFoundError, match=r"nobody\.onnx"):
        PiperEngine(TTSConfig(voice=str(missing)))
    missing.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"nobody\.onnx\.json"):
        PiperEngine(TTSConfig(voice=str(missing)))


def test_unknown_engine_name() -> None:
    with pytest.raises(ValueError, match="unknown TTS engine 'nope'"):
        create_tts(TTSConfig(engine="nope"))


async def test_a_replys_later_pieces_run_below_its_first(engine: PiperEngine) -> None:
    """Four callers on two cores: the piece a caller waits for (a reply's first) runs on a normal thread, the pieces
    made ahead of playout on threads of lower priority (tts/threaded.AHEAD_NICE), so a first piece gets the CPU
    before another call's later sentences, but only once the audio before them still has ``AHEAD_BUFFER_S`` to
    play (a later piece behind a short first one must not starve). Read off the real worker threads."""
    import os
    import threading

    from assistant.tts.base import PieceByPiece
    from assistant.tts.threaded import AHEAD_NICE, ThreadedSynthesis

    seen: dict[str, int] = {}
    threads = ThreadedSynthesis("probe", 2, 16_000)

    def make(name: str):  # type: ignore[no-untyped-def]
        def chunks(stop: threading.Event):  # type: ignore[no-untyped-def]
            seen[name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            yield np.zeros(160, np.float32)
        return chunks

    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        async for _ in threads.stream(make("first"), "first"):
            pass
        async for _ in threads.stream(make("ahead"), "ahead", ahead=True):
            pass
    finally:
        threads.close()
    assert seen["first"] == base and seen["ahead"] == min(19, base + AHEAD_NICE)

    asked: list[bool] = []

    class Spy(PieceByPiece):
        sample_rate = 1000

        async def synthesize(self, request: TTSRequest):  # type: ignore[no-untyped-def]
            asked.append(request.ahead)
            seconds = 3.0 if request.text.startswith("Here it is") else 0.0 if request.text == "…" else 0.5
            yield np.zeros(int(seconds * self.sample_rate), np.float32)

    async def pieces():  # type: ignore[no-untyped-def]
        for p in ("Sure.", "Here it is, as you asked.", "Anything else?", "Bye."):
            yield p

    async for _ in Spy().synthesize_stream(pieces(), TTSRequest(text="")):
        pass
    # The first piece is waited for; the second has only half a second of audio before it (it must not be starved:
    # normal priority); the third and fourth have seconds of it still to play, so they are made ahead.
    assert asked == [False, False, True, True]
    assert AHEAD_BUFFER_S > 0.5
    asked.clear()  # asked ahead: every piece is
    async for _ in Spy().synthesize_stream(pieces(), TTSRequest(text="", ahead=True)):
        pass
    assert asked == [True, True, True, True]
    asked.clear()  # a first piece that made no audio: the next is the one the caller waits for

    async def silent_first():  # type: ignore[no-untyped-def]
        for p in ("…", "Here it is, as you asked.", "Bye."):
            yield p

    async for _ in Spy().synthesize_stream(silent_first(), TTSRequest(text="")):
        pass
    assert asked == [False, False, True]
    # The engine itself takes the flag: the same sentence, made ahead, is one chunk of speech as well.
    later = [c async for c in engine.synthesize(TTSRequest(text="Hello there.", ahead=True))]
    assert len(later) == 1 and later[0].size > engine.sample_rate // 4
