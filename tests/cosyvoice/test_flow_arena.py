"""The flow arena (`flow_arena.py`) and the batched attention over it (`flow_cache.attend_slots`) against
their eager twin, each stream alone on buffers of its own, on the tiny model in float32: streams of two voices
and a cold one at different points, batched with padding, committing and provisional, give each one's mel
within 1e-5 and leave its committed keys, values and conv tails as alone (1e-4); a stream past the frame cap
moves to buffers of its own and still agrees; slots are taken and given back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cv_fixtures import random_voice, tiny_model_and_voice

import assistant.tts.cosyvoice.flow_cache as flow_cache
from assistant.tts.cosyvoice.batch_work import run_grouped, run_together
from assistant.tts.cosyvoice.flow import FlowSolve
from assistant.tts.cosyvoice.flow_arena import FlowArena
from assistant.tts.cosyvoice.flow_cache import KVCache
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import StreamingSynthesis

ATOL = 1e-5
STATE_TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    gen = torch.Generator().manual_seed(5)
    other = random_voice(gen, 37)
    prefixes = [FlowPrefix(model.flow, voice), FlowPrefix(model.flow, other)]
    return model, prefixes, g


def _inputs(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (*(torch.randn(1, 80, n, generator=g) for _ in range(3)), torch.randn(1, 80, generator=g))


def _stream_caches(model, prefixes) -> list[list[dict]]:
    """Voice A, voice B, voice A again, and a cold stream (no prefix)."""
    steps = model.flow.cfg.n_timesteps
    out = [p.fork().step_caches for p in (prefixes[0], prefixes[1], prefixes[0])]
    return [*out, [{"capacity": 0} for _ in range(steps)]]


def _committed(caches: list[dict], layers: list) -> list[torch.Tensor]:
    """A stream's committed keys and values at every step and layer."""
    out = []
    for c in caches:
        for layer in layers:
            kv = c.get(layer)
            if isinstance(kv, KVCache) and kv.length and kv.k is not None and kv.v is not None:
                out += [kv.k[:, :, : kv.length], kv.v[:, :, : kv.length]]
    return out


def _same_state(flow, arena: FlowArena, want: list, batched: list, slots: list, tol: float) -> None:
    """Each stream's committed keys/values and conv tails: in its slot as on its own buffers (``want``), within
    ``tol`` absolute and relative (keys reach ten and more: a float32 ulp there is 1e-6)."""
    for i, slot in enumerate(slots):
        mine, theirs = _committed(batched[i], arena.layers), _committed(want[i], arena.layers)
        assert len(mine) == len(theirs) == 2 * flow.cfg.n_timesteps * len(arena.layers)
        for a, b in zip(theirs, mine, strict=True):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
        tails_want = [c[conv] for c in want[i] for conv in arena.convs]
        tails_arena = [arena.tail_views[s][j][2 * slot : 2 * slot + 2]
                       for s in range(flow.cfg.n_timesteps) for j in range(len(arena.convs))]
        for a, b in zip(tails_want, tails_arena, strict=True):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)


@torch.inference_mode()
def test_batched_attention_over_the_arena_equals_the_loop_and_each_stream_alone(setup, monkeypatch):
    """Four streams (two voices, one cold) at different points, in one padded batch per round, committing and
    provisional: the batch over the arena against the same batch attended stream by stream (its eager twin) and
    against each stream alone: the mel within 1e-5 at every round; the state each leaves (keys, values, conv
    tails: hidden states deep in the U-Net) within 1e-4 absolute and relative, as test_batched_flow.py allows
    for caches (the twin itself is 3.6e-5 from alone: another float summation order)."""
    model, prefixes, _ = setup
    flow = model.flow
    arena = FlowArena(flow.decoder.estimator, flow.cfg.n_timesteps, slots=5, frames=120)
    alone, loop, batched = (_stream_caches(model, prefixes) for _ in range(3))
    slots = [arena.take() for _ in batched]
    assert slots == [0, 1, 2, 3] and arena.free == 1
    for caches, slot, prefix in zip(batched, slots, [*prefixes, prefixes[0], None], strict=False):
        assert slot is not None
        arena.bind(caches, slot, prefix)
    calls = {"slots": 0}
    orig = flow_cache.attend_slots

    def spy(*a, **k):
        calls["slots"] += 1
        return orig(*a, **k)

    monkeypatch.setattr(flow_cache, "attend_slots", spy)
    spks = [_inputs(1, 90 + i)[3] for i in range(4)]
    rounds = [(20, 13, 7, 20, False), (11, 25, 3, 9, False), (6, 6, 6, 16, True), (9, 2, 14, 5, False)]
    for r, (*lengths, provisional) in enumerate(rounds):
        def solves(caches_list: list[list[dict]], r: int = r, lengths: list[int] = lengths,
                   provisional: bool = provisional) -> list[FlowSolve]:
            out = []
            for i, (caches, n) in enumerate(zip(caches_list, lengths, strict=True)):
                z, mu, cond, _ = _inputs(n, 100 * r + i)
                if provisional and i % 2:            # streams 1 and 3 solve provisionally, on throw-away dicts
                    caches = [{**c, "provisional": True} for c in caches]
                out.append(FlowSolve(flow, z, mu, spks[i], cond, caches))
            return out

        want = solves(alone)
        for s in want:
            run_grouped([s])
        twin = solves(loop)
        FlowSolve.run_batch(twin)                    # the batch, each stream attending on its own
        got = solves(batched)
        FlowSolve.run_batch(got)                     # the batch over the arena: two voices and a cold stream
        for a, t, b in zip(want, twin, got, strict=True):
            assert b.result.shape == a.result.shape
            torch.testing.assert_close(b.result, t.result, atol=ATOL, rtol=0)
            torch.testing.assert_close(b.result, a.result, atol=ATOL, rtol=0)
        # the state left: hidden states deep in the U-Net (conv inputs reach tens) a few float32 ulps apart
        _same_state(flow, arena, loop, batched, slots, STATE_TOL)
        _same_state(flow, arena, alone, batched, slots, STATE_TOL)
    assert calls["slots"] == len(rounds) * flow.cfg.n_timesteps * len(arena.layers)
    for slot in slots:
        arena.release(slot)
    assert arena.free == 5
    with pytest.raises(RuntimeError, match="twice"):
        arena.release(0)


@torch.inference_mode()
def test_a_stream_past_the_frame_cap_leaves_the_arena_and_still_agrees(setup):
    model, prefixes, _ = setup
    flow = model.flow
    arena = FlowArena(flow.decoder.estimator, flow.cfg.n_timesteps, slots=2, frames=24)
    alone = [prefixes[0].fork().step_caches for _ in range(2)]
    batched = [prefixes[0].fork().step_caches for _ in range(2)]
    for caches in batched:
        slot = arena.take()
        assert slot is not None
        arena.bind(caches, slot, prefixes[0])
    for r, lengths in enumerate([(20, 10), (10, 10), (7, 3)]):       # stream 0 passes 24 frames in round 2
        want = [FlowSolve(flow, *_inputs(n, 10 * r + i)[:2], _inputs(1, i)[3], _inputs(n, 10 * r + i)[2], c)
                for i, (c, n) in enumerate(zip(alone, lengths, strict=True))]
        for s in want:
            run_grouped([s])
        got = [FlowSolve(flow, *_inputs(n, 10 * r + i)[:2], _inputs(1, i)[3], _inputs(n, 10 * r + i)[2], c)
               for i, (c, n) in enumerate(zip(batched, lengths, strict=True))]
        FlowSolve.run_batch(got)
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b.result, a.result, atol=ATOL, rtol=0)
    layer = arena.layers[0]
    assert batched[0][0][layer].slot is None and batched[0][0][layer].length == 37     # moved out, all kept
    assert batched[1][0][layer].slot is not None and batched[1][0][layer].length == 23  # still in its slot


def test_streams_in_the_arena_give_the_audio_they_give_alone(setup):
    """Whole streams bound to slots (warm voices and a cold one, different first hops), run together, against
    each alone on buffers of its own: the same audio; the slots go back when asked."""
    model, prefixes, g = setup
    voice = tiny_model_and_voice()[1]
    arena = FlowArena(model.flow.decoder.estimator, model.flow.cfg.n_timesteps, slots=3, frames=200)
    tokens = g["e2e.speech_tokens"].tolist()

    def streams(bind: bool) -> list[StreamingSynthesis]:
        out = []
        for i, (prefix, hop) in enumerate([(prefixes[0], 10), (prefixes[0], 7), (None, 10)]):
            s = StreamingSynthesis(model.flow, model.hift, voice, StreamSchedule.fast(hop), prefix=prefix, seed=i)
            if bind:
                assert s.bind_arena(arena)
            for t in tokens[: 80 - 10 * i]:
                s.add(t)
            s.finish()
            out.append(s)
        return out

    def drive(group: list[StreamingSynthesis]) -> list[np.ndarray]:
        audio: list[list[np.ndarray]] = [[] for _ in group]
        while any(s.due() for s in group):
            due = [i for i, s in enumerate(group) if s.due()]
            for i, c in zip(due, run_together([group[i].chunk_steps() for i in due], (14, 20, 50, 100)),
                            strict=True):
                audio[i].append(c.audio)
        return [np.concatenate(a) for a in audio]

    want = drive(streams(False))
    bound = streams(True)
    assert arena.free == 0
    got = drive(bound)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4)           # whole streams: as batched against alone
    for s in bound:
        s.release_arena()
        s.release_arena()                                       # once only, however often asked
    assert arena.free == 3
