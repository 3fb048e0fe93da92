"""Streaming schedules on the tiny model: chunk timing, exactness against whole-utterance synthesis, seams.

"Away from seams" does not arise for the fast schedule's vocoder: it carries its whole state (F0, source
phase, convolution context) across chunks, so with exact look-ahead there is no seam region at all and the
streamed audio equals one `hift.inference` over the same mel and random draws everywhere (atol 1e-4).
Frames the fast schedule computes *provisionally* (past the flow's last exact 25-token boundary) differ from
the final mel by design; they are checked for continuity (seam steps), not equality.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cv_fixtures import tiny_model_and_voice

from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import first_chunk_mel, run_stream, seam_steps
from assistant.tts.cosyvoice.vocoding import NoiseTape, make_generator

AUDIO_ATOL = 1e-4   # streamed vs whole audio, float32 summation order only
MEL_ATOL = 1e-4
SEAM_K = 3.0        # a seam's sample step may be at most 3x the 99th percentile of nearby steps


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    return model, voice, g["e2e.speech_tokens"].tolist()


def _whole(model, voice, tokens, seed=0):
    """Whole-utterance synthesis of the same tokens: one streaming=True/finalize=True flow call, one vocoder
    call with the request's random draws (the same tape a streamed request uses). A cold voice's stream (its
    whole prompt through its own flow state) computes exactly these frames, chunk by chunk."""
    with torch.inference_mode():
        mel = model.flow.inference(
            torch.tensor([tokens]), None, voice.speech_tokens, None, voice.speech_feat, None, voice.embedding,
            streaming=True, finalize=True,
        )
        cpu = torch.device("cpu")
        tape = NoiseTape(make_generator(cpu, seed), model.hift.m_source.n_harmonics, cpu)
        audio, _ = model.hift.inference(mel, noise=tape.span(0, mel.size(2) * 480))
    return mel, audio[0].numpy()


def _whole_fast(model, voice, tokens, seed=0):
    """The fast schedule's whole utterance: the voice's sealed prompt (`FlowPrefix`) continued by one finalising
    call over every token, one vocoder call over the mel with the request's draws."""
    with torch.inference_mode():
        mel = FlowPrefix(model.flow, voice).fork().push(torch.tensor([tokens]), finalize=True)
        cpu = torch.device("cpu")
        tape = NoiseTape(make_generator(cpu, seed), model.hift.m_source.n_harmonics, cpu)
        audio, _ = model.hift.inference(mel, noise=tape.span(0, mel.size(2) * 480))
    return mel, audio[0].numpy()


def test_official_schedule_matches_reference_chunking(setup):
    """25+3 tokens first, then hop 50, last chunk at eos: the reference's three token2wav calls and sizes."""
    model, voice, tokens = setup
    chunks = run_stream(model.flow, model.hift, voice, tokens, StreamSchedule.official())
    assert [c.tokens_seen for c in chunks] == [28, 78, 100]
    assert [c.audio.size for c in chunks] == [20160, 48000, 27840]
    assert [c.covers for c in chunks] == [(0, 25), (25, 75), (75, 100)]
    audio = np.concatenate([c.audio for c in chunks])
    steps = seam_steps(audio, list(np.cumsum([c.audio.size for c in chunks])[:-1]))
    print("official seam steps / p99 nearby:", [f"{s:.2f}" for s in steps])
    assert max(steps) <= SEAM_K


@pytest.mark.parametrize("first", [10, 5])
def test_first_chunk_after_configured_tokens(setup, first):
    model, voice, tokens = setup
    chunks = run_stream(model.flow, model.hift, voice, tokens, StreamSchedule.fast(first))
    assert chunks[0].tokens_seen == first + 3  # + the flow's pre-look-ahead
    assert chunks[0].audio.size > 0
    hops = [b - a for a, b in (c.covers for c in chunks)]
    assert hops[0] == first
    # later chunks end on the encoder's 25-token chunks (the prompt is 25 tokens): exact when made
    assert all(b % 25 == 0 for _, b in (c.covers for c in chunks[1:-1]))
    assert hops[1:3] == ([15, 25] if first == 10 else [20, 25])


@pytest.mark.parametrize("warm", [True, False])
def test_aligned_stream_equals_whole_utterance(setup, warm):
    """Chunks on the flow's exact boundaries + exact vocoder look-ahead: streamed audio == whole, everywhere
    (warm: the sealed prompt continued; cold: the whole-utterance call itself)."""
    model, voice, tokens = setup
    _, whole = (_whole_fast if warm else _whole)(model, voice, tokens)
    sched = StreamSchedule("fast", 25, 25, vocoder_lookahead=None)
    prefix = FlowPrefix(model.flow, voice) if warm else None
    chunks = run_stream(model.flow, model.hift, voice, tokens, sched, seed=0, prefix=prefix)
    audio = np.concatenate([c.audio for c in chunks])
    assert audio.shape == whole.shape and len(chunks) == 4
    err = np.abs(audio - whole).max()
    print(f"aligned stream vs whole: max abs {err:.2e} (whole max {np.abs(whole).max():.3f})")
    assert err < AUDIO_ATOL


@pytest.mark.parametrize(("warm", "steps"), [(True, None), (True, 4), (False, None)])
def test_fast_stream_exact_frames_and_seams(setup, warm, steps, monkeypatch):
    """Default fast schedule: every exactly computed mel frame equals the whole-utterance mel (warm: the
    sealed prompt's; cold: the official whole-utterance call's); the audio has no step at any seam beyond
    the signal's own sample-to-sample differences."""
    model, voice, tokens = setup
    whole_mel, _ = (_whole_fast if warm else _whole)(model, voice, tokens)
    from assistant.tts.cosyvoice.hift import StreamingHiFT

    fed = []
    orig = StreamingHiFT.push_steps

    def spy(self, mel, *a, **k):
        fed.append(mel.clone())
        return orig(self, mel, *a, **k)

    monkeypatch.setattr(StreamingHiFT, "push_steps", spy)
    prefix = FlowPrefix(model.flow, voice) if warm else None
    chunks = run_stream(model.flow, model.hift, voice, tokens, StreamSchedule.fast(first_chunk_steps=steps),
                        prefix=prefix)
    mel = torch.cat(fed, dim=2)
    assert mel.shape == whole_mel.shape
    per_frame = (mel - whole_mel).abs()[0].amax(0)                         # [frames]
    # provisional frames: only the first chunk's (tokens 0-10); every later chunk ends on an exact boundary
    provisional = torch.zeros_like(per_frame, dtype=torch.bool)
    provisional[: 2 * 10] = True
    kind = "warm" if warm else "cold"
    print(
        f"fast ({kind}, first-chunk steps {steps}): exact frames max {per_frame[~provisional].max():.2e}, "
        f"provisional frames max {per_frame[provisional].max():.3f} (mel std {whole_mel.std():.3f})"
    )
    assert per_frame[~provisional].max() < MEL_ATOL
    audio = np.concatenate([c.audio for c in chunks])
    assert audio.size == 100 * 2 * 480 and np.isfinite(audio).all()
    seams = list(np.cumsum([c.audio.size for c in chunks])[:-1])
    ratios = seam_steps(audio, seams)
    print("fast seam steps / p99 nearby:", [f"{s:.2f}" for s in ratios])
    assert len(ratios) == len(chunks) - 1 and max(ratios) <= SEAM_K


def test_first_chunk_solver_steps_quality(setup):
    """Mel difference of the first chunk with fewer Euler steps vs 10 (reported; 10 must be identical)."""
    model, voice, tokens = setup
    ref = first_chunk_mel(model.flow, model.hift, voice, tokens, 10, None)
    assert ref.shape == (1, 80, 20)
    for k in (10, 6, 4, 2):
        mel = first_chunk_mel(model.flow, model.hift, voice, tokens, 10, k)
        d = (mel - ref).abs()
        print(f"first chunk {k:2d} steps vs 10: mean abs {d.mean():.3f}, max abs {d.max():.3f}, std {ref.std():.3f}")
        assert torch.isfinite(mel).all()
        if k == 10:
            assert d.max() == 0


def test_requests_do_not_share_state(setup):
    """Two interleaved streams of different tokens give what each gives alone (seeded vocoder draws)."""
    model, voice, tokens = setup
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis

    other = tokens[::-1]  # both cold: no prefix built before (run_stream without a cache, an empty cache)
    alone = [
        np.concatenate([c.audio for c in run_stream(model.flow, model.hift, voice, t, StreamSchedule.fast(), seed=s)])
        for t, s in ((tokens, 1), (other, 2))
    ]
    cache = PromptCache()
    streams = [StreamingSynthesis(model.flow, model.hift, voice, StreamSchedule.fast(), cache=cache, seed=s)
               for s in (1, 2)]
    out: list[list[np.ndarray]] = [[], []]
    for i in range(len(tokens)):
        for k, (s, t) in enumerate(zip(streams, (tokens, other), strict=True)):
            s.add(t[i])
            while s.due():
                out[k].append(s.next_chunk().audio)
    for k, s in enumerate(streams):
        s.finish()
        while s.due():
            out[k].append(s.next_chunk().audio)
    for k in range(2):
        np.testing.assert_allclose(np.concatenate(out[k]), alone[k], atol=1e-6)


def test_sealed_prompt_close_to_whole_utterance(setup):
    """The fast schedule encodes the voice prompt once as a finished sequence (its last tokens look ahead into
    zeros, not into the request's first tokens). Against one whole-utterance official call the new frames'
    mel differs only a little (reported; bounded by a fraction of the mel's spread)."""
    model, voice, tokens = setup
    official, _ = _whole(model, voice, tokens)
    sealed, _ = _whole_fast(model, voice, tokens)
    d = (sealed - official).abs()
    print(f"sealed prompt vs whole utterance: mean abs {d.mean():.4f}, max abs {d.max():.3f}, "
          f"mel std {official.std():.3f}")
    assert sealed.shape == official.shape
    assert d.mean() < 0.1 * official.std()


def test_cold_voice_builds_its_prefix_for_the_next_request(setup):
    """A new voice starts at once on its own flow state (cold: its whole prompt goes through its first chunk)
    and its prefix is kept afterwards; the next request of that content is warm (a hit, also under another
    prompt object) and gives exactly a fresh prefix's audio. Cold and warm differ only by the sealed prompt's
    approximation (bounded in test_fidelity.py)."""
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.streaming import StreamingSynthesis
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    model, voice, tokens = setup
    cache = PromptCache()
    sched = StreamSchedule.fast()
    first = StreamingSynthesis(model.flow, model.hift, voice, sched, cache=cache)
    # Cold, and at once: nothing of the prefix was built before the first chunk (the scheduler builds it later).
    assert first.cold and first.missing_prefix is not None and not first.missing_prefix.prefix.built
    assert cache.stats()["entries"] == 0
    cold = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, voice, tokens, sched, 3, cache)])
    assert cache.stats()["misses"]["flow"] == 2 and cache.stats()["entries"] == 1
    copy = CosyVoicePrompt("other-id", "", voice.speech_tokens.clone(), voice.speech_feat.clone(),
                           voice.embedding.clone())
    warm = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, copy, tokens, sched, 3, cache)])
    assert cache.stats()["hits"]["flow"] == 1
    fresh = FlowPrefix(model.flow, voice)
    alone = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, voice, tokens, sched, 3,
                                                        prefix=fresh)])
    np.testing.assert_allclose(warm, alone, atol=1e-6)
    assert warm.shape == cold.shape and not np.array_equal(warm, cold)
    # a reduced-step first chunk adds its solver's caches to the voice's entry, and the cache re-measures it
    before = cache.stats()["bytes"]
    StreamingSynthesis(model.flow, model.hift, voice, StreamSchedule.fast(first_chunk_steps=4), cache=cache)
    assert cache.stats()["bytes"] > before and cache.stats()["entries"] == 1


@pytest.mark.parametrize("n", [61, 51])
def test_prefix_built_chunk_by_chunk_equals_one_pass(setup, n):
    """The prefix is built one encoder chunk per step (so the scheduler can interleave it); its keys and
    values equal one pass over the same tokens. 61 tokens: two exact chunks, 11 left pending for each
    request; 51: one token dropped, two chunks, the last sealed."""
    from assistant.tts.cosyvoice.batch_work import run_alone
    from assistant.tts.cosyvoice.flow import StreamingFlow
    from assistant.tts.cosyvoice.flow_prefix import flow_prompt, kv_prefixes

    model, _, _ = setup
    voice = _voice(n, torch.Generator().manual_seed(5))
    built = FlowPrefix(model.flow, voice)
    t, feat, sealed = flow_prompt(voice, 25, 3)
    assert (built.prompt_tokens, built.sealed, built.state.encoded) == ((61, False, 50) if n == 61 else (50, True, 50))
    one = StreamingFlow(model.flow, t, feat, voice.embedding, noise_offset=2 * (n - t.size(1)))
    run_alone(one.encode_steps(50, look_ahead=not sealed))
    for got, want in zip(built._kv, kv_prefixes(one.step_caches), strict=True):
        assert got.keys() == want.keys()
        for key in got:
            torch.testing.assert_close(got[key][0], want[key][0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[key][1], want[key][1], atol=1e-5, rtol=1e-5)


def _voice(n: int, gen: torch.Generator):
    """A random voice prompt of n speech tokens (n not a multiple of 25 exercises the prompt cut)."""
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    return CosyVoicePrompt(f"v{n}", "", torch.randint(0, 6561, (1, n), generator=gen, dtype=torch.int32),
                           torch.randn(1, 2 * n, 80, generator=gen), torch.randn(1, 192, generator=gen))
