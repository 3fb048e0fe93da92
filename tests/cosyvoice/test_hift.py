"""Parity of our HiFT vocoder (assistant.tts.cosyvoice.hift) with the reference implementation.

Goldens: ../shared/fixtures/cosyvoice2/tiny (see its README). Every random draw of each reference
call is stored, so the tests replay them exactly, and also check that seeding the global generator
as the reference did reproduces the same draws.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from assistant.tts.cosyvoice.hift import HiFTConfig, HiFTVocoder, crossfade_window, fade_in_out
from assistant.tts.cosyvoice.hift_source import SourceNoise

FIXTURES = Path(__file__).resolve().parents[3] / "shared/fixtures/cosyvoice2"
TINY = FIXTURES / "tiny"
pytestmark = pytest.mark.skipif(not (TINY / "hift.pt").exists(), reason=f"CosyVoice2 fixtures absent: {TINY}")

AUDIO_ATOL = 1e-3
F0_RTOL = 1e-3
OVERLAP = 3840  # samples: 8 mel frames x 480, the reference's hift cache


def _tiny_config() -> HiFTConfig:
    """The `hift` section of tiny/cosyvoice2.yaml, as the yaml reader hands it over."""
    return HiFTConfig.from_yaml(
        {
            "__class__": "cosyvoice.hifigan.generator.HiFTGenerator",
            "in_channels": 80,
            "base_channels": 64,
            "nb_harmonics": 8,
            "sampling_rate": 24000,
            "nsf_alpha": 0.1,
            "nsf_sigma": 0.003,
            "nsf_voiced_threshold": 10,
            "upsample_rates": [8, 5, 3],
            "upsample_kernel_sizes": [16, 11, 7],
            "istft_params": {"n_fft": 16, "hop_len": 4},
            "resblock_kernel_sizes": [3, 7, 11],
            "resblock_dilation_sizes": [[1, 3, 5]] * 3,
            "source_resblock_kernel_sizes": [7, 7, 11],
            "source_resblock_dilation_sizes": [[1, 3, 5]] * 3,
            "lrelu_slope": 0.1,
            "audio_limit": 0.99,
            "f0_predictor": {
                "__class__": "cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor",
                "num_class": 1,
                "in_channels": 80,
                "cond_channels": 64,
            },
        }
    )


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def golden() -> dict[str, torch.Tensor]:
    return torch.load(TINY / "golden.pt", weights_only=True)


@pytest.fixture(scope="module")
def hift() -> HiFTVocoder:
    model = HiFTVocoder(_tiny_config()).eval()
    model.load_state_dict(torch.load(TINY / "hift.pt", weights_only=True), strict=True)
    return model


def _report(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    err = (got.float() - want.float()).abs().max().item()
    rel = err / max(want.abs().max().item(), 1e-12)
    print(f"{name:36s} max abs {err:.3e}  max rel {rel:.3e}")
    return err


def test_full_size_keys_and_shapes():
    want = json.loads((FIXTURES / "full_size_keys/hift.json").read_text())["keys"]
    with torch.device("meta"):
        model = HiFTVocoder(HiFTConfig())
    got = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(want)
    assert got == {k: [list(s), d] for k, (s, d) in want.items()}


def test_legacy_weight_norm_names_load(hift):
    """A checkpoint written with the old weight_g / weight_v names loads into the same weights."""
    legacy = {
        k.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): v
        for k, v in hift.state_dict().items()
    }
    model = HiFTVocoder(_tiny_config())
    model.load_state_dict(legacy, strict=True)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, hift.state_dict()[k], rtol=0, atol=0)


def test_seeded_draws_match_recorded(golden):
    """SourceNoise.draw after the reference's seed reproduces the recorded draws bit for bit."""
    for seed, prefix, n in [
        (777, "hift_full.", 38400),
        (778, "hift_stream.chunk1_", 24000),
        (779, "hift_stream.chunk2_", 18240),
    ]:
        torch.manual_seed(seed)
        noise = SourceNoise.draw(n, 9)
        torch.testing.assert_close(noise.rand_ini, golden[f"{prefix}rand_ini"], rtol=0, atol=0)
        torch.testing.assert_close(noise.sine_noise, golden[f"{prefix}sine_noise"], rtol=0, atol=0)


def _check(name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape, name
    assert _report(name, got, want) < atol, name


@pytest.mark.parametrize("replay", [True, False], ids=["injected", "seeded"])
def test_full_utterance(hift, golden, replay):
    mel = golden["hift_full.mel_in"]
    trace: dict[str, torch.Tensor] = {}
    if replay:
        noise = SourceNoise(golden["hift_full.rand_ini"], golden["hift_full.sine_noise"])
        speech, source = hift.inference(mel, noise=noise, trace=trace)
    else:
        torch.manual_seed(777)
        speech, source = hift.inference(mel, trace=trace)
    f0_want = golden["hift_full.f0"]
    rel = ((trace["f0"] - f0_want).abs() / f0_want.abs().clamp(min=1.0)).max().item()
    _report("hift_full.f0", trace["f0"], f0_want)
    assert rel < F0_RTOL
    _check("hift_full.source", source, golden["hift_full.source"], AUDIO_ATOL)
    _check("hift_full.speech", speech, golden["hift_full.speech"], AUDIO_ATOL)


@pytest.mark.parametrize("replay", [True, False], ids=["injected", "seeded"])
def test_two_chunk_stream(hift, golden, replay):
    """token2wav-style glue: chunk 1 keeps an 8-frame overlap, chunk 2 reuses its source and cross-fades."""
    mel = golden["hift_full.mel_in"]

    def noise(prefix: str, seed: int) -> SourceNoise | None:
        if replay:
            return SourceNoise(golden[f"{prefix}_rand_ini"], golden[f"{prefix}_sine_noise"])
        torch.manual_seed(seed)
        return None

    mel1 = mel[:, :, :50]
    raw1, source1 = hift.inference(mel1, noise=noise("hift_stream.chunk1", 778))
    _check("hift_stream.chunk1_raw_speech", raw1, golden["hift_stream.chunk1_raw_speech"], AUDIO_ATOL)
    _check("hift_stream.chunk1_source", source1, golden["hift_stream.chunk1_source"], AUDIO_ATOL)
    out1 = raw1[:, :-OVERLAP]
    _check("hift_stream.chunk1_out", out1, golden["hift_stream.chunk1_out"], AUDIO_ATOL)

    mel2 = torch.cat([mel1[:, :, -8:], mel[:, :, 50:]], dim=2)
    torch.testing.assert_close(mel2, golden["hift_stream.chunk2_mel_in"], rtol=0, atol=0)
    raw2, source2 = hift.inference(mel2, cache_source=source1[:, :, -OVERLAP:], noise=noise("hift_stream.chunk2", 779))
    _check("hift_stream.chunk2_raw_speech", raw2, golden["hift_stream.chunk2_raw_speech"], AUDIO_ATOL)
    _check("hift_stream.chunk2_source", source2, golden["hift_stream.chunk2_source"], AUDIO_ATOL)
    out2 = fade_in_out(raw2, raw1[:, -OVERLAP:], crossfade_window(OVERLAP))
    _check("hift_stream.chunk2_out", out2, golden["hift_stream.chunk2_out"], AUDIO_ATOL)


def test_fade_in_out_matches_numpy_recipe(golden):
    """On the reference's own chunks, the cross-fade is the float64 Hamming mix, stored float32."""
    raw2, raw1 = golden["hift_stream.chunk2_raw_speech"], golden["hift_stream.chunk1_raw_speech"]
    out = fade_in_out(raw2, raw1[:, -OVERLAP:], crossfade_window(OVERLAP))
    w = np.hamming(2 * OVERLAP)
    want = raw2.numpy().copy()
    want[..., :OVERLAP] = raw2.numpy()[..., :OVERLAP] * w[:OVERLAP] + raw1.numpy()[..., -OVERLAP:] * w[OVERLAP:]
    np.testing.assert_array_equal(out.numpy(), want)
    torch.testing.assert_close(out, golden["hift_stream.chunk2_out"], rtol=0, atol=1e-6)


def test_bf16_difference(hift, golden):
    """fp32 vs bf16 waveform on the tiny model, same draws: printed, only loosely bounded."""
    mel = golden["hift_full.mel_in"]
    noise = SourceNoise(golden["hift_full.rand_ini"], golden["hift_full.sine_noise"])
    ref, _ = hift.inference(mel, noise=noise)
    for label, cast in [
        ("all bf16", lambda m: m.to(torch.bfloat16)),
        ("decoder bf16, F0+source fp32", lambda m: m.cast_decoder(torch.bfloat16)),
    ]:
        low = HiFTVocoder(hift.cfg).eval()
        low.load_state_dict(hift.state_dict())
        speech, _ = cast(low).inference(mel.to(torch.bfloat16), noise=noise)
        err = (speech - ref).abs()
        print(
            f"hift speech fp32 vs {label}: max abs {err.max():.3e}, mean abs {err.mean():.3e}, "
            f"ref rms {ref.pow(2).mean().sqrt():.3e}"
        )
        assert speech.dtype == torch.float32 and torch.isfinite(speech).all()


@pytest.mark.xfail(
    reason="unfinished: chunk 2 builds its phase from its own F0 at the left edge, where the 5-layer F0 conv "
    "lacks context (off by up to ~20 Hz), so the carried phase drifts; fix = hand the phase over "
    "mid-overlap (phase_start), see the report",
    strict=False,
)
def test_streaming_hift_matches_whole_away_from_seams(hift, golden):
    """Chunks [0:30], [30:55], [55:80] with carried phase vs one call, on the same noise per sample."""
    from assistant.tts.cosyvoice.hift import StreamingHiFT

    mel = golden["hift_full.mel_in"]
    full_noise = SourceNoise(golden["hift_full.rand_ini"], golden["hift_full.sine_noise"])
    whole, _ = hift.inference(mel, noise=full_noise)
    state, spf, out = StreamingHiFT(hift), 480, []
    bounds = [0, 30, 55, 80]
    for i in range(3):
        a, b = bounds[i], bounds[i + 1]
        start = max(a - state.overlap, 0) if i else 0
        noise = SourceNoise(full_noise.rand_ini, full_noise.sine_noise[:, start * spf : b * spf])
        out.append(state.push(mel[:, :, a:b], finalize=i == 2, noise=noise))
    audio = torch.cat(out, dim=1)
    assert audio.shape == whole.shape
    err = (audio - whole).abs()[0]
    seams = torch.zeros_like(err, dtype=torch.bool)
    for b in bounds[1:-1]:  # cross-fade span [b - overlap, b) frames, plus a 2-frame margin each side
        seams[(b - state.overlap - 2) * spf : (b + 2) * spf] = True
    print(
        f"streaming hift vs whole: away from seams max abs {err[~seams].max():.3e}, "
        f"at seams max abs {err[seams].max():.3e}, whole max {whole.abs().max():.3e}"
    )
    assert err[~seams].max() < 1e-2
