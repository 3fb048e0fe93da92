"""The synthesis service behind the TTS API, independent of the engine and of HTTP.

It turns a client's JSON request into audio:

    JSON ─▶ tts_request.parse_params (the request table: 400/413 naming the field and its range)
         ─▶ TTSService.prepare (engine capabilities; the voice from VoiceSources → TTSRequest)
         ─▶ TTSService.stream (concurrency slot, timeout, effects the engine lacks, resampling)
         ─▶ float32 chunks at the output rate; ``pcm_bytes`` makes s16le of them

Effects: ``speed`` goes to the engine when it says ``native_speed`` (within SPEED_RANGE; the rest by
``effects.time_stretch``), else all by ``effects.time_stretch``; ``pitch``
likewise with ``native_pitch`` / ``effects.pitch_shift``; ``energy`` is always ``effects.apply_energy``
(a gain with a limiter, so no clipping). DSP stretch and shift need context across a whole utterance, so
when either is needed the text is cut into sentences and each sentence is synthesised, processed and sent
whole: the stream then moves one sentence at a time (no seams inside a sentence, a natural pause between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from assistant.audio import float_to_s16
from assistant.config import Config
from assistant.pipeline.synthesis import SynthesisPath, SynthesisTimeout
from assistant.server.metrics import Metrics
from assistant.server.tts_api.request import SynthesisParams, TTSError, bad_field
from assistant.server.tts_api.voice_prep import VoiceSources
from assistant.tts.base import (
    SPEED_RANGE,
    TTSBusy,
    TTSEngine,
    TTSRequest,
    TTSUnsupported,
    with_streaming,
)
from assistant.tts.tags import split_leading_tag, split_style_tag
from assistant.tts.text import join_short
from assistant.tts.text import split_sentences as text_sentences
from assistant.tts.voice_store import ReferenceClipStore

log = logging.getLogger(__name__)

BUSY_WAIT_S = 1.0                     # how long a request waits for a synthesis slot before 429 busy

# A leading tag like "[cheerful] " or "【关心】": an emotion/style instruction, not words to speak.
MIN_SENTENCE_CHARS = 12               # shorter pieces are glued to the next one


def split_sentences(text: str) -> list[str]:
    """Sentences for per-sentence DSP (the one splitter, `assistant.tts.text`); pieces shorter than
    ``MIN_SENTENCE_CHARS`` join the next one."""
    return join_short(text_sentences(text), MIN_SENTENCE_CHARS) or [text]


# --- the service ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One prepared synthesis: the engine request and what the service adds around it."""

    engine: TTSEngine
    request: TTSRequest
    engine_rate: int
    sample_rate: int          # output rate
    speed_dsp: float          # 1.0: none (native or not asked)
    pitch_dsp: float          # 0.0: none
    energy: float
    tag_dropped: bool         # a leading emotion tag was removed because the engine has no instruct mode
    tag: str | None = None    # a leading tag an instruct engine gets on every piece of the chunked text


class TTSService:
    """Validation against the engine, the process-wide concurrency slots, effects, streaming (per-client rate
    limits are the guard's: ``server/limits.py``)."""

    def __init__(self, cfg: Config, metrics: Metrics, voices: ReferenceClipStore,
                 engine: Callable[[], TTSEngine | None]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.voices = voices
        self.sources = VoiceSources(cfg, voices)
        self._engine = engine
        self.max_slots = max(1, cfg.tts.max_concurrent)
        if cfg.tts.backend == "ray":  # the replicas say busy; this only bounds what waits at this gateway
            from assistant.serve_ray import tts_gateway_capacity

            self.max_slots = tts_gateway_capacity(cfg)
        self._slots = asyncio.Semaphore(self.max_slots)

    # --- admission -------------------------------------------------------------------------------------
    def current_engine(self) -> TTSEngine | None:
        """The engine if loaded, else None."""
        return self._engine()

    def engine(self) -> TTSEngine:
        """The engine, or 503 not_ready while it loads."""
        engine = self._engine()
        if engine is None:
            raise TTSError(503, "not_ready", "the TTS engine is still loading; retry shortly", {"Retry-After": "2"})
        return engine

    async def engine_voice(self, name: str, field: str = "voice") -> str | None:
        """The engine's voice id for a voice name as ``voice`` takes it (a registered voice by id or name, the
        engine's own, a clip in the voices folder), made ready in the engine; None for its default voice.
        What the voice session's other products (the Realtime API) speak with."""
        engine = self.engine()
        voice, clip = await self.sources._named_voice(engine, name, field, "")
        if clip is not None:  # a cloning engine that cannot keep voices: only per-request cloning
            raise TTSError(400, "unsupported", f"{name!r} is a clip the engine {engine.name} cannot keep as a voice",
                           param=field)
        return voice

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of ``tts.max_concurrent`` synthesis slots; 429 busy if none frees up within BUSY_WAIT_S."""
        try:
            await asyncio.wait_for(self._slots.acquire(), BUSY_WAIT_S)
        except TimeoutError:
            raise TTSError(429, "busy", f"all {self.max_slots} synthesis slots are busy; retry shortly",
                           {"Retry-After": "1"}) from None
        try:
            yield
        finally:
            self._slots.release()

    # --- preparing a job -------------------------------------------------------------------------------
    async def prepare(self, p: SynthesisParams) -> Job:
        """Check the request against the engine and build the engine request; raise TTSError if refused."""
        engine = self.engine()
        caps = engine.capabilities
        text, instruct, tag_dropped = p.text, p.instruct, False
        if instruct and not caps.instruct:
            raise TTSError(400, "unsupported", f"engine {engine.name} cannot follow 'instruct'", param="instruct")
        # A leading tag: engines without instruct mode drop it (documented); for instruct engines a style tag
        # holds for the whole text, and the speech path chunks the text, so it goes on every piece (stream).
        leading, rest = split_leading_tag(text) if not caps.instruct else split_style_tag(text)
        if leading is not None and not rest.strip():
            raise bad_field("text", "nothing to say after the leading tag")
        if leading is not None:
            text, tag_dropped = rest, not caps.instruct
        if p.language and p.language not in caps.languages:
            raise TTSError(400, "unsupported",
                           f"engine {engine.name} does not speak language {p.language!r}; it speaks "
                           f"{', '.join(caps.languages)}", param="language")
        if p.vocoder is not None and p.vocoder not in caps.vocoders:
            has = (f"has the vocoder {caps.vocoders[0]!r} (accepted names: {', '.join(caps.vocoders)})"
                   if caps.vocoders else "does not name its vocoder; omit the field")
            raise TTSError(400, "unsupported", f"field 'vocoder': {p.vocoder!r} is not this server's vocoder; "
                           f"engine {engine.name} {has}", param="vocoder")
        voice, reference = await self.sources.voice_of(engine, p)
        # Speed: the engine takes what it can natively (within SPEED_RANGE); DSP stretches the rest.
        lo, hi = SPEED_RANGE
        speed_engine = min(max(p.speed, lo), hi) if caps.native_speed else 1.0
        speed_dsp = p.speed / speed_engine
        pitch_native = caps.native_pitch or p.pitch == 0.0
        request = TTSRequest(
            text=text,
            voice=voice,
            reference=reference,
            language=p.language,
            instruct=instruct,
            speed=speed_engine,
            pitch=p.pitch if caps.native_pitch else 0.0,
            seed=p.seed,
        )
        return Job(
            engine=engine,
            request=request,
            engine_rate=engine.sample_rate,
            sample_rate=p.sample_rate or engine.sample_rate,
            speed_dsp=1.0 if abs(speed_dsp - 1.0) < 1e-9 else speed_dsp,
            pitch_dsp=0.0 if pitch_native else p.pitch,
            energy=p.energy,
            tag_dropped=tag_dropped,
            tag=leading if caps.instruct else None,
        )

    # --- streaming -------------------------------------------------------------------------------------
    async def stream(self, job: Job) -> AsyncGenerator[np.ndarray, None]:
        """Float32 mono chunks at ``job.sample_rate``, each as soon as it exists; holds a slot throughout."""
        async with self.slot():
            t0 = time.perf_counter()
            first = True
            engine = _TagOnEveryPiece(job.engine, job.tag) if job.tag else job.engine
            path = SynthesisPath(engine, job.sample_rate, timeout_s=self.cfg.tts.timeout_s, chunker=self.cfg.chunker)
            dsp = job.speed_dsp != 1.0 or job.pitch_dsp
            source = self._dsp_chunks(job, path) if dsp else path.speak(job.request.text, job.request)
            try:
                while True:
                    try:
                        chunk = await anext(source)
                    except StopAsyncIteration:
                        break
                    except SynthesisTimeout:
                        raise TTSError(504, "timeout", f"synthesis took over {self.cfg.tts.timeout_s:g} s") from None
                    except TTSUnsupported as exc:
                        raise TTSError(400, "unsupported", str(exc)) from None
                    except TTSBusy as exc:
                        raise TTSError(429, "busy", str(exc), {"Retry-After": "1"}) from None
                    if job.energy != 1.0:
                        from assistant.tts.effects import apply_energy  # brings scipy: on first use

                        chunk = apply_energy(chunk, job.energy)
                    if first:
                        first = False
                        self.metrics.tts_first_chunk_seconds.observe(time.perf_counter() - t0)
                    yield np.asarray(chunk, dtype=np.float32)
            finally:
                await source.aclose()  # type: ignore[attr-defined]

    async def _dsp_chunks(self, job: Job, path: SynthesisPath) -> AsyncIterator[np.ndarray]:
        """Per sentence: synthesise whole, then stretch/shift it with full context (no seams inside)."""
        from assistant.tts import effects as fx  # brings scipy: on first use

        for sentence in split_sentences(job.request.text):
            parts = [c async for c in path.speak(sentence, job.request)]
            if not parts:
                continue
            audio = np.concatenate(parts)
            if job.speed_dsp != 1.0:
                audio = await asyncio.to_thread(fx.time_stretch, audio, job.sample_rate, job.speed_dsp)
            if job.pitch_dsp:
                audio = await asyncio.to_thread(fx.pitch_shift, audio, job.sample_rate, job.pitch_dsp)
            yield np.asarray(audio, dtype=np.float32)


class _TagOnEveryPiece:
    """An instruct engine speaking a chunked text: a leading tag (``[关心]``) holds for the whole text, so each
    piece goes to the engine with the tag in front, as the engine's own tag handling expects."""

    def __init__(self, engine: TTSEngine, tag: str) -> None:
        self._engine = with_streaming(engine)
        self._tag = tag

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def synthesize_stream(self, pieces: AsyncIterator[str], request: TTSRequest) -> AsyncIterator[np.ndarray]:
        async def tagged() -> AsyncIterator[str]:
            async for piece in pieces:
                yield f"[{self._tag}] {piece}"

        chunks = self._engine.synthesize_stream(tagged(), request)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]



def pcm_bytes(chunk: np.ndarray) -> bytes:
    """float32 −1…1 → s16le bytes."""
    return float_to_s16(chunk).astype("<i2").tobytes()
