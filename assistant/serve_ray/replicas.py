"""What runs on a Ray Serve replica: one TTS engine, one ASR engine or the embedded LLM, wrapped for remote calls.

The classes are plain; :mod:`assistant.serve_ray.app` makes them deployments with the options of ``[ray]``.

- :class:`TTSReplica` holds the configured engine (the batching CosyVoice2 engine on its GPU, or Piper) and
  streams float32 chunks back through a streaming handle, each with the time it left the replica, so the
  gateway can measure the hop. Voices are Serve's multiplexed models: a request names its voice id as the
  ``multiplexed_model_id``, Serve sends it to a replica that holds that voice warm, and a replica keeps at
  most ``ray.voices_per_replica`` (least recently used go first). Cancelling the stream (barge-in, a client
  gone) cancels the generator here, which closes the engine's stream and frees its slot.
- :class:`ASRReplica` runs ``transcribe`` on a worker thread, so its ``max_ongoing_requests`` transcriptions
  overlap.
- :class:`LLMReplica` holds the embedded model (``respond/llama/``: its slots and waiting room) and streams a
  reply's text deltas, then what it cost; cancelling the stream cancels the reply and frees its slot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
from ray import serve

from assistant.asr.base import Transcript
from assistant.audio import SPEECH_RATE
from assistant.config import Config, Overrides, apply_overrides
from assistant.respond.base import Message, Usage
from assistant.serve_ray.traced import Headers, ReplicaTelemetry, TracedReplica
from assistant.telemetry import names
from assistant.tts.base import ReferenceClip, TTSCapabilities, TTSEngine, TTSRequest, VoiceCloner
from assistant.tts.voice_store import ReferenceClipStore

if TYPE_CHECKING:
    from assistant.respond.llama import ModelInfo

log = logging.getLogger(__name__)

DEFAULT_VOICE = ""  # the multiplexed id of requests without a voice: the engine's default


def config_from_dict(values: Overrides) -> Config:
    """A :class:`Config` from ``Config.to_dict()`` (what crosses to a replica), checked like a file."""
    cfg = Config()
    apply_overrides(cfg, values, "ray deployment")
    return cfg


def replica_names() -> tuple[str, str]:
    """(this replica's short id, its actor name in namespace ``serve``: what an operator or a test kills)."""
    replica = serve.get_replica_context().replica_id
    return replica.unique_id, replica.to_full_id_str()


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What a gateway needs to know of the remote engine to stand in for it."""

    name: str
    sample_rate: int
    capabilities: TTSCapabilities
    cloner: bool


class TTSReplicaStats(TypedDict):
    """A TTS replica's load and the voices it holds (tests and diagnostics)."""

    replica: str
    actor: str
    active: int                # streams running now
    served: int                # streams started
    voices: list[str]
    engine_active: int | None  # the engine's own count of running syntheses, where it keeps one
    sentences_made: int


class ASRReplicaStats(TypedDict):
    replica: str
    actor: str
    active: int


# What a TTS replica streams back per chunk: (float32 chunk, wall time it left the replica, wall time the call
# arrived there, the replica's id).
SentChunk = tuple[np.ndarray, float, float, str]
# What an ASR replica answers: (the transcript, wall time the call arrived, time it waited for a worker, wall time
# it was done).
TimedTranscript = tuple[Transcript, float, float, float]


class TTSReplica(TracedReplica):
    """One TTS engine on one replica; voices multiplexed by id; chunks streamed with their send time."""

    async def __init__(self, config: Overrides) -> None:  # type: ignore[misc]  # Serve awaits it
        from assistant.tts import create_tts

        cfg = config_from_dict(config)
        self.cfg = cfg
        self.tts_cfg = dataclasses.replace(cfg.tts, backend="local")
        from assistant.asr import hearing

        reachable = {*hearing(cfg.asr)[0], cfg.tts.language}  # a voice per language for another: on first use
        self.engine: TTSEngine = await asyncio.to_thread(create_tts, self.tts_cfg, reachable)
        await self.engine.warmup()
        self.replica, self.actor = replica_names()
        self.traced = ReplicaTelemetry(cfg, "TTS", self.replica)
        self.active = 0                       # streams running now
        self.served = 0                       # streams started
        self.voice_engines: dict[str, TTSEngine] = {}   # per-voice engines (Piper: one model per voice)
        self.clips: dict[str, ReferenceClip] = {}        # clips handed over by add_voice (cloning engines)
        self.store = ReferenceClipStore(Path(cfg.server.data_dir) / "voices", cfg.tts_api.max_voices)

        async def voice(voice_id: str) -> _VoiceHandle:
            return await self._load_voice(voice_id)

        # Serve's multiplexing: the LRU of voices held here, reported to the routers that send each voice's
        # requests to the replicas holding it. Wired per instance so that its size comes from the config.
        self.voice = serve.multiplexed(max_num_models_per_replica=max(1, cfg.ray.voices_per_replica))(voice)
        log.info("ray.tts_replica_ready replica=%s engine=%s", self.replica, self.engine.name)

    # --- voices (Serve model multiplexing) ------------------------------------------------------------
    async def _load_voice(self, voice_id: str) -> _VoiceHandle:
        """The engine that speaks ``voice_id`` here, made ready once (what Serve's multiplexing caches).

        A cloning engine prepares the voice from the clip ``add_voice`` gave this replica, else from the
        shared voice store (``server.data_dir``, on storage every replica sees); an engine with one voice
        per model (Piper) gets an engine of its own for that voice.
        """
        engine = self.engine
        if isinstance(engine, VoiceCloner) and engine.capabilities.voice_cloning:
            clip = self.clips.get(voice_id)
            if clip is None:
                cached = self.store.cache_path(voice_id, engine.name) if self.store.get(voice_id) else None
                if cached is not None and cached.is_file():
                    await engine.load_voice(voice_id, cached)
                    return _VoiceHandle(engine, voice_id, self)
                clip = await asyncio.to_thread(self.store.load_clip, voice_id)
            await engine.add_voice(voice_id, clip)
            return _VoiceHandle(engine, voice_id, self)
        from assistant.tts import create_tts

        voiced = await asyncio.to_thread(create_tts, dataclasses.replace(self.tts_cfg, voice=voice_id))
        await voiced.warmup()
        self.voice_engines[voice_id] = voiced
        return _VoiceHandle(voiced, voice_id, self)

    async def add_voice(self, voice_id: str, clip: ReferenceClip) -> str:
        """Prepare a cloned voice on the replica this call was routed to (by its multiplexed id)."""
        self.clips[voice_id] = clip
        await self._engine_for_request()
        return self.replica

    async def load_voice(self, voice_id: str, path: str) -> str:
        """A voice's saved prepared form, on storage this replica sees."""
        if isinstance(self.engine, VoiceCloner):
            await self.engine.load_voice(voice_id, Path(path))
        return self.replica

    async def forget_voice(self, voice_id: str) -> str:
        self.clips.pop(voice_id, None)
        if isinstance(self.engine, VoiceCloner):
            self.engine.forget_voice(voice_id)
        return self.replica

    async def _engine_for_request(self) -> TTSEngine:
        voice_id = serve.get_multiplexed_model_id()
        if not voice_id:
            return self.engine
        return (await self.voice(voice_id)).engine

    # --- synthesis -------------------------------------------------------------------------------------
    async def info(self) -> EngineInfo:
        engine = self.engine
        return EngineInfo(engine.name, engine.sample_rate, engine.capabilities, isinstance(engine, VoiceCloner))

    async def stats(self) -> TTSReplicaStats:
        """This replica's load and the voices it holds (tests and diagnostics)."""
        return {"replica": self.replica, "actor": self.actor, "active": self.active, "served": self.served,
                "voices": sorted(self.voice_engines) + sorted(self.clips),
                "engine_active": getattr(self.engine, "active", None),
                "sentences_made": sum(getattr(e, "sentences_made", 0)
                                      for e in [self.engine, *self.voice_engines.values()])}

    async def synthesize(self, request: TTSRequest, trace: Headers | None = None) -> AsyncIterator[SentChunk]:
        """(float32 chunk, wall time it left here, wall time the call arrived, this replica) as the engine makes
        each chunk; a cancel stops the engine. ``trace``: the call's context (a ``ray.replica.tts`` span)."""
        started = time.time()
        attrs: dict[str, object] = {names.TTS_CHARS: len(request.text), names.TTS_VOICE: request.voice or "",
                                    names.TTS_LANGUAGE: request.language or "", names.TTS_ENGINE: self.engine.name,
                                    names.TTS_CHUNKS: 0}
        if self.traced.include_text:
            attrs[names.INPUT] = request.text
        with self.traced.recording(names.REPLICA_TTS, trace, started, attrs):
            engine = await self._engine_for_request()
            if engine is not self.engine:
                request = dataclasses.replace(request, voice=None)  # a per-voice engine speaks only its voice
            self.active += 1
            self.served += 1
            chunks = engine.synthesize(request)
            sent = 0
            try:
                async for chunk in chunks:
                    if not sent:
                        attrs[names.TTS_TTFB_MS] = round((time.time() - started) * 1000, 1)
                    sent += 1
                    attrs[names.TTS_CHUNKS] = sent
                    yield np.asarray(chunk, dtype=np.float32), time.time(), started, self.replica
            finally:
                self.active -= 1
                await chunks.aclose()  # type: ignore[attr-defined]


class _VoiceHandle:
    """What the multiplexed loader caches: when Serve evicts it, the replica forgets the voice."""

    def __init__(self, engine: TTSEngine, voice_id: str, owner: TTSReplica) -> None:
        self.engine, self.voice_id = engine, voice_id
        self.owner: TTSReplica | None = owner

    def __del__(self) -> None:  # Serve calls it when it evicts the voice (and Python when collected)
        owner, self.owner = getattr(self, "owner", None), None
        if owner is None:
            return
        owner.clips.pop(self.voice_id, None)
        if owner.voice_engines.pop(self.voice_id, None) is None and isinstance(owner.engine, VoiceCloner):
            owner.engine.forget_voice(self.voice_id)
        log.info("ray.voice_evicted replica=%s voice=%s", owner.replica, self.voice_id)


class ASRReplica(TracedReplica):
    """One ASR engine on one replica: ``asr.workers`` transcriptions at once, each on a worker thread.

    Serve sends a replica up to twice that (``app.build_asr``); the rest wait here, so each answer can say how
    long it waited apart from how long the hop took.
    """

    async def __init__(self, config: Overrides) -> None:  # type: ignore[misc]  # Serve awaits it
        from assistant.asr import create_asr

        cfg = config_from_dict(config)
        self.engine = await asyncio.to_thread(create_asr, dataclasses.replace(cfg.asr, backend="local"))
        await asyncio.to_thread(self.engine.warmup)
        self.replica, self.actor = replica_names()
        self.traced = ReplicaTelemetry(cfg, "ASR", self.replica)
        self.active = 0
        self._workers = asyncio.Semaphore(max(1, cfg.asr.workers))
        log.info("ray.asr_replica_ready replica=%s engine=%s", self.replica, self.engine.name)

    async def transcribe(self, audio: np.ndarray, language: str | None = None, prompt: str | None = None,
                         trace: Headers | None = None) -> TimedTranscript:
        """(the transcript, wall time the call arrived, time it waited for a worker, wall time it was done).
        ``trace``: the call's context (a ``ray.replica.asr`` span)."""
        arrived = time.time()
        attrs: dict[str, object] = {names.AUDIO_S: round(len(audio) / SPEECH_RATE, 3)}
        with self.traced.recording(names.REPLICA_ASR, trace, arrived, attrs):
            async with self._workers:
                waited = time.time() - arrived
                attrs[names.QUEUE_MS] = round(waited * 1000, 1)
                self.active += 1
                try:
                    result = await asyncio.to_thread(self.engine.transcribe, audio, language=language, prompt=prompt)
                finally:
                    self.active -= 1
            attrs |= {names.ASR_CHARS: len(result.text), names.TURN_LANGUAGE: result.language}
            if self.traced.include_text:
                attrs[names.OUTPUT] = result.text
        return result, arrived, waited, time.time()

    async def stats(self) -> ASRReplicaStats:
        return {"replica": self.replica, "actor": self.actor, "active": self.active}


class ReplyAsks(TypedDict):
    """A reply's own asks (:class:`~assistant.respond.base.ReplyOptions` without what it reports back)."""

    language: str | None
    temperature: float | None
    max_tokens: int | None


class LLMReplicaStats(TypedDict):
    replica: str
    actor: str
    active: int  # replies running
    waiting: int  # replies waiting for a slot
    cancelled: int
    tokens_after_cancel: int
    generated_tokens: int


class LLMReplica(TracedReplica):
    """The embedded model on one replica (``respond.slots`` replies at once, ``respond.max_waiting`` waiting; past
    that ``busy``). A reply streams as text deltas, then its :class:`~assistant.respond.base.Usage`.

    It serves the same object a child process serves (``respond/hosted.ResponderService``): one protocol for the
    model in process, in a child process and on Ray."""

    async def __init__(self, config: Overrides) -> None:  # type: ignore[misc]  # Serve awaits it
        from assistant.respond.hosted import ResponderService
        from assistant.respond.hub import resolve_model

        cfg = config_from_dict(config)
        respond = dataclasses.replace(cfg.respond, engine="llama", backend="local")
        respond = await asyncio.to_thread(resolve_model, respond)  # an hf://… model: pulled on the replica's node
        self.service = await asyncio.to_thread(ResponderService, dataclasses.asdict(respond))
        await self.service.start()
        self.replica, self.actor = replica_names()
        self.traced = ReplicaTelemetry(cfg, "LLM", self.replica)
        self.model = str(self.service.describe().get("model", ""))
        log.info("ray.llm_replica_ready replica=%s model=%s", self.replica, self.model)

    async def info(self) -> ModelInfo:
        return self.service.describe()  # type: ignore[return-value]  # the embedded model's ModelInfo

    async def stats(self) -> LLMReplicaStats:
        counts = self.service.stats()
        return {"replica": self.replica, "actor": self.actor, "active": counts["active"],
                "waiting": counts["waiting"], "cancelled": counts["cancelled"],
                "tokens_after_cancel": counts["tokens_after_cancel"], "generated_tokens": counts["generated_tokens"]}

    async def respond(self, text: str, history: list[Message], asks: ReplyAsks,
                      trace: Headers | None = None) -> AsyncIterator[str | Usage]:
        """The reply's text deltas, then its usage. ``trace``: the call's context (a ``ray.replica.llm`` span)."""
        started = time.time()
        attrs: dict[str, object] = {names.LLM_MODEL: self.model, names.RESPONSE_CHARS: 0}
        with self.traced.recording(names.REPLICA_LLM, trace, started, attrs):
            stream = self.service.respond(text, history, dict(asks))
            chars = 0
            try:
                async for item in stream:
                    if isinstance(item, Usage):
                        attrs |= {names.LLM_INPUT_TOKENS: item.input_tokens,
                                  names.LLM_OUTPUT_TOKENS: item.output_tokens}
                    elif item:
                        if not chars:
                            attrs[names.TTFT_MS] = round((time.time() - started) * 1000, 1)
                        chars += len(item)
                        attrs[names.RESPONSE_CHARS] = chars
                    yield item
            finally:
                await stream.aclose()  # a cancelled call (barge-in, a gateway gone) cancels the reply here
