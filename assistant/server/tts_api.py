"""The TTS API: ``POST /api/tts``, ``GET /ws/tts``, ``/api/voices``, ``GET /api/openapi.json``.

Handlers only translate HTTP/WebSocket to :class:`~assistant.server.tts_service.TTSService` and back; validation,
limits, effects and streaming live in the service. Every refusal is JSON ``{"error", "detail"}``; over the
WebSocket it is a text message and the socket stays open for the next request.

WebSocket protocol (one request at a time per socket; many sockets at once):

    client → text  {"text": ..., ...same fields as POST /api/tts...}   (``streaming``/``format`` are ignored)
    server → text  {"type": "start", "sample_rate": N, "channels": 1, "format": "s16le"}
    server → binary s16le mono PCM chunks, each as soon as it exists
    server → binary b"END"                                   (or, instead, a text {"error", "detail"})
    client → text  {"type": "cancel"}                         stops the current request; END follows
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from typing import Any

import numpy as np
from aiohttp import BodyPartReader, WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError

from assistant.audio import write_wav_bytes
from assistant.config import Config
from assistant.server.http import CONFIG, SERVICES, HTTPJSONError, read_json
from assistant.server.openapi import build_openapi
from assistant.server.tts_service import SynthesisParams, TTSError, TTSService, parse_params, pcm_bytes
from assistant.tts.voices import VoiceLimitError, VoiceStore, valid_voice_id

log = logging.getLogger(__name__)

TTS_SERVICE: web.AppKey[TTSService] = web.AppKey("tts_service", TTSService)
END = b"END"
WS_HEARTBEAT_S = 30.0
MULTIPART_SLACK = 65_536           # headers and boundaries around the parts of a multipart body
MAX_VOICE_NAME_CHARS = 64
PCM_CONTENT_TYPE = "application/octet-stream"


def setup_tts_routes(app: web.Application) -> None:
    """Register the TTS routes and the service (the engine is taken from ``Services`` once loaded)."""
    from pathlib import Path

    cfg = app[CONFIG]
    services = app[SERVICES]
    store = VoiceStore(Path(cfg.server.data_dir) / "voices", cfg.tts_api.max_voices)
    app[TTS_SERVICE] = TTSService(cfg, services.metrics, store, lambda: services.tts)
    app.router.add_post("/api/tts", tts_http)
    app.router.add_get("/ws/tts", tts_ws)
    app.router.add_get("/api/voices", list_voices)
    app.router.add_post("/api/voices", create_voice)
    app.router.add_delete("/api/voices/{voice_id}", delete_voice)
    app.router.add_get("/api/openapi.json", openapi)


def _client(request: web.Request) -> str:
    """The rate-limit key: the peer address (a proxy in front should do its own limiting)."""
    return request.remote or "unknown"


def _json_cap(cfg: Config) -> int:
    """Largest JSON request: the body limit plus a base64 reference clip (4/3 of the upload cap)."""
    return cfg.server.max_body_bytes + (cfg.tts_api.max_upload_bytes * 4) // 3 + 16


def _outcome_of(exc: HTTPJSONError) -> str:
    try:
        return str(json.loads(exc.text or "{}").get("error", "bad_request"))
    except ValueError:
        return "bad_request"


def _as_http(exc: TTSError) -> HTTPJSONError:
    return HTTPJSONError(exc.status, exc.error, exc.detail, headers=exc.headers or None)


async def _read_multipart(request: web.Request, limits: dict[str, int]) -> dict[str, bytes]:
    """Read a multipart body part by part, each bounded by ``limits[name]``; unknown parts are refused."""
    total = sum(limits.values()) + MULTIPART_SLACK
    if request.content_length is not None and request.content_length > total:
        raise HTTPJSONError(413, "too_large", f"request body over {total} bytes")
    try:
        reader = await request.multipart()
        out: dict[str, bytes] = {}
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name not in limits:
                name = getattr(part, "name", None)
                raise HTTPJSONError(400, "bad_request",
                                    f"unexpected form part {name!r}; allowed: {', '.join(limits)}")
            if part.name in out:
                raise HTTPJSONError(400, "bad_request", f"form part {part.name!r} given twice")
            cap = limits[part.name]
            data = bytearray()
            while chunk := await part.read_chunk(65_536):
                data += chunk
                if len(data) > cap:
                    what = "reference clip" if part.filename else f"form part {part.name!r}"
                    raise HTTPJSONError(413, "too_large", f"{what} is over {cap} bytes")
            out[part.name] = bytes(data)
        return out
    except HTTPJSONError:
        raise
    except (ValueError, AssertionError, KeyError, HttpProcessingError) as exc:
        # HttpProcessingError: a part's headers are malformed (aiohttp raises InvalidHeader / LineTooLong).
        raise HTTPJSONError(400, "bad_multipart", f"malformed multipart body ({type(exc).__name__})") from None


def _text_part(parts: dict[str, bytes], name: str) -> str | None:
    if name not in parts:
        return None
    try:
        return parts[name].decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPJSONError(400, "bad_request", f"form part {name!r} must be UTF-8 text") from None


async def _read_tts_body(request: web.Request, cfg: Config) -> tuple[dict[str, Any], bytes | None]:
    """JSON body, or multipart with a ``request`` JSON part and an optional ``speaker_wav`` file part."""
    if request.content_type == "multipart/form-data":
        parts = await _read_multipart(
            request, {"request": cfg.server.max_body_bytes, "speaker_wav": cfg.tts_api.max_upload_bytes}
        )
        raw = _text_part(parts, "request")
        if raw is None:
            raise HTTPJSONError(400, "bad_request", "multipart body needs a 'request' part holding the JSON")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise HTTPJSONError(400, "bad_json", f"'request' part is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HTTPJSONError(400, "bad_json", "'request' part must be a JSON object")
        return data, parts.get("speaker_wav")
    return await read_json(request, _json_cap(cfg)), None


# --- POST /api/tts ---------------------------------------------------------------------------------------
async def tts_http(request: web.Request) -> web.StreamResponse:
    """Synthesise: a WAV (or raw PCM) file, or with ``streaming`` a chunked s16le stream."""
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    t0 = time.perf_counter()
    outcome = "error"
    try:
        svc.check_rate(_client(request))
        data, upload = await _read_tts_body(request, cfg)
        params = parse_params(data, cfg, upload)
        job = await svc.prepare(params)
        chunks = svc.stream(job)
        try:
            if params.streaming:
                resp = await _stream_http(request, params, job.sample_rate, chunks, t0)
            else:
                resp = await _whole_http(params, job.sample_rate, chunks, t0)
        finally:
            await chunks.aclose()
        outcome = "ok"
        return resp
    except StreamAborted as exc:
        outcome = exc.outcome
        return exc.response
    except TTSError as exc:
        outcome = exc.error
        raise _as_http(exc) from None
    except HTTPJSONError as exc:
        outcome = _outcome_of(exc)
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        outcome = "cancelled"
        raise
    except Exception as exc:
        log.warning("tts_failed transport=http kind=%s", type(exc).__name__)
        raise HTTPJSONError(500, "synthesis_failed", "the engine failed to synthesise this text") from None
    finally:
        svc.metrics.tts_requests_total.labels(outcome=outcome).inc()
        log.info("tts_request transport=http outcome=%s ms=%.0f", outcome, (time.perf_counter() - t0) * 1000)


def _audio_headers(sample_rate: int) -> dict[str, str]:
    return {"X-Sample-Rate": str(sample_rate), "X-Channels": "1", "X-Sample-Format": "s16le"}


async def _whole_http(params: SynthesisParams, sample_rate: int, chunks: Any, t0: float) -> web.Response:
    parts: list[np.ndarray] = []
    first_ms = None
    async for chunk in chunks:
        if first_ms is None:
            first_ms = (time.perf_counter() - t0) * 1000
        parts.append(chunk)
    audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    headers = _audio_headers(sample_rate) | {
        "X-Audio-Seconds": f"{len(audio) / sample_rate:.3f}",
        "X-TTS-First-Chunk-Ms": f"{first_ms or 0.0:.0f}",
        "X-TTS-Total-Ms": f"{(time.perf_counter() - t0) * 1000:.0f}",
    }
    if params.format != "pcm":
        body = await asyncio.to_thread(write_wav_bytes, audio, sample_rate)
        return web.Response(body=body, content_type="audio/wav", headers=headers)
    return web.Response(body=pcm_bytes(audio), content_type=PCM_CONTENT_TYPE, headers=headers)


def streaming_wav_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes 0xFFFFFFFF, as ffmpeg and browsers accept)."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", unknown))


async def _stream_http(request: web.Request, params: SynthesisParams, sample_rate: int, chunks: Any,
                       t0: float) -> web.StreamResponse:
    """Chunked s16le: the first chunk is computed before the headers go out, so early errors get a status."""
    try:
        first: np.ndarray | None = await anext(chunks)
    except StopAsyncIteration:
        first = None
    explicit_wav = params.format == "wav"
    resp = web.StreamResponse(headers=_audio_headers(sample_rate) | {
        "Content-Type": "audio/wav" if explicit_wav else PCM_CONTENT_TYPE,
        "X-TTS-First-Chunk-Ms": f"{(time.perf_counter() - t0) * 1000:.0f}",
        "Cache-Control": "no-store",
    })
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        if explicit_wav:
            await resp.write(streaming_wav_header(sample_rate))
        if first is not None:
            await resp.write(pcm_bytes(first))
            async for chunk in chunks:
                await resp.write(pcm_bytes(chunk))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        # Headers are gone: the only honest signal left is to cut the connection (no final chunk).
        outcome = exc.error if isinstance(exc, TTSError) else "synthesis_failed"
        log.warning("tts_stream_aborted outcome=%s", outcome)
        if request.transport is not None:
            request.transport.abort()
        raise StreamAborted(outcome, resp) from None
    await resp.write_eof()
    return resp


class StreamAborted(Exception):
    """A streamed response failed after its headers were sent; the connection was cut."""

    def __init__(self, outcome: str, response: web.StreamResponse) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.response = response


# --- GET /ws/tts -----------------------------------------------------------------------------------------
async def tts_ws(request: web.Request) -> web.WebSocketResponse:
    """Many requests per socket, one at a time; see the module docstring for the message protocol."""
    cfg = request.app[CONFIG]
    ws = web.WebSocketResponse(heartbeat=WS_HEARTBEAT_S, max_msg_size=_json_cap(cfg))
    await ws.prepare(request)
    client = _client(request)
    task: asyncio.Task[None] | None = None
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                try:
                    data = json.loads(msg.data)
                except json.JSONDecodeError as exc:
                    await _ws_error(ws, "bad_json", f"message is not valid JSON: {exc}")
                    continue
                if not isinstance(data, dict):
                    await _ws_error(ws, "bad_json", "message must be a JSON object")
                    continue
                kind = data.pop("type", "synthesize")
                if kind == "cancel":
                    if task is not None and not task.done():
                        task.cancel()
                    continue
                if kind != "synthesize":
                    await _ws_error(ws, "bad_request", f"field 'type': {kind!r} is unknown; use synthesize or cancel")
                    continue
                if task is not None and not task.done():
                    await _ws_error(ws, "busy", "a request is already in flight on this socket; wait for END")
                    continue
                data.pop("streaming", None)
                data.pop("format", None)
                task = asyncio.create_task(_ws_synthesize(request, ws, data, client), name="tts-ws")
            elif msg.type == WSMsgType.BINARY:
                await _ws_error(ws, "bad_request", "send requests as JSON text messages")
            elif msg.type == WSMsgType.ERROR:
                break
    finally:
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    return ws


async def _ws_error(ws: web.WebSocketResponse, error: str, detail: str) -> None:
    if not ws.closed:
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await ws.send_json({"error": error, "detail": detail})


async def _ws_synthesize(request: web.Request, ws: web.WebSocketResponse, data: dict[str, Any], client: str) -> None:
    """One request on a socket: start message, PCM chunks, END; or one error message."""
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    t0 = time.perf_counter()
    outcome = "error"
    try:
        svc.check_rate(client)
        params = parse_params(data, cfg)
        job = await svc.prepare(params)
        chunks = svc.stream(job)
        started = False
        try:
            async for chunk in chunks:
                if not started:
                    started = True
                    await ws.send_json({"type": "start", "sample_rate": job.sample_rate, "channels": 1,
                                        "format": "s16le"})
                await ws.send_bytes(pcm_bytes(chunk))
        finally:
            await chunks.aclose()
        if not started:
            await ws.send_json({"type": "start", "sample_rate": job.sample_rate, "channels": 1, "format": "s16le"})
        await ws.send_bytes(END)
        outcome = "ok"
    except TTSError as exc:
        outcome = exc.error
        await _ws_error(ws, exc.error, exc.detail)
    except asyncio.CancelledError:
        outcome = "cancelled"
        if ws.closed:
            raise
        # The client asked to cancel: the request ends with END as usual, the socket stays usable.
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await ws.send_bytes(END)
    except ConnectionResetError:
        outcome = "cancelled"
    except Exception as exc:
        log.warning("tts_failed transport=ws kind=%s", type(exc).__name__)
        await _ws_error(ws, "synthesis_failed", "the engine failed to synthesise this text")
    finally:
        svc.metrics.tts_requests_total.labels(outcome=outcome).inc()
        log.info("tts_request transport=ws outcome=%s ms=%.0f", outcome, (time.perf_counter() - t0) * 1000)


# --- /api/voices -----------------------------------------------------------------------------------------
def _voice_json(voice: Any, cloning: bool) -> dict[str, Any]:
    return voice.to_json() | {"cloning": cloning}


def _engine_clones(svc: TTSService) -> bool:
    engine = svc.current_engine()
    return bool(engine is not None and engine.capabilities.voice_cloning)


async def list_voices(request: web.Request) -> web.Response:
    svc = request.app[TTS_SERVICE]
    cloning = _engine_clones(svc)
    voices = await asyncio.to_thread(svc.voices.list)
    engine = svc.current_engine()
    return web.json_response({
        "voices": [_voice_json(v, cloning) for v in voices],
        "engine": engine.name if engine is not None else None,
        "cloning": cloning,
        "max_voices": svc.voices.max_voices,
    })


async def create_voice(request: web.Request) -> web.Response:
    """Multipart ``clip`` + ``transcript`` (+ ``name``) → 201 ``{voice_id, ..., cloning}``.

    On an engine without cloning the clip is still stored (``"cloning": false``): it can be used once the
    server runs a cloning engine, and synthesis with it is refused (400 unsupported) until then.
    """
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    try:
        svc.check_rate(_client(request))
        engine = svc.engine()
        if request.content_type != "multipart/form-data":
            raise HTTPJSONError(400, "bad_request", "send multipart/form-data with 'clip', 'transcript', 'name'")
        parts = await _read_multipart(request, {
            "clip": cfg.tts_api.max_upload_bytes,
            "transcript": 4 * cfg.tts.max_text_chars,
            "name": 4 * MAX_VOICE_NAME_CHARS,
        })
        if not parts.get("clip"):
            raise HTTPJSONError(400, "bad_request", "form part 'clip' (the reference audio file) is required")
        transcript = (_text_part(parts, "transcript") or "").strip()
        if not transcript:
            raise HTTPJSONError(400, "bad_request", "form part 'transcript' (what the clip says) is required")
        if len(transcript) > cfg.tts.max_text_chars:
            raise HTTPJSONError(413, "too_large", f"transcript over {cfg.tts.max_text_chars} characters")
        name = " ".join((_text_part(parts, "name") or "").split())
        if len(name) > MAX_VOICE_NAME_CHARS or not all(c.isprintable() for c in name):
            raise HTTPJSONError(400, "bad_request", f"field 'name': printable text up to {MAX_VOICE_NAME_CHARS} chars")
        clip = await svc.decode_clip(parts["clip"], transcript)
        try:
            voice = await asyncio.to_thread(svc.voices.create, clip.audio, clip.sample_rate, transcript, name)
        except VoiceLimitError as exc:
            raise HTTPJSONError(409, "voice_limit", str(exc)) from None
        try:
            cloning = await svc.prepare_voice(engine, voice.voice_id, clip)
        except BaseException:
            await asyncio.to_thread(svc.voices.delete, voice.voice_id)
            raise
    except TTSError as exc:
        raise _as_http(exc) from None
    return web.json_response(_voice_json(voice, cloning), status=201)


async def delete_voice(request: web.Request) -> web.Response:
    svc = request.app[TTS_SERVICE]
    voice_id = request.match_info["voice_id"]
    if not valid_voice_id(voice_id) or not await asyncio.to_thread(svc.voices.delete, voice_id):
        raise HTTPJSONError(404, "unknown_voice", "no such voice")
    svc.forget_voice(voice_id)
    return web.json_response({"status": "deleted", "voice_id": voice_id})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_openapi(request.app[CONFIG]))
