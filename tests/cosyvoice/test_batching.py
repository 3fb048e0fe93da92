"""The engine-wide batcher on the tiny model: batched decode == alone, isolation, cancel, busy, text streaming."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from cv_fixtures import need_fixtures, tiny_model_and_voice

from assistant.config import TTSConfig
from assistant.tts.base import TTSRequest
from assistant.tts.cosyvoice.admission import EngineBusy
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.slot_decoder import SlotDecoder
from tests.waiting import until

AUDIO_ATOL = 1e-4  # float32 summation order (batched vs one stream: 2e-5 seen)


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    return model, voice, g


def _engine(model, **kw):
    from assistant.tts.cosyvoice.engine import CosyVoiceEngine

    engine = CosyVoiceEngine(TTSConfig(engine="cosyvoice2", model_dir=str(need_fixtures()), **kw))
    engine.attach(model)
    return engine


@torch.inference_mode()
def _greedy_slot_tokens(model, dec: SlotDecoder, inputs: list[torch.Tensor], n: int) -> list[list[int]]:
    """Decode n greedy tokens for each prompt, all slots stepped together."""
    lm = model.llm
    out: list[list[int]] = [[] for _ in inputs]
    nxt, pos = [], []
    for slot, x in enumerate(inputs):
        h = dec.prefill(slot, x[0])
        out[slot].append(int(lm.logp_from_hidden(h).argmax()))
        nxt.append(lm.speech_embedding.weight[out[slot][-1]])
        pos.append(x.size(1))
    for _ in range(n - 1):
        h = dec.decode(torch.stack(nxt), torch.tensor(pos))
        logp = lm.logp_from_hidden(h)
        for s in range(len(inputs)):
            out[s].append(int(logp[s].argmax()))
            nxt[s] = lm.speech_embedding.weight[out[s][-1]]
            pos[s] += 1
    return out


def test_slot_decoder_matches_reference_and_is_batch_invariant(setup):
    model, _, g = setup
    lm = model.llm
    ref_input = lm.build_lm_input(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    others = [lm.build_lm_input(g["in.e2e_text_token"], None, None),
              lm.build_lm_input(g["in.text_token"][:, :5], g["in.prompt_text_token"], None)]
    alone = [_greedy_slot_tokens(model, SlotDecoder(lm, 1, 256), [x], 30)[0] for x in [ref_input, *others]]
    assert alone[0] == g["llm.greedy_tokens"].reshape(-1).tolist()[:30]  # the reference's greedy tokens
    hf = list(lm.generate(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"],
                          sampler=lm.make_sampler(greedy=True), min_len=30, max_len=30))
    assert alone[0] == hf
    together = _greedy_slot_tokens(model, SlotDecoder(lm, 3, 256), [ref_input, *others], 30)
    assert together == alone


async def _collect(engine, voice, g, seed=0, tokens=None, schedule=None):
    chunks = []
    async for c in engine.stream_ids(g["in.e2e_text_token"], voice, prompt_text_ids=g["in.prompt_text_token"],
                                     greedy=True, seed=seed, tokens=tokens, schedule=schedule):
        chunks.append(c)
    return chunks


def test_concurrent_requests_equal_each_alone(setup):
    model, voice, g = setup
    engine = _engine(model, max_concurrent=2)

    async def run():
        await engine.prepare_voice(voice)                 # warm: every request forks the same prefix
        alone = await _collect(engine, voice, g)
        both = await asyncio.gather(_collect(engine, voice, g), _collect(engine, voice, g, tokens=60))
        alone60 = await _collect(engine, voice, g, tokens=60)
        await engine.close()
        return alone, both, alone60

    alone, (a, b), alone60 = asyncio.run(run())
    # first chunk: 10 tokens (made once 13 exist; decoding runs on meanwhile, so more may exist by then)
    assert alone[0].covers == (0, 10) and alone[0].tokens_seen >= 13
    audio = np.concatenate([c.audio for c in alone])
    assert audio.size == 100 * 960  # the golden e2e: 100 greedy tokens, eos never sampled
    # batched flow and vocoder calls sum in another order than one stream's: float32 rounding only
    np.testing.assert_allclose(np.concatenate([c.audio for c in a]), audio, atol=AUDIO_ATOL)
    np.testing.assert_allclose(np.concatenate([c.audio for c in b]), np.concatenate([c.audio for c in alone60]),
                               atol=AUDIO_ATOL)
    assert engine.batcher.decoder.batch_rows > engine.batcher.decoder.steps  # some decode steps were batched
    assert engine.stats()["max_flow_batch"] >= 2               # and some flow / vocoder calls


def test_cancel_frees_slot_and_busy_when_full(setup):
    model, voice, g = setup
    engine = _engine(model, max_concurrent=1, max_waiting=1)

    async def run():
        b = engine.batcher
        first = engine.stream_ids(g["in.e2e_text_token"], voice, greedy=True, tokens=400)
        await first.__anext__()                  # running, holds the slot
        second = engine.stream_ids(g["in.e2e_text_token"], voice, greedy=True, tokens=20)
        task = asyncio.create_task(second.__anext__())  # waits for the slot
        await until(lambda: b.tickets == 2, "the second request to wait for the slot")
        with pytest.raises(EngineBusy):
            await engine.stream_ids(g["in.e2e_text_token"], voice, tokens=20).__anext__()
        await first.aclose()                     # barge-in: released at once
        assert b.tickets == 1
        await asyncio.wait_for(task, 10)         # the waiting one now runs
        async for _ in second:
            pass
        await until(lambda: b.running() == 0, "the batcher to be idle")
        assert b.tickets == 0
        await engine.close()

    asyncio.run(run())


def test_official_schedule_through_engine(setup):
    model, voice, g = setup
    engine = _engine(model, max_concurrent=1)

    async def run():
        out = await _collect(engine, voice, g, schedule=StreamSchedule.official())
        await engine.close()
        return out

    chunks = asyncio.run(run())
    assert [c.covers for c in chunks] == [(0, 25), (25, 75), (75, 100)]
    assert [c.tokens_seen >= n for c, n in zip(chunks, [28, 78, 100], strict=True)] == [True] * 3


def test_synthesize_stream_speaks_clauses_as_text_arrives(setup, monkeypatch):
    """Text deltas in (no tokenizer in the tiny fixture: characters become ids), audio per clause out."""
    model, _, _ = setup
    engine = _engine(model, max_concurrent=1)
    monkeypatch.setattr(model.frontend, "encode", lambda s: [ord(c) % 1000 for c in s])
    monkeypatch.setattr(model, "plan", lambda text, instruct=None, language=None: ([text], None))
    spoken: list[str] = []
    orig = engine._speak

    def spy(m, text, *a):
        spoken.append(text)
        return orig(m, text, *a)

    monkeypatch.setattr(engine, "_speak", spy)

    async def deltas():
        for piece in ["Hello there, my", " friend. How are", " you today?"]:
            yield piece
            await asyncio.sleep(0)

    async def run():
        n = 0
        async for audio in engine.synthesize_stream(deltas(), TTSRequest(text="", seed=1)):
            n += audio.size
        await engine.close()
        return n

    total = asyncio.run(run())
    assert total > 0 and len(spoken) >= 2
    assert "".join(spoken).replace(" ", "") == "Hellothere,myfriend.Howareyoutoday?"


def test_static_decode_step_traced_on_cpu_equals_eager(setup):
    """The decode step a GPU replays as a CUDA graph (every slot, static buffers, the whole cache as keys),
    run through the same code on the CPU with the capture skipped: the same greedy tokens as eager decoding,
    with a free slot among the live ones, and every run counted."""
    from assistant.tts.cosyvoice.slot_decoder import StaticDecodeStep

    model, _, g = setup
    lm = model.llm
    inputs = [lm.build_lm_input(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"]),
              lm.build_lm_input(g["in.e2e_text_token"], None, None)]
    eager = _greedy_slot_tokens(model, SlotDecoder(lm, 2, 128), inputs, 20)
    dec = SlotDecoder(lm, 3, 128)
    emb = lm.speech_embedding.weight
    x = torch.zeros(3, emb.size(1))
    pos = torch.zeros(3, dtype=torch.long)
    step = StaticDecodeStep(dec, x, pos, cuda_graph=True)
    assert step.capture()["path"] == "static step (cpu, capture skipped)"
    out: list[list[int]] = [[], []]
    with torch.inference_mode():
        for slot, inp in zip((0, 2), inputs, strict=True):          # slot 1 stays free
            h = dec.prefill(slot, inp[0])
            out[slot // 2].append(int(lm.logp_from_hidden(h).argmax()))
            x[slot] = emb[out[slot // 2][-1]]
            pos[slot] = inp.size(1)
        for _ in range(19):
            h = step()
            for row, slot in enumerate((0, 2)):
                out[row].append(int(lm.logp_from_hidden(h[slot]).argmax()))
                x[slot] = emb[out[row][-1]]
            pos[[0, 2]] += 1
    assert out == eager
    assert step.record["direct_steps"] == 19 and step.record["replays"] == 0


def test_sampling_inside_the_static_step_gives_exactly_the_eager_tokens(setup):
    """The decode step with its sampling inside (what a GPU replays as one graph), traced on the CPU: seeded
    (sampled, not greedy) jobs draw exactly the eager path's tokens, a held job (not stepped for a while) and a
    free slot keep their state untouched, every slot's state ends as the eager path leaves it, and a job alone
    draws the tokens it draws inside the batch."""
    from assistant.tts.cosyvoice.decode_state import DecodeState
    from assistant.tts.cosyvoice.jobs import SpeechJob
    from assistant.tts.cosyvoice.prompt_cache import PromptCache

    model, voice, g = setup
    texts = (g["in.e2e_text_token"], g["in.text_token"], g["in.e2e_text_token"][:, :5])

    def run(static: bool, which: tuple[int, ...] = (0, 1, 2)) -> tuple[list[list[int]], DecodeState]:
        state = DecodeState(model.llm, 4, 256, cuda_graphs=False, static_step=static)
        cache = PromptCache()
        jobs = [SpeechJob(texts[i], voice, g["in.prompt_text_token"] if i == 1 else None, None,
                          StreamSchedule.fast(), lambda item: None, seed=100 + i, ignore_eos=i == 2) for i in which]
        with torch.inference_mode():
            prompts = [state.prompt(j, cache) for j in jobs]
            for j, slot in zip(jobs, (0, 2, 3), strict=False):                # slot 1 stays free
                j.slot = slot
            out = [[int(t)] for t in state.start(jobs, prompts)]
            for step in range(30):
                stepping = jobs if step < 10 or step >= 20 else jobs[:2]     # job 2 held for ten steps
                for j, t in zip(stepping, state.step(stepping).tolist(), strict=True):
                    out[jobs.index(j)].append(t)
        return out, state

    eager, eager_state = run(False)
    static, static_state = run(True)
    assert static == eager
    assert len({tuple(t) for t in eager}) == 3 and all(len(t) > 20 for t in eager)
    for name in ("_next", "_pos", "_steps", "_recent"):
        torch.testing.assert_close(getattr(static_state, name), getattr(eager_state, name), atol=1e-6, rtol=0)
    assert static_state.path["direct_steps"] == 30 and eager_state.path["path"] == "eager (cpu)"
    alone, _ = run(True, (0,))
    assert alone[0] == static[0]


def test_batcher_on_the_static_step(setup):
    """The workers' graphed paths, traced on the CPU: the decode step with its sampling and a prepared voice's
    static first chunk (flow, vocoder). Two seeded requests give the same audio as on the eager path, their
    first chunks ran as one static batch, and the records say which paths ran."""
    from assistant.tts.cosyvoice.batching import SpeechBatcher
    from assistant.tts.cosyvoice.flow_prefix import flow_prefix
    from assistant.tts.cosyvoice.job_runner import job_args, run_job

    model, voice, g = setup

    async def one(static: bool):
        batcher = SpeechBatcher(model.llm, model.flow, model.hift, slots=2, max_positions=256, static_step=static,
                                static_chunks=static)
        prepared = batcher.prepare_voice(flow_prefix(model.flow, voice, batcher.cache))

        async def request(seed: int) -> np.ndarray:
            args = job_args(model, g["in.e2e_text_token"], voice, None, 1.0, seed, StreamSchedule.fast(), tokens=40)
            return np.concatenate([c.audio async for c in run_job(batcher, args)])

        audio = await asyncio.gather(request(5), request(6))
        stats = batcher.stats()
        batcher.close()
        return audio, stats, prepared

    eager, eager_stats, eager_prepared = asyncio.run(one(False))
    static, static_stats, prepared = asyncio.run(one(True))
    assert eager_stats["decode_path"]["path"] == "eager (cpu)" and eager_stats["first_chunk_path"] == "eager"
    assert eager_prepared["path"].startswith("eager")
    assert static_stats["decode_path"]["path"] == "static step (cpu, capture skipped)"
    assert static_stats["decode_path"]["direct_steps"] == static_stats["decode_steps"] > 0
    assert prepared["flow"]["path"] == static_stats["first_chunk_path"] == "static step (cpu, capture skipped)"
    assert static_stats["first_chunk_flow_direct"] >= 1 and static_stats["first_push"]["direct_steps"] >= 1
    for a, b in zip(eager, static, strict=True):
        np.testing.assert_allclose(b, a, atol=AUDIO_ATOL)


def test_prefills_of_different_lengths_in_one_forward_equal_each_alone(setup):
    """Jobs starting together are prefilled in one forward: each row's last hidden state and its slot's keys
    and values equal its own prefill (one with a cached prompt start, one without, different lengths)."""
    model, _, g = setup
    lm = model.llm
    head, rest = lm.build_lm_input_parts(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    other = lm.build_lm_input(g["in.e2e_text_token"], None, None)
    alone = SlotDecoder(lm, 3, 128)
    past = alone.prefix_kv(head[0])
    want = [alone.prefill(0, rest[0], past), alone.prefill(2, other[0])]
    together = SlotDecoder(lm, 3, 128)
    got = together.prefill_many([0, 2], [rest[0], other[0]], [past, None])
    for i, slot, n in ((0, 0, head.size(1) + rest.size(1)), (1, 2, other.size(1))):
        torch.testing.assert_close(got[i], want[i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together.k_cache[:, slot, :, :n], alone.k_cache[:, slot, :, :n], atol=1e-5,
                                   rtol=1e-5)
    assert rest.size(1) != other.size(1)


def test_static_prefill_equals_the_eager_prefill_alone_and_in_a_padded_batch(setup):
    """The prefill a GPU replays per (batch, length) bucket, run directly on the CPU with its static buffers: one
    prompt alone and three (one with a cached start, different lengths) in the bucket of four give the eager
    prefill's last hidden states and keys/values within 1e-5; a slot no request holds is left as it was."""
    from assistant.tts.cosyvoice.prefill_graphs import StaticPrefill

    model, _, g = setup
    lm = model.llm
    head, rest = lm.build_lm_input_parts(g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    others = [lm.build_lm_input(g["in.e2e_text_token"], None, None), lm.build_lm_input(g["in.text_token"], None, None)]
    with torch.inference_mode():
        eager = SlotDecoder(lm, 4, 256)
        past = eager.prefix_kv(head[0])
        xs, pasts, slots = [rest[0], others[0][0], others[1][0]], [past, None, None], [0, 2, 3]
        want_one = eager.prefill(0, rest[0], past).clone()
        want_kv = eager.k_cache[:, 0].clone(), eager.v_cache[:, 0].clone()
        want = eager.prefill_many(slots, xs, pasts)
        static = SlotDecoder(lm, 4, 256)
        static.k_cache[:, 1] = 7.0                                   # a slot no request holds
        graphs = StaticPrefill(static, (1, 4), graph=True, lengths=(64, 128))
        assert graphs.fits(xs, pasts) and graphs.record["path"] == "static step (cpu, capture skipped)"
        one = graphs.run([0], xs[:1], pasts[:1])
        torch.testing.assert_close(one[0], want_one, atol=1e-5, rtol=0)
        n = head.size(1) + rest.size(1)
        torch.testing.assert_close(static.k_cache[:, 0, :, :n], want_kv[0][:, :, :n], atol=1e-5, rtol=0)
        got = graphs.run(slots, xs, pasts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for slot, length in zip(slots, [n, others[0].size(1), others[1].size(1)], strict=True):
        for cache in ("k_cache", "v_cache"):
            torch.testing.assert_close(getattr(static, cache)[:, slot, :, :length],
                                       getattr(eager, cache)[:, slot, :, :length], atol=1e-5, rtol=0)
    assert bool((static.k_cache[:, 1] == 7.0).all())
    assert graphs.record["direct_steps"] == 2 and len({x.size(0) for x in xs}) == 3


def test_first_packets_first_holds_jobs_past_their_first_chunk_tokens_and_admits_one_at_a_time(setup):
    from assistant.tts.cosyvoice.decode_worker import admissible, first_packets_first
    from assistant.tts.cosyvoice.jobs import SpeechJob

    _, voice, g = setup

    def job(decoded: int, played: bool) -> SpeechJob:
        j = SpeechJob(g["in.e2e_text_token"], voice, None, None, StreamSchedule.fast(), lambda item: None)
        j.decoded = list(range(decoded))
        j.t_first_audio = 1.0 if played else None
        return j

    short, ready, playing = job(5, False), job(13, False), job(40, True)
    jobs = [short, ready, playing]
    assert first_packets_first(jobs, first_chunks=False, lookahead=3) == jobs        # no first chunk under way
    assert first_packets_first(jobs, first_chunks=True, lookahead=3) == [short]      # only tokens a first needs
    # waiting jobs start one at a time, once no running job is short of its first chunk's tokens
    assert admissible(3, jobs, lookahead=3) == 0
    assert admissible(3, [ready, playing], lookahead=3) == 1
    assert admissible(0, [ready, playing], lookahead=3) == 0


def test_held_decoding_changes_no_audio_and_ends(setup):
    """With the hold on (the CPU default) and off, two concurrent requests give the same audio; with it on,
    the decode thread really did wait while the first chunks ran."""
    model, voice, g = setup

    async def run(hold: bool) -> tuple[list, dict]:
        engine = _engine(model, max_concurrent=2)
        engine.batcher.decoder.hold_ahead = hold
        await engine.prepare_voice(voice)
        # long enough that the LLM is still decoding while the first chunks run
        both = await asyncio.gather(_collect(engine, voice, g, seed=1, tokens=400),
                                    _collect(engine, voice, g, seed=2, tokens=300))
        stats = engine.stats()
        await engine.close()
        return both, stats

    held, stats_held = asyncio.run(run(True))
    free, stats_free = asyncio.run(run(False))
    assert stats_held["decode_held_s"] > 0 and stats_free["decode_held_s"] == 0
    for a, b in zip(held, free, strict=True):
        np.testing.assert_allclose(np.concatenate([c.audio for c in a]), np.concatenate([c.audio for c in b]),
                                   atol=AUDIO_ATOL)
