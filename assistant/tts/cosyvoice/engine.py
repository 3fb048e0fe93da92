"""``CosyVoiceEngine``: CosyVoice2 behind the ``TTSEngine`` protocol.

The model runs in one worker thread (one GPU stream of work; PyTorch calls never block the event loop).
For now each sentence is synthesised whole and yielded as one chunk; the streaming scheduler replaces this.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from assistant.config import TTSConfig
from assistant.tts.base import LANGUAGES, ReferenceClip, TTSCapabilities, TTSRequest, TTSUnsupported
from assistant.tts.cosyvoice.model import CosyVoice2, SynthesisCancelled
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, VoiceCloningUnavailable

log = logging.getLogger(__name__)

WARMUP_TEXT = "Hello."


class CosyVoiceEngine:
    """TTS engine over our CosyVoice2 implementation."""

    name = "cosyvoice2"
    sample_rate = 24000
    capabilities = TTSCapabilities(
        voice_cloning=True, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES
    )

    def __init__(self, cfg: TTSConfig, voices_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.voices_dir = voices_dir
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyvoice")
        self._model: CosyVoice2 | None = None
        self._loading: asyncio.Future[CosyVoice2] | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------

    def _load(self) -> CosyVoice2:
        model = CosyVoice2.from_dir(self.cfg.model_dir, self.cfg.device, self.cfg.dtype, self.voices_dir)
        self.sample_rate = model.sample_rate
        if not model.voice_encoder.available:
            self.capabilities = TTSCapabilities(
                voice_cloning=False, instruct=True, native_speed=True, native_pitch=False, languages=LANGUAGES
            )
        return model

    async def model(self) -> CosyVoice2:
        """The loaded model; the first caller starts loading it in the worker thread."""
        if self._model is not None:
            return self._model
        if self._loading is None:
            self._loading = asyncio.get_running_loop().run_in_executor(self._executor, self._load)
        self._model = await self._loading
        return self._model

    async def warmup(self) -> None:
        model = await self.model()
        if not model.frontend.has_tokenizer:
            log.warning("cosyvoice2 warm-up skipped: no text tokenizer in %s", self.cfg.model_dir)
            return
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: model.synthesize(WARMUP_TEXT, self._default_voice(model), seed=0)
        )
        log.info("cosyvoice2 warm-up took %.2f s", time.perf_counter() - t0)

    async def close(self) -> None:
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

    def _default_voice(self, model: CosyVoice2) -> CosyVoicePrompt | str | None:
        return self.cfg.voice or None

    def _voice_for(self, model: CosyVoice2, request: TTSRequest) -> CosyVoicePrompt:
        if request.reference is not None:
            ref = request.reference
            if not model.voice_encoder.available:
                raise TTSUnsupported("voice cloning unavailable: the model directory lacks the ONNX front-end files")
            return model.voice_encoder.encode("", ref.audio, ref.sample_rate, ref.text)
        try:
            return model.resolve_voice(request.voice or self._default_voice(model))
        except KeyError as exc:
            raise TTSUnsupported(str(exc)) from exc

    # --- synthesis ----------------------------------------------------------------------------------------

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """One chunk per sentence; cancelling stops the worker at its next speech token."""
        if request.pitch:
            raise TTSUnsupported("cosyvoice2 has no native pitch shift")
        if request.language and request.language not in LANGUAGES:
            raise TTSUnsupported(f"language {request.language!r} not supported")
        model = await self.model()
        loop = asyncio.get_running_loop()
        cancel = threading.Event()

        def prepare() -> tuple[CosyVoicePrompt, list[str], str | None, object]:
            voice = self._voice_for(model, request)
            sentences, instruct = model.plan(request.text, request.instruct, request.language)
            return voice, sentences, instruct, model.make_sampler(request.seed)

        voice, sentences, instruct, sampler = await loop.run_in_executor(self._executor, prepare)
        try:
            for sentence in sentences:
                audio = await loop.run_in_executor(
                    self._executor,
                    model.synthesize_sentence, sentence, voice, instruct, request.speed, sampler, cancel,
                )
                if audio.size:
                    yield audio.astype(np.float32, copy=False)
        except SynthesisCancelled:
            return
        finally:
            cancel.set()  # an abandoned iteration stops the worker too


__all__ = ["CosyVoiceEngine"]
