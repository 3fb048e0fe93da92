"""Voices computed once (the prompt cache), GPU readiness on the CPU (no stray tensors), batched device sampling."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from cv_fixtures import need_fixtures, tiny_model_and_voice

from assistant.config import TTSConfig
from assistant.tts.base import ReferenceClip
from assistant.tts.cosyvoice.prompt_cache import PromptCache, digest
from assistant.tts.cosyvoice.sampling import sample_tokens, uniforms
from assistant.tts.cosyvoice.slot_decoder import SlotDecoder


@pytest.fixture(scope="module")
def setup():
    return tiny_model_and_voice()


def _engine(model, **kw):
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    engine = CosyVoiceEngine(TTSConfig(engine="cosyvoice2", model_dir=str(need_fixtures()), **kw))
    engine.attach(model)
    return engine


# --- the cache ------------------------------------------------------------------------------------------


def test_cache_is_bounded_by_bytes_and_evicts_least_recent():
    mb = 1 << 20
    cache = PromptCache(max_bytes=3 * mb)
    blob = {name: torch.zeros(mb // 4) for name in "abcd"}  # 1 MB each (float32)
    cache.put("flow", "a", blob["a"])
    cache.put("flow", "b", blob["b"])
    cache.put("llm", "c", blob["c"])
    assert cache.get("flow", "a") is blob["a"]            # a is now the most recent
    cache.put("flow", "d", blob["d"])                     # over budget: b (least recent) goes
    st = cache.stats()
    assert st["bytes"] <= 3 * mb and st["entries"] == 3 and st["evictions"] == 1
    assert cache.get("flow", "b") is None and cache.get("flow", "a") is not None
    assert st["hits"]["flow"] == 1 and st["entries_by_kind"] == {"clip": 0, "flow": 2, "llm": 1}
    cache.put("flow", "huge", torch.zeros(mb))            # 4 MB > budget: returned by get_or_make, not kept
    assert cache.get("flow", "huge") is None and cache.stats()["oversize"] == 1
    made = []
    value = cache.get_or_make("clip", "k", lambda: made.append(1) or torch.ones(3))
    again = cache.get_or_make("clip", "k", lambda: made.append(1) or torch.ones(3))
    assert again is value and made == [1]


def test_digest_is_by_content():
    a = torch.arange(10, dtype=torch.int32).reshape(1, 10)
    assert digest(a, "x") == digest(a.clone(), "x")
    assert digest(a, "x") != digest(a + 1, "x") and digest(a) != digest(a.long())


def test_same_clip_bytes_are_a_cache_hit(setup, monkeypatch):
    """speaker_wav sent again with the same bytes: the front end runs once; other bytes run it again."""
    model, voice, _ = setup
    engine = _engine(model)
    calls = []

    def encode(voice_id, audio, sample_rate, prompt_text=""):
        calls.append(len(audio))
        return voice

    monkeypatch.setattr(model.voice_encoder, "encode", encode)
    clip = np.sin(np.arange(16000 * 3) / 20.0).astype(np.float32)
    first = engine.clip_voice(model, ReferenceClip(clip, 16000, "hello"))
    again = engine.clip_voice(model, ReferenceClip(clip.copy(), 16000, "hello"))
    assert first is again and calls == [clip.size]
    engine.clip_voice(model, ReferenceClip(clip[:-1], 16000, "hello"))
    engine.clip_voice(model, ReferenceClip(clip, 16000, "other words"))
    assert len(calls) == 3
    st = engine.cache_stats()
    assert st["hits"]["clip"] == 1 and st["misses"]["clip"] == 3
    asyncio.run(engine.close())


# --- GPU readiness, checked on the CPU -------------------------------------------------------------------


def _stray(obj, where: str, device: str, seen: set[int]) -> list[str]:
    """Tensors reachable from obj's attributes (modules, dicts, lists, tuples) that are not on ``device``."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [] if obj.device.type == device else [f"{where}: {obj.device}"]
    if isinstance(obj, torch.nn.Module):
        out = []
        for name, t in list(obj.named_parameters(recurse=False)) + list(obj.named_buffers(recurse=False)):
            if t is not None and t.device.type != device:
                out.append(f"{where}.{name}: {t.device}")
        for name, child in obj.named_children():
            out += _stray(child, f"{where}.{name}", device, seen)
        for name, value in vars(obj).items():
            if name.startswith("_") or isinstance(value, torch.nn.Module):
                continue
            out += _stray(value, f"{where}.{name}", device, seen)
        return out
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in _stray(v, f"{where}[{k!r}]", device, seen)]
    if isinstance(obj, (list, tuple)):
        return [s for i, v in enumerate(obj) for s in _stray(v, f"{where}[{i}]", device, seen)]
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("assistant."):
        return [s for k, v in vars(obj).items() for s in _stray(v, f"{where}.{k}", device, seen)]
    return []


def test_no_stray_tensor_off_the_model_device():
    """Everything built for a device lives there: the three models built under ``torch.device("meta")``, and
    the per-request state objects made over them (flow stream, vocoder stream, slot decoder, batcher)."""
    from assistant.tts.cosyvoice.batching import SpeechBatcher
    from assistant.tts.cosyvoice.flow import StreamingFlow
    from assistant.tts.cosyvoice.hift import StreamingHiFT
    from assistant.tts.cosyvoice.llm import build_speech_lm
    from assistant.tts.cosyvoice.loader import build_flow, build_hift, read_spec

    spec = read_spec(need_fixtures())
    meta = torch.device("meta")
    lm = build_speech_lm(spec.llm, spec.qwen, meta)
    lm.llm.rebuild_rotary(meta)
    flow, hift = build_flow(spec, meta), build_hift(spec, meta)
    stray = _stray(lm, "llm", "meta", set()) + _stray(flow, "flow", "meta", set()) + _stray(hift, "hift", "meta", set())
    stream = StreamingFlow(flow, torch.zeros(1, 25, dtype=torch.int32), torch.zeros(1, 50, 80), torch.zeros(1, 192))
    stray += _stray(stream, "StreamingFlow", "meta", set())
    stray += _stray(StreamingHiFT(hift), "StreamingHiFT", "meta", set())
    stray += _stray(SlotDecoder(lm, 2, 64), "SlotDecoder", "meta", set())
    batcher = SpeechBatcher(lm, flow, hift, slots=2, max_positions=64)
    try:
        stray += _stray({k: v for k, v in vars(batcher).items() if isinstance(v, torch.Tensor)}, "batcher", "meta",
                        set())
    finally:
        batcher.close()
    assert not stray, "tensors off the model's device:\n" + "\n".join(stray)


def test_noise_follows_the_module_and_time_embedding_is_float32():
    from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig, fixed_noise

    cfg = FlowConfig(input_size=16, encoder_output_size=16, encoder_heads=2, encoder_linear_units=16,
                     encoder_blocks=1, encoder_up_blocks=1, estimator_channels=[16], attention_head_dim=8,
                     n_blocks=1, num_mid_blocks=1, num_heads=2)
    with torch.device("meta"):
        flow = CausalFlow(cfg)
    assert flow.noise.device.type == "meta"
    cpu = CausalFlow(cfg).to(torch.bfloat16)
    assert torch.equal(cpu.noise.float(), fixed_noise().to(torch.bfloat16).float())
    from assistant.tts.cosyvoice.flow_decoder import timestep_features

    t = torch.tensor([0.5003], dtype=torch.bfloat16)
    assert timestep_features(t, 8).dtype == torch.float32


# --- LLM prompt start and batched device sampling ------------------------------------------------------------


def test_prefill_from_cached_prompt_start_matches_full_prefill(setup):
    model, _, g = setup
    lm = model.llm
    head, rest = lm.build_lm_input_parts(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    assert torch.equal(torch.cat([head, rest], dim=1),
                       lm.build_lm_input(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"]))
    dec = SlotDecoder(lm, 2, 128)
    full = dec.prefill(0, torch.cat([head, rest], dim=1)[0])
    cached = dec.prefill(1, rest[0], dec.prefix_kv(head[0]))
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dec.k_cache[:, 1], dec.k_cache[:, 0], atol=1e-5, rtol=1e-5)


def test_device_sampling_rows_are_independent_and_follow_the_nucleus(setup):
    model, _, _ = setup
    cfg = model.llm.cfg
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(4, cfg.speech_token_size + 3, generator=gen).mul(3).log_softmax(-1)
    recent = torch.full((4, cfg.win_size), -1, dtype=torch.long)
    seeds = torch.tensor([1, 2, 3, 1])
    steps = torch.tensor([0, 0, 5, 0])
    greedy = torch.tensor([False, False, False, True])
    tokens = sample_tokens(logp, recent, seeds, steps, greedy, cfg)
    assert tokens[3] == logp[3].argmax()
    alone = [int(sample_tokens(logp[i : i + 1], recent[i : i + 1], seeds[i : i + 1], steps[i : i + 1],
                               greedy[i : i + 1], cfg)) for i in range(4)]
    assert tokens.tolist() == alone                                          # rows never see each other
    probs, order = logp.softmax(-1).sort(descending=True)
    for i in range(3):                                                      # inside row i's nucleus
        head = probs[i, : cfg.top_k]
        keep = int(((head.cumsum(0) - head) < cfg.top_p).sum())
        assert int(tokens[i]) in order[i, : max(keep, 1)].tolist()
    # a token repeated in the window is drawn again from the whole distribution, never itself
    rep = torch.full((1, cfg.win_size), int(logp[0].argmax()), dtype=torch.long)
    peaked = torch.full_like(logp[:1], -30.0)
    peaked[0, int(logp[0].argmax())] = 0.0
    assert int(sample_tokens(peaked, rep, seeds[:1], steps[:1], greedy[:1], cfg)) != int(logp[0].argmax())
    u = uniforms(torch.arange(1000), torch.zeros(1000, dtype=torch.long), 2)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.03


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_batched_and_voices_are_reused(setup):
    """The production path (device sampling, batched): a seeded request gives the same audio alone and beside
    another request; another seed differs; the voice's flow prefix and LLM prompt start are computed once."""
    model, voice, g = setup
    engine = _engine(model, max_concurrent=2)

    async def one(seed, tokens=None):
        out = []
        async for c in engine.stream_ids(g["in.e2e_text_token"], voice, prompt_text_ids=g["in.prompt_text_token"],
                                         seed=seed, tokens=tokens):
            out.append(c.audio)
        return np.concatenate(out)

    async def run():
        await engine.prepare_voice(voice)                 # the voice's flow prefix once (a miss), then hits
        alone = await one(7)
        together, _ = await asyncio.gather(one(7), one(8, tokens=40))
        other = await one(8)
        await engine.close()
        return alone, together, other

    alone, together, other = asyncio.run(run())
    np.testing.assert_allclose(together, alone, atol=1e-4)   # batched: float32 summation order only
    assert other.shape != alone.shape or not np.allclose(other, alone)
    st = engine.cache_stats()
    assert st["misses"]["flow"] == 1 and st["hits"]["flow"] == 4
    assert st["misses"]["llm"] == 1 and st["hits"]["llm"] == 3
