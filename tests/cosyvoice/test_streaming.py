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

from assistant.tts.cosyvoice.streaming import (
    NoiseTape,
    StreamSchedule,
    first_chunk_mel,
    make_generator,
    run_stream,
    seam_steps,
)

AUDIO_ATOL = 1e-4   # streamed vs whole audio, float32 summation order only
MEL_ATOL = 1e-4
SEAM_K = 3.0        # a seam's sample step may be at most 3x the 99th percentile of nearby steps


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    return model, voice, g["e2e.speech_tokens"].tolist()


def _whole(model, voice, tokens, seed=0):
    """Whole-utterance synthesis of the same tokens: one streaming=True/finalize=True flow call, one vocoder
    call with the request's random draws (the same tape a streamed request uses)."""
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
    from assistant.tts.cosyvoice.streaming import FlowPrefix

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


def test_aligned_stream_equals_whole_utterance(setup):
    """Chunks on the flow's exact boundaries + exact vocoder look-ahead: streamed audio == whole, everywhere."""
    model, voice, tokens = setup
    _, whole = _whole_fast(model, voice, tokens)
    sched = StreamSchedule("fast", 25, 25, vocoder_lookahead=None)
    chunks = run_stream(model.flow, model.hift, voice, tokens, sched, seed=0)
    audio = np.concatenate([c.audio for c in chunks])
    assert audio.shape == whole.shape and len(chunks) == 4
    err = np.abs(audio - whole).max()
    print(f"aligned stream vs whole: max abs {err:.2e} (whole max {np.abs(whole).max():.3f})")
    assert err < AUDIO_ATOL


@pytest.mark.parametrize("steps", [None, 4])
def test_fast_stream_exact_frames_and_seams(setup, steps, monkeypatch):
    """Default fast schedule: every exactly computed mel frame equals the whole-utterance mel; the audio has
    no step at any seam beyond the signal's own sample-to-sample differences."""
    model, voice, tokens = setup
    whole_mel, _ = _whole_fast(model, voice, tokens)
    import assistant.tts.cosyvoice.streaming as streaming

    fed = []
    orig = streaming.StreamingHiFT.push

    def spy(self, mel, *a, **k):
        fed.append(mel.clone())
        return orig(self, mel, *a, **k)

    monkeypatch.setattr(streaming.StreamingHiFT, "push", spy)
    chunks = run_stream(model.flow, model.hift, voice, tokens, StreamSchedule.fast(first_chunk_steps=steps))
    mel = torch.cat(fed, dim=2)
    assert mel.shape == whole_mel.shape
    per_frame = (mel - whole_mel).abs()[0].amax(0)                         # [frames]
    # provisional frames: only the first chunk's (tokens 0-10); every later chunk ends on an exact boundary
    provisional = torch.zeros_like(per_frame, dtype=torch.bool)
    provisional[: 2 * 10] = True
    print(
        f"fast (first-chunk steps {steps}): exact frames max {per_frame[~provisional].max():.2e}, "
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

    other = tokens[::-1]
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


def test_warm_voice_gives_the_same_audio_as_cold(setup):
    """A voice's flow prefix computed once and reused (warm) gives exactly the audio of a fresh one (cold); the
    cache counts the hit; equal content under another prompt object hits too."""
    from assistant.tts.cosyvoice.prompt_cache import PromptCache
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    model, voice, tokens = setup
    cache = PromptCache()
    sched = StreamSchedule.fast()
    cold = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, voice, tokens, sched, 3, cache)])
    assert cache.stats()["misses"]["flow"] == 1 and cache.stats()["entries"] == 1
    copy = CosyVoicePrompt("other-id", "", voice.speech_tokens.clone(), voice.speech_feat.clone(),
                           voice.embedding.clone())
    warm = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, copy, tokens, sched, 3, cache)])
    assert cache.stats()["hits"]["flow"] == 1
    np.testing.assert_array_equal(warm, cold)
    alone = np.concatenate([c.audio for c in run_stream(model.flow, model.hift, voice, tokens, sched, 3)])
    np.testing.assert_array_equal(alone, cold)
    # a reduced-step first chunk adds its solver's caches to the voice's entry, and the cache re-measures it
    from assistant.tts.cosyvoice.streaming import flow_prefix

    before = cache.stats()["bytes"]
    flow_prefix(model.flow, voice, cache, 4)
    assert cache.stats()["bytes"] > before and cache.stats()["entries"] == 1
