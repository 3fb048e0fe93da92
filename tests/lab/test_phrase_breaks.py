"""``python -m lab phrase-breaks``: the replay is exact about order and time, reads both kinds of file, and says
what a cut changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.__main__ import main
from lab.phrase_breaks import Voice, load_replies, replay, tokens, voice_chat

LONG = "No, 20 ounces of iced coffee with whole milk and a little bit of sugar is a bit of a challenge."


def test_tokens_stream_the_reply_whole() -> None:
    for text in (LONG, "I'm sorry, I can't. 3,000 dollars at 10:30!", "  Deux mots, 今日は  "):
        assert "".join(tokens(text)) == text
    assert tokens("No, 20 ounces")[:3] == ["No", ",", " 20"]


def test_a_long_clause_after_a_one_word_piece_leaves_a_silence_the_cut_fills() -> None:
    voice = Voice()
    whole = replay(LONG, 72, voice_chat(0), voice)
    cut = replay(LONG, 72, voice_chat(400), voice)
    assert whole.pieces == ("No,", LONG[4:])
    assert cut.pieces == ("No,", "20 ounces of iced coffee", LONG[29:])
    # "No," (2 tokens, 0.48 s of audio) then 22 tokens more at 72 ms: the caller waits over a second in silence.
    assert whole.longest_gap_ms > 1000
    assert cut.longest_gap_ms < whole.longest_gap_ms / 5
    assert cut.first_audio_ms == whole.first_audio_ms  # the first piece is the same
    # A reply with no long clause is played the same with the rule on.
    short = "I'm sorry, I can't send messages or make calls."
    assert replay(short, 30, voice_chat(400), voice) == replay(short, 30, voice_chat(0), voice)
    assert replay(LONG, 5, voice_chat(400), voice).pieces == whole.pieces  # a fast model: no cut


def test_replies_come_from_lab_replies_and_from_bench_v2v(tmp_path: Path) -> None:
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"rows": [
        {"preset": "config", "half": "tuning", "language": "en", "reply": "Tuning."},
        {"preset": "config", "half": "heldout", "language": "en", "reply": "Held out."},
        {"preset": "plain", "half": "heldout", "language": "en", "reply": "Another prompt."},
        {"preset": "config", "half": "heldout", "language": "ja", "reply": "日本語。"},
        {"preset": "config", "half": "heldout", "language": "en", "reply": "  "},
    ]}))
    v2v = tmp_path / "v2v.json"
    v2v.write_text(json.dumps({"levels": [{"turns": [{"reply_text": "Heard."}, {"reply_text": ""}, {}]}]}))
    assert load_replies([replies], "heldout") == ["Held out."]
    assert load_replies([replies], "all") == ["Tuning.", "Held out."]
    assert load_replies([replies, v2v], "tuning") == ["Tuning.", "Heard."]


def test_the_command_writes_its_table_and_refuses_bad_numbers(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    v2v = tmp_path / "v2v.json"
    v2v.write_text(json.dumps({"levels": [{"turns": [{"reply_text": LONG}, {"reply_text": "Sure."}]}]}))
    assert main(["phrase-breaks", str(v2v), "--token-ms", "72", "--break-ms", "0,400", "--out", str(tmp_path),
                 "--show", "400"]) == 0
    out = capsys.readouterr().out
    assert "   1  No, | 20 ounces of iced coffee | with whole milk" in out
    rows = json.loads((tmp_path / "phrase_breaks.json").read_text())["rows"]
    assert [(r["phrase_break_ms"], r["gap_over_300"], r["cut_replies"]) for r in rows] == [(0, 1, 0), (400, 0, 1)]
    for bad in (["--token-ms", "0"], ["--break-ms", "x"]):
        with pytest.raises(SystemExit):
            main(["phrase-breaks", str(v2v), "--out", str(tmp_path), *bad])
