"""``CosyVoiceEngine``: CosyVoice2 behind the ``TTSEngine`` protocol, streaming, many sessions per process.

One `SpeechBatcher` (one worker thread, one device) serves every session: it batches the LLM decode steps of
all active requests and makes each request's audio chunks on its streaming schedule (`streaming.py`).
Chunks travel from the worker to the awaiting consumer through an ``asyncio.Queue`` filled with
``loop.call_soon_threadsafe``: nothing sleeps or polls.

Text can stream in too: `synthesize_stream` takes the pieces of one reply as the speech path's chunker
releases them (an LLM reply as it is written) and speaks them one after another in one admission slot;
audio of piece k plays while piece k+1 is still being written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import numpy as np
import torch

from assistant.config import TTSConfig
from assistant.tts.base import LANGUAGES, SPEED_RANGE, ReferenceClip, TTSCapabilities, TTSRequest, TTSUnsupported
from assistant.tts.cosyvoice.batching import EngineBusy, SpeechBatcher, SpeechJob, Ticket
from assistant.tts.cosyvoice.model import CosyVoice2
from assistant.tts.cosyvoice.streaming import Chunk, StreamSchedule
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, VoiceCloningUnavailable

log = logging.getLogger(__name__)

WARMUP_TEXT = "Hello."
WARMUP_TOKENS = 40  # speech tokens per warm-up run: first chunk, a growing hop and a final chunk


class CosyVoiceEngine:
    """Streaming TTS engine over our CosyVoice2 implementation."""

    name = "cosyvoice2"
    sample_rate = 24000
    capabilities = TTSCapabilities(
        voice_cloning=True, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES
    )

    def __init__(self, cfg: TTSConfig, voices_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.voices_dir = voices_dir
        # Loading and voice encoding (ONNX) run here; synthesis runs in the batcher's own thread.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyvoice")
        self._model: CosyVoice2 | None = None
        self._batcher: SpeechBatcher | None = None
        self._loading: asyncio.Future[CosyVoice2] | None = None
        self.schedule = StreamSchedule.named(
            cfg.stream_schedule, cfg.first_chunk_tokens, cfg.first_chunk_steps or None
        )

    # --- lifecycle ----------------------------------------------------------------------------------------

    def _load(self) -> CosyVoice2:
        model = CosyVoice2.from_dir(self.cfg.model_dir, self.cfg.device, self.cfg.dtype, self.voices_dir)
        self.attach(model)
        return model

    def attach(self, model: CosyVoice2) -> None:
        """Use an already loaded model (tests, bench) and start the batcher over it."""
        self._model = model
        self.sample_rate = model.sample_rate
        if not model.voice_encoder.available:
            self.capabilities = TTSCapabilities(
                voice_cloning=False, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES
            )
        cuda = torch.device(model.device).type == "cuda"
        self._batcher = SpeechBatcher(
            model.llm,
            model.flow,
            model.hift,
            slots=self.cfg.max_concurrent,
            max_waiting=self.cfg.max_waiting,
            max_positions=self.cfg.max_positions,
            cuda_graphs=self.cfg.cuda_graphs and cuda,
            sample_rate=model.sample_rate,
        )

    async def model(self) -> CosyVoice2:
        """The loaded model; the first caller starts loading it."""
        if self._model is not None:
            return self._model
        if self._loading is None:
            self._loading = asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        return await self._loading

    @property
    def batcher(self) -> SpeechBatcher:
        if self._batcher is None:
            raise RuntimeError("model not loaded yet (await engine.model())")
        return self._batcher

    async def warmup(self) -> None:
        """Run every slot once with fixed-length dummy text so kernels, graphs and caches are warm."""
        model = await self.model()
        t0 = time.perf_counter()
        try:
            voice = model.resolve_voice(self.cfg.voice or None)
        except KeyError:
            voice = self._dummy_voice(model)
        n = max(1, min(self.cfg.max_concurrent, 4))
        text = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))

        async def one() -> None:
            async for _ in self.stream_ids(text, voice, tokens=WARMUP_TOKENS, seed=0):
                pass

        await asyncio.gather(*(one() for _ in range(n)))
        log.info("cosyvoice2 warm-up (%d streams) took %.2f s", n, time.perf_counter() - t0)

    @staticmethod
    def _dummy_voice(model: CosyVoice2) -> CosyVoicePrompt:
        from assistant.tts.cosyvoice.model import empty_voice

        return empty_voice(model.device)

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- voices -------------------------------------------------------------------------------------------

    async def add_voice(self, voice_id: str, clip: ReferenceClip) -> CosyVoicePrompt:
        model = await self.model()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, model.add_voice, voice_id, clip.audio, clip.sample_rate, clip.text
            )
        except VoiceCloningUnavailable as exc:
            raise TTSUnsupported(str(exc)) from exc

    def _voice_for(self, model: CosyVoice2, request: TTSRequest) -> CosyVoicePrompt:
        if request.reference is not None:
            ref = request.reference
            if not model.voice_encoder.available:
                raise TTSUnsupported("voice cloning unavailable: the model directory lacks the ONNX front-end files")
            return model.voice_encoder.encode("", ref.audio, ref.sample_rate, ref.text)
        try:
            return model.resolve_voice(request.voice or self.cfg.voice or None)
        except KeyError as exc:
            raise TTSUnsupported(str(exc)) from exc

    # --- the streaming core -------------------------------------------------------------------------------

    async def _run_job(self, job_args: dict, ticket: Ticket | None = None) -> AsyncIterator[Chunk]:
        """Submit one job and yield its chunks as the worker makes them; closing the iterator cancels it.

        Without a ``ticket`` one is reserved (and released) here; `EngineBusy` when none is free.
        """
        await self.model()
        batcher = self.batcher
        own = ticket is None
        ticket = ticket or batcher.reserve()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()

        def deliver(item: Chunk | BaseException | None) -> None:  # worker thread
            loop.call_soon_threadsafe(queue.put_nowait, item)

        job = SpeechJob(deliver=deliver, **job_args)
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

    def _job_args(
        self,
        model: CosyVoice2,
        text_ids: torch.Tensor,
        voice: CosyVoicePrompt,
        instruct_ids: torch.Tensor | None,
        speed: float,
        seed: int | None,
        greedy: bool = False,
        schedule: StreamSchedule | None = None,
        tokens: int | None = None,
    ) -> dict:
        """Keyword arguments of a `SpeechJob` in the mode the inputs select (see model.py's table)."""
        if instruct_ids is not None:
            prompt_text, prompt_speech = instruct_ids, None
        else:
            prompt_text = model._prompt_text_ids(voice)
            prompt_speech = voice.speech_tokens if prompt_text is not None else None
        lo, hi = SPEED_RANGE
        if not lo <= speed <= hi:
            raise TTSUnsupported(f"speed {speed} outside {lo}-{hi}")
        return dict(
            text_ids=text_ids,
            voice=voice,
            prompt_text=prompt_text,
            prompt_speech=prompt_speech,
            schedule=schedule or self.schedule,
            sampler=model.make_sampler(seed, greedy),
            min_tokens=tokens,
            max_tokens=tokens,
            ignore_eos=tokens is not None,
            speed=speed,
            seed=seed,
        )

    async def stream_ids(
        self,
        text_ids: torch.Tensor,
        voice: CosyVoicePrompt,
        *,
        prompt_text_ids: torch.Tensor | None = None,
        schedule: StreamSchedule | None = None,
        seed: int | None = None,
        greedy: bool = False,
        tokens: int | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[Chunk]:
        """Token-level streaming (no tokenizer needed): text ids [1, T] → `Chunk`s with their statistics.

        ``prompt_text_ids`` selects zero-shot mode with the voice's speech tokens; ``tokens`` forces exactly
        that many speech tokens (eos ignored; benchmarks).
        """
        model = await self.model()
        if prompt_text_ids is not None:
            voice = CosyVoicePrompt(**{**voice.__dict__, "prompt_text_tokens": prompt_text_ids})
        args = self._job_args(model, text_ids, voice, None, speed, seed, greedy, schedule, tokens)
        async with aclosing(self._run_job(args)) as chunks:  # closing us closes the job at once
            async for chunk in chunks:
                yield chunk

    # --- the TTSEngine protocol ---------------------------------------------------------------------------

    def _check(self, request: TTSRequest) -> None:
        if request.pitch:
            raise TTSUnsupported("cosyvoice2 has no native pitch shift")
        if request.language and request.language not in LANGUAGES:
            raise TTSUnsupported(f"language {request.language!r} not supported")

    async def _speak(
        self, model: CosyVoice2, text: str, request: TTSRequest, voice: CosyVoicePrompt, ticket: Ticket
    ) -> AsyncIterator[np.ndarray]:
        sentences, instruct = model.plan(text, request.instruct, request.language)
        instruct_ids = torch.tensor([model.frontend.encode(instruct)], dtype=torch.long) if instruct else None
        for sentence in sentences:
            text_ids = torch.tensor([model.frontend.encode(sentence)], dtype=torch.long)
            args = self._job_args(model, text_ids, voice, instruct_ids, request.speed, request.seed)
            async with aclosing(self._run_job(args, ticket)) as chunks:
                async for chunk in chunks:
                    if chunk.audio.size:
                        yield chunk.audio

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """Stream 24 kHz float32 chunks, sentence after sentence; `EngineBusy` when no place is free.

        Cancelling (``aclose`` / task cancel) frees the request's place at once and stops its decoding at
        the worker's next step.
        """
        self._check(request)
        model = await self.model()
        ticket = self.batcher.reserve()
        try:
            voice = await asyncio.get_running_loop().run_in_executor(self._executor, self._voice_for, model, request)
            async with aclosing(self._speak(model, request.text, request, voice, ticket)) as audio_chunks:
                async for audio in audio_chunks:
                    yield audio
        finally:
            ticket.release()

    async def synthesize_stream(
        self, pieces: AsyncIterator[str], request: TTSRequest | None = None
    ) -> AsyncIterator[np.ndarray]:
        """Speak one reply whose text is still being written, piece by piece, in one admission place.

        ``pieces`` come already chunked (the speech path's ``TextChunker``): each is spoken as it is, as soon
        as it arrives, while later pieces queue up. ``request`` carries voice, language, speed, seed and
        instruction (its ``text`` is ignored).
        """
        request = request or TTSRequest(text="")
        self._check(request)
        model = await self.model()
        ticket = self.batcher.reserve()
        queued: asyncio.Queue[str | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for piece in pieces:
                    queued.put_nowait(piece)
            finally:
                queued.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            voice = await asyncio.get_running_loop().run_in_executor(self._executor, self._voice_for, model, request)
            while (piece := await queued.get()) is not None:
                if piece.strip():
                    async with aclosing(self._speak(model, piece, request, voice, ticket)) as audio_chunks:
                        async for audio in audio_chunks:
                            yield audio
            await reader  # surface the text source's errors
        finally:
            reader.cancel()
            ticket.release()


__all__ = ["CosyVoiceEngine", "EngineBusy"]
