"""Prompt features (mel, whisper mel, kaldi fbank), ONNX voice encoding and the voice store."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from assistant.tts.cosyvoice.prompt_features import (
    kaldi_fbank,
    prompt_mel,
    slaney_mel_filterbank,
    speaker_fbank,
    whisper_log_mel,
)
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, PromptStore, VoiceCloningUnavailable, VoiceEncoder
from tests import needs


def _tone(sr: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * hz * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def test_prompt_mel_frames_and_peak() -> None:
    a = _tone(24000, 1.0, 1000.0)
    mel = prompt_mel(a)
    assert mel.shape == (24000 // 480, 80)
    fb = slaney_mel_filterbank(24000, 1920, 80, 0.0, 8000.0)
    assert int(mel.mean(0).argmax()) == int(fb[:, round(1000 / 12.5)].argmax())  # the 1 kHz bin lights up
    # independent reference: direct DFT of one reflect-padded frame
    y = np.pad(a.astype(np.float64), 720, mode="reflect")
    frame = y[480 * 7 : 480 * 7 + 1920] * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1920) / 1920))
    mag = np.sqrt(np.abs(np.fft.rfft(frame)) ** 2 + 1e-9)
    ref = np.log(np.maximum(fb.astype(np.float64) @ mag, 1e-5))
    np.testing.assert_allclose(mel[7].numpy(), ref, atol=1e-3)


def test_slaney_filterbank_properties() -> None:
    fb = slaney_mel_filterbank(16000, 400, 128, 0.0, 8000.0)
    assert fb.shape == (128, 201) and (fb >= 0).all()
    peaks = fb.argmax(1)
    assert (np.diff(peaks) >= 0).all()  # centres rise with the bin index


def test_whisper_mel_shape_and_range() -> None:
    a = _tone(16000, 2.0)
    m = whisper_log_mel(a)
    assert m.shape == (128, 2 * 16000 // 160)
    assert float(m.max() - m.min()) <= 2.0 + 1e-6  # 8 (log10) dynamic range, divided by 4


def _naive_fbank(x: np.ndarray) -> np.ndarray:
    """Kaldi fbank written loop by loop from its definition, float64."""
    def mel(f: float) -> float:
        return 1127.0 * math.log(1 + f / 700.0)
    out = []
    lo, hi = mel(20.0), mel(8000.0)
    d = (hi - lo) / 81
    for s in range(0, len(x) - 400 + 1, 160):
        fr = x[s : s + 400].astype(np.float64)
        fr = fr - fr.mean()
        fr = np.concatenate([[fr[0] - 0.97 * fr[0]], fr[1:] - 0.97 * fr[:-1]])
        fr = fr * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 399)) ** 0.85
        p = np.abs(np.fft.rfft(fr, 512)) ** 2
        row = []
        for b in range(80):
            left, c, right = lo + b * d, lo + (b + 1) * d, lo + (b + 2) * d
            e = 0.0
            for k in range(256):
                m = mel(k * 16000 / 512)
                if left < m < right:
                    e += p[k] * ((m - left) / (c - left) if m <= c else (right - m) / (right - c))
            row.append(math.log(max(e, np.finfo(np.float32).eps)))
        out.append(row)
    return np.array(out)


def test_kaldi_fbank_matches_definition() -> None:
    a = _tone(16000, 0.05)
    f = kaldi_fbank(a)
    assert f.shape == (1 + (800 - 400) // 160, 80)
    np.testing.assert_allclose(f.numpy(), _naive_fbank(a), atol=2e-3)
    s = speaker_fbank(_tone(16000, 0.5))
    assert torch.allclose(s.mean(0), torch.zeros(80), atol=1e-4)


def _onnx_models(tmp: Path) -> tuple[Path, Path]:
    onnx = needs.module("onnx")
    from onnx import TensorProto, helper

    # speaker model stand-in: mean over time of the fbank, tiled to 192 dims → [1, 192]
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["feat"], ["m"], axes=[1], keepdims=0),
         helper.make_node("Tile", ["m", "reps"], ["emb"])],
        "campplus", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, None])],
        [helper.make_tensor("reps", TensorProto.INT64, [2], [1, 3])],
    )
    camp = tmp / "campplus.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), camp)
    # tokenizer stand-in: one token per 4 whisper frames (25 Hz): argmax of 4-frame-pooled mel bins
    g = helper.make_graph(
        [helper.make_node("MaxPool", ["feat"], ["pooled"], kernel_shape=[4], strides=[4]),
         helper.make_node("ArgMax", ["pooled"], ["tok"], axis=1, keepdims=0),
         helper.make_node("Cast", ["len"], ["len_"], to=TensorProto.INT64)],
        "tokenizer",
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 128, None]),
         helper.make_tensor_value_info("len", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("tok", TensorProto.INT64, [1, None])],
    )
    tok = tmp / "speech_tokenizer_v2.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), tok)
    return camp, tok


def test_voice_encoder_with_stand_in_onnx(tmp_path: Path) -> None:
    camp, tok = _onnx_models(tmp_path)
    enc = VoiceEncoder(camp, tok)
    assert enc.available
    audio = _tone(44100, 1.0)  # any rate in
    p = enc.encode("v1", audio, 44100, "hello")
    assert p.speech_tokens.dtype == torch.int32 and p.speech_tokens.shape == (1, 25)
    assert p.speech_feat.shape == (1, 50, 80)
    assert p.embedding.shape == (1, 240)  # the stand-in tiles 80 → 240
    with pytest.raises(VoiceCloningUnavailable):
        VoiceEncoder(None, None).encode("x", audio, 44100)


def test_voice_store_roundtrip(tmp_path: Path) -> None:
    p = CosyVoicePrompt("alice", "hi there", torch.arange(5, dtype=torch.int32)[None],
                        torch.randn(1, 10, 80), torch.randn(1, 192), torch.tensor([[1, 2]]))
    store = PromptStore(tmp_path)
    store.put(p)
    fresh = PromptStore(tmp_path)
    q = fresh.get("alice")
    assert q is not None and q.prompt_text == "hi there" and fresh.ids() == ["alice"]
    assert torch.equal(q.speech_tokens, p.speech_tokens) and torch.equal(q.speech_feat, p.speech_feat)
    assert torch.equal(q.prompt_text_tokens, p.prompt_text_tokens)
    with pytest.raises(ValueError):
        store.get("../etc")


def test_resample_without_soxr_matches_soxr(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine has no soxr: prompts are resampled by scipy instead, to the same signal."""
    from assistant.tts.cosyvoice.prompt_features import resample

    t = np.arange(48000) / 48000
    x = (0.5 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 3100 * t)).astype(np.float32)
    with_soxr = resample(x, 48000, 16000)
    monkeypatch.setitem(sys.modules, "soxr", None)
    without = resample(x, 48000, 16000)
    assert without.dtype == np.float32 and without.shape == with_soxr.shape
    inner = slice(200, -200)  # edges: the two filters start and stop differently
    assert np.abs(without[inner] - with_soxr[inner]).max() < 1e-3  # 1.3e-4 here, on a 0.7 peak
