"""Speech LLM: full-size key/shape layout, and parity with the reference on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from cv_fixtures import need_fixture, need_fixtures

from assistant.tts.cosyvoice.llm import (
    QWEN2_05B_CONFIG,
    GreedySampler,
    RasSampler,
    SpeechLMConfig,
    build_speech_lm,
    logp_difference,
    qwen_config_from_dict,
)
from assistant.tts.cosyvoice.loader import load_speech_lm

ATOL = 1e-4


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return torch.load(need_fixtures() / "golden.pt", weights_only=True)


@pytest.fixture(scope="module")
def tiny_llm():
    torch.set_num_threads(1)
    return load_speech_lm(need_fixtures(), "cpu", "float32")


def _inputs(g: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"]


def test_full_size_keys_and_shapes_on_meta() -> None:
    path = need_fixture("full_size_keys/llm.json")
    ref = json.loads(path.read_text())["keys"]
    model = build_speech_lm(SpeechLMConfig(), qwen_config_from_dict(QWEN2_05B_CONFIG), "meta")
    sd = model.state_dict()
    assert set(sd) == set(ref)
    wrong = {k: (list(sd[k].shape), ref[k][0]) for k in ref if list(sd[k].shape) != ref[k][0]}
    assert not wrong


def test_lm_input_and_teacher_forced(tiny_llm, golden) -> None:
    x = tiny_llm.build_lm_input(*_inputs(golden))
    torch.testing.assert_close(x, golden["llm.lm_input"], atol=ATOL, rtol=0)
    hidden = tiny_llm.forward_hidden(x)
    torch.testing.assert_close(hidden, golden["llm.tf_hidden"], atol=ATOL, rtol=0)
    logp = tiny_llm.forward_logp(x)
    torch.testing.assert_close(logp, golden["llm.tf_logp"], atol=ATOL, rtol=0)
    torch.testing.assert_close(logp[0, -1], golden["llm.first_step_logp"], atol=ATOL, rtol=0)


def test_greedy_decode_matches(tiny_llm, golden) -> None:
    steps: list[torch.Tensor] = []
    tokens = list(tiny_llm.generate(
        *_inputs(golden), sampler=GreedySampler(), max_len=40, on_logp=lambda i, lp: steps.append(lp.clone())
    ))
    assert tokens == golden["llm.greedy_tokens"].tolist()
    logp = torch.stack(steps)
    torch.testing.assert_close(logp, golden["llm.greedy_logp"], atol=ATOL, rtol=0)
    # teacher-forced without cache over prompt + 39 tokens agrees with the cached steps
    x = torch.cat([tiny_llm.build_lm_input(*_inputs(golden)),
                   tiny_llm.speech_embedding(torch.tensor([tokens[:39]]))], dim=1)
    tf = tiny_llm.forward_logp(x)[:, -40:]
    torch.testing.assert_close(tf, golden["llm.tf_full_logp_last40"], atol=ATOL, rtol=0)


def test_e2e_tokens(tiny_llm, golden) -> None:
    """Section d: text = e2e text, zero-shot prompt (prompt text + prompt speech); max_len = 20 * 5."""
    _, prompt_text, prompt_speech = _inputs(golden)
    tokens = tiny_llm.tokens(golden["in.e2e_text_token"], prompt_text, prompt_speech, greedy=True)
    assert len(tokens) == 100
    assert tokens == golden["e2e.speech_tokens"].tolist()


def test_eos_masked_before_min_len(tiny_llm, golden) -> None:
    text, prompt_text, prompt_speech = _inputs(golden)
    eos = tiny_llm.cfg.eos_id

    class EosLover:
        def __call__(self, logp: torch.Tensor, decoded: list[int]) -> int:
            return eos if torch.isfinite(logp[eos]) else int(torch.argmax(logp))

    tokens = list(tiny_llm.generate(text, prompt_text, prompt_speech, sampler=EosLover()))
    assert len(tokens) == tiny_llm.length_limits(text.numel())[0] == 2 * 12


def test_bf16_difference_reported(golden) -> None:
    llm = load_speech_lm(need_fixtures(), "cpu", "bfloat16")
    x = llm.build_lm_input(*_inputs(golden))
    logp = llm.forward_logp(x)
    abs_err, rel_err = logp_difference(logp, golden["llm.tf_logp"])
    print(f"bf16 teacher-forced logp vs fp32 golden: max abs {abs_err:.4g}, rel {rel_err:.4g}")
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()
    assert llm.llm.model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_ras_sampler_seeded_and_anti_repetition() -> None:
    logp = torch.log_softmax(torch.tensor([5.0, 4.0, 0.0, -1.0, -2.0]), dim=0)
    a = [RasSampler(generator=torch.Generator().manual_seed(3))(logp, []) for _ in range(1)]
    b = [RasSampler(generator=torch.Generator().manual_seed(3))(logp, []) for _ in range(1)]
    assert a == b
    # top-p 0.8: only ids 0 and 1 can come out of the nucleus (0 holds ~0.72 < 0.8, then 1)
    s = RasSampler(generator=torch.Generator().manual_seed(0))
    assert {s.nucleus(logp) for _ in range(200)} <= {0, 1}
    # a token seen once in the last 10 is banned for the redraw (win 10 * tau 0.1 = 1)
    sharp = torch.log_softmax(torch.tensor([50.0, 0.0, 0.0]), dim=0)
    s = RasSampler(generator=torch.Generator().manual_seed(0))
    assert all(s(sharp, [0]) != 0 for _ in range(20))
    assert s(sharp, [1, 2]) == 0
