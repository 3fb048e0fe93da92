"""One synthesis job seen from the event loop: its keyword arguments from a request's inputs, and its chunks
awaited as the worker threads make them.

Chunks travel from the chunk thread to the awaiting consumer through an ``asyncio.Queue`` filled with
``loop.call_soon_threadsafe``: nothing sleeps or polls. Closing the iterator cancels the job at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from functools import partial

import torch

from assistant.tts.base import SPEED_RANGE, TTSUnsupported
from assistant.tts.cosyvoice.admission import Ticket
from assistant.tts.cosyvoice.batching import SpeechBatcher
from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import Chunk
from assistant.tts.cosyvoice.voice import CosyVoicePrompt


def job_args(
    model: CosyVoice2,
    text_ids: torch.Tensor,
    voice: CosyVoicePrompt,
    instruct_ids: torch.Tensor | None,
    speed: float,
    seed: int | None,
    schedule: StreamSchedule,
    greedy: bool = False,
    tokens: int | None = None,
) -> partial[SpeechJob]:
    """A `SpeechJob` in the mode the inputs select (see cosyvoice2.py's table), all but where its chunks go
    (``deliver``, given by `run_job`); ``tokens`` forces exactly that many speech tokens (eos ignored; benchmarks)."""
    prompt_text: torch.Tensor | None
    prompt_speech: torch.Tensor | None
    if instruct_ids is not None:
        prompt_text, prompt_speech = instruct_ids, None
    else:
        prompt_text = model.prompt_text_ids(voice)
        prompt_speech = voice.speech_tokens if prompt_text is not None else None
    lo, hi = SPEED_RANGE
    if not lo <= speed <= hi:
        raise TTSUnsupported(f"speed {speed} outside {lo}-{hi}")
    return partial(
        SpeechJob,
        text_ids=text_ids,
        voice=voice,
        prompt_text=prompt_text,
        prompt_speech=prompt_speech,
        schedule=schedule,
        greedy=greedy,
        min_tokens=tokens,
        max_tokens=tokens,
        ignore_eos=tokens is not None,
        speed=speed,
        seed=seed,
    )


async def run_job(
    batcher: SpeechBatcher, args: partial[SpeechJob], ticket: Ticket | None = None
) -> AsyncGenerator[Chunk, None]:
    """Submit one job and yield its chunks as the workers make them; closing the iterator cancels it.

    Without a ``ticket`` one is reserved (and released) here; `EngineBusy` when none is free.
    """
    own = ticket is None
    ticket = ticket or batcher.reserve()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()

    def deliver(item: Chunk | BaseException | None) -> None:  # worker thread
        loop.call_soon_threadsafe(queue.put_nowait, item)

    job = args(deliver=deliver)
    batcher.submit(job)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        batcher.cancel(job)  # no-op once finished; frees the slot of an abandoned stream
        if own:
            ticket.release()


__all__ = ["job_args", "run_job"]
