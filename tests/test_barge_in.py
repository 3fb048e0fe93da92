"""Barge-in that keeps the truth: real Silero VAD, a real reply track played out in real time.

- speech over the reply cancels it, and the turn enters the history with what the user said and only the
  part of the reply that was heard (cut where playback stopped, through the text→audio boundaries);
- a short sound or a backchannel pauses the reply, which then resumes where it stopped, nothing lost;
- a short "stop" is no backchannel: it cancels the reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from assistant.asr.base import Transcript
from assistant.audio import read_audio
from assistant.bench.shared_data import shared_path
from assistant.pipeline.conversation import Conversation, TurnDeps
from assistant.pipeline.events import EventChannel
from assistant.pipeline.reply import played_text
from assistant.respond.base import Message, ReplyOptions
from assistant.rtc.outbound import ReplyTrack
from assistant.tts.base import TTSCapabilities, TTSRequest
from assistant.vad.endpoint import Endpointer
from assistant.vad.silero import SileroModel
from tests.conftest import test_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHUNK = 320
REPLY = "One two three four. Five six seven eight. Nine ten eleven twelve. Thirteen fourteen fifteen."
PIECE_S = 0.6  # each text piece is spoken as 0.6 s of tone


class LengthASR:
    """The question for long audio; ``short_text`` for a short sound."""

    def __init__(self, short_text: str) -> None:
        self.short_text = short_text

    async def transcribe(self, audio: np.ndarray, **_: Any) -> Transcript:
        return Transcript(text="What is the weather like today?" if len(audio) > 16_000 else self.short_text)

    async def transcribe_partial(self, audio: np.ndarray, **kw: Any) -> Transcript:
        return await self.transcribe(audio, **kw)


class Reply:
    name = "fixed"

    async def respond(self, text: str, history: Sequence[Message]) -> AsyncIterator[str]:
        for word in REPLY.split(" "):
            yield word + " "


class KeptReply(Reply):
    """:class:`Reply`, keeping each reply's ``ReplyOptions.kept``: what the conversation told the responder it kept."""

    def __init__(self) -> None:
        self.kept: list[asyncio.Future[str]] = []

    async def respond(self, text: str, history: Sequence[Message],  # type: ignore[override]
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        assert options is not None and options.kept is not None
        self.kept.append(options.kept)
        async for piece in super().respond(text, history):
            yield piece


class PieceTone:
    """0.6 s of tone per text piece, so the reply's audio maps to its text piece by piece."""

    name = "tone"
    sample_rate = 16_000
    capabilities = TTSCapabilities()

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        t = np.arange(int(PIECE_S * 16_000)) / 16_000
        yield (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

    async def warmup(self) -> None: ...

    async def close(self) -> None: ...


def test_played_text_cuts_at_the_piece_playing() -> None:
    spoken = [(0, "One two three four. "), (100, "Five six seven eight. "), (200, "Nine ten.")]
    assert played_text(spoken, 300, 0) == ""
    assert played_text(spoken, 300, 100) == "One two three four."
    assert played_text(spoken, 300, 150) == "One two three four. Five six"  # half of the second piece
    assert played_text(spoken, 300, 300) == "One two three four. Five six seven eight. Nine ten."


async def _talk(short: np.ndarray, short_text: str, *, played_s: float = 0.5, rejoin_ms: int | None = None,
                asr: LengthASR | None = None, until_turn: int | None = None, went_on_ms: int | None = None,
                responder: Reply | None = None) -> tuple[Conversation, list[dict], ReplyTrack]:
    """Ask a question, let the reply play ``played_s``, make ``short`` over it, then let it all play out (until the
    reply is done or a second turn is heard; ``until_turn``: until that turn's reply is done)."""
    x, _ = read_audio(shared_path("audio") / "en_weather.wav")
    x = x[: int(3.2 * 16_000)]  # the question, then just enough silence to end it (speech ends at 2.54 s)
    turn: dict[str, Any] = {"speculative": False}
    if rejoin_ms is not None:
        turn["rejoin_ms"] = rejoin_ms
    if went_on_ms is not None:
        turn["went_on_ms"] = went_on_ms
    cfg = test_config(turn=turn)
    events = EventChannel()
    seen: list[dict] = []
    events.subscribe(seen.append)
    track = ReplyTrack(queue_ms=60)
    asr = asr or LengthASR(short_text)
    deps = TurnDeps(asr=asr, tts=PieceTone(), responder=responder or Reply())  # type: ignore[arg-type]
    endpointer = Endpointer(cfg.vad, SileroModel.shared())  # type: ignore[attr-defined]
    conv = Conversation(cfg, endpointer, deps, track, events, "b")  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()

    async def listen() -> None:  # the peer: takes a frame every 20 ms
        while True:
            await track.recv()

    async def say(audio: np.ndarray) -> None:  # the mic: 20 ms every 20 ms
        t0 = loop.time()
        for i in range(0, len(audio), CHUNK):
            conv.feed(audio[i : i + CHUNK])
            await asyncio.sleep(max(0.0, t0 + (i + CHUNK) / 16_000 - loop.time()))

    listener = loop.create_task(listen())
    try:
        await say(x)
        for _ in range(300):
            if any(e["type"] == "reply_audio_start" for e in seen):
                break
            await say(np.zeros(CHUNK, np.float32))
        await say(np.zeros(int(played_s * 16_000), np.float32))  # some of the reply plays
        await say(np.concatenate([short, np.zeros(int(1.5 * 16_000), np.float32)]))
        for _ in range(500):  # until the turn is over
            if until_turn is not None:
                if any(e["type"] == "reply_done" and e["turn"] == until_turn for e in seen):
                    break
            elif any(e["type"] == "reply_done" or (e["type"] == "transcript" and e["turn"] == 2) for e in seen):
                break
            await say(np.zeros(CHUNK, np.float32))
        await asyncio.sleep(0.3)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await conv.close()
    return conv, seen, track


def _speech(seconds: float) -> np.ndarray:
    x, _ = read_audio(shared_path("audio") / "en_story.wav")
    return x[int(0.51 * 16_000) : int((0.51 + seconds) * 16_000)]


async def test_long_speech_cancels_and_the_history_keeps_only_what_was_heard() -> None:
    # Over a second of the reply first: sooner (turn.went_on_ms) the speech would go on with the question's turn.
    replies = KeptReply()
    conv, seen, _ = await _talk(_speech(2.0), "Tell me a short story about a cat who learns to play the piano.",
                                played_s=1.2, responder=replies)
    kinds = [e["type"] for e in seen]
    assert "interrupted" in kinds and "reply_resumed" not in kinds
    first = conv.history.messages[:2]
    assert [m.role for m in first] == ["user", "assistant"]
    assert first[0].content == "What is the weather like today?"
    heard = first[1].content
    # About 1.7 s of the 2.4 s reply was played (1.2 s, then until the barge-in was sure): a true prefix.
    assert heard and REPLY.startswith(heard) and len(heard) < len(REPLY) - 20, heard
    assert heard.split()[-1] in REPLY.split(), heard
    # The responder is told what the history kept (it gets the next prompt ready from that, not what it said).
    assert replies.kept[0].done() and replies.kept[0].result() == heard


async def test_backchannel_pauses_the_reply_and_it_resumes_where_it_stopped() -> None:
    conv, seen, track = await _talk(_speech(0.45), "Mm-hmm.")
    kinds = [e["type"] for e in seen]
    assert kinds.count("interrupted") == 1 and "reply_resumed" in kinds, kinds
    assert kinds.index("interrupted") < kinds.index("reply_resumed") < kinds.index("reply_done")
    assert conv.turns == 1  # the backchannel was not a turn
    # Nothing was lost: every piece's audio was played (4 pieces × 0.6 s at 48 kHz, in 20 ms frames).
    assert track.audible_frames_sent >= int(4 * PIECE_S / 0.02)
    assert conv.history.messages[1].content.strip() == REPLY


async def test_a_short_stop_is_not_a_backchannel() -> None:
    conv, seen, _ = await _talk(_speech(0.45), "Stop.")
    kinds = [e["type"] for e in seen]
    assert "interrupted" in kinds and "reply_resumed" not in kinds
    assert conv.history.messages[0].content == "What is the weather like today?"
    assert len(conv.history.messages[1].content) < len(REPLY.strip())
    assert conv.turns == 2  # "Stop." became the next turn


@pytest.mark.parametrize("went_on_ms", [5000, 0])
async def test_a_short_word_that_goes_on_is_no_backchannel(went_on_ms: int) -> None:
    """Short speech over the reply that is no backchannel word ("Madrid.", the end of a request the decision cut
    at its pause) is never resumed over and lost. Begun within turn.went_on_ms of the decision it goes on with the
    same turn (``interrupted``, reason ``went_on``; one turn, heard again over both stretches); later it cancels the
    reply and is the next turn."""
    asr = RecordingASR("Madrid.")
    replies = KeptReply()
    conv, seen, _ = await _talk(_speech(0.45), "", asr=asr, went_on_ms=went_on_ms, until_turn=2, responder=replies)
    kinds = [e["type"] for e in seen]
    assert "interrupted" in kinds and "reply_resumed" not in kinds, kinds
    interrupted = [e for e in seen if e["type"] == "interrupted"]
    users = [m.content for m in conv.history.messages if m.role == "user"]
    assert [e["reason"] for e in interrupted] == ["barge_in"], interrupted  # the pause said it; no second event
    if went_on_ms:
        assert len(users) == 1, users  # one turn: the question's audio carried in front of "Madrid."
        assert max(asr.lengths) >= asr.lengths[0] + int(0.45 * 16_000), asr.lengths
        # The turn cut at its pause never entered the history: its responder is told so (nothing is prepared
        # from a history that never happened); the turn heard whole is kept.
        assert replies.kept[0].cancelled() and replies.kept[-1].result() == conv.history.messages[-1].content
    else:
        said = [e["text"] for e in seen if e["type"] == "transcript" and e.get("final") and e["turn"] == 2]
        assert said == ["Madrid."] and len(users) == 2, (said, users)


class RecordingASR(LengthASR):
    """LengthASR that keeps the length of each audio it was given."""

    def __init__(self, short_text: str) -> None:
        super().__init__(short_text)
        self.lengths: list[int] = []

    async def transcribe(self, audio: np.ndarray, **kw: Any) -> Transcript:
        self.lengths.append(len(audio))
        return await super().transcribe(audio, **kw)


@pytest.mark.parametrize("rejoin_ms", [5000, 0])
async def test_speech_right_after_the_decision_is_the_same_turn_going_on(rejoin_ms: int) -> None:
    """The speaker goes on just after the turn was decided, while its reply has begun (a decision at a pause they
    had not finished): within turn.rejoin_ms the reply stops (``interrupted``, reason ``went_on``), nothing of it
    enters the history, and the two stretches of speech are heard as one turn. With rejoin_ms 0 (and went_on_ms 0,
    which would join them once the speech has ended) the same speech is a barge-in: the first turn stays in the
    history, the speech is a turn of its own."""
    asr = RecordingASR("and tomorrow")
    conv, seen, _ = await _talk(_speech(2.0), "", played_s=0.1, rejoin_ms=rejoin_ms, asr=asr, until_turn=2,
                                went_on_ms=None if rejoin_ms else 0)
    interrupted = [e for e in seen if e["type"] == "interrupted"]
    users = [m.content for m in conv.history.messages if m.role == "user"]
    if rejoin_ms:
        assert [e["reason"] for e in interrupted] == ["went_on"], interrupted
        assert len(users) == 1 and users[0].startswith("What is the weather like today?"), users  # one turn
        # Its pass heard both stretches: the question's audio carried in front of the speech after it.
        assert max(asr.lengths) >= asr.lengths[0] + 2 * 16_000 - 1600, asr.lengths
    else:
        assert interrupted and interrupted[0]["reason"] == "barge_in", interrupted
        assert len(users) == 2, users  # the question (with what of its reply was heard), then the new speech
