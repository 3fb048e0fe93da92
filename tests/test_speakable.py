"""Text for the ear (tts/speakable.py): Markdown, lists, URLs, symbols and units said well, in the reply's
language, the same whether the text comes whole or in deltas; and the speech path applies it to every responder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assistant.config import ChunkerConfig
from assistant.tts.chunker import TextChunker
from assistant.tts.speakable import speakable

MARKDOWN_REPLY = (
    "Here are some dinner ideas:\n\n"
    "## Quick dinners\n"
    "* **Marinated Squab:** roast it at 200°C for 25-30 min.\n"
    "* __Pasta__ with *garlic* & olive oil\n"
    "1. Boil 2 l of water\n"
    "2) Add 500 g of pasta\n"
    "> Tip: see [the recipe](https://www.example.com/pasta?x=1) or https://cooking.example.org/a/b.\n"
    "```python\nprint('never read aloud')\n```\n"
    "| Dish | Time |\n|---|---|\n| Soup | 20 min |\n"
    "Enjoy! 🍝\n"
)


def chunk(text: str, step: int, language: str | None = None) -> list[str]:
    c = TextChunker(ChunkerConfig(), language=language)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += c.push(text[i : i + step])
    return out + c.flush()


def test_markdown_reply_is_spoken_as_sentences() -> None:
    said = " ".join(chunk(MARKDOWN_REPLY, 1))
    for mark in ("*", "_", "#", "`", "[", "](", "|", "http", "www", ">", "🍝", "print", "---"):
        assert mark not in said, (mark, said)
    assert "Quick dinners." in said  # a heading is a sentence of its own
    assert "Marinated Squab: roast it at 200 degrees Celsius for 25 to 30 minutes." in said
    assert "Pasta with garlic and olive oil." in said  # a list item ends with a full stop
    assert "Add 500 grams of pasta." in said
    assert "see the recipe or cooking dot example dot org." in said  # a link keeps its text, a URL its host
    assert "Soup, 20 minutes." in said
    assert said.endswith("Enjoy!")


@pytest.mark.parametrize("step", [1, 2, 3, 7, 10_000])
def test_deltas_of_any_size_give_the_same_speech(step: int) -> None:
    # "**bold**" or a link split across deltas is whole by the time a piece is shaped.
    assert " ".join(chunk(MARKDOWN_REPLY, step)) == " ".join(chunk(MARKDOWN_REPLY, 10_000))


def test_code_block_state_ends_with_the_reply() -> None:
    c = TextChunker(ChunkerConfig())
    c.push("Run this:\n```\nrm -rf x\n")
    c.flush()  # the reply ended inside the block (cut, barge-in): the next reply is not swallowed
    assert c.push("Next reply here. And") == ["Next reply here."]


@pytest.mark.parametrize(("text", "language", "want"), [
    ("It is 50% likely.", "en", "It is 50 percent likely."),
    ("Il fait 20°C, 50% & plus.", "fr", "Il fait 20 degrés Celsius, 50 pour cent et plus."),
    ("今天气温20°C，湿度50%。", None, "今天气温20摄氏度，湿度百分之50。"),
    ("気温は20°Cで、5-10kmです。", None, "気温は20度で、5から10キロメートルです。"),
    ("습도는 50%입니다.", None, "습도는 50퍼센트입니다."),
    ("Meet at 7 am & leave at 5:30 PM.", "en", "Meet at 7 a.m. and leave at 5:30 p.m."),
    ("Use 1/2 cup and/or 2 kg.", "en", "Use one half cup and or 2 kilograms."),
    ("It is 3.5 km, 1 km or 3,000 ft.", "en", "It is 3.5 kilometers, 1 kilometer or 3,000 ft."),
    ("3 x 4 = 12", "en", "3 times 4 equals 12"),
    ("On 2024-01-15 at 10:30.", "en", "On 2024-01-15 at 10:30."),  # a date is no range
    ("50% 20°C", "it", "50% 20°C"),  # no table for Italian: no English words, the voice says the symbols
    ("snake_case and _this_", "en", "snake_case and this"),
    ("2. 1. Add the tea leaves", "en", "Add the tea leaves."),  # nested markers, as SmolLM2 writes them
    ("1. 1. 1. 1. ", "en", ""),
    # A phone number is said digit by digit, never as a range ("555 to 1234") or a count in the thousands.
    ("Call 555-1234 now.", "en", "Call 5 5 5, 1 2 3 4 now."),
    ("Dial 1-800-555-1234 or (555) 123-4567.", "en", "Dial 1, 8 0 0, 5 5 5, 1 2 3 4 or 5 5 5, 1 2 3, 4 5 6 7."),
    ("Ring +1-555-123-4567.", "en", "Ring plus 1, 5 5 5, 1 2 3, 4 5 6 7."),
    ("Appelez le 555-1234.", "fr", "Appelez le 5 5 5, 1 2 3 4."),
    ("请拨打555-1234。", None, "请拨打5 5 5，1 2 3 4。"),
    ("From 100-1000 people, 25-30 minutes.", "en", "From 100 to 1000 people, 25 to 30 minutes."),  # ranges stay
    # A digit string read back (a caller's number, a code) is said digit by digit, not as a count: espeak-ng reads
    # "2025998630" as "two billion twenty five million ...", "482913" in the thousands and "202-599-863" with "dash".
    ("Your number is 2025998630.", "en", "Your number is 2 0 2, 5 9 9, 8 6 3 0."),
    ("Got it: 202-599-863.", "en", "Got it: 2 0 2, 5 9 9, 8 6 3."),
    ("Your code is 482913.", "en", "Your code is 4 8 2, 9 1 3."),
    ("Your ZIP code is 94110, order number 55213.", "en", "Your ZIP code is 9 4 1 1 0, order number 5 5 2 1 3."),
    ("電話番号は03-1234-5678です。", None, "電話番号は0 3，1 2 3 4，5 6 7 8です。"),
    ("请拨打13812345678。", None, "请拨打1 3 8，1 2 3 4，5 6 7 8。"),  # a mobile number: 3-4-4
    ("Call 18005551234 or 12345678.", "en", "Call 1, 8 0 0, 5 5 5, 1 2 3 4 or 1 2 3 4, 5 6 7 8."),
    # ... but a count, money, a year, a date, a decimal and a short number stay as the voice reads them.
    ("About 3,500,000 people, 1000000 stars, 25000 dollars, $2500000.", "en",
     "About 3,500,000 people, 1000000 stars, 25000 dollars, $2500000."),
    ("In 2025, on 2024-01-15, pi is 3.14159265, room 1204.", "en",
     "In 2025, on 2024-01-15, pi is 3.14159265, room 1204."),
])
def test_symbols_and_units_in_the_language(text: str, language: str | None, want: str) -> None:
    assert speakable(text, language) == want


def test_a_digit_string_of_any_length_is_said() -> None:
    """Past 4,300 digits Python's int() raises; the round-count test must not take a reply's voice with it."""
    said = speakable("Your code is " + "7" * 5000 + ".", "en")
    assert said.startswith("Your code is 7 7 7, 7 7 7,") and said.count("7") == 5000
    assert speakable("1" + "0" * 5000, "en") == "1" + "0" * 5000  # a round count stays


def test_no_english_words_in_cjk_text() -> None:
    for text in ("温度は30°Cで、50%の確率で雨 & 風。https://www.example.jp/a を見て。",
                 "温度30°C，50%，详见 https://www.example.cn/a 。"):
        said = speakable(text)
        ascii_words = [w for w in said.replace(".", " ").split() if w.isascii() and w.isalpha()]
        assert set(ascii_words) <= {"example", "jp", "cn"}, said


_md_piece = st.sampled_from(["**", "*", "__", "`", "# ", "- ", "1. ", "> ", "[a](http://b.c)", "\n", " ", "|",
                             "```\n", "~~", "x", "word", "3", "%", "°C", "km", "漢字", "かな", "한글", "。", ". ",
                             ", ", "!", "🎉", "https://www.ex.com/p"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_md_piece, max_size=40), st.integers(min_value=1, max_value=12))
def test_any_markdown_soup_leaves_no_markup_and_streams_alike(parts: list[str], step: int) -> None:
    text = "".join(parts)
    whole = chunk(text, 10_000)
    streamed = chunk(text, step)
    for piece in streamed:
        assert piece and piece == piece.strip()
        assert any(ch.isalnum() for ch in piece)
        for mark in ("**", "__", "`", "~~", "](", "http", "🎉"):
            assert mark not in piece, (mark, piece, text)
    # The same words come out whatever the deltas (pieces may be cut at other places).
    assert "".join("".join(streamed).split()) == "".join("".join(whole).split())


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
@settings(max_examples=200, deadline=None)
def test_never_raises_and_is_stable(text: str) -> None:
    once = speakable(text)
    assert "\n" not in once
    assert speakable(once) == speakable(speakable(once))


class _Recorder:
    """A TTS engine that records the text it is asked to say (and says nothing)."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def synthesize_stream(self, text: AsyncIterator[str], request: object) -> AsyncIterator[object]:
        import numpy as np

        async for piece in text:
            self.pieces.append(piece)
            yield np.zeros(160, dtype=np.float32)


@pytest.mark.parametrize("engine", ["echo", "rules"])
def test_every_responder_is_shaped_on_the_way_to_tts(engine: str) -> None:
    """The echo and rules responders (no LLM) go through the same speech path as the embedded model."""
    from assistant.config import RespondConfig
    from assistant.pipeline.synthesis import SynthesisPath
    from assistant.respond import create_responder
    from assistant.tts.base import TTSRequest

    responder = create_responder(RespondConfig(engine=engine))
    said = "**Remind me** at 7 am & visit https://www.example.com/x — 50% done 🎉"

    async def main() -> list[str]:
        deltas = responder.respond(said, [])
        recorder = _Recorder()
        path = SynthesisPath(recorder, 16000, timeout_s=10.0)  # type: ignore[arg-type]
        async for _ in path.speak(deltas, TTSRequest(text="", language="en")):
            pass
        return recorder.pieces

    pieces = asyncio.run(main())
    text = " ".join(pieces)
    assert pieces and "**" not in text and "http" not in text and "🎉" not in text and "&" not in text, text
    if engine == "echo":
        assert "example dot com" in text and "50 percent" in text and "7 a.m." in text
