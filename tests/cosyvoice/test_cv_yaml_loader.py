"""Yaml reading (nothing executed) and model-directory errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cv_fixtures import need_fixtures

from assistant.tts.cosyvoice.loader import ModelDirError, load_model_dir, load_speech_lm, verify_model_dir
from assistant.tts.cosyvoice.yaml_config import YamlConfigError, read_model_yaml, read_model_yaml_text

FULL_LIKE = """
__set_seed1: !apply:random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
sample_rate: 24000
llm_input_size: 896
qwen_pretrain_path: ''
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1
llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_input_size>
    speech_token_size: 6561
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                inference_cfg_rate: 0.7
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            channels: [256]
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
allowed_special: 'all'
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>/CosyVoice-BlankEN
    skip_special_tokens: True
"""


def test_full_like_yaml() -> None:
    raw = read_model_yaml_text(FULL_LIKE, overrides={"qwen_pretrain_path": "/m"})
    assert not any(k.startswith("__set_seed") for k in raw)
    llm = raw["llm"]
    assert llm["__class__"] == "cosyvoice.llm.llm.Qwen2LM" and llm["llm_output_size"] == 896
    assert llm["llm"] == {"__class__": "cosyvoice.llm.llm.Qwen2Encoder", "pretrain_path": "/m"}
    assert llm["sampling"]["__partial__"] is True and llm["sampling"]["top_k"] == 25
    dec = raw["flow"]["decoder"]
    assert dec["cfm_params"] == {"sigma_min": 1e-06, "inference_cfg_rate": 0.7}
    assert dec["estimator"]["static_chunk_size"] == 50
    assert dec["estimator"]["num_decoding_left_chunks"] == -1
    assert raw["get_tokenizer"]["token_path"] == "/m/CosyVoice-BlankEN"


def test_tiny_yaml() -> None:
    raw = read_model_yaml(need_fixtures() / "cosyvoice2.yaml")
    assert raw["llm"]["speech_token_size"] == 6561 and raw["llm"]["llm_input_size"] == 64
    assert raw["flow"]["decoder"]["estimator"]["static_chunk_size"] == 50
    assert raw["flow"]["decoder"]["cfm_params"]["sigma_min"] == 1e-6
    assert raw["hift"]["f0_predictor"]["__class__"].endswith("ConvRNNF0Predictor")
    assert raw["hift"]["sampling_rate"] == 24000


def test_yaml_errors() -> None:
    with pytest.raises(YamlConfigError, match="no such key"):
        read_model_yaml_text("a: !ref <b>\n")
    with pytest.raises(YamlConfigError, match="unsupported expression"):
        read_model_yaml_text("a: 1\nb: !ref __import__('os') + <a>\n")


def _copy_tiny(tmp_path: Path) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(need_fixtures(), dest, ignore=shutil.ignore_patterns("golden.pt"))
    return dest


def test_missing_file(tmp_path: Path) -> None:
    d = _copy_tiny(tmp_path)
    (d / "llm.pt").unlink()
    with pytest.raises(ModelDirError, match=r"missing llm\.pt"):
        load_speech_lm(d)
    with pytest.raises(ModelDirError, match="not found"):
        load_speech_lm(tmp_path / "nowhere")


def test_wrong_shape_and_keys(tmp_path: Path) -> None:
    d = _copy_tiny(tmp_path)
    sd = torch.load(d / "llm.pt", weights_only=True)
    sd["llm_decoder.weight"] = torch.zeros(10, 64)
    sd["extra.weight"] = torch.zeros(1)
    del sd["speech_embedding.weight"]
    torch.save(sd, d / "llm.pt")
    with pytest.raises(ModelDirError) as info:
        load_speech_lm(d)
    msg = str(info.value)
    assert "llm.pt" in msg and "llm_decoder.weight: file [10, 64], model [6564, 64]" in msg
    assert "missing keys (speech_embedding.weight)" in msg and "unexpected keys (extra.weight)" in msg


def test_truncated_file(tmp_path: Path) -> None:
    d = _copy_tiny(tmp_path)
    data = (d / "llm.pt").read_bytes()
    (d / "llm.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelDirError, match=r"llm\.pt: cannot be read .*truncated or corrupt"):
        load_speech_lm(d)


def test_full_load_and_verify(tmp_path: Path) -> None:
    d = need_fixtures()
    verify_model_dir(d)
    loaded = load_model_dir(d, "cpu", "float32")
    assert not loaded.can_clone and any("campplus.onnx" in n for n in loaded.notes)
    assert loaded.tokenizer_dir is None
    bad = _copy_tiny(tmp_path)
    sd = torch.load(bad / "hift.pt", weights_only=True)
    sd.pop(next(iter(sd)))
    torch.save(sd, bad / "hift.pt")
    with pytest.raises(ModelDirError, match=r"hift\.pt: .*missing keys"):
        verify_model_dir(bad)


def test_models_verify_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from assistant.cli import main

    assert main(["models", "verify", str(need_fixtures())]) == 0
    assert main(["models", "verify", str(tmp_path)]) == 1
    assert "missing cosyvoice2.yaml" in capsys.readouterr().err
