"""The chunk scheduler's rounds on the tiny model, driven by hand (no thread): earliest deadline first, batches
filled with streams whose next piece matches, a cold voice's prefix built only when nothing is due and no request
waits for its first audio."""

from __future__ import annotations

import time

import pytest
import torch
from cv_fixtures import tiny_model_and_voice

from assistant.tts.cosyvoice.chunk_scheduler import ChunkWorker
from assistant.tts.cosyvoice.flow_prefix import flow_prefix, prefix_key
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.prompt_cache import PromptCache
from assistant.tts.cosyvoice.schedule import StreamSchedule


@pytest.fixture(scope="module")
def setup():
    model, voice, g = tiny_model_and_voice()
    return model, voice, g["e2e.speech_tokens"].tolist()


def _worker(model, cache: PromptCache, max_batch: int) -> ChunkWorker:
    return ChunkWorker(model.flow, model.hift, cache, sample_rate=24000, max_batch=max_batch)  # not started


def _job(voice, tokens: list[int], name: str, log: list, played_s: float | None) -> SpeechJob:
    """A job whose LLM has produced every token; ``played_s``: audio it has played so far (None: nothing)."""
    job = SpeechJob(torch.zeros(1, 5, dtype=torch.long), voice, None, None, StreamSchedule.fast(),
                    deliver=lambda item: log.append((name, item)), seed=1)
    job.decoded, job.decode_done, job.hi = list(tokens), True, len(tokens)
    job.t_submit = time.perf_counter()
    if played_s is not None:
        job.t_first_audio, job.audio_s = time.perf_counter() - 10.0, played_s
    return job


def _rounds(worker: ChunkWorker, jobs: list[SpeechJob], log: list, n: int) -> list[str]:
    """Run rounds until n chunks were delivered; the names of the jobs, in delivery order."""
    with torch.inference_mode():
        while sum(1 for _, item in log if item is not None and not isinstance(item, BaseException)) < n:
            worker._round([j for j in jobs if not j.cancelled.is_set()])
    return [name for name, item in log if item is not None]


def test_earliest_deadline_first_one_at_a_time(setup):
    model, voice, tokens = setup
    cache = PromptCache()
    flow_prefix(model.flow, voice, cache)
    log: list = []
    # started 10 s ago: their audio runs out in 0.3, 0.6 and 0.9 s
    jobs = [_job(voice, tokens, "late", log, 10.9), _job(voice, tokens, "soon", log, 10.3),
            _job(voice, tokens, "new", log, None), _job(voice, tokens, "middle", log, 10.6)]
    worker = _worker(model, cache, max_batch=1)
    order = _rounds(worker, jobs, log, 8)
    firsts = list(dict.fromkeys(order))            # each job's first chunk, in the order they came
    assert firsts == ["new", "soon", "middle", "late"]
    # "new" has played nothing: first; then it plays (deadline: now + its audio), so it keeps coming before
    # "soon" only while its audio runs out sooner
    assert order[0] == "new" and worker.max_seen_batch == 1


def test_batch_takes_every_matching_stream(setup):
    model, voice, tokens = setup
    cache = PromptCache()
    flow_prefix(model.flow, voice, cache)
    log: list = []
    jobs = [_job(voice, tokens, name, log, s) for name, s in (("a", 12.0), ("b", 11.0), ("c", 13.0))]
    worker = _worker(model, cache, max_batch=4)
    order = _rounds(worker, jobs, log, 3)
    assert sorted(order[:3]) == ["a", "b", "c"] and worker.max_seen_batch == 3
    assert worker.batches < 3 * len(log)            # pieces shared calls


def test_cold_voice_starts_at_once_and_its_prefix_is_built_when_idle(setup):
    model, voice, tokens = setup
    cache = PromptCache()
    log: list = []
    job = _job(voice, tokens[:13], "cold", log, None)
    job.decode_done = False                        # the LLM is still decoding: no more chunks due after one
    worker = _worker(model, cache, max_batch=4)
    _rounds(worker, [job], log, 1)
    assert job.stats["cold_voice"] == 1.0 and cache.get("flow", prefix_key(model.flow, voice)) is None
    arriving = _job(voice, tokens, "arriving", log, None)
    worker.expect(arriving)                        # submitted, still in its prefill: no first audio yet
    batches = worker.batches
    with torch.inference_mode():
        worker._round([job])
    assert worker.batches == batches, "a build piece ran while a request waited for its first audio"
    arriving.cancel()                              # gone before it started: the builds go on
    with torch.inference_mode():
        while worker._builds:                      # nothing due: each round builds one piece of the prefix
            worker._round([job])
    assert worker.stats()["prefixes_built"] == 1 and cache.get("flow", prefix_key(model.flow, voice)) is not None
