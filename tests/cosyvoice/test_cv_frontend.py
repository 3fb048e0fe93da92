"""Text front end: language tags, instructions, emotion tags, sentence splitting, normalisation."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from cv_fixtures import FIXTURES, need_fixture

from assistant.tts.cosyvoice.frontend import (
    END_OF_PROMPT,
    TextFrontend,
    format_instruct,
    language_tag,
    prepare_text,
    split_emotion_tag,
)
from tests import needs


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
        needs.missing("wetext unavailable (the cosyvoice extra declares it): numbers are not normalised")
    assert "二零二四" in zh and "twenty three" in en
    assert f.normalize("<|en|>I have 23") == "<|en|>I have 23"  # tagged text is left alone


# --- the reference front end's output (../shared/fixtures/cosyvoice2/tiny_tokenizer/frontend_golden.json) ---

TOKENIZER_DIR = FIXTURES / "tiny_tokenizer"
_GOLDEN = TOKENIZER_DIR / "frontend_golden.json"
_CASES = json.loads(_GOLDEN.read_text())["cases"] if _GOLDEN.is_file() else []


@pytest.fixture(scope="module")
def tiny_frontend() -> TextFrontend:
    need_fixture("tiny_tokenizer/frontend_golden.json")
    return TextFrontend(TOKENIZER_DIR)


@pytest.mark.parametrize("case", range(len(_CASES)) or [0])  # without the golden: one case, which the fixture stops
def test_reference_segments_and_ids(tiny_frontend: TextFrontend, case: int) -> None:
    """Segments and token ids of each of the reference's ten texts (normalised, split, encoded)."""
    c = _CASES[case]
    if any(ch.isdigit() for ch in c["text"]) and not tiny_frontend.normalizes:
        needs.missing("wetext unavailable (the cosyvoice extra declares it): numbers are not normalised")
    segments = tiny_frontend.sentences(c["text"])
    assert segments == c["segments"]
    assert [tiny_frontend.encode(s) for s in segments] == c["token_ids"]


def test_reference_special_tokens_and_instructions(tiny_frontend: TextFrontend) -> None:
    golden = json.loads(_GOLDEN.read_text())
    tok = tiny_frontend.tokenizer()
    assert {t: tok.convert_tokens_to_ids(t) for t in golden["special_token_ids"]} == golden["special_token_ids"]
    for ins in golden["instructions"]:
        assert tiny_frontend.encode(ins["text"]) == ins["token_ids"]


def test_reference_quirks_without_wetext() -> None:
    """The two places the reference's split differs from plain sentence splitting: a mark run keeps its first
    mark, and a later segment keeps the blank before it."""
    f = TextFrontend(normalize_text=False)
    assert f.split("Well... (this part) - and this isn't.") == ["Well. (this part) - and this isn't."]
    assert f.split("Really?! Yes.") == ["Really? Yes."]
    long = " ".join(f"This is sentence number {i} which is moderately long." for i in range(20))
    parts = f.split(long)
    assert parts[0][0] == "T" and all(p.startswith(" This") for p in parts[1:])
    assert "".join(parts) == long


def test_works_without_wetext(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No wetext installed (the GPU machine): one clear log line, text goes through unnormalised."""
    monkeypatch.setitem(sys.modules, "wetext", None)  # makes `import wetext` raise ImportError
    f = TextFrontend()
    with caplog.at_level(logging.WARNING, logger="assistant.tts.cosyvoice.frontend"):
        # the reference's zh clean-up still runs
        assert f.sentences("I have 23 apples. 今天是2024年") == ["I have 23 apples。今天是2024年。"]
        assert f.sentences("It is 3 pm.") == ["It is 3 pm."]
    lines = [r.getMessage() for r in caplog.records if "wetext" in r.getMessage()]
    assert len(lines) == 1 and "normalisation skipped" in lines[0]
    assert not f.normalizes
