"""Registered voices on the real CosyVoice2 engine (tiny random-weight model, stand-in ONNX voice encoders):
after a restart the engine loads the prompt it cached instead of recomputing it, and a deleted voice leaves
the engine's memory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from assistant.audio import write_wav_bytes
from assistant.config import Config
from tests import needs
from tests.conftest import serve, tts_only_services
from tests.cosyvoice.test_cv_voice import _onnx_models
from tests.test_cosyvoice_voice_chat import tiny_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def speaker_stand_in(path: Path) -> None:
    """campplus stand-in with the tiny model's 192-dim embedding: mean fbank, tiled, cut to 192."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["feat"], ["m"], axes=[1], keepdims=0),
         helper.make_node("Tile", ["m", "reps"], ["t"]),
         helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["emb"])],
        "campplus", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 192])],
        [helper.make_tensor("reps", TensorProto.INT64, [2], [1, 3]),
         helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
         helper.make_tensor("ends", TensorProto.INT64, [1], [192]),
         helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), path)


def engine_for(model_dir: Path) -> Any:  # the CosyVoice engine (torch), imported here
    from assistant.config import TTSConfig
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    return CosyVoiceEngine(TTSConfig(engine="cosyvoice2", model_dir=str(model_dir), device="cpu", dtype="float32",
                                     max_concurrent=1, cuda_graphs=False))


def clip_wav() -> bytes:
    sr = 16000
    t = np.arange(3 * sr) / sr
    return write_wav_bytes((0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)))
                           .astype(np.float32), sr)


async def test_cached_voice_is_loaded_after_a_restart_and_forgotten_on_delete(tmp_path, monkeypatch):
    needs.module("onnx")
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt, VoiceEncoder

    model_dir = tiny_model_dir(tmp_path)
    _, tokenizer = _onnx_models(tmp_path)
    shutil.copy(tokenizer, model_dir / "speech_tokenizer_v2.onnx")
    speaker_stand_in(model_dir / "campplus.onnx")
    cfg = Config()
    cfg.server.data_dir = str(tmp_path / "data")
    cfg.tts.timeout_s = 120.0
    encoded: list[str] = []
    original = VoiceEncoder.encode

    def counting(self: VoiceEncoder, voice_id: str, *args: object, **kw: object) -> CosyVoicePrompt:
        encoded.append(voice_id)
        return original(self, voice_id, *args, **kw)

    monkeypatch.setattr(VoiceEncoder, "encode", counting)

    first = engine_for(model_dir)
    async with serve(cfg, tts_only_services(cfg, first)) as (base, _), aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("clip", clip_wav(), filename="me.wav", content_type="audio/wav")
        form.add_field("transcript", "hello there")
        form.add_field("name", "Me")
        async with http.post(f"{base}/api/voices", data=form) as r:
            assert r.status == 201, await r.text()
            voice = await r.json()
    await first.close()
    vid = voice["voice_id"]
    assert voice["cloning"] is True and encoded == [vid]
    cache = Path(cfg.server.data_dir) / "voices" / vid / "cache-cosyvoice2.npz"
    saved = CosyVoicePrompt.load(cache)

    restarted = engine_for(model_dir)
    async with serve(cfg, tts_only_services(cfg, restarted)) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/api/tts", json={"text": "Hi.", "voice": "Me", "format": "pcm"}) as r:
            assert r.status == 200, await r.text()
            assert len(await r.read()) > 0
        assert encoded == [vid]  # nothing recomputed: the cached prompt was loaded
        held = restarted._model.voices.get(vid)
        assert held is not None
        for name in ("speech_tokens", "speech_feat", "embedding"):
            assert np.array_equal(getattr(held, name).numpy(), getattr(saved, name).numpy()), name
        async with http.delete(f"{base}/api/voices/{vid}") as r:
            assert r.status == 200
        assert restarted._model.voices.get(vid) is None  # the engine forgot the deleted voice
        async with http.post(f"{base}/api/tts", json={"text": "Hi.", "voice": vid}) as r:
            assert r.status == 400 and (await r.json())["error"] == "unknown_voice"
    await restarted.close()
