"""The gateway's side of the Ray hop: stand-ins for the TTS engine and the ASR runner that call Serve.

:class:`RemoteTTS` is a :class:`~assistant.tts.base.TTSEngine`: the speech path, the TTS service and the
conversation use it exactly as they use an in-process engine. Each piece of text is one streaming call to
the TTS deployment (``multiplexed_model_id`` = the voice id, so Serve sends it to a replica holding that
voice warm); closing the stream cancels the call, and the replica's generator, and the engine's slot.
A refusal for overload (the caller's queue full: ``BackPressureError``; or the replica's engine full:
``EngineBusy``) becomes :class:`~assistant.tts.base.TTSBusy`, which the API answers 429 ``busy`` and a call
reports as an ``error`` event, as in-process.

:class:`RemoteASR` has the face of :class:`~assistant.asr.runner.ASRRunner` (``transcribe``,
``transcribe_partial``, ``busy``) with the same time limit, ``asr.timeout_s``.

Both report the hop's cost through ``on_hop(kind, seconds)``: ``call`` is the request's way to the replica
(with any wait for a free one) plus the first chunk's way back (what a turn's first audio pays), ``chunk`` a
later chunk's way back, stamped when it arrives (a reader task takes chunks off the stream as they come, a
bounded read-ahead, so a chunk is not stamped late because the listener was still playing the one before);
``asr`` a transcription's way to the replica and back, ``asr_wait`` its wait there for a free worker. They are
read off wall clocks stamped on both sides: exact on one machine, as good as NTP across machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, ParamSpec, Protocol, TypeVar, cast, overload

import numpy as np
from ray import serve
from ray.serve.exceptions import BackPressureError

from assistant.asr.base import PassKind, PassTiming, Transcript
from assistant.config import Config
from assistant.respond.base import Message, ReplyOptions, ResponderError, Usage
from assistant.serve_ray.app import (
    ASR_DEPLOYMENT,
    LLM_DEPLOYMENT,
    TTS_DEPLOYMENT,
    asr_app_name,
    deploy,
    join_cluster,
    llm_app_name,
    running_apps,
    tts_app_name,
)
from assistant.serve_ray.replicas import (
    DEFAULT_VOICE,
    ASRReplicaStats,
    EngineInfo,
    LLMReplicaStats,
    ReplyAsks,
    SentChunk,
    TimedTranscript,
    TTSReplicaStats,
)
from assistant.telemetry import carry
from assistant.tts.base import PieceByPiece, ReferenceClip, TTSBusy, TTSRequest

if TYPE_CHECKING:
    from assistant.respond.llama import ModelInfo

log = logging.getLogger(__name__)

HopObserver = Callable[[str, float], None]
MAX_VOICE_HANDLES = 256  # voices whose streaming handle a gateway keeps
READ_AHEAD = 32  # chunks a call takes off the stream before its caller wants them

# --- the Ray handles, as this module uses them ---------------------------------------------------------------
# Serve's ``DeploymentHandle`` types every method's ``.remote()`` as "a response or a response generator" (which one
# depends on ``options(stream=...)``) of Any; these say what each deployment method takes and gives back
# (``replicas.py``). ``connect_tts`` and ``connect_asr`` narrow the handle Serve gives them to these.
P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class Response(Awaitable[R], Protocol[R]):
    """One call to a replica (Serve's ``DeploymentResponse``): awaited, waited for with a limit, or cancelled."""

    def result(self, *, timeout_s: float | None = None) -> R: ...

    def cancel(self) -> None: ...


class ChunkStream(Protocol):
    """A streaming call (Serve's ``DeploymentResponseGenerator``): chunks as the replica yields them."""

    def __aiter__(self) -> AsyncIterator[SentChunk]: ...

    def cancel(self) -> None: ...


class Method(Protocol[P, R]):
    """A deployment method on a handle: ``.remote(...)`` calls it on a replica."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


class TTSHandle(Protocol):
    """The TTS deployment (``replicas.TTSReplica``) as this gateway calls it."""

    info: Method[[], Response[EngineInfo]]
    stats: Method[[], Response[TTSReplicaStats]]
    add_voice: Method[[str, ReferenceClip], Response[str]]
    load_voice: Method[[str, str], Response[str]]
    forget_voice: Method[[str], Response[str]]

    @overload
    def options(self, *, multiplexed_model_id: str) -> TTSHandle: ...

    @overload
    def options(self, *, stream: Literal[True]) -> TTSStreamHandle: ...


class TTSStreamHandle(Protocol):
    """The TTS deployment's streaming handle (``options(stream=True)``)."""

    synthesize: Method[[TTSRequest, dict[str, str]], ChunkStream]


class ReplyStream(Protocol):
    """A streaming reply (Serve's ``DeploymentResponseGenerator``): text deltas, then the reply's usage."""

    def __aiter__(self) -> AsyncIterator[str | Usage]: ...

    def cancel(self) -> None: ...


class LLMHandle(Protocol):
    """The LLM deployment (``replicas.LLMReplica``) as this gateway calls it."""

    info: Method[[], Response[ModelInfo]]
    stats: Method[[], Response[LLMReplicaStats]]

    def options(self, *, stream: Literal[True]) -> LLMStreamHandle: ...


class LLMStreamHandle(Protocol):
    respond: Method[[str, list[Message], ReplyAsks, dict[str, str]], ReplyStream]


class ASRHandle(Protocol):
    """The ASR deployment (``replicas.ASRReplica``) as this gateway calls it."""

    transcribe: Method[[np.ndarray, str | None, str | None, dict[str, str]], Response[TimedTranscript]]
    stats: Method[[], Response[ASRReplicaStats]]


# --- what the reader task hands the caller ---------------------------------------------------------------------
class _End:
    """The stream ended."""


_END = _End()


@dataclass(frozen=True)
class _Failed:
    error: Exception


class RemoteTTS(PieceByPiece):
    """The TTS deployment as an engine: one streaming call per piece of text."""

    def __init__(self, handle: TTSHandle, info: EngineInfo, on_hop: HopObserver | None = None) -> None:
        self._handle = handle
        self.name = info.name
        self.sample_rate = info.sample_rate
        self.capabilities = info.capabilities
        self.on_hop = on_hop
        self.calls = 0
        self.last_replica = ""  # the replica that served the latest call (tests, diagnostics)
        self._streams: OrderedDict[str, TTSStreamHandle] = OrderedDict()  # voice id → its streaming handle

    def _route(self, voice: str | None) -> TTSHandle:
        return self._handle.options(multiplexed_model_id=voice or DEFAULT_VOICE)

    def _stream_handle(self, voice: str | None) -> TTSStreamHandle:
        """The streaming handle for a voice (``options()`` builds a new handle each time: not per call)."""
        key = voice or DEFAULT_VOICE
        handle = self._streams.pop(key, None) or self._route(key).options(stream=True)
        self._streams[key] = handle
        while len(self._streams) > MAX_VOICE_HANDLES:
            self._streams.popitem(last=False)
        return handle

    async def synthesize(self, request: TTSRequest) -> AsyncIterator[np.ndarray]:
        """Chunks as the replica makes them. A reader task takes them off the stream as they arrive (so each
        is stamped on arrival, not when the listener wants it), at most ``READ_AHEAD`` ahead of the caller."""
        self.calls += 1
        # The call's trace context goes along (telemetry on): the replica's span joins the call's trace.
        stream = self._stream_handle(request.voice).synthesize.remote(request, carry.headers(request.session))
        queue: asyncio.Queue[np.ndarray | _End | _Failed] = asyncio.Queue(maxsize=READ_AHEAD)
        reader = asyncio.get_running_loop().create_task(self._read(stream, queue, time.time()))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    break
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            # Closed early (barge-in, timeout, a client gone): the replica's generator is cancelled and the
            # engine's slot freed. (A call that never got a replica raises its refusal again on cancel.)
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            with contextlib.suppress(Exception):
                stream.cancel()

    async def _read(self, stream: ChunkStream, queue: asyncio.Queue[np.ndarray | _End | _Failed],
                    called: float) -> None:
        items = _busy_as_tts_busy(stream)
        first = True
        try:
            while True:
                asked = time.time()
                try:
                    chunk, sent, started, replica = await anext(items)
                except StopAsyncIteration:
                    break
                got = time.time()
                self.last_replica = replica
                if self.on_hop is not None:
                    if first:  # the way in (with any wait for a free replica) and the first chunk's way back
                        self.on_hop("call", (started - called) + (got - sent))
                    elif asked <= sent:  # not when the read-ahead was full (then the chunk waited for room)
                        self.on_hop("chunk", got - sent)
                first = False
                await queue.put(chunk)
            await queue.put(_END)
        except Exception as exc:
            await queue.put(_Failed(exc))
        finally:
            await items.aclose()

    async def warmup(self) -> None:
        """The replicas warmed themselves up when they started."""

    async def close(self) -> None:
        """Nothing to free here: the replicas belong to the cluster, and serve every gateway."""

    async def stats(self) -> TTSReplicaStats:
        """Load of the replica one call lands on (tests and diagnostics)."""
        return await self._handle.stats.remote()


class RemoteCloningTTS(RemoteTTS):
    """A remote engine that clones voices: each voice is prepared on the replica its requests go to."""

    async def add_voice(self, voice_id: str, clip: ReferenceClip) -> object:
        await self._route(voice_id).add_voice.remote(voice_id, clip)
        return None  # the prepared form stays on the replica (no file for this gateway to keep)

    async def load_voice(self, voice_id: str, path: Path) -> object:
        return await self._route(voice_id).load_voice.remote(voice_id, str(path))

    def forget_voice(self, voice_id: str) -> None:
        self._route(voice_id).forget_voice.remote(voice_id)  # best effort; eviction frees it anyway


async def _busy_as_tts_busy(stream: ChunkStream) -> AsyncGenerator[SentChunk, None]:
    try:
        async for item in stream:
            yield item
    except BackPressureError as exc:
        raise TTSBusy("every TTS replica is full and the wait at this gateway is too; retry shortly") from exc


class RemoteASR:
    """The ASR deployment with the face of ``ASRRunner``: async transcriptions under ``asr.timeout_s``."""

    def __init__(self, handle: ASRHandle, cfg: Config, on_hop: HopObserver | None = None) -> None:
        self._handle = handle
        self.timeout_s = cfg.asr.timeout_s
        # What this gateway lets run at once: partials are skipped past it, so they never queue ahead of
        # a final transcript (the replicas' own bound is max_ongoing_requests).
        self.workers = max(1, cfg.ray.asr_replicas * max(1, cfg.asr.workers))
        self._in_flight = 0
        self.on_hop = on_hop
        from assistant.asr import hearing

        self.languages, self.detects = hearing(cfg.asr)  # the replicas load the same config's model

    @property
    def busy(self) -> bool:
        return self._in_flight >= self.workers

    async def transcribe(self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None,
                         session: str = "", kind: PassKind = PassKind.FINAL) -> Transcript:
        """A transcription on a replica (``session`` and ``kind`` are this gateway's to weigh: Serve queues
        calls in order)."""
        called = time.time()
        response = self._handle.transcribe.remote(np.asarray(audio, dtype=np.float32), language, prompt,
                                                  carry.headers(session))
        self._in_flight += 1
        try:
            result, arrived, waited, done = await asyncio.wait_for(response, self.timeout_s)
        except TimeoutError:
            response.cancel()
            log.error("asr.timeout timeout_s=%.1f backend=ray", self.timeout_s)
            raise
        except BackPressureError as exc:
            raise RuntimeError("every ASR replica is full; the turn is dropped") from exc
        finally:
            self._in_flight -= 1
        now = time.time()
        if self.on_hop is not None:
            self.on_hop("asr", (arrived - called) + (now - done))
            self.on_hop("asr_wait", waited)
        timing = PassTiming(called, max(called, arrived + waited), now, remote=(arrived, done))
        return dataclasses.replace(result, timing=timing)

    async def transcribe_partial(self, audio: np.ndarray, *, language: str | None = None,
                                 prompt: str | None = None, session: str = "") -> Transcript | None:
        if self.busy:
            return None
        return await self.transcribe(audio, language=language, prompt=prompt, session=session, kind=PassKind.PARTIAL)

    async def warmup(self) -> None:
        """The replicas warmed themselves up when they started."""

    def close(self) -> None:
        """The replicas belong to the cluster."""


MSG_LLM_BUSY = "The language model is busy. Please try again."
MSG_LLM_FAILED = "The language model failed to answer."


class RemoteResponder:
    """The LLM deployment as a responder: one streaming call per reply; closing the stream cancels the reply on
    the replica. With several replicas a conversation's turns may land on different ones (each keeps its own KV
    cache): one replica per machine or GPU, with more slots, keeps every turn's prefix cached."""

    def __init__(self, handle: LLMHandle, info: ModelInfo) -> None:
        self._handle = handle.options(stream=True)
        self.info = info
        self.name = info["engine"]
        self.model = info["model"]

    def describe(self) -> ModelInfo:
        return self.info

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        opts = options if options is not None else ReplyOptions()
        asks: ReplyAsks = {"language": opts.language, "temperature": opts.temperature, "max_tokens": opts.max_tokens}
        stream = self._handle.respond.remote(text, list(history), asks, carry.headers(opts.session))
        try:
            async for item in stream:
                if isinstance(item, Usage):
                    opts.usage = item
                elif item:
                    yield item
        except BackPressureError as exc:
            raise ResponderError(MSG_LLM_BUSY) from exc
        except Exception as exc:
            cause = getattr(exc, "cause", exc)  # a replica's exception comes wrapped (RayTaskError)
            if isinstance(cause, ResponderError):
                raise ResponderError(str(cause.args[0]) if cause.args else MSG_LLM_FAILED) from exc
            log.warning("respond.error kind=ray error=%s", type(exc).__name__)
            raise ResponderError(MSG_LLM_FAILED) from exc
        finally:
            with contextlib.suppress(Exception):
                stream.cancel()

    async def aclose(self) -> None:
        """The replicas belong to the cluster."""


def _wait_for_app(cfg: Config, name: str) -> None:
    deadline = time.monotonic() + cfg.ray.connect_timeout_s
    while name not in running_apps():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Serve application {name!r} is not running on the Ray cluster at {cfg.ray.address!r}; deploy it "
                f"(`assistant engines` or `serve deploy configs/serve.yaml`) or set ray.deploy = true"
            )
        time.sleep(0.5)


def _engines(cfg: Config, *, tts: bool, asr: bool, llm: bool = False) -> None:
    """Join the cluster; deploy what is missing (``ray.deploy``) or wait for it to be deployed."""
    join_cluster(cfg)
    if cfg.ray.deploy:
        deploy(cfg, tts=tts, asr=asr, llm=llm)
    for wanted, name in ((tts, tts_app_name(cfg)), (asr, asr_app_name(cfg)), (llm, llm_app_name(cfg))):
        if wanted:
            _wait_for_app(cfg, name)


def connect_tts(cfg: Config, on_hop: HopObserver | None = None) -> RemoteTTS:
    """The TTS deployment as an engine (blocking: call it off the event loop)."""
    _engines(cfg, tts=True, asr=False)
    handle = cast(TTSHandle, serve.get_deployment_handle(TTS_DEPLOYMENT, tts_app_name(cfg)))
    info = handle.info.remote().result(timeout_s=cfg.ray.connect_timeout_s)
    cls = RemoteCloningTTS if info.cloner and info.capabilities.voice_cloning else RemoteTTS
    log.info("ray.tts_connected app=%s engine=%s rate=%d", tts_app_name(cfg), info.name, info.sample_rate)
    return cls(handle, info, on_hop)


def connect_asr(cfg: Config, on_hop: HopObserver | None = None) -> RemoteASR:
    """The ASR deployment with the runner's face (blocking: call it off the event loop)."""
    _engines(cfg, tts=False, asr=True)
    handle = cast(ASRHandle, serve.get_deployment_handle(ASR_DEPLOYMENT, asr_app_name(cfg)))
    handle.stats.remote().result(timeout_s=cfg.ray.connect_timeout_s)
    log.info("ray.asr_connected app=%s", asr_app_name(cfg))
    return RemoteASR(handle, cfg, on_hop)


def connect_llm(cfg: Config) -> RemoteResponder:
    """The LLM deployment as a responder (blocking: call it off the event loop)."""
    _engines(cfg, tts=False, asr=False, llm=True)
    handle = cast(LLMHandle, serve.get_deployment_handle(LLM_DEPLOYMENT, llm_app_name(cfg)))
    info = handle.info.remote().result(timeout_s=cfg.ray.connect_timeout_s)
    log.info("ray.llm_connected app=%s model=%s", llm_app_name(cfg), info["model"])
    return RemoteResponder(handle, info)


__all__ = ["RemoteASR", "RemoteCloningTTS", "RemoteResponder", "RemoteTTS", "connect_asr", "connect_llm",
           "connect_tts"]
