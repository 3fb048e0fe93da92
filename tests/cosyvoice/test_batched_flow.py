"""Batched flow and vocoder work across streams on the tiny model: every stream's audio equals its audio made
alone (float32 summation order only), with different prompts, tokens, chunk lengths, warm and cold voices,
exact-length groups and groups padded up to buckets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cv_fixtures import random_voice, tiny_model_and_voice

from assistant.tts.cosyvoice.batch_work import run_grouped, run_together
from assistant.tts.cosyvoice.flow import FlowSolve
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import StreamingSynthesis

AUDIO_ATOL = 1e-4   # float32 summation order (batched matmuls block differently)
MEL_ATOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    gen = torch.Generator().manual_seed(11)

    voices = [voice, random_voice(gen, 37), random_voice(gen, 61)]
    tokens = g["e2e.speech_tokens"].tolist()
    token_lists = [tokens, tokens[::-1][:83], torch.randint(0, 6561, (71,), generator=gen).tolist()]
    return model, voices, token_lists


def _streams(model, voices, token_lists, warm: list[bool], first_hops: list[int]) -> list[StreamingSynthesis]:
    out = []
    for i, (voice, toks) in enumerate(zip(voices, token_lists, strict=True)):
        prefix = FlowPrefix(model.flow, voice) if warm[i] else None
        s = StreamingSynthesis(model.flow, model.hift, voice, StreamSchedule.fast(first_hops[i]), prefix=prefix,
                               seed=i)
        for t in toks:
            s.add(t)
        s.finish()
        out.append(s)
    return out


def _drive(streams: list[StreamingSynthesis], buckets: tuple[int, ...], together: bool) -> list[np.ndarray]:
    """Every due chunk of every stream, in rounds; together: one lockstep run per round (batched pieces)."""
    audio: list[list[np.ndarray]] = [[] for _ in streams]
    while any(s.due() for s in streams):
        due = [i for i, s in enumerate(streams) if s.due()]
        if together:
            chunks = run_together([streams[i].chunk_steps() for i in due], buckets)
        else:
            chunks = [run_together([streams[i].chunk_steps()])[0] for i in due]
        for i, c in zip(due, chunks, strict=True):
            audio[i].append(c.audio)
    return [np.concatenate(a) for a in audio]


@pytest.mark.parametrize(("warm", "first_hops", "buckets"), [
    ([True, True, True], [10, 10, 10], ()),            # same lengths: batched as they are
    ([True, False, True], [10, 5, 7], ()),             # mixed warm/cold, different chunk lengths
    ([False, True, True], [10, 5, 7], (14, 20, 50, 100)),  # padded up to buckets so more streams share calls
])
def test_batched_streams_equal_each_alone(setup, warm, first_hops, buckets, monkeypatch):
    model, voices, token_lists = setup
    sizes: list[int] = []
    orig = run_grouped

    def spy(items, b=()):
        groups = orig(items, b)
        sizes.extend(len(g) for g in groups)
        return groups

    import assistant.tts.cosyvoice.batch_work as batch_work

    monkeypatch.setattr(batch_work, "run_grouped", spy)
    alone = _drive(_streams(model, voices, token_lists, warm, first_hops), buckets, together=False)
    assert max(sizes) == 1
    sizes.clear()
    batched = _drive(_streams(model, voices, token_lists, warm, first_hops), buckets, together=True)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(alone, batched, strict=True))
    print(f"warm {warm} hops {first_hops} buckets {buckets}: group sizes {sorted(set(sizes))}, "
          f"max |batched - alone| {worst:.2e}")
    assert max(sizes) >= 2                                    # some pieces really ran together
    for a, b in zip(alone, batched, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, atol=AUDIO_ATOL)


@pytest.mark.parametrize("buckets", [(), (14, 20, 50, 100)])
def test_streams_of_one_voice_share_its_prefix_in_one_attention(setup, buckets, monkeypatch):
    """Streams of the same warm voice start with no frames of their own: their first solves attend to the
    shared prefix in one batched attention (`attend_shared`); audio as each alone."""
    model, voices, token_lists = setup
    prefix = FlowPrefix(model.flow, voices[0])

    def streams() -> list[StreamingSynthesis]:
        out = []
        for i, (toks, hop) in enumerate(zip(token_lists, (10, 10, 7), strict=True)):
            s = StreamingSynthesis(model.flow, model.hift, voices[0], StreamSchedule.fast(hop), prefix=prefix,
                                   seed=i)
            for t in toks:
                s.add(t)
            s.finish()
            out.append(s)
        return out

    import assistant.tts.cosyvoice.flow_cache as flow_cache

    shared = []
    orig = flow_cache.attend_shared

    def spy(*a, **k):
        shared.append(len(a[4]))
        return orig(*a, **k)

    alone = _drive(streams(), buckets, together=False)
    monkeypatch.setattr(flow_cache, "attend_shared", spy)
    batched = _drive(streams(), buckets, together=True)
    assert shared and max(shared) >= 2
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_allclose(b, a, atol=AUDIO_ATOL)


def test_padded_solve_equals_unpadded(setup):
    """One batched solve of streams with 20, 13 and 7 new frames (padded to 20) against each stream's own
    solve: the real frames and every stream's caches afterwards agree."""
    model, _, _ = setup
    flow = model.flow

    def inputs(n: int, seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return (*(torch.randn(1, 80, n, generator=g) for _ in range(3)), torch.randn(1, 80, generator=g))

    def solves() -> list[FlowSolve]:
        """Per stream: 30 frames solved before (so its caches hold a past), then a solve of n new frames."""
        out = []
        for i, n in enumerate((20, 13, 7)):
            caches: list[dict] = [{} for _ in range(flow.cfg.n_timesteps)]
            z, mu, cond, spks = inputs(30, 100 + i)
            run_grouped([FlowSolve(flow, z, mu, spks, cond, caches)])
            z, mu, cond, _ = inputs(n, 200 + i)
            out.append(FlowSolve(flow, z, mu, spks, cond, caches))
        return out

    alone = solves()
    for s in alone:
        run_grouped([s])
    together = solves()
    groups = run_grouped(together, buckets=(20,))
    assert len(groups) == 1 and len(groups[0]) == 3
    for a, b in zip(alone, together, strict=True):
        assert b.result.shape == a.result.shape
        torch.testing.assert_close(b.result, a.result, atol=MEL_ATOL, rtol=0)
        assert a.caches[0]["frames"] == b.caches[0]["frames"] == 30 + a.frames
    # the next call continues from equal caches (padding wrote nothing a stream keeps)
    for a, b in zip(alone, together, strict=True):
        z, mu, cond, _ = inputs(5, 7)
        nxt = [FlowSolve(flow, z, mu, x.spks, cond, x.caches) for x in (a, b)]
        run_grouped(nxt[:1])
        run_grouped(nxt[1:])
        torch.testing.assert_close(nxt[1].result, nxt[0].result, atol=MEL_ATOL, rtol=0)
