"""TextChunker: early first clause, whole sentences after, no splits inside numbers or abbreviations."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import numpy as np
import pytest

from assistant.config import ChunkerConfig
from assistant.tts.chunker import TextChunker, speakable


def run(text: str, step: int = 1, cfg: ChunkerConfig | None = None, **kw: int) -> list[str]:
    """Feed ``text`` in ``step``-character deltas (1 = the worst case for look-ahead), then flush."""
    c = TextChunker(cfg or ChunkerConfig(), **kw)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += c.push(text[i : i + step])
    return out + c.flush()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_sentences_numbers_abbreviations(step: int) -> None:
    text = ("Sure, I can help. Mr. Smith paid $3.50 for 2.5 kg, e.g. apples, i.e. fruit. "
            "Dr. J. K. Rowling lives in the U.S. with approx. five cats! Really?! Yes... it is true.")
    assert run(text, step) == [
        "Sure, I can help.",
        "Mr. Smith paid $3.50 for 2.5 kilograms, e.g. apples, i.e. fruit.",  # units said (tts/speakable.py)
        "Dr. J. K. Rowling lives in the U.S. with approx. five cats!",
        "Really?!",
        "Yes... it is true.",
    ]


def test_first_clause_is_sent_early_then_only_sentences() -> None:
    c = TextChunker(ChunkerConfig(first_min_chars=12))
    assert c.push("Well, ") == []  # too short for a clause break
    assert c.push("let me think about that") == []
    assert c.push(",") == ["Well, let me think about that,"]  # after a letter no number goes on: out at once
    assert c.push(" okay") == []
    # After the first chunk, commas no longer break.
    assert c.push(" so the answer, as far as I know, is") == []
    assert c.push(" yes. And") == ["okay so the answer, as far as I know, is yes."]
    assert c.flush() == ["And"]
    # flush() starts a new reply: the first-clause rule applies again.
    assert c.push("Another reply begins here; ") == ["Another reply begins here;"]


def test_a_voice_chat_replys_one_word_clause_is_its_first_piece() -> None:
    """Piper speaks a piece once it has all of it, and the caller waits for the first: with the default
    chunker.reply_first_min_chars a one-word clause ("No,", "Sure,") goes out alone, as soon as its comma is
    followed; the rest comes as a sentence."""
    cfg = ChunkerConfig()
    c = TextChunker(ChunkerConfig(first_min_chars=cfg.reply_first_min_chars))
    assert c.push("No") == [] and c.push(",") == ["No,"]
    assert c.push(" I") == []
    assert c.push("'m not able to send messages.") == []
    assert c.push(" Ok") == ["I'm not able to send messages."]
    assert run("Sure, here is one.", first_min_chars=cfg.reply_first_min_chars)[0] == "Sure,"
    assert run("A, B and C.", first_min_chars=cfg.reply_first_min_chars) == ["A, B and C."]  # a letter is no clause


def test_a_comma_after_a_letter_ends_the_first_piece_without_the_next_token() -> None:
    """The model writes "I'm sorry," then " I": a comma or semicolon after a letter is a clause's end however the
    text goes on, so the first piece goes out with it, one model step sooner. After a digit it waits ("3," may be
    "3,000"), and so does a colon ("https:")."""
    cfg = ChunkerConfig()
    voice_chat = ChunkerConfig(first_min_chars=cfg.reply_first_min_chars, runway_chars=cfg.reply_runway_chars)
    c = TextChunker(voice_chat)
    assert c.push("I'm sorry") == [] and c.push(",") == ["I'm sorry,"]
    assert c.push(" I can't do that") == [] and c.push(";") == ["I can't do that;"]
    c = TextChunker(voice_chat)
    assert c.push("It costs about 3") == [] and c.push(",") == []
    assert c.push("000 dollars, or so.") == ["It costs about 3,000 dollars,"]
    c = TextChunker(voice_chat)
    assert c.push("The page is at https") == [] and c.push(":") == []
    assert c.push("//example.org today, I think") == ["The page is at example dot org today,"]  # the link whole


def test_a_voice_chat_replys_next_clause_follows_a_one_word_first_piece() -> None:
    """After "No," (0.3 s of speech) the caller would hear silence while the model, shared by four callers, writes
    the rest of the sentence: with chunker.reply_runway_chars the next clause goes out on its own too, until the
    pieces released hold that many characters; then only sentences end a piece."""
    cfg = ChunkerConfig()
    voice_chat = ChunkerConfig(first_min_chars=cfg.reply_first_min_chars, runway_chars=cfg.reply_runway_chars)
    assert run("No, I'm sorry, I can't send messages or make calls.", cfg=voice_chat) == [
        "No,", "I'm sorry,", "I can't send messages or make calls."]
    c = TextChunker(voice_chat)
    assert c.push("Sure, here is a recipe for you, with eggs") == ["Sure,", "here is a recipe for you,"]
    assert c.push(", flour, and sugar. Then") == ["with eggs, flour, and sugar."]  # 30 letters made: sentences
    assert c.flush() == ["Then"]
    # Without it (the TTS service, a streaming voice) a later piece ends only at a sentence.
    assert run("No, I'm sorry, I can't.", first_min_chars=cfg.reply_first_min_chars) == ["No,", "I'm sorry, I can't."]


def paced(text: str, ms_per_token: float, cfg: ChunkerConfig) -> list[str]:
    """Feed ``text`` a word (or mark) at a time, one every ``ms_per_token`` on the chunker's clock, then flush."""
    now = [0.0]
    c = TextChunker(cfg, clock=lambda: now[0])
    out: list[str] = []
    for token in re.findall(r" ?[\w']+| ?[^\w\s]|\s+", text):
        now[0] += ms_per_token / 1000
        out += c.push(token)
    return out + c.flush()


def test_a_slow_voice_chat_replys_long_clause_is_cut_before_a_joining_word() -> None:
    """After "No," the model shared by four callers wrote "20 ounces of iced coffee with whole milk and a little bit
    of sugar is a bit of a challenge." in 1.3 s: with chunker.reply_phrase_break_ms a clause the model has been
    writing that long with no mark is cut before its last joining word; one that comes quickly stays whole."""
    cfg = ChunkerConfig()
    voice_chat = ChunkerConfig(first_min_chars=cfg.reply_first_min_chars, runway_chars=cfg.reply_runway_chars,
                               phrase_break_ms=cfg.reply_phrase_break_ms)
    assert cfg.reply_phrase_break_ms == 600 and cfg.phrase_break_ms == 0
    long_reply = "No, 20 ounces of iced coffee with whole milk and a little bit of sugar is a bit of a challenge."
    assert paced(long_reply, 72, voice_chat) == [  # 0.6 s at 72 ms a token: 8 tokens in, cut before "and"
        "No,", "20 ounces of iced coffee with whole milk", "and a little bit of sugar is a bit of a challenge."]
    assert paced(long_reply, 5, voice_chat) == ["No,", long_reply[4:]]  # a fast model: no cut
    assert run(long_reply, cfg=voice_chat) == ["No,", long_reply[4:]]  # an echo: all there at once
    # The first piece too (the caller waits for it), and the cut waits for a joining word 12 letters in.
    assert paced("I can't make you a large iced coffee with almond milk today.", 72, voice_chat)[0] == (
        "I can't make you a large iced coffee")
    assert paced("Yes and it is also a very good choice for a cold day.", 72, voice_chat) == [
        "Yes and it is also a very good choice for a cold day."]
    # Whole words only ("withstand" is not "with"); nothing to cut in CJK.
    assert paced("Our travel mugs can easily withstand boiling water all day long.", 72, voice_chat) == [
        "Our travel mugs can easily withstand boiling water all day long."]
    assert paced("今日はとても良い天気ですね and with 散歩に行きましょう and 公園で。", 72, voice_chat) == [
        "今日はとても良い天気ですね and with 散歩に行きましょう and 公園で。"]
    # Once the pieces out hold runway_chars, a later sentence waits for its end as before.
    assert paced("I'm sorry, I can't do that. I can make you a coffee with almond milk and a little sugar.", 72,
                 voice_chat) == ["I'm sorry,", "I can't do that.",
                                 "I can make you a coffee with almond milk and a little sugar."]
    # Off by default (the TTS service, a streaming voice).
    assert paced(long_reply, 72, ChunkerConfig(first_min_chars=cfg.reply_first_min_chars)) == [
        "No,", long_reply[4:]]


def test_first_clause_marks_and_short_sentence() -> None:
    assert run("Here is the plan: we go now and then we rest.")[0] == "Here is the plan:"
    assert run("It depends — mostly on the weather today.")[0] == "It depends —"
    assert run("Hi! How are you doing today, my friend?") == ["Hi!", "How are you doing today, my friend?"]
    # "3,000" and "10:30" are not clause breaks.
    assert run("It costs 3,000 dollars at 10:30 tomorrow morning.") == [
        "It costs 3,000 dollars at 10:30 tomorrow morning."]


def test_trailing_period_waits_for_next_char() -> None:
    c = TextChunker()
    assert c.push("The value is 3.") == []
    assert c.push("5 today. ") == []          # next word unknown: could be "approx. five"
    assert c.push("Next") == ["The value is 3.5 today."]
    assert c.flush() == ["Next"]


def test_list_items_newlines_and_markdown() -> None:
    text = "Here you go:\n1. Buy **milk**\n2. Call [Bob](http://x.y)\n\n# Done\n- `code` item"
    # List items and headings are spoken as sentences (tts/speakable.py): the marker goes, a full stop ends them.
    assert run(text) == ["Here you go:", "Buy milk.", "Call Bob.", "Done.", "code item."]
    assert speakable("**Bold** and _x_ `y`") == "Bold and x y"


def test_quotes_stay_with_their_sentence() -> None:
    assert run('He said "stop." Then he left. (Quietly.) Done.') == [
        'He said "stop."', "Then he left.", "(Quietly.)", "Done."]


def test_forced_break_at_space_past_max_chars() -> None:
    words = " ".join(f"word{i}" for i in range(60))
    chunks = run(words, step=7, max_chars=50)
    assert all(len(ch) <= 50 for ch in chunks)
    assert " ".join(chunks) == words
    # A long run-on sentence prefers a clause mark to a bare space.
    text = "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen"
    assert run(text, max_chars=45)[0] == "one two three four five six seven,"
    # No space at all: hard cut at twice the limit, nothing lost.
    blob = "x" * 130
    assert "".join(run(blob, max_chars=50)) == blob


def test_cjk_without_spaces() -> None:
    text = "你好，我是你的语音助手。今天天气很好！我们去公园吧？好的；走吧"
    assert run(text) == ["你好，我是你的语音助手。", "今天天气很好！", "我们去公园吧？", "好的；", "走吧"]
    # The first clause of a long CJK sentence goes early on "，".
    first = run("今天我们要讨论的问题非常重要而且复杂，所以请认真听我说完。")[0]
    assert first == "今天我们要讨论的问题非常重要而且复杂，"
    long = "这是一个非常长的句子没有任何标点符号" * 10
    chunks = run(long, max_chars=40)
    assert "".join(chunks) == long and all(len(ch) <= 40 for ch in chunks)
    # Mixed scripts: Japanese sentence ends, ASCII "!" right after CJK.
    assert run("こんにちは。元気ですか!はい") == ["こんにちは。", "元気ですか!", "はい"]


def test_punctuation_only_and_empty() -> None:
    c = TextChunker()
    assert c.push("") == [] and c.flush() == []
    assert run("... !!! ---") == []
    assert run("   ") == []


def test_reset_drops_pending_text() -> None:
    c = TextChunker()
    c.push("Half a sentence that was interr")
    c.reset()
    assert c.pending == "" and c.flush() == []


# --- the one sentence splitter and CJK helper (assistant.tts.text) the chunker, the TTS service and the
# CosyVoice front end share ---


def test_whole_text_splitter_uses_the_chunker_rules() -> None:
    from assistant.tts.text import split_sentences

    text = "Mr. Smith paid $3.50. Really?! Yes... it is.\n今天很好。明天下雨！OK"
    parts = split_sentences(text)
    assert "".join(parts) == text  # raw slices: nothing lost, blanks kept at the start of the next piece
    assert [p.strip() for p in parts] == [
        "Mr. Smith paid $3.50.", "Really?!", "Yes... it is.", "今天很好。", "明天下雨！", "OK"]
    # The streaming chunker releases the same sentences (it only adds the early first clause).
    assert run(text, 1, first_min_chars=1000) == [p.strip() for p in parts]


def test_cjk_helpers_and_short_piece_joining() -> None:
    from assistant.tts.text import contains_chinese, has_cjk, is_cjk, join_short, spoken_length, starts_cjk

    assert is_cjk("。") and is_cjk("か") and is_cjk("한") and is_cjk("中") and not is_cjk("a")
    assert has_cjk("ok かな") and not contains_chinese("ok かな") and contains_chinese("ok 中")
    assert starts_cjk("中a") and not starts_cjk("a中") and not starts_cjk("")
    # A CJK letter takes about as long to say as two Latin ones; its punctuation counts once, as Latin's does.
    assert spoken_length("好的，") == 5 and spoken_length("Sure,") == 5 and spoken_length("はい、OK") == 7
    assert join_short(["Hi.", " Ok.", " This is long enough."], 12) == ["Hi. Ok. This is long enough."]
    assert join_short(["今天。", "明天很好很好很好很好很好。"], 6) == ["今天。明天很好很好很好很好很好。"]
    assert join_short(["A long first sentence.", " Ok."], 12) == ["A long first sentence. Ok."]
    assert join_short(["...", " !"], 1) == []


# --- CJK replies reach the voice early -----------------------------------------------------------------------
MANDARIN_REPLY = (
    "好的，我来帮你查一下今天的天气情况。北京今天晴转多云，最高气温二十五度，最低气温十五度，空气质量良好，"
    "适合外出散步。下午可能会有一阵小雨，记得带伞，晚上气温下降，注意保暖。明天还想出门的话，我可以再帮你看看天气。"
)


async def test_first_clause_of_a_mandarin_reply_reaches_tts_before_the_reply_is_complete() -> None:
    """The reply streams in one character at a time, and the rest of it is held back until the engine has been
    handed its first piece: if the first clause waited for the whole text, the reply would never finish."""
    from assistant.config import ChunkerConfig
    from assistant.pipeline.synthesis import SynthesisPath
    from assistant.tts.base import PieceByPiece, TTSCapabilities, TTSRequest

    assert len(MANDARIN_REPLY) >= 100
    first_piece = asyncio.Event()
    pieces: list[tuple[str, int]] = []  # (piece, characters of the reply sent when it reached the engine)
    sent = 0

    class Recorder(PieceByPiece):
        name, sample_rate = "recorder", 16_000
        capabilities = TTSCapabilities(languages=("zh",))

        async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
            pieces.append((request.text, sent))
            first_piece.set()
            yield np.full(160, 0.1, np.float32)

    async def reply() -> AsyncIterator[str]:
        nonlocal sent
        for ch in MANDARIN_REPLY:
            if sent == 20:  # the rest only once the first clause is with the engine (at most 5 s)
                await asyncio.wait_for(first_piece.wait(), 5.0)
            sent += 1
            yield ch

    path = SynthesisPath(Recorder(), 16_000, timeout_s=10.0, chunker=ChunkerConfig(first_min_chars=4))
    chunks = [c async for c in path.speak(reply(), TTSRequest(text="", language="zh"))]
    assert chunks
    assert pieces[0] == ("好的，", 3)  # the first clause went out with 3 of 100+ characters written
    assert "".join(p for p, _ in pieces) == MANDARIN_REPLY
    assert all(p.endswith(("。", "，")) for p, _ in pieces)  # later pieces at CJK sentence marks


def test_japanese_speech_text_reads_units_and_decimals() -> None:
    from assistant.tts.kokoro_engine import for_speech

    assert for_speech("気温は25℃、湿度は50%です。") == "気温は25度、湿度は50パーセントです。"
    assert for_speech("3.5kgと5 kmとPython 3") == "3点5キログラムと5キロメートルとPython 3"


def test_kokoro_cuts_a_long_sentence_within_its_context_and_drops_nothing() -> None:
    from assistant.tts.kokoro_engine import MAX_PHONEMES, _phoneme_chunks

    plain = "a" * (2 * MAX_PHONEMES + 10)  # no punctuation to cut at
    assert "".join(_phoneme_chunks(plain)) == plain
    assert all(len(c) <= MAX_PHONEMES for c in _phoneme_chunks(plain))
    marked = ("b" * 300 + ", ") * 4
    assert _phoneme_chunks(marked) == [("b" * 300 + ",")] * 4  # at the marks when there are some
