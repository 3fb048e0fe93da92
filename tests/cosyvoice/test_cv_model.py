"""Whole-utterance synthesis on the tiny model, the engine protocol, and `models pull` without network."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from cv_fixtures import need_fixtures, synthesize_ids, tokens_to_audio

from assistant.config import TTSConfig
from assistant.tts.base import TTSEngine, TTSRequest
from assistant.tts.cosyvoice import pull as pull_mod
from assistant.tts.cosyvoice.pull import PullError, pull_cosyvoice2
from assistant.tts.cosyvoice.voice import CosyVoicePrompt


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2

    return CosyVoice2.from_dir(need_fixtures(), "cpu", "float32")


def _voice(g: dict[str, torch.Tensor]) -> CosyVoicePrompt:
    return CosyVoicePrompt("p", "", g["in.prompt_speech_token"], g["in.prompt_feat"], g["in.embedding"])


def test_synthesize_ids_and_speed(model) -> None:
    g = torch.load(need_fixtures() / "golden.pt", weights_only=True)
    voice = _voice(g)
    tokens, audio = synthesize_ids(model, g["in.e2e_text_token"], voice, g["in.prompt_text_token"], greedy=True)
    assert tokens == g["e2e.speech_tokens"].tolist()
    assert audio.dtype == np.float32 and audio.shape == (100 * 2 * 480,)
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 0.99 + 1e-6
    fast = tokens_to_audio(model, tokens, voice, speed=2.0)
    assert fast.shape == (100 * 480,)
    _, sampled_a = synthesize_ids(model, g["in.e2e_text_token"], voice, g["in.prompt_text_token"], seed=5)
    assert sampled_a.size > 0


def test_engine_protocol(model) -> None:
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    engine = CosyVoiceEngine(TTSConfig(engine="cosyvoice2", model_dir=str(need_fixtures())))
    assert isinstance(engine, TTSEngine)
    assert engine.capabilities.native_speed and not engine.capabilities.native_pitch
    assert engine.capabilities.languages == ("zh", "en", "ja", "yue", "ko")

    async def run() -> None:
        m = await engine.model()
        assert not m.voice_encoder.available  # the tiny fixture has no ONNX files
        await engine.close()

    asyncio.run(run())
    _ = TTSRequest(text="x")


def test_pull_verifies_and_reports_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = need_fixtures()

    def offline(repo: str, dest: Path, source: str) -> None:
        raise ConnectionError("Failed to establish a new connection: [Errno -3] name resolution")

    monkeypatch.setattr(pull_mod, "_download", offline)
    with pytest.raises(PullError, match="no network"):
        pull_cosyvoice2(tmp_path / "m")

    def copy_tiny(repo: str, dest: Path, source: str) -> None:
        import shutil

        assert repo == "FunAudioLLM/CosyVoice2-0.5B"
        shutil.copytree(tiny, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("golden.pt"))

    monkeypatch.setattr(pull_mod, "_download", copy_tiny)
    assert pull_cosyvoice2(tmp_path / "ok") == tmp_path / "ok"

    def broken(repo: str, dest: Path, source: str) -> None:
        copy_tiny(repo, dest, source)
        (dest / "flow.pt").write_bytes(b"not a checkpoint")

    monkeypatch.setattr(pull_mod, "_download", broken)
    with pytest.raises(PullError, match=r"flow\.pt"):
        pull_cosyvoice2(tmp_path / "bad")
    with pytest.raises(PullError, match="unknown source"):
        pull_cosyvoice2(tmp_path / "x", source="ftp")
