"""Text front end: language tags, instructions, emotion tags, sentence splitting, normalisation."""

from __future__ import annotations

import pytest

from assistant.tts.cosyvoice.frontend import (
    END_OF_PROMPT,
    TextFrontend,
    format_instruct,
    language_tag,
    prepare_text,
    split_emotion_tag,
)


def test_language_tags() -> None:
    assert [language_tag(x) for x in ("zh", "en", "ja", "yue", "ko")] == [
        "<|zh|>", "<|en|>", "<|ja|>", "<|yue|>", "<|ko|>"]
    assert language_tag(None) == ""
    with pytest.raises(ValueError):
        language_tag("fr")


def test_instruct_format() -> None:
    assert format_instruct("用四川话说这句话") == "用四川话说这句话" + END_OF_PROMPT
    assert format_instruct("x" + END_OF_PROMPT) == "x" + END_OF_PROMPT


def test_emotion_tags() -> None:
    assert split_emotion_tag("[关心] 你还好吗？") == ("用关心的语气说", "你还好吗？")
    assert split_emotion_tag("[Cheerful] Hello!") == ("Speak in a cheerful, happy tone.", "Hello!")
    assert split_emotion_tag("[sarcastic] Great.") == ("sarcastic", "Great.")
    assert split_emotion_tag("[laughter] ha") == (None, "[laughter] ha")  # a sound token, not an emotion
    assert split_emotion_tag("no tag") == (None, "no tag")
    p = prepare_text("[sad] Goodbye.", language="en")
    assert p.text == "<|en|>Goodbye." and p.instruct == "Speak in a sad tone." + END_OF_PROMPT
    p = prepare_text("[sad] Goodbye.", instruct="Whisper it.")
    assert p.text == "Goodbye." and p.instruct == "Whisper it." + END_OF_PROMPT


def test_sentence_split() -> None:
    f = TextFrontend(normalize_text=False)
    long = " ".join(f"This is sentence number {i} which is moderately long." for i in range(20))
    parts = f.split(long)
    assert len(parts) > 1 and " ".join(parts).split() == long.split()
    assert all(len(p.split()) <= 80 for p in parts)
    assert f.split("Hi. Ok.") == ["Hi. Ok."]  # short pieces are kept together
    zh = "今天天气很好。" * 20
    zparts = f.split(zh)
    assert "".join(zparts) == zh and all(len(p) <= 80 for p in zparts)
    assert f.split('He said "go." Then left') == ['He said "go." Then left.']
    assert f.split("...") == []


def test_normalize_numbers() -> None:
    f = TextFrontend()
    zh = f.normalize("今天是2024年3月5日")
    en = f.normalize("I have 23 apples.")
    if zh == "今天是2024年3月5日":
        pytest.skip("wetext unavailable")
    assert "二零二四" in zh and "twenty three" in en
    assert f.normalize("<|en|>I have 23") == "<|en|>I have 23"  # tagged text is left alone
