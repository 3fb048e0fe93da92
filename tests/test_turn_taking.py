"""Turn-taking: speculation is never heard unless committed, pauses mid-sentence do not cut the user off,
partial transcripts come before the final one, and the transcript moves the endpoint."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import pytest

from assistant.asr.base import Transcript
from assistant.audio import read_audio
from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.config import TurnConfig
from assistant.pipeline.conversation import Conversation, TurnDeps
from assistant.pipeline.end_of_turn import TurnEnd, judge
from assistant.pipeline.events import EventChannel
from assistant.pipeline.trace import GAPS, PARTS
from assistant.pipeline.turn_taking import is_backchannel
from assistant.respond.base import Responder
from assistant.respond.echo import EchoResponder
from assistant.respond.skills import CallContext, load_skills, with_skills
from assistant.respond.skills.timers import CallTimers
from assistant.rtc.outbound import ReplyTrack
from assistant.tts.base import TTSCapabilities, TTSRequest
from assistant.vad.endpoint import Endpointer
from assistant.vad.silero import SileroModel
from tests.conftest import serve, test_config

CHUNK = 320  # 20 ms at 16 kHz, as the inbound reader delivers


class InstantASR:
    """Answers at once, so a speculative reply is fully prepared long before the pause ends."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def transcribe(self, audio: np.ndarray, **_: Any) -> Transcript:
        seconds = len(audio) / 16_000
        self.calls.append(seconds)
        text = "I would like to order." if seconds < 2.2 else "I would like to order a large pizza."
        return Transcript(text=text)

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript:
        return await self.transcribe(audio, **kw)


class FinishedASR(InstantASR):
    """InstantASR whose first half is a finished sentence (transcript cue complete), so a pause after it can end the
    turn on a sure score."""

    async def transcribe(self, audio: np.ndarray, **kw: Any) -> Transcript:
        heard = await super().transcribe(audio, **kw)
        return Transcript(text="I would like a coffee." if heard.text == "I would like to order." else heard.text)


class ToneTTS:
    name = "tone"
    sample_rate = 16_000
    capabilities = TTSCapabilities()

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        t = np.arange(8000) / 16_000
        yield (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

    async def warmup(self) -> None: ...

    async def close(self) -> None: ...


async def _run_conversation(cfg: Any, audio: np.ndarray, asr: InstantASR | None = None,
                            responder: Responder | None = None, before_close: Callable[[], None] | None = None,
                            ) -> tuple[Conversation, list[dict], list[tuple[int, float]]]:
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    track = ReplyTrack(queue_ms=1000)
    writes: list[tuple[int, float]] = []  # (number of committed turns when written, peak)
    original_write = track.write

    async def spy(pcm: np.ndarray, generation: int | None = None) -> bool:
        writes.append((conv.turns, float(np.abs(pcm).max()) if len(pcm) else 0.0))
        return await original_write(pcm, generation)

    track.write = spy  # type: ignore[method-assign]
    deps = TurnDeps(asr=asr or InstantASR(), tts=ToneTTS(), responder=responder or EchoResponder())
    conv = Conversation(cfg, Endpointer(cfg.vad, SileroModel.shared()), deps, track, events, "t")
    for i in range(0, len(audio), CHUNK):
        conv.feed(audio[i : i + CHUNK])
        await asyncio.sleep(0.002)  # let turn tasks run between chunks, as they would in real time
    await asyncio.sleep(0.3)
    if before_close is not None:
        before_close()
    await conv.close()
    return conv, seen, writes


@pytest.mark.asyncio
async def test_speculative_reply_is_never_heard_when_the_user_goes_on(shared_audio) -> None:
    x, _ = read_audio(shared_audio / "en_pause_midsentence.wav")
    cfg = test_config(turn={"speculative": True, "speculative_pause_ms": 150, "smart_endpoint": False})
    conv, seen, writes = await _run_conversation(cfg, x)
    assert conv.speculations["dropped"] >= 1, conv.speculations  # a reply was prepared in the pause...
    finals = [e["text"] for e in seen if e["type"] == "transcript" and e["final"]]
    assert finals == ["I would like to order a large pizza."]  # ...and never shown
    replies = [e["text"] for e in seen if e["type"] == "reply_text"]
    assert replies and all(replies[-1].startswith(r) for r in replies)  # one reply, to the whole sentence
    assert replies[-1] == "You said: I would like to order a large pizza."
    # Every write to the reply track happened after the (single) turn was committed.
    assert writes and all(turns == 1 for turns, _ in writes)


class TimerASR(InstantASR):
    """The sentence with its pause as a timer request: "Set a timer for five minutes, [pause] please." """

    async def transcribe(self, audio: np.ndarray, **kw: Any) -> Transcript:
        heard = await super().transcribe(audio, **kw)
        whole = heard.text.endswith("pizza.")
        return Transcript(text="Set a timer for five minutes, please." if whole else "Set a timer for five minutes.")


async def _timer_request(shared_audio: Any, cfg: Any
                         ) -> tuple[Conversation, list[dict], list[tuple[int, list[str]]]]:
    """The pause file heard as "Set a timer for five minutes, [pause] please." on a call with timers (the intent
    step in front of echo): the conversation, its events, and (timers running, their changes) just before it
    closes (closing cancels a turn still replying, and with it what its skill did)."""
    x, _ = read_audio(shared_audio / "en_pause_midsentence.wav")
    changes: list[str] = []
    timers = CallTimers(max_timers=5, max_seconds=3600, on_due=lambda *_: None,
                        on_change=lambda action, *_: changes.append(action))
    responder = with_skills(EchoResponder(), load_skills(["timers"]), CallContext(timers=timers), intents="always")
    live: list[tuple[int, list[str]]] = []
    try:
        conv, seen, _ = await _run_conversation(cfg, x, TimerASR(), responder,
                                                before_close=lambda: live.append((len(timers.timers), [*changes])))
    finally:
        timers.close()
    return conv, seen, live


@pytest.mark.parametrize("turn", [
    pytest.param({"speculative": True, "speculative_pause_ms": 150, "smart_endpoint": False}, id="speculated"),
    pytest.param({"speculative": False, "smart_endpoint": False, "end_of_turn_model": False, "policy": "flat",
                  "confirm_ms": 1000}, id="committed-unsure"),
])
@pytest.mark.asyncio
async def test_a_skill_that_acts_waits_for_the_turn_to_be_sure(shared_audio, turn: dict[str, Any]) -> None:
    """A timer asked for before a pause the speaker goes on from is set once: the speculative turn at the pause (or
    the turn committed there whose end was unsure) never sets it, and the whole sentence's turn does."""
    conv, seen, live = await _timer_request(shared_audio, test_config(vad={"end_silence_ms": 250}, turn=turn))
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert conv.speculations["dropped"] >= 1 or len(ends) == 2  # a turn at the pause, dropped
    assert live == [(1, ["set"])]  # set once, by the whole sentence's turn (none set, then taken back, before it)
    replies = [e["text"] for e in seen if e["type"] == "reply_text"]
    assert replies[-1] == "Timer set for 5 minutes."


@pytest.mark.asyncio
async def test_a_skill_that_acted_for_a_turn_dropped_after_its_reply_began_is_undone(shared_audio) -> None:
    """No hold (turn.confirm_ms 0): the turn at the pause is sure at once and its timer is set; the speaker goes on
    within turn.rejoin_ms, the turn is dropped and heard again whole: the first timer is taken back, and the call
    keeps one."""
    cfg = test_config(vad={"end_silence_ms": 250},
                      turn={"speculative": False, "smart_endpoint": False, "end_of_turn_model": False,
                            "policy": "flat", "confirm_ms": 0, "rejoin_ms": 1000})
    _, seen, live = await _timer_request(shared_audio, cfg)
    assert len([e for e in seen if e["type"] == "speech_end"]) == 2  # the pause ended a turn, then the sentence
    assert live == [(1, ["set", "cancelled", "set"])]


@pytest.mark.asyncio
async def test_an_unsure_end_is_heard_only_once_the_silence_confirms_it(shared_audio) -> None:
    """turn.confirm_ms: a turn ended by a short silence at the sentence's 400 ms pause is committed, but its reply
    waits for more silence; the speaker goes on first, so it is dropped unheard (no audio written, no `interrupted`
    event: no false start) and the sentence is one turn, whose reply is heard once the silence after it confirms it.
    Nor was the dropped reply read: its text waits for the confirmation as its audio does."""
    x, _ = read_audio(shared_audio / "en_pause_midsentence.wav")  # speech ends at 4.03 s of 5.54 s
    cfg = test_config(vad={"end_silence_ms": 250},
                      turn={"speculative": False, "smart_endpoint": False, "end_of_turn_model": False,
                            "policy": "flat", "confirm_ms": 1000})
    _, seen, writes = await _run_conversation(cfg, x)
    ends = [e for e in seen if e["type"] == "speech_end"]
    assert len(ends) == 2, ends  # the pause ended a turn: the fixed 250 ms silence is shorter than it
    assert not [e for e in seen if e["type"] == "interrupted"]  # ... whose reply nobody heard
    words = [e for e in seen if e["type"] == "transcript" and e.get("final")]
    assert [e["turn"] for e in words] == [ends[0]["turn"], ends[1]["turn"]]  # both turns were committed ...
    dropped = [e for e in seen if e["type"] == "turn_dropped"]
    assert [(e["turn"], e["heard"]) for e in dropped] == [(ends[0]["turn"], False)]  # ... the first taken back
    replies = [e for e in seen if e["type"] == "reply_text"]
    assert replies and {e["turn"] for e in replies} == {ends[1]["turn"]}  # ... and only the second one's reply read
    assert replies[-1]["text"] == "You said: I would like to order a large pizza."
    assert writes and all(turns == 2 for turns, _ in writes)  # only the whole sentence's reply was written


@pytest.mark.asyncio
async def test_a_held_reply_is_heard_when_the_audio_stops_coming(shared_audio) -> None:
    """A client that stops sending audio after the speech end (a push-to-talk app, a Realtime client) still hears
    the held reply: turn.confirm_ms of wall time confirms it as the same silence of audio would."""
    x, _ = read_audio(shared_audio / "en_weather.wav")
    cfg = test_config(vad={"end_silence_ms": 250},
                      turn={"speculative": False, "smart_endpoint": False, "end_of_turn_model": False,
                            "policy": "flat", "confirm_ms": 800})
    events = EventChannel()
    track = ReplyTrack(queue_ms=1000)
    written = asyncio.Event()
    original_write = track.write

    async def spy(pcm: np.ndarray, generation: int | None = None) -> bool:
        written.set()
        return await original_write(pcm, generation)

    track.write = spy  # type: ignore[method-assign]
    deps = TurnDeps(asr=InstantASR(), tts=ToneTTS(), responder=EchoResponder())
    conv = Conversation(cfg, Endpointer(cfg.vad, SileroModel.shared()), deps, track, events, "h")
    try:
        ends: list[dict] = []
        events.subscribe(lambda e: ends.append(e) if e["type"] == "speech_end" else None)
        i = 0
        while not ends and i < len(x):  # feed until the turn ends, then no more audio
            conv.feed(x[i : i + CHUNK])
            i += CHUNK
            await asyncio.sleep(0.002)
        assert ends and not written.is_set()
        await asyncio.wait_for(written.wait(), 5.0)
    finally:
        await conv.close()


@pytest.mark.asyncio
async def test_without_confirm_ms_the_pause_splits_the_turn_audibly(shared_audio) -> None:
    """The same sentence with turn.confirm_ms 0 (off): the reply to its first half is written (heard) before the
    speaker goes on: the false start the hold removes."""
    x, _ = read_audio(shared_audio / "en_pause_midsentence.wav")
    cfg = test_config(vad={"end_silence_ms": 250},
                      turn={"speculative": False, "smart_endpoint": False, "end_of_turn_model": False,
                            "policy": "flat", "confirm_ms": 0, "rejoin_ms": 0})
    _, _, writes = await _run_conversation(cfg, x)
    assert any(turns == 1 for turns, _ in writes), writes


@pytest.mark.asyncio
@pytest.mark.parametrize("sure_ms", [0, 600])
async def test_a_sure_end_waits_confirm_sure_ms(shared_audio, caplog, sure_ms: int) -> None:
    """turn.confirm_sure_ms: an end whose score reaches confirm_sure waits that much silence, not confirm_ms. The
    falling policy here ends the turn at the sentence's 400 ms pause on a sure score (heard as "I would like a
    coffee."): heard at once (0), the first half's reply is written before the speaker goes on; held 600 ms, it is
    dropped unheard and only the whole sentence's reply is written, 600 ms after its end (not confirm_ms's 3 s)."""
    caplog.set_level(logging.INFO, logger="assistant.pipeline.turn_taking")
    x, _ = read_audio(shared_audio / "en_pause_midsentence.wav")  # speech ends at 4.03 s of 5.54 s
    cfg = test_config(turn={"speculative": True, "smart_endpoint": True, "end_of_turn_model": False,
                            "policy": "falling", "falling_from": 0.5, "falling_to": 0.5, "confirm_ms": 3000,
                            "confirm_sure": 1.2, "confirm_sure_ms": sure_ms, "rejoin_ms": 0})
    _, seen, writes = await _run_conversation(cfg, x, FinishedASR())
    assert len([e for e in seen if e["type"] == "speech_end"]) == 2  # decided (sure) at the pause, and at the end
    if not sure_ms:
        assert any(turns == 1 for turns, _ in writes), writes  # the false start the hold removes
        return
    assert not [e for e in seen if e["type"] == "interrupted"]
    assert writes and all(turns == 2 for turns, _ in writes), writes
    held = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reply_held")]
    assert held and all(m.endswith("until_ms=600") for m in held), held


@pytest.mark.asyncio
async def test_speculation_committed_when_the_pause_is_the_end(shared_audio) -> None:
    x, _ = read_audio(shared_audio / "en_weather.wav")
    cfg = test_config(turn={"speculative": True, "smart_endpoint": False})
    conv, seen, writes = await _run_conversation(cfg, x)
    assert conv.speculations["committed"] == 1, conv.speculations
    assert [e["turn"] for e in seen if e["type"] == "transcript" and e["final"]] == [1]
    assert writes and all(turns == 1 for turns, _ in writes)


@pytest.mark.asyncio
@pytest.mark.parametrize("speculative", [True, False])
async def test_turn_metrics_parts_add_up_to_the_server_v2v(shared_audio, speculative: bool) -> None:
    """The turn_metrics event splits the server's v2v into parts that add up to it exactly."""
    x, _ = read_audio(shared_audio / "en_weather.wav")
    cfg = test_config(turn={"speculative": speculative})
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    track = ReplyTrack(queue_ms=60)

    async def listen() -> None:  # the peer: pulls paced frames, so the first audible one is handed over
        while True:
            await track.recv()

    deps = TurnDeps(asr=InstantASR(), tts=ToneTTS(), responder=EchoResponder())
    conv = Conversation(cfg, Endpointer(cfg.vad, SileroModel.shared()), deps, track, events, "m")
    listener = asyncio.create_task(listen())
    try:
        for i in range(0, len(x), CHUNK):
            conv.feed(x[i : i + CHUNK])
            await asyncio.sleep(0.002)
        for _ in range(200):
            if any(e["type"] == "turn_metrics" for e in seen):
                break
            await asyncio.sleep(0.02)
    finally:
        await conv.close()
        listener.cancel()
    (metrics,) = [e for e in seen if e["type"] == "turn_metrics"]
    d = metrics["durations_ms"]
    assert [k for k in d if k in PARTS] == list(PARTS), d
    assert round(sum(d[k] for k in PARTS) * 10) == round(d["server_v2v_ms"] * 10), d
    assert all(d[k] >= 0 for k in PARTS), d
    assert d["endpoint_ms"] > 0
    assert set(metrics["gaps_ms"]) == set(GAPS) and all(v >= 0 for v in metrics["gaps_ms"].values())


@pytest.mark.asyncio
async def test_complete_sentence_ends_the_turn_sooner(shared_audio) -> None:
    x, _ = read_audio(shared_audio / "en_weather.wav")
    ends = {}
    for smart in (False, True):
        # The flat policy's fixed wait after a complete-looking transcript (complete_endpoint_ms) is under test.
        cfg = test_config(turn={"speculative": True, "smart_endpoint": smart, "complete_endpoint_ms": 250,
                                "policy": "flat"})
        _, seen, _ = await _run_conversation(cfg, x)
        (end,) = [e for e in seen if e["type"] == "speech_end"]
        ends[smart] = end
    assert ends[True]["reason"] == "complete_sentence"
    assert ends[False]["reason"] == "silence"
    # Same real speech end, decided about 250 ms sooner (500 ms hangover → 250 ms).
    assert ends[True]["t_ms"] - ends[True]["at_ms"] < ends[False]["t_ms"] - ends[False]["at_ms"] - 150


def test_judge_turn_end() -> None:
    assert judge("What is the weather like today?") is TurnEnd.COMPLETE
    assert judge("Thanks.") is TurnEnd.COMPLETE
    assert judge("I would like to order.") is TurnEnd.INCOMPLETE
    assert judge("Can I get a pizza with") is TurnEnd.INCOMPLETE
    assert judge("so um...") is TurnEnd.INCOMPLETE
    assert judge("hello there") is TurnEnd.UNKNOWN
    assert judge("") is TurnEnd.UNKNOWN


@pytest.mark.asyncio
@pytest.mark.slow
async def test_pause_mid_sentence_does_not_cut_and_partials_come_first(shared_audio) -> None:
    """Real peers, real ASR: one turn for the sentence with a 400 ms pause, partials before the final."""
    async with serve(test_config(asr={"partials": True})) as (url, _app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            result = await client.run_turn(
                load_utterance(shared_audio / "en_pause_midsentence.wav"), 0, TurnSettings(timeout_s=40.0)
            )
        finally:
            await client.close()
    assert result.status == "ok", result.reason
    kinds = [(e.body["type"], e.body.get("final")) for e in client.events if e.body["type"] == "transcript"]
    finals = [e.body["text"] for e in client.events if e.body["type"] == "transcript" and e.body.get("final")]
    assert len(finals) == 1, finals
    assert "order" in finals[0].lower() and "pizza" in finals[0].lower()
    assert ("transcript", False) in kinds and kinds.index(("transcript", False)) < kinds.index(("transcript", True))
    assert len([e for e in client.events if e.body["type"] == "speech_end"]) == 1


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.parametrize("confirm_ms", [0, 2500])
async def test_a_caller_hears_a_false_start_only_without_the_confirming_silence(shared_audio, tmp_path,
                                                                                 confirm_ms: int) -> None:
    """Real peers, real models, the bench's client: "What is the weather like today?", 1.5 s of silence, then "Set a
    timer …" as one turn, ended (250 ms of silence) at the gap. Without turn.confirm_ms the first sentence's reply is
    heard before the speaker goes on: the bench counts a false start. With it longer than the gap, nothing is heard
    before the speech end, and the words after the gap are heard with the ones before."""
    import json

    import soundfile as sf

    first, sr = read_audio(shared_audio / "en_weather.wav")
    second, _ = read_audio(shared_audio / "en_timer.wav")
    entries = {e["file"]: e for e in json.loads((shared_audio / "manifest.json").read_text())}
    a_end = int(entries["en_weather.wav"]["speech_ends_s"] * sr)
    b_start = int(entries["en_timer.wav"]["speech_starts_s"] * sr)
    gap = np.zeros(int(1.5 * sr), np.float32)
    audio = np.concatenate([first[:a_end], gap, second[b_start:]]).astype(np.float32)
    end_s = (a_end + gap.size + int(entries["en_timer.wav"]["speech_ends_s"] * sr) - b_start) / sr
    sf.write(tmp_path / "two.wav", audio, sr)
    (tmp_path / "manifest.json").write_text(json.dumps([{"file": "two.wav", "speech_ends_s": end_s,
                                                         "text": "two sentences, a gap between"}]))
    cfg = test_config(vad={"end_silence_ms": 250},
                      turn={"speculative": True, "smart_endpoint": False, "end_of_turn_model": False,
                            "policy": "flat", "confirm_ms": confirm_ms, "rejoin_ms": 0},
                      respond={"engine": "echo"})
    async with serve(cfg) as (url, _app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            result = await client.run_turn(load_utterance(tmp_path / "two.wav"), 0, TurnSettings(timeout_s=40.0))
        finally:
            await client.close()
    assert result.status == "ok", result.reason
    assert result.speech_ends >= 2, result  # the gap ended a turn either way
    if confirm_ms:
        assert result.false_start_ms == 0, result
        assert "timer" in result.reply_text.lower() and "weather" in result.reply_text.lower(), result.reply_text
    else:
        assert result.false_start_ms > 0, result


class StreamingToneTTS(ToneTTS):
    """An engine that takes the reply's text as it arrives (as CosyVoice2 does)."""

    def __init__(self) -> None:
        self.streamed: list[str] = []

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        raise AssertionError("a streaming engine gets the text through synthesize_stream")
        yield np.zeros(0, np.float32)  # pragma: no cover

    async def synthesize_stream(self, texts: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        async for piece in texts:
            self.streamed.append(piece)
            async for chunk in ToneTTS.synthesize(self, request):
                yield chunk


@pytest.mark.asyncio
async def test_streaming_engine_gets_the_reply_text_as_it_arrives(shared_audio) -> None:
    x, _ = read_audio(shared_audio / "en_weather.wav")
    cfg = test_config(turn={"speculative": False})
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    tts = StreamingToneTTS()
    conv = Conversation(
        cfg,
        Endpointer(cfg.vad, SileroModel.shared()),
        TurnDeps(asr=InstantASR(), tts=tts, responder=EchoResponder()),
        ReplyTrack(queue_ms=1000),
        events,
        "s",
    )
    for i in range(0, len(x), CHUNK):
        conv.feed(x[i : i + CHUNK])
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.3)
    await conv.close()
    assert "".join(tts.streamed).strip() == "You said: I would like to order a large pizza."
    assert not [e for e in seen if e["type"] == "error"]


def test_a_backchannel_is_made_of_backchannel_words() -> None:
    """Short speech over the reply resumes it only when it says nothing but a backchannel: "Madrid." said just
    after a reply began (a decision at the pause before it) is the speaker going on, and becomes a turn."""
    cfg = TurnConfig()
    for text, lang in (("Mm-hmm.", "en"), ("Yeah, okay.", "en"), ("Got it.", ""), ("うん", "ja"), ("嗯嗯", "zh"),
                       ("네", "ko"), ("", "en")):
        assert is_backchannel(text, lang, 400, cfg), text
    for text, lang in (("Madrid.", "en"), ("Madrid.", ""), ("Two.", "en"), ("Stop.", "en"), ("Yeah, stop.", "en"),
                       ("東京", "ja"), ("Okay yeah sure right.", "en")):
        assert not is_backchannel(text, lang, 900, cfg), text
    assert not is_backchannel("Madrid.", "en", 400, cfg)  # short, but a word no listener says to go on
    assert is_backchannel("Madrid.", "fr", 400, cfg)  # no list for the language: the length decides, as before
    assert is_backchannel(None, "", 400, cfg) and not is_backchannel(None, "", 900, cfg)  # the ASR failed
