"""Voice store (atomic, persistent, ids never from clients) and the service's pure helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from assistant.config import Config
from assistant.server.tts_service import (
    RateLimiter,
    TTSError,
    parse_params,
    split_leading_tag,
    split_sentences,
)
from assistant.tts.voices import TMP_PREFIX, VoiceLimitError, VoiceStore, valid_voice_id

SR = 16000


def _clip(seconds: float = 3.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_create_list_get_and_reload(tmp_path):
    store = VoiceStore(tmp_path, max_voices=5)
    v = store.create(_clip(), SR, "hello there", name="Ann")
    assert valid_voice_id(v.voice_id)
    assert v.name == "Ann" and v.duration_s == pytest.approx(3.0)
    folder = tmp_path / v.voice_id
    assert sorted(p.name for p in folder.iterdir()) == ["clip.wav", "meta.json"]
    assert json.loads((folder / "meta.json").read_text())["transcript"] == "hello there"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]

    again = VoiceStore(tmp_path, max_voices=5)  # a restart
    assert [x.voice_id for x in again.list()] == [v.voice_id]
    clip = again.load_clip(v.voice_id)
    assert clip.sample_rate == SR and clip.text == "hello there"
    assert np.max(np.abs(clip.audio - _clip())) < 1e-3


def test_cap_and_delete(tmp_path):
    store = VoiceStore(tmp_path, max_voices=2)
    a = store.create(_clip(), SR, "a")
    store.create(_clip(), SR, "b")
    with pytest.raises(VoiceLimitError):
        store.create(_clip(), SR, "c")
    assert store.delete(a.voice_id)
    assert not (tmp_path / a.voice_id).exists()
    assert not store.delete(a.voice_id)
    store.create(_clip(), SR, "c")
    assert len(store.list()) == 2


def test_client_strings_never_become_paths(tmp_path):
    store = VoiceStore(tmp_path / "voices", max_voices=5)
    (tmp_path / "secret").mkdir()
    for bad in ("../secret", "..", "/etc", "ABCDEF0123456789", "0123", "0123456789abcdef/../x", ""):
        assert not valid_voice_id(bad)
        assert store.get(bad) is None
        assert store.delete(bad) is False
        with pytest.raises(KeyError):
            store.load_clip(bad)
    assert (tmp_path / "secret").is_dir()
    v = store.create(_clip(), SR, "x")
    with pytest.raises(ValueError):
        store.cache_path(v.voice_id, "../../x")


def test_failed_write_leaves_nothing_and_leftovers_are_cleaned(tmp_path):
    store = VoiceStore(tmp_path, max_voices=5)

    def broken(voice_id, folder):
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.create(_clip(), SR, "x", write_cache=broken)
    assert list(tmp_path.iterdir()) == [] and store.list() == []
    (tmp_path / f"{TMP_PREFIX}0123456789abcdef").mkdir()  # an interrupted write from a crash
    (tmp_path / "0123456789abcdef").mkdir()                # a folder without meta: skipped
    assert VoiceStore(tmp_path, max_voices=5).list() == []
    assert not (tmp_path / f"{TMP_PREFIX}0123456789abcdef").exists()


def test_cache_file_is_written_atomically(tmp_path):
    store = VoiceStore(tmp_path, max_voices=5)
    v = store.create(_clip(), SR, "x")
    store.write_cache_file(v.voice_id, "cosyvoice2", lambda p: p.write_bytes(b"npz"))
    assert store.cache_path(v.voice_id, "cosyvoice2").read_bytes() == b"npz"
    assert not [p for p in (tmp_path / v.voice_id).iterdir() if p.name.startswith(TMP_PREFIX)]


def test_rate_limiter_token_bucket():
    now = [0.0]
    rl = RateLimiter(per_minute=3, clock=lambda: now[0])
    assert [rl.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = rl.take("a")
    assert wait == pytest.approx(20.0)  # one token every 20 s
    assert rl.take("b") == 0.0          # per client
    now[0] += 20.0
    assert rl.take("a") == 0.0
    assert RateLimiter(per_minute=0).take("a") == 0.0


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"text": "hi", "speed": 2.5}, 400, "'speed'"),
        ({"text": "hi", "pitch": -13}, 400, "-12 to 12"),
        ({"text": "hi", "energy": "loud"}, 400, "'energy'"),
        ({"text": "hi", "language": "fr"}, 400, "zh, en, ja, yue, ko"),
        ({"text": "hi", "format": "mp3"}, 400, "wav, pcm"),
        ({"text": "hi", "sample_rate": 4000}, 400, "8000 to 48000"),
        ({"text": "hi", "volume": 1}, 400, "'volume'"),
        ({"text": "hi", "streaming": "yes"}, 400, "'streaming'"),
        ({"text": ""}, 400, "'text'"),
        ({"text": "x" * 2001}, 413, "limit is 2000"),
        ({"text": "hi", "voice": "v", "speaker_wav": "AAAA"}, 400, "not both"),
    ],
)
def test_parse_params_names_the_field(body, status, needle):
    with pytest.raises(TTSError) as err:
        parse_params(body, Config())
    assert err.value.status == status
    assert needle in err.value.detail


def test_parse_params_defaults():
    p = parse_params({"text": "hi"}, Config())
    assert (p.speed, p.pitch, p.energy, p.streaming, p.format, p.sample_rate) == (1.0, 0.0, 1.0, False, None, None)


def test_tags_and_sentences():
    assert split_leading_tag("[cheerful] Hello!") == ("cheerful", "Hello!")
    assert split_leading_tag("【关心】你还好吗") == ("关心", "你还好吗")
    assert split_leading_tag("Hello [x]") == (None, "Hello [x]")
    assert split_sentences("Hi. This is one sentence. And here is another one!") == [
        "Hi. This is one sentence.", "And here is another one!"]
    assert split_sentences("今天北京晴转多云，最高气温十八度。明天有小雨，出门请记得带伞。") == [
        "今天北京晴转多云，最高气温十八度。", "明天有小雨，出门请记得带伞。"]
