"""Parity of our HiFT vocoder (assistant.tts.cosyvoice.hift) with the reference implementation.

Goldens: ../shared/fixtures/cosyvoice2/tiny (see its README). Every random draw of each reference
call is stored, so the tests replay them exactly, and also check that seeding the global generator
as the reference did reproduces the same draws.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cv_fixtures import FIXTURES, TINY, need_fixture, report

from assistant.tts.cosyvoice.hift import HiFTConfig, HiFTVocoder, crossfade_window, fade_in_out
from assistant.tts.cosyvoice.hift_source import SourceNoise


@pytest.fixture(autouse=True)
def _tiny_hift() -> None:
    need_fixture("tiny/hift.pt")

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


@pytest.fixture(scope="module")
def hift() -> HiFTVocoder:
    model = HiFTVocoder(_tiny_config()).eval()
    model.load_state_dict(torch.load(TINY / "hift.pt", weights_only=True), strict=True)
    return model


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
    assert report(name, got, want) < atol, name


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
    report("hift_full.f0", trace["f0"], f0_want)
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


# --- streaming (StreamingHiFT) ---------------------------------------------------------------------------

SPF = 480  # samples per mel frame
SEAM_HALF = 120  # samples each side of a seam for the click check (10 ms window at 24 kHz)


@pytest.fixture(scope="module")
def whole(hift, golden) -> torch.Tensor:
    """Whole-utterance `inference` on the golden mel with the recorded draws: [38400]."""
    noise = SourceNoise(golden["hift_full.rand_ini"], golden["hift_full.sine_noise"])
    return hift.inference(golden["hift_full.mel_in"], noise=noise)[0][0]


def _stream(hift, golden, splits: list[int], **kwargs) -> tuple[torch.Tensor, list[int], object]:
    """Push the golden mel in chunks of `splits` frames, each with its slice of the recorded draws."""
    from assistant.tts.cosyvoice.hift import StreamingHiFT

    mel = golden["hift_full.mel_in"]
    rand_ini, sine_noise = golden["hift_full.rand_ini"], golden["hift_full.sine_noise"]
    state, out, a = StreamingHiFT(hift, **kwargs), [], 0
    assert sum(splits) == mel.size(2)
    for i, n in enumerate(splits):
        noise = SourceNoise(rand_ini, sine_noise[:, a * SPF : (a + n) * SPF])
        out.append(state.push(mel[:, :, a : a + n], final=i == len(splits) - 1, noise=noise))
        assert out[-1].dim() == 1 and out[-1].dtype == torch.float32
        a += n
    return torch.cat(out), [o.numel() for o in out], state


def _seam_ratios(audio: torch.Tensor, seams: list[int]) -> list[float]:
    """|step| across each seam / (3 x 99th percentile of |step| in the 10 ms around it); <= 1: no click."""
    d = audio.diff().abs()
    ratios = []
    for b in seams:
        if 0 < b < audio.numel():
            around = d[max(b - 1 - SEAM_HALF, 0) : b - 1 + SEAM_HALF]
            ratios.append(d[b - 1].item() / (3 * torch.quantile(around, 0.99).item()))
    return ratios


def test_receptive_field_matches_nan_probe(hift, golden):
    """A NaN in one mel frame / one frame of source reaches exactly as far as `receptive_field` says."""
    reach = hift.receptive_field()
    mel, k, n = golden["hift_full.mel_in"], 40, 80
    noise = SourceNoise(golden["hift_full.rand_ini"], golden["hift_full.sine_noise"])
    with torch.inference_mode():
        clean = hift.source(hift.f0_predictor(mel), noise)
        bad = mel.clone()
        bad[:, :, k] = float("nan")
        nan_f0 = torch.isnan(hift.f0_predictor(bad)[0]).nonzero().flatten()
        assert (nan_f0.min().item(), nan_f0.max().item()) == (k - reach.f0, k + reach.f0)

        def frames_hit(audio: torch.Tensor) -> tuple[int, int]:
            hit = torch.isnan(audio.view(n, SPF)).any(dim=1).nonzero().flatten()
            return k - hit.min().item(), hit.max().item() - k

        assert frames_hit(hift.decode(bad, clean)[0]) == (reach.mel_left, reach.mel_right)
        source = clean.clone()
        source[:, :, k * SPF : (k + 1) * SPF] = float("nan")
        assert frames_hit(hift.decode(mel, source)[0]) == (reach.source_left, reach.source_right)


@pytest.mark.parametrize("splits", [[10, 20, 50], [3, 3, 74], [40, 40], [30, 25, 25]], ids=str)
def test_streaming_hift_matches_whole(hift, golden, whole, splits):
    """Streamed audio == whole-utterance inference everywhere (no seam excluded), and no clicks."""
    audio, lengths, state = _stream(hift, golden, splits)
    assert audio.shape == whole.shape
    err = (audio - whole).abs().max().item()
    out_seams = list(np.cumsum(lengths)[:-1])
    mel_seams = list(np.cumsum(splits)[:-1] * SPF)
    ratios = _seam_ratios(audio, out_seams + mel_seams)
    print(
        f"stream {splits}: max abs vs whole {err:.3e} (nothing excluded), chunk lengths {lengths}, "
        f"worst seam step / (3 x p99 around) {max(ratios, default=0):.2f}"
    )
    assert err < AUDIO_ATOL
    assert all(r <= 1 for r in ratios)
    assert state.held_frames == 0 and state.closed


def test_streaming_hift_one_frame_pushes_bounded_state(hift, golden, whole):
    """80 single-frame pushes: still exact; the buffers stay within context + look-ahead (no regrowth)."""
    from assistant.tts.cosyvoice.hift import StreamingHiFT

    mel = golden["hift_full.mel_in"]
    rand_ini, sine_noise = golden["hift_full.rand_ini"], golden["hift_full.sine_noise"]
    state, out = StreamingHiFT(hift), []
    bound = state.context + state.lookahead + 1
    for a in range(80):
        noise = SourceNoise(rand_ini, sine_noise[:, a * SPF : (a + 1) * SPF])
        out.append(state.push(mel[:, :, a : a + 1], final=False, noise=noise))
        assert state.mel is not None and state.mel.size(2) <= bound
        assert state.source.size(2) <= bound * SPF and state.noise.size(1) <= bound * SPF
        assert state.held_frames == min(a + 1, state.lookahead)
    out.append(state.push(mel[:, :, :0], final=True))  # an empty final push flushes the held frames
    audio = torch.cat(out)
    err = (audio - whole).abs().max().item()
    print(f"stream 80 x 1 frame: max abs vs whole {err:.3e}")
    assert audio.shape == whole.shape and err < AUDIO_ATOL


def test_streaming_hift_short_lookahead(hift, golden, whole):
    """Latency knob: 8 frames of look-ahead instead of the exact 21 stays close, still without clicks."""
    audio, lengths, _ = _stream(hift, golden, [10, 20, 50], lookahead_frames=8)
    err = (audio - whole).abs().max().item()
    ratios = _seam_ratios(audio, list(np.cumsum(lengths)[:-1]))
    print(f"stream look-ahead 8: max abs vs whole {err:.3e}, lengths {lengths}, worst seam {max(ratios):.2f}")
    assert lengths[0] == 2 * SPF and err < AUDIO_ATOL and all(r <= 1 for r in ratios)


def test_streaming_hift_api(hift, golden):
    """1-D float32 output, legacy `finalize` keyword, seeded default draws reproducible, closed after final."""
    from assistant.tts.cosyvoice.hift import StreamingHiFT

    mel = golden["hift_full.mel_in"][:, :, :40]
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        state = StreamingHiFT(hift)
        assert state.push(mel[:, :, :0]).numel() == 0
        first = state.push(mel[:, :, :25])
        runs.append(torch.cat([first, state.push(mel[:, :, 25:], finalize=True)]))
        assert first.numel() == (25 - state.lookahead) * SPF
        with pytest.raises(RuntimeError):
            state.push(mel[:, :, :1])
    assert runs[0].shape == (40 * SPF,) and runs[0].dtype == torch.float32
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    with pytest.raises(ValueError):
        StreamingHiFT(hift).push(mel[:, :, :2], noise=SourceNoise(torch.zeros(1, 9), torch.zeros(1, 480, 9)))
