"""The first chunk as static graphs (`flow_graphs.py`, `hift_graphs.py`, `first_chunk.py`), run directly on the
CPU with their static buffers, against their eager twins on the tiny model in float32: the voice's first-chunk
flow solve and the vocoder's first push equal the eager path within 1e-5 at one stream and in a padded batch of
four; a stream alone equals the same stream inside the batch; the caches are left as the eager path leaves
them; and whole streams made with them give the eager path's audio.

Voices: the golden 25-token prompt (sealed prefix), 37 and 61 tokens (the rest of the prompt goes through the
first chunk), and 40 (rest 15: the eager path commits the first chunk at once, the static one with the second).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cv_fixtures import random_voice, tiny_model_and_voice

from assistant.tts.cosyvoice.batch_work import run_together
from assistant.tts.cosyvoice.first_chunk import FirstChunkGraphs
from assistant.tts.cosyvoice.flow_cache import KVCache
from assistant.tts.cosyvoice.flow_graphs import FirstChunkFlow
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.hift import StreamingHiFT
from assistant.tts.cosyvoice.hift_graphs import FirstPush
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import StreamingSynthesis, first_chunk_mel
from assistant.tts.cosyvoice.vocoding import NoiseTape, make_generator

ATOL = 1e-5
# a whole stream: a batched F0 a few ulps off shifts the harmonic phase, summed over every later frame, a little
# (as tests/cosyvoice/test_batched_flow.py: batched against alone)
STREAM_ATOL = 1e-4
HOP = 10


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    gen = torch.Generator().manual_seed(11)
    voices = {25: voice, 37: random_voice(gen, 37), 40: random_voice(gen, 40), 61: random_voice(gen, 61)}
    prefixes = {n: FlowPrefix(model.flow, v) for n, v in voices.items()}
    token_lists = [g["e2e.speech_tokens"].tolist(), g["e2e.speech_tokens"].flip(0).tolist(),
                   torch.randint(0, 6561, (90,), generator=gen).tolist()]
    return model, voices, prefixes, token_lists


def _snapshot(prefix: FlowPrefix) -> list[torch.Tensor]:
    """Every tensor of the prefix's state (encoder cache, conv tails, keys/values) as copies."""
    out = [v.clone() for v in prefix.state.encoder_cache.values() if isinstance(v, torch.Tensor)]
    out += [t.clone() for v in prefix.state.encoder_cache.values() if isinstance(v, tuple) for t in v]
    for tails, kv in prefix.step_prefixes():
        out += [v.clone() for v in tails.values() if isinstance(v, torch.Tensor)]
        out += [t.clone() for pair in kv.values() for t in pair]
    return out


@pytest.mark.parametrize("n", [25, 37, 40, 61])
def test_static_first_chunk_flow_equals_eager_alone_and_in_a_padded_batch(setup, n):
    model, voices, prefixes, token_lists = setup
    flow, prefix = model.flow, prefixes[n]
    look = flow.cfg.pre_lookahead_len
    firsts = [t[: HOP + look] for t in token_lists]
    eager = [first_chunk_mel(flow, model.hift, voices[n], t, HOP, None, prefix) for t in firsts]
    before = _snapshot(prefix)
    solver = FirstChunkFlow(flow, prefix, HOP, None, (1, 4), graph=True)      # off CUDA: run directly
    with torch.inference_mode():
        alone = solver.run(firsts[:1])
        batch = solver.run(firsts)                                           # 3 streams in the bucket of 4
    assert solver.record["path"] == "static step (cpu, capture skipped)" and solver.record["direct_steps"] == 2
    assert alone[0].shape == eager[0].shape == (1, 80, 2 * HOP)
    torch.testing.assert_close(alone[0], eager[0], atol=ATOL, rtol=0)
    for got, want in zip(batch, eager, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(batch[0], alone[0], atol=ATOL, rtol=0)        # alone = inside the batch
    for a, b in zip(before, _snapshot(prefix), strict=True):                # the voice's state: untouched
        assert torch.equal(a, b)


def _first_pushes(model, mels: list[torch.Tensor], seeds: list[int]):
    dev = torch.device("cpu")
    tapes = [NoiseTape(make_generator(dev, s), model.hift.m_source.n_harmonics, dev) for s in seeds]
    spf = model.hift.cfg.samples_per_frame
    return [t.span(0, m.size(2) * spf) for t, m in zip(tapes, mels, strict=True)], tapes


def test_static_first_push_equals_eager_and_leaves_the_same_state(setup):
    """The vocoder's first push of one stream and of three in the bucket of four: the audio and every piece
    of the streaming state as `StreamingHiFT.push` leaves them, and the next push gives the same audio."""
    model = setup[0]
    hift = model.hift
    gen = torch.Generator().manual_seed(3)
    frames = 2 * HOP
    mels = [torch.randn(1, 80, frames + 30, generator=gen) for _ in range(3)]
    firsts = [m[:, :, :frames] for m in mels]
    noises, tapes = _first_pushes(model, firsts, [1, 2, 3])
    push = FirstPush(hift, frames, (1, 4), graph=True)
    spf = hift.cfg.samples_per_frame
    for group in (firsts[:1], firsts):
        with torch.inference_mode():
            pushed = push.run(group, noises[: len(group)])
        for i, (mel, (f0, source, audio)) in enumerate(zip(group, pushed, strict=True)):
            eager = StreamingHiFT(hift, lookahead_frames=4)
            static = StreamingHiFT(hift, lookahead_frames=4)
            want = eager.push(mel, False, noises[i])
            got = static.adopt_first_push(mel, noises[i], f0, source, audio)
            assert got.shape == want.shape and got.numel() == (frames - 4) * spf
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            for name in ("received", "emitted", "mel_start", "f0_start", "f0_end", "src_start", "src_end"):
                assert getattr(static, name) == getattr(eager, name), name
            for name in ("mel", "source", "noise", "cycles", "rand_ini"):
                torch.testing.assert_close(getattr(static, name), getattr(eager, name), atol=ATOL, rtol=0)
            # F0 is in Hz (tens to hundreds): within 1e-5 of it (a batched conv sums in another order)
            torch.testing.assert_close(static.f0, eager.f0, atol=ATOL, rtol=ATOL)
            # the next push continues the same state (the tape gives the same draws for the same samples)
            more = tapes[i].span(frames * spf, (frames + 30) * spf)
            torch.testing.assert_close(static.push(mels[i][:, :, frames:], True, more),
                                       eager.push(mels[i][:, :, frames:], True, more), atol=ATOL, rtol=0)
    assert push.record["direct_steps"] == 2


def _own_caches(stream: StreamingSynthesis) -> list[torch.Tensor]:
    """A stream's committed flow state: encoder cache, conv tails, committed keys/values."""
    st = stream.backend.state
    out = [v for v in st.encoder_cache.values() if isinstance(v, torch.Tensor)]
    out += [t for v in st.encoder_cache.values() if isinstance(v, tuple) for t in v]
    for c in st.step_caches:
        for v in c.values():
            if isinstance(v, KVCache):
                if v.length and v.k is not None and v.v is not None:      # uncommitted frames are not state
                    out += [v.k[:, :, : v.length], v.v[:, :, : v.length]]
            elif isinstance(v, torch.Tensor):
                out.append(v)
    return out


@pytest.mark.parametrize("n", [25, 40])
def test_streams_with_static_first_chunks_equal_the_eager_path(setup, n):
    """Three streams of a voice, first chunks batched through the static solver and push, then every later
    chunk: each stream's caches equal the eager ones within 1e-5 (after the first chunk where the eager path
    also leaves them uncommitted, after the second where it had committed), and its audio the eager audio."""
    model, voices, prefixes, token_lists = setup
    graphs = FirstChunkGraphs(model.flow, model.hift, StreamSchedule.fast(HOP), 4, graphs=True)
    graphs.prepare(prefixes[n])

    def streams(static: bool) -> list[StreamingSynthesis]:
        out = []
        for i, toks in enumerate(token_lists):
            s = StreamingSynthesis(model.flow, model.hift, voices[n], StreamSchedule.fast(HOP), prefix=prefixes[n],
                                   seed=i, first_chunk=graphs if static else None)
            for t in toks:
                s.add(t)
            s.finish()
            out.append(s)
        return out

    eager, static = streams(False), streams(True)
    assert all(s.backend.first_flow is not None for s in static)
    audio: dict[bool, list[list[np.ndarray]]] = {False: [[], [], []], True: [[], [], []]}
    rounds = 0
    while any(s.due() for s in eager + static):
        for kind, group in ((False, eager), (True, static)):
            chunks = run_together([s.chunk_steps() for s in group])
            for i, c in enumerate(chunks):
                audio[kind][i].append(c.audio)
        rounds += 1
        deferred = n % 25 >= 15
        if rounds == (2 if deferred else 1):        # where both paths have committed the same tokens
            for e, s in zip(eager, static, strict=True):
                for a, b in zip(_own_caches(e), _own_caches(s), strict=True):
                    # deferred: one commit of two encoder chunks against two commits of one (float order, as
                    # batched against alone in test_batched_flow.py)
                    torch.testing.assert_close(b, a, atol=1e-4 if deferred else ATOL, rtol=0)
    for e, s in zip(audio[False], audio[True], strict=True):
        np.testing.assert_allclose(np.concatenate(s), np.concatenate(e), atol=STREAM_ATOL)
    stats = graphs.stats()
    assert stats["first_chunk_flow_direct"] == 1 and stats["first_push"]["direct_steps"] == 1   # one batch each
