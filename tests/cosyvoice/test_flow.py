"""Parity of our CosyVoice2 flow (assistant.tts.cosyvoice.flow) with the reference implementation.

Goldens: ../shared/fixtures/cosyvoice2/tiny (see its README): a tiny random-weight model and the
reference's intermediates for a non-streaming call and the first streaming chunk.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from cv_fixtures import FIXTURES, TINY, need_fixture, report

from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig, StreamingFlow, fixed_noise


@pytest.fixture(autouse=True)
def _tiny_flow() -> None:
    need_fixture("tiny/flow.pt")

MEL_ATOL = 1e-4


class _Ref(str):
    """A `!ref` expression, resolved after loading."""


def _tagged_loader() -> type[yaml.SafeLoader]:
    """SafeLoader that turns hyperpyyaml tags into plain dicts (what the project's yaml reader returns)."""

    class Loader(yaml.SafeLoader):
        pass

    def new(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        value = loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode) else {}
        out = {"__class__": suffix, **value}
        if suffix == "omegaconf.DictConfig":
            return value.get("content", value)
        return out

    def name(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        return {**new(loader, suffix, node), "__partial__": True}

    def apply(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        return None

    Loader.add_multi_constructor("!new:", new)
    Loader.add_multi_constructor("!name:", name)
    Loader.add_multi_constructor("!apply:", apply)
    Loader.add_constructor("!ref", lambda loader, node: _Ref(loader.construct_scalar(node)))
    return Loader


def read_tiny_yaml(path: Path) -> dict[str, Any]:
    raw = yaml.load(path.read_text(), Loader=_tagged_loader())

    def resolve(v: Any) -> Any:
        if isinstance(v, _Ref):
            expr = re.sub(r"<(\w+)>", lambda m: repr(raw[m.group(1)]), v)
            return eval(expr, {"__builtins__": {}})  # only literals and * from the fixture yaml
        if isinstance(v, dict):
            return {k: resolve(x) for k, x in v.items()}
        if isinstance(v, list):
            return [resolve(x) for x in v]
        return v

    return resolve(raw)


@pytest.fixture(scope="module")
def flow() -> CausalFlow:
    cfg = FlowConfig.from_yaml(read_tiny_yaml(TINY / "cosyvoice2.yaml")["flow"])
    model = CausalFlow(cfg).eval()
    model.load_state_dict(torch.load(TINY / "flow.pt", weights_only=True), strict=True)
    return model


def test_full_size_keys_and_shapes():
    want = json.loads((FIXTURES / "full_size_keys/flow.json").read_text())["keys"]
    with torch.device("meta"):
        model = CausalFlow(FlowConfig())
    got = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(want)
    assert got == {k: [list(s), d] for k, (s, d) in want.items()}


def test_tiny_config_from_yaml():
    cfg = FlowConfig.from_yaml(read_tiny_yaml(TINY / "cosyvoice2.yaml")["flow"])
    assert (cfg.input_size, cfg.encoder_output_size, cfg.encoder_heads, cfg.encoder_blocks) == (64, 64, 4, 2)
    assert (cfg.estimator_channels, cfg.n_blocks, cfg.num_mid_blocks, cfg.estimator_chunk_size) == (
        [64],
        1,
        2,
        50,
    )


def test_fixed_noise(golden):
    torch.testing.assert_close(fixed_noise()[:, :, :300], golden["flow.cfm_rand_noise_first300"], rtol=0, atol=0)


def _traced(flow: CausalFlow) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[Any]]:
    """Forward hooks that record what the reference's trace holds: the encoder's output, mu, the speaker
    projection, the estimator's inputs and output at step 0 and its t at every step."""
    trace: dict[str, torch.Tensor] = {}
    ts: list[torch.Tensor] = []

    def estimator(module, args, out):
        x, mask, mu, t, spks, cond = args[:6]
        if not ts:
            trace.update(est_step0_in_x=x, est_step0_in_mask=mask, est_step0_in_mu=mu, est_step0_in_t=t,
                         est_step0_in_spks=spks, est_step0_in_cond=cond, est_step0_out=out)
        ts.append(t[0])

    handles = [
        flow.encoder.register_forward_hook(lambda m, a, out: trace.update(encoder_out=out)),
        flow.encoder_proj.register_forward_hook(lambda m, a, out: trace.update(mu=out)),
        flow.spk_embed_affine_layer.register_forward_hook(lambda m, a, out: trace.update(spk_proj=out)),
        flow.decoder.estimator.register_forward_hook(estimator),
    ]
    return trace, ts, handles


def _run(flow: CausalFlow, golden, n_new: int, streaming: bool, finalize: bool):
    trace, ts, handles = _traced(flow)
    try:
        mel = _infer(flow, golden, n_new, streaming, finalize)
    finally:
        for h in handles:
            h.remove()
    trace["est_t_all"] = torch.stack(ts)
    trace["mel"] = mel
    return trace


def _infer(flow: CausalFlow, golden, n_new: int, streaming: bool, finalize: bool) -> torch.Tensor:
    return flow.inference(
        token=golden["in.flow_token"][:, :n_new],
        token_len=torch.tensor([n_new], dtype=torch.int32),
        prompt_token=golden["in.prompt_speech_token"],
        prompt_token_len=torch.tensor([golden["in.prompt_speech_token"].shape[1]], dtype=torch.int32),
        prompt_feat=golden["in.prompt_feat"],
        prompt_feat_len=torch.tensor([golden["in.prompt_feat"].shape[1]], dtype=torch.int32),
        embedding=golden["in.embedding"],
        streaming=streaming,
        finalize=finalize,
    )


TRACED = [
    "encoder_out",
    "mu",
    "spk_proj",
    "est_step0_in_x",
    "est_step0_in_mask",
    "est_step0_in_mu",
    "est_step0_in_t",
    "est_step0_in_spks",
    "est_step0_in_cond",
    "est_step0_out",
    "est_t_all",
    "mel",
]


@pytest.mark.parametrize(
    ("prefix", "n_new", "streaming", "finalize"),
    [("flow_nonstream", 40, False, True), ("flow_stream_chunk1", 28, True, False)],
)
def test_flow_parity(flow, golden, prefix, n_new, streaming, finalize):
    trace = _run(flow, golden, n_new, streaming, finalize)
    worst = {}
    for name in TRACED:
        want = golden[f"{prefix}.{name}"]
        got = trace[name]
        assert got.shape == want.shape, name
        worst[name] = report(f"{prefix}.{name}", got, want)
    assert max(worst.values()) < MEL_ATOL, worst


def test_estimator_alone(flow, golden):
    """The estimator on the reference's own step-0 inputs (isolates it from the encoder)."""
    for prefix, streaming in [("flow_nonstream", False), ("flow_stream_chunk1", True)]:
        args = [golden[f"{prefix}.est_step0_in_{k}"] for k in ("x", "mask", "mu", "t", "spks", "cond")]
        with torch.inference_mode():
            out = flow.decoder.estimator(*args, streaming=streaming)
        assert report(f"{prefix}.estimator_alone", out, golden[f"{prefix}.est_step0_out"]) < MEL_ATOL


def test_bf16_difference(flow, golden):
    """fp32 vs bf16 mel on the tiny model: printed, only loosely bounded."""
    ref = _run(flow, golden, 40, False, True)["mel"]
    low = CausalFlow(flow.cfg).eval()
    low.load_state_dict(flow.state_dict())
    low = low.to(torch.bfloat16)
    mel = _run(low, golden, 40, False, True)["mel"]
    err = (mel - ref).abs()
    print(f"flow mel fp32 vs bf16: max abs {err.max():.3e}, mean abs {err.mean():.3e}, ref std {ref.std():.3f}")
    assert torch.isfinite(mel).all()


def _streamed(flow: CausalFlow, golden, pieces: list[int]) -> list[torch.Tensor]:
    state = StreamingFlow(flow, golden["in.prompt_speech_token"], golden["in.prompt_feat"], golden["in.embedding"])
    tokens = golden["in.flow_token"]
    out, at = [], 0
    for i, n in enumerate(pieces):
        out.append(state.push(tokens[:, at : at + n], finalize=i == len(pieces) - 1))
        at += n
    return out


def test_streaming_first_chunk_matches_reference(flow, golden):
    """25 prompt + 28 new tokens: the cached path emits the reference's first streaming chunk."""
    state = StreamingFlow(flow, golden["in.prompt_speech_token"], golden["in.prompt_feat"], golden["in.embedding"])
    mel = state.push(golden["in.flow_token"][:, :28])
    assert report("streaming_flow.chunk1 vs reference", mel, golden["flow_stream_chunk1.mel"]) < MEL_ATOL


@pytest.mark.parametrize("pieces", [[10, 20, 10], [28, 12], [3, 30, 4, 3]])
def test_streaming_matches_whole_utterance(flow, golden, pieces):
    """Chunk by chunk with caches == one streaming=True, finalize=True call over all 40 tokens."""
    whole = _run(flow, golden, 40, True, True)["mel"]
    chunks = _streamed(flow, golden, pieces)
    assert all(c.size(2) % 2 == 0 for c in chunks)
    mel = torch.cat(chunks, dim=2)
    assert mel.shape == whole.shape
    assert report(f"streaming_flow {pieces} vs whole", mel, whole) < MEL_ATOL
