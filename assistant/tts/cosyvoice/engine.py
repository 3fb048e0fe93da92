"""``CosyVoiceEngine``: CosyVoice2 behind the ``TTSEngine`` protocol, streaming, many sessions per process.

One `SpeechBatcher` (a decode thread and a chunk thread, one device) serves every session: it batches the LLM
decode steps of all active requests and, beside them, the flow and vocoder work of their audio chunks, each
request on its streaming schedule (`streaming.py`). Jobs are submitted and awaited by `job_runner.py`.

A voice costs its prompt once: the engine's `PromptCache` (LRU by bytes, ``tts.prompt_cache_mb``) keeps by
content hash the voice of a reference clip, the flow's prompt state and the LLM's prompt start; `cache_stats`
and `stats` expose its counters and the decode path (CUDA graph or eager, and what the capture cost).

Text can stream in too: `synthesize_stream` takes the pieces of one reply as the speech path's chunker
releases them (an LLM reply as it is written) and speaks them one after another in one admission slot;
audio of piece k plays while piece k+1 is still being written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path

import numpy as np
import torch

from assistant.config import TTSConfig
from assistant.tts.base import LANGUAGES, ReferenceClip, TTSCapabilities, TTSRequest, TTSUnsupported
from assistant.tts.cosyvoice import SAMPLE_RATE
from assistant.tts.cosyvoice.admission import EngineBusy, Ticket
from assistant.tts.cosyvoice.batching import SpeechBatcher
from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2, empty_voice
from assistant.tts.cosyvoice.flow_prefix import flow_prefix
from assistant.tts.cosyvoice.job_runner import job_args, run_job
from assistant.tts.cosyvoice.prompt_cache import PromptCache, digest
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import Chunk
from assistant.tts.cosyvoice.vocoding import stream_sync
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, VoiceCloningUnavailable

log = logging.getLogger(__name__)

WARMUP_TEXT = "Hello."
WARMUP_TOKENS = 40  # speech tokens per warm-up run: first chunk, a growing hop and a final chunk
VOCODERS = ("hifigan", "hift")  # HiFT: a HiFi-GAN-family vocoder (iSTFT head); clients send either name


class CosyVoiceEngine:
    """Streaming TTS engine over our CosyVoice2 implementation."""

    name = "cosyvoice2"
    sample_rate = SAMPLE_RATE
    capabilities = TTSCapabilities(
        voice_cloning=True, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES,
        vocoders=VOCODERS,
    )

    def __init__(self, cfg: TTSConfig, voices_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.voices_dir = voices_dir
        # Loading and voice encoding (ONNX) run here; synthesis runs in the batcher's own thread.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyvoice")
        self._model: CosyVoice2 | None = None
        self._batcher: SpeechBatcher | None = None
        self._loading: asyncio.Future[CosyVoice2] | None = None
        # Voices' computed prompts (clip features, flow prefix, LLM prompt start) by content hash.
        self.prompt_cache = PromptCache(int(cfg.prompt_cache_mb) << 20)
        self.schedule = StreamSchedule.named(
            cfg.stream_schedule, cfg.first_chunk_tokens, cfg.first_chunk_steps or None
        )

    # --- lifecycle ----------------------------------------------------------------------------------------

    def _load(self) -> CosyVoice2:
        model = CosyVoice2.from_dir(self.cfg.model_dir, self.cfg.device, self.cfg.dtype, self.voices_dir)
        self.attach(model)
        return model

    def attach(self, model: CosyVoice2, *, static_paths: bool = False) -> None:
        """Use an already loaded model (tests, bench) and start the batcher over it. ``static_paths``: run the
        graphed paths' static functions directly on any device (how a CPU traces what a GPU replays)."""
        self._model = model
        self.sample_rate = model.sample_rate
        if not model.voice_encoder.available:
            self.capabilities = TTSCapabilities(
                voice_cloning=False, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES,
                vocoders=VOCODERS,
            )
        cuda = torch.device(model.device).type == "cuda"
        # On CUDA a stream's solve is padded up to the fast schedule's own lengths (first chunk, one and two
        # encoder chunks of frames), so streams at different points share calls; on the CPU padding would
        # only add work.
        ratio, chunk = model.flow.cfg.token_mel_ratio, model.flow.cfg.encoder_chunk_size
        buckets = (ratio * self.schedule.first_hop, ratio * chunk, 2 * ratio * chunk) if cuda else ()
        self._batcher = SpeechBatcher(
            model.llm,
            model.flow,
            model.hift,
            slots=self.cfg.max_concurrent,
            max_waiting=self.cfg.max_waiting,
            max_positions=self.cfg.max_positions,
            cuda_graphs=self.cfg.cuda_graphs and cuda,
            static_step=static_paths,
            static_chunks=static_paths,
            schedule=self.schedule,
            arena_frames=self.cfg.flow_stream_frames,
            sample_rate=model.sample_rate,
            cache=self.prompt_cache,
            buckets=buckets,
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

    def cache_stats(self) -> dict[str, object]:
        """The prompt cache's counters (entries, bytes, hits and misses per kind, evictions)."""
        return self.prompt_cache.stats()

    def stats(self) -> dict[str, object]:
        """Batcher counters (decode path and capture cost, steps, mean batch) and the prompt cache's."""
        out: dict[str, object] = {"prompt_cache": self.cache_stats()}
        if self._batcher is not None:
            out.update(self._batcher.stats())
        return out

    async def warmup(self) -> None:
        """Capture the decode step's CUDA graph (once, timed, before any request), then run every slot at once
        with fixed-length dummy text so kernels, allocator, the batched flow and vocoder calls and the default
        voice's prompt are warm."""
        model = await self.model()
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.batcher.capture)
        try:
            voice = model.resolve_voice(self.cfg.voice or None)
        except KeyError:
            voice = empty_voice(model.device)
        await self.prepare_voice(voice)
        n = max(1, min(self.cfg.max_concurrent, 4))
        text = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))

        async def one() -> None:
            async for _ in self.stream_ids(text, voice, tokens=WARMUP_TOKENS, seed=0):
                pass

        await asyncio.gather(*(one() for _ in range(n)))
        log.info("cosyvoice2 warm-up (%d streams) took %.2f s", n, time.perf_counter() - t0)

    async def prepare_voice(self, voice: CosyVoicePrompt) -> None:
        """Build the voice's flow prefix now (in the loading thread) unless the prompt cache has it, and its
        static first chunk (on CUDA: captured as graphs, in the chunk thread): its first request is then warm.
        A request never waits for this: without the prefix it starts cold, without the graphs it runs eagerly."""
        model = await self.model()
        steps = self.schedule.first_chunk_steps

        def build() -> None:
            prefix = flow_prefix(model.flow, voice, self.prompt_cache, steps)
            stream_sync(torch.device(model.device))      # complete before another stream reads it
            self.batcher.prepare_voice(prefix)

        await asyncio.get_running_loop().run_in_executor(self._executor, build)

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

    async def load_voice(self, voice_id: str, path: str | Path) -> CosyVoicePrompt:
        """Adopt a prompt saved by `CosyVoicePrompt.save` (after a restart: nothing is recomputed)."""
        model = await self.model()
        prompt = await asyncio.get_running_loop().run_in_executor(self._executor, CosyVoicePrompt.load, path)
        prompt.voice_id = voice_id
        model.voices.put(prompt, persist=False)
        return prompt

    def forget_voice(self, voice_id: str) -> None:
        """Drop a voice from memory (it was deleted)."""
        if self._model is not None:
            self._model.voices.remove(voice_id)

    def _voice_for(self, model: CosyVoice2, request: TTSRequest) -> CosyVoicePrompt:
        if request.reference is not None:
            ref = request.reference
            if not model.voice_encoder.available:
                raise TTSUnsupported("voice cloning unavailable: the model directory lacks the ONNX front-end files")
            return self.clip_voice(model, ref)
        try:
            return model.resolve_voice(request.voice or self.cfg.voice or None)
        except KeyError as exc:
            raise TTSUnsupported(str(exc)) from exc

    def clip_voice(self, model: CosyVoice2, clip: ReferenceClip) -> CosyVoicePrompt:
        """A reference clip's voice prompt; the same clip bytes (and transcript) again skip the front end."""
        key = digest(np.asarray(clip.audio, dtype=np.float32), int(clip.sample_rate), clip.text or "")
        return self.prompt_cache.get_or_make(
            "clip", key, lambda: model.voice_encoder.encode("", clip.audio, clip.sample_rate, clip.text)
        )

    # --- the streaming core -------------------------------------------------------------------------------

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
    ) -> AsyncGenerator[Chunk, None]:
        """Token-level streaming (no tokenizer needed): text ids [1, T] → `Chunk`s with their statistics.

        ``prompt_text_ids`` selects zero-shot mode with the voice's speech tokens; ``tokens`` forces exactly
        that many speech tokens (eos ignored; benchmarks).
        """
        model = await self.model()
        if prompt_text_ids is not None:
            voice = CosyVoicePrompt(**{**voice.__dict__, "prompt_text_tokens": prompt_text_ids})
        args = job_args(model, text_ids, voice, None, speed, seed, schedule or self.schedule, greedy, tokens)
        async with aclosing(run_job(self.batcher, args)) as chunks:  # closing us closes the job at once
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
    ) -> AsyncGenerator[np.ndarray, None]:
        sentences, instruct = model.plan(text, request.instruct, request.language)
        instruct_ids = torch.tensor([model.frontend.encode(instruct)], dtype=torch.long) if instruct else None
        for sentence in sentences:
            text_ids = torch.tensor([model.frontend.encode(sentence)], dtype=torch.long)
            args = job_args(model, text_ids, voice, instruct_ids, request.speed, request.seed, self.schedule)
            async with aclosing(run_job(self.batcher, args, ticket)) as chunks:
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
