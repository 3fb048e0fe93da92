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
from typing import Any
from urllib.parse import urljoin, urlsplit

import numpy as np

from assistant.audio import AudioFormatError, float_to_s16, read_audio
from assistant.config import Config
from assistant.pipeline.speech import SpeechPath, SpeechTimeout
from assistant.server.metrics import Metrics
from assistant.tts.base import LANGUAGES, SPEED_RANGE, ReferenceClip, TTSEngine, TTSRequest, TTSUnsupported
from assistant.tts.tags import split_leading_tag
from assistant.tts.text import join_short
from assistant.tts.text import split_sentences as text_sentences
from assistant.tts.voices import VoiceStore, valid_voice_id

log = logging.getLogger(__name__)


PITCH_RANGE = (-12.0, 12.0)           # semitones: one octave either way
ENERGY_RANGE = (0.5, 2.0)
SAMPLE_RATE_RANGE = (8000, 48000)
FORMATS = ("wav", "pcm")
MAX_INSTRUCT_CHARS = 500
MAX_VOICE_ID_CHARS = 64
MAX_SEED = 2**31 - 1
BUSY_WAIT_S = 1.0                     # how long a request waits for a synthesis slot before 429 busy
MAX_RATE_CLIENTS = 10_000             # rate-limiter buckets kept; the least recently seen go first
MAX_URL_REDIRECTS = 3                 # same-host redirects followed when fetching an allowed speaker_wav URL

FIELDS = frozenset({
    "text", "voice", "speaker_wav", "prompt_text", "language", "instruct", "speed", "pitch", "energy",
    "streaming", "format", "sample_rate", "seed",
})

# A leading tag like "[cheerful] " or "【关心】": an emotion/style instruction, not words to speak.
MIN_SENTENCE_CHARS = 12               # shorter pieces are glued to the next one
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class TTSError(Exception):
    """A request the service refuses: HTTP status, a short error code, and a human-readable detail."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}

    def to_json(self) -> dict[str, str]:
        return {"error": self.error, "detail": self.detail}


def _bad(field: str, detail: str) -> TTSError:
    return TTSError(400, "bad_request", f"field '{field}': {detail}")


# --- parameters ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SynthesisParams:
    """A validated request, before the engine is consulted."""

    text: str
    voice: str | None = None
    speaker_wav: bytes | str | None = None   # uploaded bytes, base64 text or an http(s) URL
    prompt_text: str = ""
    language: str | None = None
    instruct: str | None = None
    speed: float = 1.0
    pitch: float = 0.0
    energy: float = 1.0
    streaming: bool = False
    format: str | None = None   # None: "wav" for a whole file, raw "pcm" when streaming
    sample_rate: int | None = None
    seed: int | None = None


def _number(data: dict[str, Any], field: str, default: float, lo: float, hi: float) -> float:
    value = data.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(field, f"must be a number from {lo:g} to {hi:g}")
    if not lo <= value <= hi:
        raise _bad(field, f"{value:g} is out of range; allowed {lo:g} to {hi:g}")
    return float(value)


def _string(data: dict[str, Any], field: str, max_chars: int) -> str | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(field, "must be a string")
    if len(value) > max_chars:
        raise TTSError(413, "too_large", f"field '{field}' is {len(value)} characters; the limit is {max_chars}")
    return value


def parse_params(data: dict[str, Any], cfg: Config, upload: bytes | None = None) -> SynthesisParams:
    """Check every field of a request body; raise ``TTSError`` naming the first bad one."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unknown field; allowed fields: {', '.join(sorted(FIELDS))}")
    max_chars = cfg.tts.max_text_chars
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _bad("text", "must be a non-empty string")
    if len(text) > max_chars:
        raise TTSError(413, "text_too_long", f"field 'text' is {len(text)} characters; the limit is {max_chars}")
    voice = _string(data, "voice", MAX_VOICE_ID_CHARS) or None
    speaker_wav: bytes | str | None = _string(data, "speaker_wav", 8 * cfg.tts_api.max_upload_bytes) or None
    if upload is not None:
        if speaker_wav is not None:
            raise _bad("speaker_wav", "give it either as a file part or in the JSON, not both")
        speaker_wav = upload
    if voice and speaker_wav is not None:
        raise _bad("voice", "give either 'voice' or 'speaker_wav', not both")
    language = data.get("language")
    if language is not None and language not in LANGUAGES:
        raise _bad("language", f"{language!r} is not supported; allowed: {', '.join(LANGUAGES)}")
    fmt = data.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise _bad("format", f"{fmt!r} is not supported; allowed: {', '.join(FORMATS)}")
    streaming = data.get("streaming", False)
    if not isinstance(streaming, bool):
        raise _bad("streaming", "must be true or false")
    sample_rate = data.get("sample_rate")
    lo, hi = SAMPLE_RATE_RANGE
    if sample_rate is not None and (
        isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or not lo <= sample_rate <= hi
    ):
        raise _bad("sample_rate", f"must be an integer from {lo} to {hi} (Hz)")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise _bad("seed", f"must be an integer from 0 to {MAX_SEED}")
    instruct = _string(data, "instruct", MAX_INSTRUCT_CHARS)
    return SynthesisParams(
        text=text,
        voice=voice,
        speaker_wav=speaker_wav,
        prompt_text=_string(data, "prompt_text", max_chars) or "",
        language=language,
        instruct=instruct.strip() if instruct and instruct.strip() else None,
        speed=_number(data, "speed", 1.0, *SPEED_RANGE),
        pitch=_number(data, "pitch", 0.0, *PITCH_RANGE),
        energy=_number(data, "energy", 1.0, *ENERGY_RANGE),
        streaming=streaming,
        format=fmt,
        sample_rate=sample_rate,
        seed=seed,
    )


def split_sentences(text: str) -> list[str]:
    """Sentences for per-sentence DSP (the one splitter, `assistant.tts.text`); pieces shorter than
    ``MIN_SENTENCE_CHARS`` join the next one."""
    return join_short(text_sentences(text), MIN_SENTENCE_CHARS) or [text]


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


class TTSService:
    """Validation against the engine, the process-wide concurrency slots, rate limits, effects, streaming."""

    def __init__(self, cfg: Config, metrics: Metrics, voices: VoiceStore,
                 engine: Callable[[], TTSEngine | None]) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.voices = voices
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
            raise _bad("speaker_wav", "must be base64 audio, a data: URI, or an allowed http(s) URL") from None

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
        """Make a stored voice known to a cloning engine (after a restart: from its clip, then cache it)."""
        if voice_id in self._engine_voices:
            return
        lock = self._voice_locks.setdefault(voice_id, asyncio.Lock())
        async with lock:
            if voice_id in self._engine_voices:
                return
            clip = await asyncio.to_thread(self.voices.load_clip, voice_id)
            await self.prepare_voice(engine, voice_id, clip)
        self._voice_locks.pop(voice_id, None)

    async def prepare_voice(self, engine: TTSEngine, voice_id: str, clip: ReferenceClip) -> bool:
        """Let a cloning engine compute its prompt for a voice and cache it on disk; False if it cannot."""
        add_voice = getattr(engine, "add_voice", None)
        if not engine.capabilities.voice_cloning or add_voice is None:
            return False
        try:
            prompt = await add_voice(voice_id, clip)
        except TTSUnsupported as exc:
            raise TTSError(400, "unsupported", str(exc)) from None
        self._engine_voices.add(voice_id)
        save = getattr(prompt, "save", None)
        if save is not None and self.voices.get(voice_id) is not None:
            with contextlib.suppress(OSError, ValueError):
                await asyncio.to_thread(self.voices.write_cache_file, voice_id, engine.name, save)
        return True

    def forget_voice(self, voice_id: str) -> None:
        self._engine_voices.discard(voice_id)

    # --- preparing a job -------------------------------------------------------------------------------
    async def prepare(self, p: SynthesisParams) -> Job:
        """Check the request against the engine and build the engine request; raise TTSError if refused."""
        engine = self.engine()
        caps = engine.capabilities
        text, instruct, tag_dropped = p.text, p.instruct, False
        if instruct and not caps.instruct:
            raise TTSError(400, "unsupported", f"engine {engine.name} cannot follow 'instruct'")
        if not caps.instruct:
            tag, rest = split_leading_tag(text)
            if tag is not None:  # documented: engines without instruct mode drop a leading emotion tag
                text, tag_dropped = rest, True
                if not text.strip():
                    raise _bad("text", "nothing to say after the leading tag")
        if p.language and p.language not in caps.languages:
            raise TTSError(400, "unsupported",
                           f"engine {engine.name} does not speak language {p.language!r}; it speaks "
                           f"{', '.join(caps.languages)}")
        reference: ReferenceClip | None = None
        voice: str | None = None
        if isinstance(p.speaker_wav, str) and _URL.match(p.speaker_wav):
            self._check_url(p.speaker_wav)  # refuse a disallowed URL whatever the engine
        if p.speaker_wav is not None:
            if not caps.voice_cloning:
                raise TTSError(400, "unsupported", f"engine {engine.name} cannot clone voices (speaker_wav)")
            reference = await self.decode_clip(await self._speaker_bytes(p.speaker_wav), p.prompt_text)
        elif p.voice:
            voice = p.voice
            if valid_voice_id(voice) and self.voices.get(voice) is not None:
                if not caps.voice_cloning:
                    raise TTSError(400, "unsupported",
                                   f"voice {voice} is a cloned voice; engine {engine.name} cannot clone voices")
                await self._ensure_engine_voice(engine, voice)
            elif voice not in getattr(engine, "voices", ()):
                raise TTSError(404, "unknown_voice", f"no voice {voice!r}; see GET /api/voices")
        speed_native = caps.native_speed or p.speed == 1.0
        pitch_native = caps.native_pitch or p.pitch == 0.0
        request = TTSRequest(
            text=text,
            voice=voice,
            reference=reference,
            language=p.language,
            instruct=instruct,
            speed=p.speed if caps.native_speed else 1.0,
            pitch=p.pitch if caps.native_pitch else 0.0,
            seed=p.seed,
        )
        return Job(
            engine=engine,
            request=request,
            engine_rate=engine.sample_rate,
            sample_rate=p.sample_rate or engine.sample_rate,
            speed_dsp=1.0 if speed_native else p.speed,
            pitch_dsp=0.0 if pitch_native else p.pitch,
            energy=p.energy,
            tag_dropped=tag_dropped,
        )

    # --- streaming -------------------------------------------------------------------------------------
    async def stream(self, job: Job) -> AsyncIterator[np.ndarray]:
        """Float32 mono chunks at ``job.sample_rate``, each as soon as it exists; holds a slot throughout."""
        async with self.slot():
            t0 = time.perf_counter()
            first = True
            path = SpeechPath(job.engine, job.sample_rate, timeout_s=self.cfg.tts.timeout_s, chunker=self.cfg.chunker)
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


def _effects() -> Any:
    from assistant.tts import effects

    return effects


def pcm_bytes(chunk: np.ndarray) -> bytes:
    """float32 −1…1 → s16le bytes."""
    return float_to_s16(chunk).astype("<i2").tobytes()
