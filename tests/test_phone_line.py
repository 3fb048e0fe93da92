"""The bench phones' line (bench/phone_line.py): what a caller says, frame by frame, and what it hears."""

from __future__ import annotations

import numpy as np
import pytest

from assistant.bench.phone_line import Playout, Voice, now


@pytest.mark.asyncio
async def test_the_voice_says_each_frame_once_and_stamps_the_speech_end_on_its_frame() -> None:
    voice = Voice(b"S")
    first = voice.say([b"a", b"b", b"c"], end_frame=1)
    out = []
    for _ in range(2):
        out.append(voice.next_frame())
        voice.sent()
    assert out == [b"a", b"b"] and first.done()  # frame 1 carried the speech end
    out.append(voice.next_frame())
    assert not voice.sent()
    # Silence goes out; an utterance queued while it is on its way starts with the next frame, not half a frame early.
    out.append(voice.next_frame())
    second = voice.say([b"x", b"y"])
    assert not voice.sent() and not second.done()
    out.append(voice.next_frame())
    assert not voice.sent() and not second.done()  # "x" is not the speech end
    out.append(voice.next_frame())
    assert voice.sent() and second.done()  # "y" is
    assert out == [b"a", b"b", b"c", b"S", b"x", b"y"]
    assert voice.next_frame() == b"S"
    assert (await voice.say([])) > 0  # nothing to say: its end is now


@pytest.mark.asyncio
async def test_the_playout_queues_replies_as_a_phone_plays_them_and_a_clear_cuts_what_has_not_played() -> None:
    ear = Playout(8000)
    loud, quiet = np.full(800, 8000, np.int16), np.zeros(800, np.int16)  # 100 ms each
    ear.play(quiet, 10.0)
    ear.play(loud, 10.05)  # arrives while the first still plays: it waits for it
    assert [p.at for p in ear.played] == [10.0, 10.1] and ear.queue_end == pytest.approx(10.2)
    assert ear.first_audible(since=10.0) == pytest.approx(10.1) and ear.first_audible(since=10.11) is None
    assert ear.last_audible_end() == pytest.approx(10.2)
    ear.cut_playout(10.15)  # a clear: the loud piece played for 50 ms, the rest never will
    assert len(ear.heard_pcm()) == 800 + 400 and ear.queue_end == 10.15
    ear.drained()
    ear.play(loud, 11.0)
    assert ear.played[-1].at == 11.0 and ear.audible_since(10.5) == 1


@pytest.mark.asyncio
async def test_a_reply_is_done_once_it_has_played_and_the_line_is_quiet() -> None:
    ear = Playout(8000)
    assert not await ear.reply_done(since=0.0, timeout_s=0.05)  # nothing heard yet
    ear.play(np.full(80, 8000, np.int16), now() - 2.0)  # 10 ms, long played
    assert await ear.reply_done(since=0.0, quiet_s=0.5, timeout_s=1.0)
