"""Voice store (atomic, persistent, ids never from clients) and the service's pure helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from assistant.config import Config
from assistant.server.limits import RateLimiter
from assistant.server.tts_api.request import TTSError, parse_params
from assistant.server.tts_api.service import split_leading_tag, split_sentences
from assistant.tts.voice_store import TMP_PREFIX, ReferenceClipStore, VoiceLimitError, valid_voice_id

SR = 16000


def _clip(seconds: float = 3.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_create_list_get_and_reload(tmp_path):
    store = ReferenceClipStore(tmp_path, max_voices=5)
    v = store.create(_clip(), SR, "hello there", name="Ann")
    assert valid_voice_id(v.voice_id)
    assert v.name == "Ann" and v.duration_s == pytest.approx(3.0)
    folder = tmp_path / v.voice_id
    assert sorted(p.name for p in folder.iterdir()) == ["clip.wav", "meta.json"]
    assert json.loads((folder / "meta.json").read_text())["transcript"] == "hello there"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]

    again = ReferenceClipStore(tmp_path, max_voices=5)  # a restart
    assert [x.voice_id for x in again.list()] == [v.voice_id]
    clip = again.load_clip(v.voice_id)
    assert clip.sample_rate == SR and clip.text == "hello there"
    assert np.max(np.abs(clip.audio - _clip())) < 1e-3


def test_cap_and_delete(tmp_path):
    store = ReferenceClipStore(tmp_path, max_voices=2)
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
    store = ReferenceClipStore(tmp_path / "voices", max_voices=5)
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
    store = ReferenceClipStore(tmp_path, max_voices=5)

    def broken(voice_id, folder):
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.create(_clip(), SR, "x", write_cache=broken)
    assert list(tmp_path.iterdir()) == [] and store.list() == []
    (tmp_path / f"{TMP_PREFIX}0123456789abcdef").mkdir()  # an interrupted write from a crash
    (tmp_path / "0123456789abcdef").mkdir()                # a folder without meta: skipped
    assert ReferenceClipStore(tmp_path, max_voices=5).list() == []
    assert not (tmp_path / f"{TMP_PREFIX}0123456789abcdef").exists()


def test_cache_file_is_written_atomically(tmp_path):
    store = ReferenceClipStore(tmp_path, max_voices=5)
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
        ({"text": "hi", "speed": 4.5}, 400, "'speed': 4.5 is out of range; allowed 0.25 to 4"),
        ({"text": "hi", "speed": True}, 400, "'speed'"),
        ({"text": "hi", "pitch": -13}, 400, "-12 to 12"),
        ({"text": "hi", "energy": "loud"}, 400, "'energy'"),
        ({"text": "hi", "language": "jp"}, 400, "did you mean 'ja'"),
        ({"text": "hi", "format": "mp3"}, 400, "wav, pcm"),
        ({"text": "hi", "sample_rate": 4000}, 400, "8000 to 48000"),
        ({"text": "hi", "volume": 1}, 400, "'volume'"),
        ({"text": "hi", "streaming": "yes"}, 400, "'streaming'"),
        ({"text": ""}, 400, "'text'"),
        ({"text": "x" * 2001}, 413, "limit is 2000"),
        ({"text": "hi", "voice": "v", "speaker_wav": "AAAA"}, 400, "not both"),
        ({"text": "hi", "vocoder": 3}, 400, "'vocoder': must be a string"),
        ({"text": "hi", "voice": "v" * 256}, 413, "'voice' is 256 characters"),
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
    assert parse_params({"text": "hi", "vocoder": " HiFiGAN "}, Config()).vocoder == "hifigan"


def test_one_table_drives_parser_field_list_and_schema():
    """Every field of the table is accepted by the parser, named in the unknown-field error and in the schema,
    with the same range: one source for each."""
    from dataclasses import fields

    from assistant.server.openapi import build_openapi
    from assistant.server.tts_api.request import STRETCH_RANGE, SynthesisParams, specs

    cfg = Config()
    table = specs(SynthesisParams)
    assert list(table) == [f.name for f in fields(SynthesisParams)]
    doc = build_openapi(cfg)["components"]["schemas"]
    assert list(doc["TTSRequest"]["properties"]) == list(table)
    assert set(doc["WSRequest"]["properties"]) == set(table) | {"metadata", "keep_open"}
    with pytest.raises(TTSError) as err:
        parse_params({"text": "hi", "nope": 1}, cfg)
    assert all(name in err.value.detail for name in table)
    for name in ("speed",):
        s = doc["TTSRequest"]["properties"][name]
        assert (s["minimum"], s["maximum"]) == STRETCH_RANGE == (0.25, 4.0)
        assert doc["SpeechRequest"]["properties"][name]["maximum"] == STRETCH_RANGE[1]
        parse_params({"text": "hi", name: STRETCH_RANGE[0]}, cfg)
        parse_params({"text": "hi", name: STRETCH_RANGE[1]}, cfg)
    from assistant.tts import base, effects, threaded

    assert effects.STRETCH_RANGE is base.STRETCH_RANGE and threaded.SPEED_RANGE is base.SPEED_RANGE


def test_voice_folder_stays_inside(tmp_path):
    """File names resolve only inside the voices folder: no '..', no absolute path, no symlink leading out."""
    from assistant.server.tts_api.voice_lookup import VoiceFolder

    root = tmp_path / "voices"
    (root / "sub").mkdir(parents=True)
    (root / "ref.wav").write_bytes(b"RIFF")
    (root / "sub" / "deep.wav").write_bytes(b"RIFF")
    (root / "ref.txt").write_text("what the clip says\n", encoding="utf-8")
    outside = tmp_path / "secret.wav"
    outside.write_bytes(b"RIFF")
    (root / "link.wav").symlink_to(outside)
    (root / "inside-link.wav").symlink_to(root / "ref.wav")
    folder = VoiceFolder(root)
    assert folder.find("ref.wav", "speaker_wav") == (root / "ref.wav").resolve()
    assert folder.find("sub/deep.wav", "speaker_wav") == (root / "sub" / "deep.wav").resolve()
    assert folder.find("inside-link.wav", "speaker_wav") == (root / "ref.wav").resolve()
    assert folder.find("missing.wav", "speaker_wav") is None
    assert folder.find("notes.txt", "speaker_wav") is None           # not audio: never a clip
    for bad, needle in [("../secret.wav", "'..'"), (str(outside), "absolute"), ("link.wav", "outside"),
                        ("sub/../../secret.wav", "'..'"), ("~/x.wav", "absolute")]:
        with pytest.raises(TTSError) as err:
            folder.find(bad, "speaker_wav")
        assert err.value.status == 400 and needle in err.value.detail, bad
    assert folder.names() == ["inside-link.wav", "ref.wav", "sub/deep.wav"]
    assert folder.transcript(root / "ref.wav") == "what the clip says"
    assert VoiceFolder(tmp_path / "none").names() == []


def test_tags_and_sentences():
    assert split_leading_tag("[cheerful] Hello!") == ("cheerful", "Hello!")
    assert split_leading_tag("【关心】你还好吗") == ("关心", "你还好吗")
    assert split_leading_tag("Hello [x]") == (None, "Hello [x]")
    assert split_sentences("Hi. This is one sentence. And here is another one!") == [
        "Hi. This is one sentence.", "And here is another one!"]
    assert split_sentences("今天北京晴转多云，最高气温十八度。明天有小雨，出门请记得带伞。") == [
        "今天北京晴转多云，最高气温十八度。", "明天有小雨，出门请记得带伞。"]


def test_docs_describe_every_request_field():
    """docs/tts_api.md names every field of the request table, the WebSocket opt-ins and the OpenAI fields."""
    from pathlib import Path

    from assistant.server.tts_api.request import SpeechParams, SynthesisParams, WSOptions, specs

    doc = (Path(__file__).resolve().parents[1] / "docs" / "tts_api.md").read_text(encoding="utf-8")
    for cls in (SynthesisParams, WSOptions, SpeechParams):
        for name in specs(cls):
            assert f"| `{name}` |" in doc, (cls.__name__, name)
    for needle in ("X-Sample-Rate", "4000 + the HTTP status", "speech.audio.delta", "models pull piper:"):
        assert needle in doc, needle
