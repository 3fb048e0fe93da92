"""The synthesis service behind the TTS API, independent of the engine and of HTTP.

It turns a client's JSON request into audio:

    JSON ─▶ parse_params (every field checked; 400/413 naming the field and its range)
         ─▶ TTSService.prepare (engine capabilities, reference clip or stored voice → TTSRequest)
         ─▶ TTSService.stream (concurrency slot, timeout, effects the engine lacks, resampling)
         ─▶ float32 chunks at the output rate; ``pcm_bytes`` makes s16le of them

Effects: ``speed`` goes to the engine when it says ``native_speed``, else ``effects.time_stretch``; ``pitch``
likewise with ``native_pitch`` / ``effects.pitch_shift``; ``energy`` is always ``effects.apply_energy``
(a gain with a limiter, so no clipping). DSP stretch and shift need context across a whole utterance, so
when either is needed the text is cut into sentences and each sentence is synthesised, processed and sent
whole: the stream then moves one sentence at a time (no seams inside a sentence, a natural pause between).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import numpy as np

from assistant.audio import AudioFormatError, float_to_s16, read_audio
from assistant.config import Config
from assistant.pipeline.speech import SpeechPath, SpeechTimeout
from assistant.server.metrics import Metrics
from assistant.server.tts_request import MAX_NAME_CHARS, SynthesisParams, TTSError, bad_field
from assistant.server.voice_names import NamedVoice, VoiceFolder, file_voice_key, resolve_name
from assistant.tts.base import (
    SPEED_RANGE,
    ReferenceClip,
    TTSEngine,
    TTSRequest,
    TTSUnsupported,
    VoiceCloner,
    with_streaming,
)
from assistant.tts.tags import split_leading_tag, split_style_tag
from assistant.tts.voices import ReferenceClipStore

log = logging.getLogger(__name__)

BUSY_WAIT_S = 1.0                     # how long a request waits for a synthesis slot before 429 busy
MAX_RATE_CLIENTS = 10_000             # rate-limiter buckets kept; the least recently seen go first
MAX_URL_REDIRECTS = 3                 # same-host redirects followed when fetching an allowed speaker_wav URL
FILE_VOICES_KEPT = 32                 # clip files of the voices folder an engine keeps prepared (least recent go)

# A leading tag like "[cheerful] " or "【关心】": an emotion/style instruction, not words to speak.
# Sentence ends for per-sentence DSP: latin marks followed by a space, CJK marks anywhere.
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？；])")
MIN_SENTENCE_CHARS = 12               # shorter pieces are glued to the next one
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def split_sentences(text: str) -> list[str]:
    """Sentences for per-sentence DSP; pieces shorter than ``MIN_SENTENCE_CHARS`` join the next one."""
    out: list[str] = []
    carry = ""
    for piece in _SENTENCE_SPLIT.split(text):
        carry = f"{carry} {piece}".strip() if carry and not _is_cjk_text(piece) else carry + piece.strip()
        if len(carry) >= MIN_SENTENCE_CHARS:
            out.append(carry)
            carry = ""
    if carry:
        if out and len(carry) < MIN_SENTENCE_CHARS:
            out[-1] = f"{out[-1]} {carry}" if not _is_cjk_text(carry) else out[-1] + carry
        else:
            out.append(carry)
    return [s for s in out if any(c.isalnum() for c in s)] or [text]


def _is_cjk_text(s: str) -> bool:
    return any("\u3000" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" for c in s[:1])


# --- rate limiting ---------------------------------------------------------------------------------------
class RateLimiter:
    """Token bucket per client: ``per_minute`` requests of burst, refilled evenly over a minute."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client → (tokens, stamp)

    def take(self, client: str) -> float:
        """Spend one token; return 0.0 if allowed, else the seconds until a token is back."""
        if self.per_minute <= 0:
            return 0.0
        now = self.clock()
        rate = self.per_minute / 60.0
        tokens, stamp = self._buckets.pop(client, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - stamp) * rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / rate
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > MAX_RATE_CLIENTS:
            self._buckets.popitem(last=False)
        return wait


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
    """Validation against the engine, the process-wide concurrency slots, rate limits, effects, streaming."""

    def __init__(self, cfg: Config, metrics: Metrics, voices: ReferenceClipStore,
                 engine: Callable[[], TTSEngine | None]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.voices = voices
        self.folder = VoiceFolder(cfg.tts_api.voices_dir)
        self._file_voices: OrderedDict[str, None] = OrderedDict()  # clip files the engine holds prepared
        self._engine = engine
        self._slots = asyncio.Semaphore(max(1, cfg.tts.max_concurrent))
        self.rate = RateLimiter(cfg.tts_api.rate_per_minute)
        self._engine_voices: set[str] = set()      # stored voices the engine has prepared in this process
        self._voice_locks: dict[str, asyncio.Lock] = {}

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

    def check_rate(self, client: str) -> None:
        wait = self.rate.take(client)
        if wait > 0:
            raise TTSError(429, "rate_limited",
                           f"more than {self.cfg.tts_api.rate_per_minute} TTS requests per minute from this client",
                           {"Retry-After": str(max(1, math.ceil(wait)))})

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of ``tts.max_concurrent`` synthesis slots; 429 busy if none frees up within BUSY_WAIT_S."""
        try:
            await asyncio.wait_for(self._slots.acquire(), BUSY_WAIT_S)
        except TimeoutError:
            raise TTSError(429, "busy", f"all {self.cfg.tts.max_concurrent} synthesis slots are busy; retry shortly",
                           {"Retry-After": "1"}) from None
        try:
            yield
        finally:
            self._slots.release()

    # --- reference clips -------------------------------------------------------------------------------
    async def decode_clip(self, data: bytes, text: str = "") -> ReferenceClip:
        """Uploaded bytes → a reference clip, checking size, format and duration limits."""
        api = self.cfg.tts_api
        if len(data) > api.max_upload_bytes:
            raise TTSError(413, "too_large", f"reference clip is over {api.max_upload_bytes} bytes")
        try:
            audio, sr = await asyncio.to_thread(read_audio, data)
        except AudioFormatError as exc:
            raise TTSError(400, "bad_audio", f"reference clip is not decodable audio ({exc})") from None
        seconds = len(audio) / sr if sr else 0.0
        if seconds > api.max_upload_seconds:
            raise TTSError(413, "clip_too_long",
                           f"reference clip is {seconds:.1f} s; allowed {api.min_upload_seconds:g} to "
                           f"{api.max_upload_seconds:g} s")
        if seconds < api.min_upload_seconds:
            raise TTSError(400, "clip_too_short",
                           f"reference clip is {seconds:.1f} s; allowed {api.min_upload_seconds:g} to "
                           f"{api.max_upload_seconds:g} s")
        return ReferenceClip(audio=audio, sample_rate=sr, text=text)

    async def _speaker_bytes(self, value: bytes | str) -> bytes:
        """The clip bytes of ``speaker_wav``: an upload, base64 (optionally a data: URI), or an allowed URL."""
        if isinstance(value, bytes):
            return value
        if _URL.match(value):
            return await self._fetch_url(value)
        b64 = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
        if len(b64) > 4 * (self.cfg.tts_api.max_upload_bytes // 3 + 2):
            raise TTSError(413, "too_large", f"reference clip is over {self.cfg.tts_api.max_upload_bytes} bytes")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise bad_field("speaker_wav", "must be a voice or file name, base64 audio, a data: URI, or an allowed "
                            "http(s) URL") from None

    def _check_url(self, url: str) -> str:
        """The URL's host if it may be fetched (http/https, host on the allowlist); else 400 url_not_allowed."""
        allowed = {h.lower() for h in self.cfg.tts_api.url_allowlist}
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            raise TTSError(400, "url_not_allowed", "speaker_wav URLs must be http or https")
        if host not in allowed:
            raise TTSError(400, "url_not_allowed",
                           "speaker_wav URL host is not on tts_api.url_allowlist" if allowed
                           else "speaker_wav URLs are disabled (tts_api.url_allowlist is empty)")
        return host

    async def _fetch_url(self, url: str) -> bytes:
        """Fetch an http(s) clip from an allow-listed host, bounded in size and time; same-host redirects only."""
        import aiohttp

        api = self.cfg.tts_api
        host = self._check_url(url)
        timeout = aiohttp.ClientTimeout(total=api.url_timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                for _ in range(MAX_URL_REDIRECTS + 1):
                    async with http.get(url, allow_redirects=False) as resp:
                        if resp.status in (301, 302, 303, 307, 308):
                            nxt = urljoin(url, resp.headers.get("Location", ""))
                            if (urlsplit(nxt).hostname or "").lower() != host:
                                raise TTSError(400, "url_not_allowed", "speaker_wav URL redirects to another host")
                            url = nxt
                            continue
                        if resp.status != 200:
                            raise TTSError(400, "url_fetch_failed", f"speaker_wav URL answered HTTP {resp.status}")
                        if (resp.content_length or 0) > api.max_upload_bytes:
                            raise TTSError(413, "too_large", f"reference clip is over {api.max_upload_bytes} bytes")
                        data = await resp.content.read(api.max_upload_bytes + 1)
                        if len(data) > api.max_upload_bytes:
                            raise TTSError(413, "too_large", f"reference clip is over {api.max_upload_bytes} bytes")
                        return data
                raise TTSError(400, "url_fetch_failed", "speaker_wav URL redirects too often")
        except TimeoutError:
            raise TTSError(400, "url_fetch_failed", f"speaker_wav URL took over {api.url_timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise TTSError(400, "url_fetch_failed", f"speaker_wav URL could not be fetched ({type(exc).__name__})"
                           ) from None

    async def _ensure_engine_voice(self, engine: TTSEngine, voice_id: str) -> None:
        """Make a stored voice known to a cloning engine: after a restart from its cached prepared form (no
        recomputation), else from its clip (and cache the result)."""
        if voice_id in self._engine_voices:
            return
        lock = self._voice_locks.setdefault(voice_id, asyncio.Lock())
        async with lock:
            if voice_id in self._engine_voices:
                return
            if not await self._load_cached_voice(engine, voice_id):
                clip = await asyncio.to_thread(self.voices.load_clip, voice_id)
                await self.prepare_voice(engine, voice_id, clip)
        self._voice_locks.pop(voice_id, None)

    async def _load_cached_voice(self, engine: TTSEngine, voice_id: str) -> bool:
        """Hand the engine the prepared form saved when the voice was made; False if there is none (or bad)."""
        if not isinstance(engine, VoiceCloner):
            return False
        path = self.voices.cache_path(voice_id, engine.name)
        if not await asyncio.to_thread(path.is_file):
            return False
        try:
            await engine.load_voice(voice_id, path)
        except Exception as exc:  # a stale or damaged cache: recompute from the clip instead
            log.warning("voice_cache_unusable id=%s engine=%s kind=%s", voice_id, engine.name, type(exc).__name__)
            return False
        self._engine_voices.add(voice_id)
        log.info("voice_cache_loaded id=%s engine=%s", voice_id, engine.name)
        return True

    async def prepare_voice(self, engine: TTSEngine, voice_id: str, clip: ReferenceClip) -> bool:
        """Let a cloning engine compute its prompt for a voice and cache it on disk; False if it cannot."""
        if not engine.capabilities.voice_cloning or not isinstance(engine, VoiceCloner):
            return False
        try:
            prompt = await engine.add_voice(voice_id, clip)
        except TTSUnsupported as exc:
            raise TTSError(400, "unsupported", str(exc)) from None
        self._engine_voices.add(voice_id)
        save = getattr(prompt, "save", None)
        if save is not None and self.voices.get(voice_id) is not None:
            try:
                await asyncio.to_thread(self.voices.write_cache_file, voice_id, engine.name, save)
            except (OSError, ValueError) as exc:
                log.warning("voice_cache_not_written id=%s kind=%s", voice_id, type(exc).__name__)
        return True

    def forget_voice(self, voice_id: str) -> None:
        """A deleted voice: the engine drops its prepared form too."""
        self._engine_voices.discard(voice_id)
        engine = self.current_engine()
        if isinstance(engine, VoiceCloner):
            engine.forget_voice(voice_id)

    async def _file_voice(self, engine: TTSEngine, path: Path, prompt_text: str) -> tuple[str | None,
                                                                                          ReferenceClip | None]:
        """A clip file of the voices folder as the engine's voice (prepared once per file version), or as a
        reference clip for cloning engines that cannot keep voices."""
        text = prompt_text or await asyncio.to_thread(self.folder.transcript, path)
        if not isinstance(engine, VoiceCloner):
            data = await asyncio.to_thread(path.read_bytes)
            return None, await self.decode_clip(data, text)
        key = await asyncio.to_thread(file_voice_key, path, text)
        if key in self._file_voices:
            self._file_voices.move_to_end(key)
            return key, None
        lock = self._voice_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._file_voices:
                data = await asyncio.to_thread(path.read_bytes)
                clip = await self.decode_clip(data, text)
                try:
                    await engine.add_voice(key, clip)
                except TTSUnsupported as exc:
                    raise TTSError(400, "unsupported", str(exc)) from None
                self._file_voices[key] = None
                while len(self._file_voices) > FILE_VOICES_KEPT:
                    old, _ = self._file_voices.popitem(last=False)
                    engine.forget_voice(old)
        self._voice_locks.pop(key, None)
        return key, None

    async def _named_voice(self, engine: TTSEngine, name: str, field: str,
                           prompt_text: str) -> tuple[str | None, ReferenceClip | None]:
        """``voice``/``speaker_wav`` given as a name → (the engine's voice id, or a reference clip)."""
        found: NamedVoice = await asyncio.to_thread(
            resolve_name, name, field, self.voices, engine, self.folder)
        if found.kind == "engine":
            return (None if found.voice_id == "default" else found.voice_id), None
        if not engine.capabilities.voice_cloning:
            what = "a registered voice" if found.kind == "stored" else "a reference clip in the voices folder"
            raise TTSError(400, "unsupported", f"{name!r} is {what}; engine {engine.name} cannot clone voices",
                           param=field)
        if found.kind == "stored":
            await self._ensure_engine_voice(engine, found.voice_id)
            return found.voice_id, None
        assert found.path is not None
        return await self._file_voice(engine, found.path, prompt_text)

    async def _voice_of(self, engine: TTSEngine, p: SynthesisParams) -> tuple[str | None, ReferenceClip | None]:
        """The request's voice: (engine voice id, None), (None, a clip to clone) or (None, None): default."""
        caps = engine.capabilities
        value = p.speaker_wav if p.speaker_wav is not None else p.voice
        field = "speaker_wav" if p.speaker_wav is not None else "voice"
        if value is None:
            return None, None
        if isinstance(value, str) and field == "speaker_wav" and _URL.match(value):
            self._check_url(value)  # refuse a disallowed URL whatever the engine
        elif isinstance(value, str) and not (field == "speaker_wav" and _is_clip_data(value)):
            return await self._named_voice(engine, value, field, p.prompt_text)
        if not caps.voice_cloning:
            raise TTSError(400, "unsupported", f"engine {engine.name} cannot clone voices (speaker_wav)",
                           param="speaker_wav")
        return None, await self.decode_clip(await self._speaker_bytes(value), p.prompt_text)

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
        voice, reference = await self._voice_of(engine, p)
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
    async def stream(self, job: Job) -> AsyncIterator[np.ndarray]:
        """Float32 mono chunks at ``job.sample_rate``, each as soon as it exists; holds a slot throughout."""
        async with self.slot():
            t0 = time.perf_counter()
            first = True
            engine = _TagOnEveryPiece(job.engine, job.tag) if job.tag else job.engine
            path = SpeechPath(engine, job.sample_rate, timeout_s=self.cfg.tts.timeout_s, chunker=self.cfg.chunker)
            dsp = job.speed_dsp != 1.0 or job.pitch_dsp
            source = self._dsp_chunks(job, path) if dsp else path.speak(job.request.text, job.request)
            try:
                while True:
                    try:
                        chunk = await anext(source)
                    except StopAsyncIteration:
                        break
                    except SpeechTimeout:
                        raise TTSError(504, "timeout", f"synthesis took over {self.cfg.tts.timeout_s:g} s") from None
                    except TTSUnsupported as exc:
                        raise TTSError(400, "unsupported", str(exc)) from None
                    if job.energy != 1.0:
                        chunk = _effects().apply_energy(chunk, job.energy)
                    if first:
                        first = False
                        self.metrics.tts_first_chunk_seconds.observe(time.perf_counter() - t0)
                    yield np.asarray(chunk, dtype=np.float32)
            finally:
                await source.aclose()  # type: ignore[attr-defined]

    async def _dsp_chunks(self, job: Job, path: SpeechPath) -> AsyncIterator[np.ndarray]:
        """Per sentence: synthesise whole, then stretch/shift it with full context (no seams inside)."""
        fx = _effects()
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


def _is_clip_data(value: str) -> bool:
    """A ``speaker_wav`` string that carries audio (a data: URI or base64), not a name: names are short."""
    return value.startswith("data:") or len(value) > MAX_NAME_CHARS


def _effects() -> Any:
    from assistant.tts import effects

    return effects


def pcm_bytes(chunk: np.ndarray) -> bytes:
    """float32 −1…1 → s16le bytes."""
    return float_to_s16(chunk).astype("<i2").tobytes()
