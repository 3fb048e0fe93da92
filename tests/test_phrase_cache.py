"""The phrase cache (tts/phrase_cache.py): a reply's short opener spoken before is spoken again at once, by the real
Piper voice; only a conversation's replies read or fill it; a stopped synthesis, a long piece or a cloned voice keeps
nothing; the bytes stay bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from assistant.config import ConfigError, TTSConfig, load_config
from assistant.pipeline.conversation import Conversation, TurnDeps
from assistant.pipeline.events import EventChannel
from assistant.respond.echo import EchoResponder
from assistant.rtc.outbound import ReplyTrack
from assistant.tts import create_tts
from assistant.tts.base import ReferenceClip, TTSRequest
from assistant.tts.phrase_cache import PhraseCache
from assistant.tts.piper_engine import PiperEngine
from assistant.vad.endpoint import Endpointer
from assistant.vad.silero import SileroModel
from tests.conftest import test_config
from tests.waiting import until

REPLY = TTSRequest(text="", session="s", reuse_audio=True)  # as a conversation asks


@pytest.fixture(scope="module")
def engine() -> Iterator[PiperEngine]:
    eng = create_tts(TTSConfig(engine="piper", max_concurrent=2, voices={}))  # sampling noise on: a repeat is cached
    assert isinstance(eng, PiperEngine)
    yield eng
    asyncio.run(eng.close())


async def speak(engine: PiperEngine, request: TTSRequest) -> list[np.ndarray]:
    return [c async for c in engine.synthesize(request)]


async def test_a_replys_opener_is_made_once_and_then_spoken_at_once(engine: PiperEngine) -> None:
    """The second "I'm sorry," of a reply runs no synthesis and is the same audio (Piper samples noise afresh each
    time it synthesizes, so a second synthesis would differ)."""
    opener = TTSRequest(**{**REPLY.__dict__, "text": " I'm sorry, "})
    made, hits = engine.sentences_made, engine.phrases.hits
    first = await speak(engine, opener)
    assert engine.sentences_made == made + 1 and first and engine.phrases.hits == hits
    again = await speak(engine, opener)
    assert engine.sentences_made == made + 1 and engine.phrases.hits == hits + 1
    assert len(again) == len(first) and all(np.array_equal(a, b) for a, b in zip(again, first, strict=True))
    again[0][:] = 0.0  # the consumer's copy: changing it leaves the kept audio as it was
    assert np.array_equal((await speak(engine, opener))[0], first[0])
    # Another speed is other audio: made, not taken from the cache.
    faster = await speak(engine, TTSRequest(**{**opener.__dict__, "speed": 1.3}))
    assert engine.sentences_made == made + 2 and len(faster[0]) < len(first[0])


async def test_only_a_conversations_requests_read_or_fill_it(engine: PiperEngine) -> None:
    """A TTS API request (no ``reuse_audio``) is always made afresh, and leaves nothing for a reply to find: a caller
    cannot learn by timing what the assistant said to someone else."""
    made = engine.sentences_made
    await speak(engine, TTSRequest(text="Of course,"))
    await speak(engine, TTSRequest(text="Of course,"))
    assert engine.sentences_made == made + 2
    await speak(engine, TTSRequest(**{**REPLY.__dict__, "text": "Of course,"}))
    assert engine.sentences_made == made + 3  # the API's two left nothing behind
    await speak(engine, TTSRequest(**{**REPLY.__dict__, "text": "Of course,"}))
    assert engine.sentences_made == made + 3
    await speak(engine, TTSRequest(text="Of course,"))  # and the reply's audio is not the API's
    assert engine.sentences_made == made + 4


async def test_a_stopped_synthesis_and_a_long_piece_keep_nothing(engine: PiperEngine) -> None:
    long_piece = TTSRequest(**{**REPLY.__dict__, "text": "This piece is longer than any opener the cache keeps."})
    made = engine.sentences_made
    await speak(engine, long_piece)
    await speak(engine, long_piece)
    assert engine.sentences_made == made + 2
    stopped = TTSRequest(**{**REPLY.__dict__, "text": "Well, then."})
    gen = engine.synthesize(stopped)
    await anext(gen)
    await gen.aclose()  # a barge-in: the consumer stopped before the synthesis said it was done
    await until(lambda: engine.active == 0, "the stopped worker to end")
    before = engine.sentences_made
    await speak(engine, stopped)
    assert engine.sentences_made == before + 1  # made again: the stopped one was not kept


def test_the_key_leaves_out_what_is_not_the_same_voice() -> None:
    cache = PhraseCache(1 << 20, 32)
    assert cache.key("Sure,", REPLY) is not None
    assert cache.key("Sure,", TTSRequest(text="")) is None  # not asked for
    clip = ReferenceClip(audio=np.zeros(16_000, np.float32), sample_rate=16_000)
    assert cache.key("Sure,", TTSRequest(**{**REPLY.__dict__, "reference": clip})) is None
    assert cache.key("Sure,", TTSRequest(**{**REPLY.__dict__, "instruct": "whisper"})) is None
    assert cache.key("x" * 33, REPLY) is None
    assert PhraseCache(0, 32).key("Sure,", REPLY) is None  # off
    keys = {cache.key("Sure,", TTSRequest(**{**REPLY.__dict__, **change}))
            for change in ({}, {"voice": "v"}, {"language": "de"}, {"speed": 1.1}, {"pitch": 2.0}, {"seed": 3})}
    assert len(keys) == 6


def test_the_least_recently_used_go_past_the_byte_bound() -> None:
    piece = np.ones(1000, np.float32)  # 4000 bytes
    cache = PhraseCache(10_000, 32)
    a, b, c = (cache.key(t, REPLY) for t in ("a", "b", "c"))
    assert a and b and c
    cache.put(a, [piece])
    cache.put(b, [piece])
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, [piece])  # 12000 bytes: b goes
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    assert cache.size_bytes == 8000 and len(cache) == 2
    cache.put(a, [piece, piece])  # replaced, not added twice: 8000 + 4000 > the bound, c goes
    assert cache.size_bytes == 8000 and cache.get(c) is None
    cache.put(c, [np.ones(3000, np.float32)])  # larger than the whole bound: not kept, nothing evicted
    assert cache.get(c) is None and cache.get(a) is not None
    kept = cache.get(a)
    assert kept is not None and not kept[0].flags.writeable


def test_sizes_below_zero_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"tts\.phrase_cache_mb"):
        load_config(overrides={"tts": {"phrase_cache_mb": -1}})
    with pytest.raises(ConfigError, match=r"tts\.phrase_cache_chars"):
        load_config(overrides={"tts": {"phrase_cache_chars": -5}})


async def test_a_conversations_second_reply_opens_without_synthesis(engine: PiperEngine) -> None:
    """Two typed turns of a real conversation (echo, the Piper voice): the second reply's "You said:" is the first's
    audio, and its track hears it."""
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    cfg = test_config()
    track = ReplyTrack(queue_ms=60)

    async def listen() -> None:  # the peer: pulls paced frames, so the replies play out and end
        while True:
            await track.recv()

    deps = TurnDeps(asr=None, tts=engine, responder=EchoResponder())  # type: ignore[arg-type]
    conv = Conversation(cfg, Endpointer(cfg.vad, SileroModel.shared()), deps, track, events, "phrases")
    listener = asyncio.create_task(listen())
    try:
        made, hits = engine.sentences_made, engine.phrases.hits
        conv.respond_to(text="one coffee please")
        await until(lambda: [e["turn"] for e in seen if e["type"] == "reply_done"] == [1], "the first reply", 30)
        first = engine.sentences_made - made
        conv.respond_to(text="two coffees please")
        await until(lambda: [e["turn"] for e in seen if e["type"] == "reply_done"] == [1, 2], "the second reply", 30)
    finally:
        listener.cancel()
        await conv.close()
    replies = [e["text"] for e in seen if e["type"] == "reply_text"]
    assert replies[-1].startswith("You said:") and first >= 2  # "You said:" is a piece of its own
    assert engine.sentences_made - made == 2 * first - 1 and engine.phrases.hits >= hits + 1
    assert sorted(e["turn"] for e in seen if e["type"] == "reply_audio_start") == [1, 2]
