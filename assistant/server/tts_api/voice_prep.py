"""Where a request's voice comes from, and keeping the engine's prepared voices in step with the store.

``voice``/``speaker_wav`` become either an engine voice id (a registered voice, the engine's own voice, or a
clip file of the voices folder prepared once) or a reference clip to clone (an upload, base64, an allow-listed
URL). Registered voices are prepared by the engine once; the prepared form is cached next to the clip and,
after a restart, loaded instead of recomputed; a deleted voice is dropped from the engine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from assistant.audio import AudioFormatError, ClipTooLong, read_audio
from assistant.body import BodyTooLarge, read_capped
from assistant.config import Config
from assistant.server.tts_api.request import MAX_NAME_CHARS, SynthesisParams, TTSError, bad_field
from assistant.server.tts_api.voice_lookup import (
    NamedVoice,
    VoiceFolder,
    content_digest,
    file_voice_key,
    resolve_name,
)
from assistant.tts.base import ReferenceClip, TTSEngine, TTSUnsupported, VoiceCloner
from assistant.tts.voice_store import ReferenceClipStore

log = logging.getLogger(__name__)

MAX_URL_REDIRECTS = 3                 # same-host redirects followed when fetching an allowed speaker_wav URL
FILE_VOICES_KEPT = 32                 # clip files of the voices folder an engine keeps prepared (least recent go)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class KeyedLocks:
    """One lock per key while anyone holds it or waits for it; forgotten when the last one leaves, on every path
    (an error or a cancel included), so the map holds only keys in use."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class VoiceSources:
    """Reference clips (decoded and bounded), names, and the engine's prepared voices."""

    def __init__(self, cfg: Config, voices: ReferenceClipStore) -> None:
        self.cfg = cfg
        self.voices = voices
        self.folder = VoiceFolder(cfg.tts_api.voices_dir)
        self._file_voices: OrderedDict[str, None] = OrderedDict()  # clip files the engine holds prepared
        self._engine_voices: set[str] = set()      # stored voices the engine has prepared in this process
        self._voice_locks = KeyedLocks()           # one preparation of a voice at a time
        self._digests: OrderedDict[tuple[str, int, int], str] = OrderedDict()  # a clip file's state → its digest

    # --- reference clips -------------------------------------------------------------------------------
    async def decode_clip(self, data: bytes, text: str = "") -> ReferenceClip:
        """Uploaded bytes → a reference clip, checking size, format and duration limits."""
        api = self.cfg.tts_api
        if len(data) > api.max_upload_bytes:
            raise TTSError(413, "too_large", f"reference clip is over {api.max_upload_bytes} bytes")
        allowed = f"allowed {api.min_upload_seconds:g} to {api.max_upload_seconds:g} s"
        try:
            # Bounded before it decodes: a declared duration over the limit is refused from the header, and any
            # other decode stops just past it (a small file of hours of silence must not become gigabytes).
            audio, sr = await asyncio.to_thread(read_audio, data, api.max_upload_seconds)
        except ClipTooLong as exc:
            what = f"{exc.seconds:.1f} s" if exc.declared else f"over {exc.max_seconds:g} s"
            raise TTSError(413, "clip_too_long", f"reference clip is {what}; {allowed}") from None
        except AudioFormatError as exc:
            raise TTSError(400, "bad_audio", f"reference clip is not decodable audio ({exc})") from None
        seconds = len(audio) / sr if sr else 0.0
        if seconds > api.max_upload_seconds:
            raise TTSError(413, "clip_too_long", f"reference clip is {seconds:.1f} s; {allowed}")
        if seconds < api.min_upload_seconds:
            raise TTSError(400, "clip_too_short", f"reference clip is {seconds:.1f} s; {allowed}")
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
                        try:
                            return await read_capped(resp, api.max_upload_bytes)
                        except BodyTooLarge:
                            raise TTSError(413, "too_large",
                                           f"reference clip is over {api.max_upload_bytes} bytes") from None
                raise TTSError(400, "url_fetch_failed", "speaker_wav URL redirects too often")
        except TimeoutError:
            raise TTSError(400, "url_fetch_failed", f"speaker_wav URL took over {api.url_timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise TTSError(400, "url_fetch_failed", f"speaker_wav URL could not be fetched ({type(exc).__name__})"
                           ) from None

    async def ensure_engine_voice(self, engine: TTSEngine, voice_id: str) -> None:
        """Make a stored voice known to a cloning engine: after a restart from its cached prepared form (no
        recomputation), else from its clip (and cache the result)."""
        if voice_id in self._engine_voices:
            return
        async with self._voice_locks.hold(voice_id):
            if voice_id in self._engine_voices:
                return
            if not await self._load_cached_voice(engine, voice_id):
                clip = await asyncio.to_thread(self.voices.load_clip, voice_id)
                await self.prepare_voice(engine, voice_id, clip)

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

    def forget_voice(self, engine: TTSEngine | None, voice_id: str) -> None:
        """A deleted voice: the engine drops its prepared form too."""
        self._engine_voices.discard(voice_id)
        if isinstance(engine, VoiceCloner):
            engine.forget_voice(voice_id)

    async def _file_voice(self, engine: TTSEngine, path: Path, prompt_text: str) -> tuple[str | None,
                                                                                          ReferenceClip | None]:
        """A clip file of the voices folder as the engine's voice (prepared once per clip content and transcript),
        or as a reference clip for cloning engines that cannot keep voices. The file's own ``.txt`` says what it
        says; a request's ``prompt_text`` is used only where there is none."""
        own = await asyncio.to_thread(self.folder.transcript, path)
        text = own or prompt_text
        if not isinstance(engine, VoiceCloner):
            data = await asyncio.to_thread(self._read_clip_file, path)
            return None, await self.decode_clip(data, text)
        key = file_voice_key(await self._clip_digest(path), own)
        if key in self._file_voices:
            self._file_voices.move_to_end(key)
            return key, None
        async with self._voice_locks.hold(key):
            if key not in self._file_voices:
                data = await asyncio.to_thread(self._read_clip_file, path)
                clip = await self.decode_clip(data, text)
                try:
                    await engine.add_voice(key, clip)
                except TTSUnsupported as exc:
                    raise TTSError(400, "unsupported", str(exc)) from None
                self._file_voices[key] = None
                while len(self._file_voices) > FILE_VOICES_KEPT:
                    old, _ = self._file_voices.popitem(last=False)
                    engine.forget_voice(old)
        return key, None

    async def _clip_digest(self, path: Path) -> str:
        """The digest of a clip file's content, read again only when the file changed (size or mtime)."""
        st = await asyncio.to_thread(path.stat)
        state = (str(path), st.st_size, st.st_mtime_ns)
        if state not in self._digests:
            self._digests[state] = await asyncio.to_thread(lambda: content_digest(self._read_clip_file(path)))
            while len(self._digests) > 4 * FILE_VOICES_KEPT:
                self._digests.popitem(last=False)
        return self._digests[state]

    def _read_clip_file(self, path: Path) -> bytes:
        """A clip file's bytes, refused before reading if it is over the upload limit."""
        cap = self.cfg.tts_api.max_upload_bytes
        if path.stat().st_size > cap:
            raise TTSError(413, "too_large", f"{path.name} is over {cap} bytes (tts_api.max_upload_bytes)")
        return path.read_bytes()

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
            await self.ensure_engine_voice(engine, found.voice_id)
            return found.voice_id, None
        assert found.path is not None
        return await self._file_voice(engine, found.path, prompt_text)

    async def voice_of(self, engine: TTSEngine, p: SynthesisParams) -> tuple[str | None, ReferenceClip | None]:
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


def _is_clip_data(value: str) -> bool:
    """A ``speaker_wav`` string that carries audio (a data: URI or base64), not a name: names are short."""
    return value.startswith("data:") or len(value) > MAX_NAME_CHARS
