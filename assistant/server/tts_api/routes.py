"""The TTS API's own routes: ``POST /api/tts``, ``GET /ws/tts``, ``/api/voices`` (OpenAI's speech API is in
``openai_speech``).

Handlers only translate HTTP/WebSocket to :class:`~assistant.server.tts_api.service.TTSService` and back; validation,
limits, effects and streaming live in the service. Every refusal is JSON ``{"error", "detail"}``.

WebSocket protocol (one request at a time per socket; many sockets at once). The handshake answer carries
``X-Sample-Rate`` (the engine's rate), ``X-Channels: 1``, ``X-Sample-Format: s16le``.

    client → text   {"text": ..., ...same fields as POST /api/tts...}  (``streaming``/``format`` are ignored)
    server → binary s16le mono PCM chunks, each as soon as it exists
    server → binary b"END"
    client → text   {"type": "cancel"}                        stops the current request; END follows

That is all a plain client sees. Opt-ins (request fields, or query parameters ``?metadata=1&keep_open=1``):
``metadata`` adds a text ``{"type": "start", "sample_rate", "channels", "format"}`` before each request's
audio. On an error the server sends one text ``{"error", "detail"}`` and closes the socket with code
4000 + the HTTP status (4400, 4413, 4429, 4503, ...) and the reason ``"<error>: <detail>"``; with
``keep_open`` it sends the message and the socket stays usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
from aiohttp import WSMsgType, web

from assistant.audio import write_wav_bytes
from assistant.body import loads_bounded
from assistant.config import Config
from assistant.server.http import (
    CONFIG,
    APIError,
    HTTPJSONError,
    WriteStalled,
    json_object,
    read_json,
    read_multipart,
    write_within,
)
from assistant.server.limits import LIMITS
from assistant.server.openapi import documented, error, json_body, ref
from assistant.server.tts_api import TTS_SERVICE
from assistant.server.tts_api.formats import streaming_wav_header
from assistant.server.tts_api.outcome import StreamAborted, request_outcome, synthesis_errors
from assistant.server.tts_api.request import (
    SynthesisParams,
    TTSError,
    WSOptions,
    parse_params,
    properties,
    schema,
    ws_options,
)
from assistant.server.tts_api.service import TTSService, pcm_bytes
from assistant.tts.voice_store import Voice, VoiceLimitError, valid_voice_id

log = logging.getLogger(__name__)

END = b"END"
WS_HEARTBEAT_S = 30.0
MAX_VOICE_NAME_CHARS = 64
PCM_CONTENT_TYPE = "application/octet-stream"


AUDIO_HEADERS = {
    "X-Sample-Rate": {"schema": {"type": "integer"}, "description": "samples per second of the audio"},
    "X-Channels": {"schema": {"type": "integer", "const": 1}, "description": "always 1 (mono)"},
    "X-Sample-Format": {"schema": {"type": "string", "const": "s16le"}, "description": "16-bit little-endian"},
}
VOICE_SCHEMA = {
    "type": "object",
    "required": ["voice_id", "name", "transcript", "duration_s", "sample_rate", "created", "cloning"],
    "properties": {
        "voice_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "name": {"type": "string"},
        "transcript": {"type": "string"},
        "duration_s": {"type": "number"},
        "sample_rate": {"type": "integer"},
        "created": {"type": "number", "description": "Unix time"},
        "cloning": {"type": "boolean",
                    "description": "whether the running engine can speak with this voice"},
    },
}
WS_START_SCHEMA = {
    "type": "object",
    "properties": {"type": {"const": "start"}, "sample_rate": {"type": "integer"},
                   "channels": {"const": 1}, "format": {"const": "s16le"}},
}


def _ws_request_schema(cfg: Config) -> dict[str, object]:
    return schema(SynthesisParams, cfg, extra=properties(WSOptions, cfg))


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


def _text_part(parts: dict[str, bytes], name: str) -> str | None:
    if name not in parts:
        return None
    try:
        return parts[name].decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPJSONError(400, "bad_request", f"form part {name!r} must be UTF-8 text") from None


async def _read_tts_body(request: web.Request, cfg: Config) -> tuple[dict[str, object], bytes | None]:
    """JSON body, or multipart with a ``request`` JSON part and an optional ``speaker_wav`` file part."""
    if request.content_type == "multipart/form-data":
        parts = await read_multipart(
            request, {"request": cfg.server.max_body_bytes, "speaker_wav": cfg.tts_api.max_upload_bytes}
        )
        raw = _text_part(parts, "request")
        if raw is None:
            raise HTTPJSONError(400, "bad_request", "multipart body needs a 'request' part holding the JSON")
        return json_object(raw, "'request' part"), parts.get("speaker_wav")
    return await read_json(request, _json_cap(cfg)), None


# --- POST /api/tts ---------------------------------------------------------------------------------------
@documented(
    "Synthesise speech",
    description="Whole WAV/PCM, or with streaming=true chunked raw s16le mono PCM sent as each "
                "chunk exists. With pitch or speed done by DSP (engines without native support) "
                "the stream moves one sentence at a time.",
    request={
        "application/json": {"schema": ref("TTSRequest")},
        "multipart/form-data": {"schema": {
            "type": "object", "required": ["request"],
            "properties": {"request": {"type": "string", "description": "the TTSRequest JSON"},
                           "speaker_wav": {"type": "string", "format": "binary"}},
        }},
    },
    responses={
        "200": {"description": "audio", "headers": AUDIO_HEADERS | {
            "X-TTS-First-Chunk-Ms": {"schema": {"type": "integer"}},
            "X-TTS-Total-Ms": {"schema": {"type": "integer"}, "description": "whole responses only"},
        }, "content": {
            "audio/wav": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                         "description": "raw s16le mono PCM"},
        }},
        **synthesis_errors(error, {
            "400": "bad field value, unknown field, bad JSON, undecodable audio, unsupported option for this "
                   "engine (vocoder, cloning, language, instruct), URL not allowed, unknown_voice (the detail "
                   "lists what exists)",
            "413": "text, body or reference clip over its limit",
            "429": "rate_limited (Retry-After) or busy (all synthesis slots taken)",
        }),
    },
    schemas={"TTSRequest": lambda cfg: schema(SynthesisParams, cfg)},
)
async def tts_http(request: web.Request) -> web.StreamResponse:
    """Synthesise: a WAV (or raw PCM) file, or with ``streaming`` a chunked s16le stream."""
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    with request_outcome(svc, "http") as outcome:
        try:
            data, upload = await _read_tts_body(request, cfg)
            params = parse_params(data, cfg, upload)
            job = await svc.prepare(params)
            chunks = svc.stream(job)
            try:
                if params.streaming:
                    resp = await _stream_http(request, params, job.sample_rate, chunks, outcome.t0)
                else:
                    resp = await _whole_http(params, job.sample_rate, chunks, outcome.t0)
            finally:
                await chunks.aclose()
            outcome.value = "ok"
            return resp
        except StreamAborted as exc:
            outcome.value = exc.outcome
            return exc.response
        except TTSError as exc:
            outcome.value = exc.error
            raise _as_http(exc) from None
        except HTTPJSONError as exc:
            outcome.value = _outcome_of(exc)
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # request_outcome names them
        except Exception as exc:
            log.warning("tts_failed transport=http kind=%s", type(exc).__name__)
            raise HTTPJSONError(500, "synthesis_failed", "the engine failed to synthesise this text") from None


def _audio_headers(sample_rate: int) -> dict[str, str]:
    return {"X-Sample-Rate": str(sample_rate), "X-Channels": "1", "X-Sample-Format": "s16le"}


async def _whole_http(params: SynthesisParams, sample_rate: int, chunks: AsyncIterator[np.ndarray],
                      t0: float) -> web.Response:
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


async def _stream_http(request: web.Request, params: SynthesisParams, sample_rate: int,
                       chunks: AsyncIterator[np.ndarray], t0: float) -> web.StreamResponse:
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
    timeout = request.app[CONFIG].tts_api.write_timeout_s
    try:
        if explicit_wav:
            await write_within(request, resp.write(streaming_wav_header(sample_rate)), timeout)
        if first is not None:
            await write_within(request, resp.write(pcm_bytes(first)), timeout)
            async for chunk in chunks:
                await write_within(request, resp.write(pcm_bytes(chunk)), timeout)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:  # the client went away: its request line says so, at info
        raise StreamAborted("client_gone", resp) from None
    except Exception as exc:
        # Headers are gone: the only honest signal left is to cut the connection (no final chunk).
        outcome = _aborted_outcome(exc)
        log.warning("tts_stream_aborted outcome=%s", outcome)
        if request.transport is not None:
            request.transport.abort()
        raise StreamAborted(outcome, resp) from None
    await resp.write_eof()
    return resp


def _aborted_outcome(exc: Exception) -> str:
    if isinstance(exc, TTSError):
        return exc.error
    return "write_timeout" if isinstance(exc, WriteStalled) else "synthesis_failed"


# --- GET /ws/tts -----------------------------------------------------------------------------------------
WS_CLOSE_BASE = 4000          # close code on an error: 4000 + the HTTP status the same error gets over HTTP
WS_REASON_BYTES = 123         # the most a close frame's reason may hold


def _ws_query(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.query.items() if k != "token"}


@documented(
    "Streaming TTS over a WebSocket",
    description="Upgrade to a WebSocket (token as ?token= when auth is on). The handshake answer "
                "carries X-Sample-Rate (the engine's rate: the audio's rate unless a request sets "
                "sample_rate), X-Channels: 1, X-Sample-Format: s16le. Send a WSRequest as a JSON "
                "text message. By default (the plain protocol) the server sends only binary "
                "messages: s16le mono PCM chunks as they are made, then the 3 bytes END. On an "
                "error it sends one text message {error, detail} and closes the socket with code "
                "4000 + the HTTP status of that error (4400, 4413, 4429, 4500, 4503, 4504) and "
                "the reason '<error>: <detail>'. Opt-ins, as request fields or query parameters "
                "(?metadata=1&keep_open=1): metadata sends {type: start, sample_rate, channels: "
                "1, format: s16le} before each request's audio; keep_open keeps the socket open "
                "after an error. Send {type: cancel} to stop the current request (END follows). "
                "One request at a time per socket (a second gets error busy); open several "
                "sockets for more.",
    parameters=[
        {"name": "metadata", "in": "query", "required": False, "schema": {"type": "boolean"}},
        {"name": "keep_open", "in": "query", "required": False, "schema": {"type": "boolean"}},
    ],
    responses={"101": {"description": "switching protocols", "headers": AUDIO_HEADERS},
               "400": error("bad query parameter"),
               "401": error("missing or wrong token"),
               "503": error("models still loading")},
    schemas={"WSRequest": _ws_request_schema, "WSStart": WS_START_SCHEMA},
)
async def tts_ws(request: web.Request) -> web.WebSocketResponse:
    """Requests one at a time per socket; the protocol (plain by default) is in the module docstring."""
    cfg = request.app[CONFIG]
    svc = request.app[TTS_SERVICE]
    limits = request.app[LIMITS]
    try:
        opts = ws_options(_ws_query(request), {}, cfg)
        engine = svc.engine()
    except TTSError as exc:  # before the upgrade: a plain HTTP error the client's handshake reports
        raise _as_http(exc) from None
    client = limits.client(request)
    api = cfg.tts_api
    # Held for the socket's life: past the caps the upgrade gets 429 (this client) or 503 (everyone).
    with limits.holding("ws", client, api.max_ws_per_client, api.max_ws_connections, "TTS WebSockets"):
        ws = web.WebSocketResponse(heartbeat=WS_HEARTBEAT_S, max_msg_size=_json_cap(cfg))
        ws.headers.update(_audio_headers(engine.sample_rate))
        await ws.prepare(request)
        await _ws_serve(request, ws, client, opts)
    return ws


async def _ws_serve(request: web.Request, ws: web.WebSocketResponse, client: str, opts: WSOptions) -> None:
    """Read the socket's messages until it closes, or until it sat idle (no message, nothing in flight) too long."""
    cfg = request.app[CONFIG]
    idle_s = cfg.tts_api.ws_idle_timeout_s
    task: asyncio.Task[None] | None = None
    try:
        while not ws.closed:
            try:
                msg = await ws.receive(timeout=idle_s)
            except TimeoutError:
                if task is not None and not task.done():
                    continue
                await ws.close(code=WS_CLOSE_BASE + 408,
                               message=_close_reason("idle_timeout", f"no request for {idle_s:g} s"))
                break
            if msg.type == WSMsgType.TEXT:
                try:
                    data = loads_bounded(msg.data)
                except ValueError as exc:  # bad JSON, or nested too deep (body.loads_bounded)
                    await _ws_fail(ws, opts, TTSError(400, "bad_json", f"message is not valid JSON: {exc}"))
                    continue
                if not isinstance(data, dict):
                    await _ws_fail(ws, opts, TTSError(400, "bad_json", "message must be a JSON object"))
                    continue
                kind = data.pop("type", "synthesize")
                if kind == "cancel":
                    if task is not None and not task.done():
                        task.cancel()
                    continue
                try:
                    opts = ws_options({}, data, cfg, current=opts)
                    if kind != "synthesize":
                        raise TTSError(400, "bad_request", f"field 'type': {kind!r} is unknown; use synthesize or "
                                       "cancel", param="type")
                    if task is not None and not task.done():
                        raise TTSError(429, "busy", "a request is already in flight on this socket; wait for END")
                except TTSError as exc:
                    await _ws_fail(ws, opts, exc)
                    continue
                data.pop("streaming", None)
                data.pop("format", None)
                task = asyncio.create_task(_ws_synthesize(request, ws, data, client, opts), name="tts-ws")
            elif msg.type == WSMsgType.BINARY:
                await _ws_fail(ws, opts, TTSError(400, "bad_request", "send requests as JSON text messages"))
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
    finally:
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _close_reason(error: str, detail: str) -> bytes:
    """``error: detail`` cut to what a close frame holds, at a character boundary."""
    reason = f"{error}: {detail}".encode()
    if len(reason) <= WS_REASON_BYTES:
        return reason
    return reason[: WS_REASON_BYTES - 3].decode("utf-8", "ignore").encode() + b"..."


async def _ws_fail(ws: web.WebSocketResponse, opts: WSOptions, exc: APIError) -> None:
    """One JSON error message; then, unless the client opted into keep_open, a close naming the problem."""
    if ws.closed:
        return
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await ws.send_json(exc.to_json())
        if not opts.keep_open:
            await ws.close(code=WS_CLOSE_BASE + exc.status, message=_close_reason(exc.error, exc.detail))


async def _ws_synthesize(request: web.Request, ws: web.WebSocketResponse, data: dict[str, object], client: str,
                         opts: WSOptions) -> None:
    """One request on a socket: (start message,) PCM chunks, END; or one error message (and a close)."""
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    timeout = cfg.tts_api.write_timeout_s

    async def start(rate: int) -> None:
        if opts.metadata:
            await write_within(request, ws.send_json(
                {"type": "start", "sample_rate": rate, "channels": 1, "format": "s16le"}), timeout)

    with request_outcome(svc, "ws") as outcome:
        try:
            request.app[LIMITS].take("tts", client)  # the same budget as POST /api/tts, once per request
            params = parse_params(data, cfg)
            job = await svc.prepare(params)
            chunks = svc.stream(job)
            started = False
            try:
                async for chunk in chunks:
                    if not started:
                        started = True
                        await start(job.sample_rate)
                    await write_within(request, ws.send_bytes(pcm_bytes(chunk)), timeout)
            finally:
                await chunks.aclose()
            if not started:
                await start(job.sample_rate)
            await write_within(request, ws.send_bytes(END), timeout)
            outcome.value = "ok"
        except APIError as exc:
            outcome.value = exc.error
            await _ws_fail(ws, opts, exc)
        except WriteStalled:
            outcome.value = "write_timeout"  # the connection is cut; the slot went back when the stream closed
        except asyncio.CancelledError:
            outcome.value = "cancelled"
            if ws.closed:
                raise
            # The client asked to cancel: the request ends with END as usual, the socket stays usable.
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await ws.send_bytes(END)
        except ConnectionResetError:
            outcome.value = "client_gone"  # the socket is gone: nothing to tell it, nothing to raise
        except Exception as exc:
            log.warning("tts_failed transport=ws kind=%s", type(exc).__name__)
            await _ws_fail(ws, opts, TTSError(500, "synthesis_failed", "the engine failed to synthesise this text"))


# --- /api/voices -----------------------------------------------------------------------------------------
def _voice_json(voice: Voice, cloning: bool) -> dict[str, object]:
    return voice.to_json() | {"cloning": cloning}


def _engine_clones(svc: TTSService) -> bool:
    engine = svc.current_engine()
    return bool(engine is not None and engine.capabilities.voice_cloning)


@documented("List stored voices", responses={"200": json_body({
    "type": "object",
    "properties": {"voices": {"type": "array", "items": ref("Voice")},
                   "engine": {"type": ["string", "null"]}, "cloning": {"type": "boolean"},
                   "max_voices": {"type": "integer"}},
}, "stored voices, oldest first")}, schemas={"Voice": VOICE_SCHEMA})
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


@documented(
    "Register a voice from a reference clip",
    description=lambda cfg: (
        f"Clip {cfg.tts_api.min_upload_seconds:g}-{cfg.tts_api.max_upload_seconds:g} s, ≤ "
        f"{cfg.tts_api.max_upload_bytes} bytes, any format FFmpeg decodes. With a cloning "
        "engine its speaker embedding and prompt tokens are computed and cached; "
        "otherwise the clip is stored and the answer says cloning: false."),
    request={"multipart/form-data": {"schema": {
        "type": "object", "required": ["clip", "transcript"],
        "properties": {"clip": {"type": "string", "format": "binary"},
                       "transcript": {"type": "string"}, "name": {"type": "string", "maxLength": 64}},
    }}},
    responses={
        "201": json_body(ref("Voice"), "created"),
        "400": error("missing part, bad audio, clip too short"),
        "409": lambda cfg: error(f"voice_limit: already {cfg.tts_api.max_voices} voices"),
        "413": error("clip too large or too long"),
        "429": error("rate limited"),
        "507": error("voice_storage: the voices folder (server.data_dir) cannot be written (read-only, full)"),
    },
    schemas={"Voice": VOICE_SCHEMA},
)
async def create_voice(request: web.Request) -> web.Response:
    """Multipart ``clip`` + ``transcript`` (+ ``name``) → 201 ``{voice_id, ..., cloning}``.

    On an engine without cloning the clip is still stored (``"cloning": false``): it can be used once the
    server runs a cloning engine, and synthesis with it is refused (400 unsupported) until then.
    """
    svc = request.app[TTS_SERVICE]
    cfg = request.app[CONFIG]
    try:
        engine = svc.engine()
        if request.content_type != "multipart/form-data":
            raise HTTPJSONError(400, "bad_request", "send multipart/form-data with 'clip', 'transcript', 'name'")
        parts = await read_multipart(request, {
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
        clip = await svc.sources.decode_clip(parts["clip"], transcript)
        try:
            voice = await asyncio.to_thread(svc.voices.create, clip.audio, clip.sample_rate, transcript, name)
        except VoiceLimitError as exc:
            raise HTTPJSONError(409, "voice_limit", str(exc)) from None
        except OSError as exc:  # a read-only or full data_dir: the operator's to fix, said as such (not a 500)
            raise storage_error(exc) from None
        try:
            cloning = await svc.sources.prepare_voice(engine, voice.voice_id, clip)
        except BaseException:
            await asyncio.to_thread(svc.voices.delete, voice.voice_id)
            raise
    except TTSError as exc:
        raise _as_http(exc) from None
    return web.json_response(_voice_json(voice, cloning), status=201)


def storage_error(exc: OSError) -> HTTPJSONError:
    """The voices folder could not be written: 507, saying which setting to look at (and the log, once per call)."""
    log.warning("voice_storage_failed error=%s", exc)
    return HTTPJSONError(507, "voice_storage", f"the voices folder cannot be written ({exc.strerror or exc}): "
                         "server.data_dir must be a writable folder to keep voices")


@documented("Delete a voice", parameters=[
    {"name": "voice_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9a-f]{16}$"}}],
    responses={"200": json_body({"type": "object"}, "deleted"), "404": error("no such voice"),
               "507": error("voice_storage: the voices folder (server.data_dir) cannot be written")})
async def delete_voice(request: web.Request) -> web.Response:
    svc = request.app[TTS_SERVICE]
    voice_id = request.match_info["voice_id"]
    try:
        deleted = valid_voice_id(voice_id) and await asyncio.to_thread(svc.voices.delete, voice_id)
    except OSError as exc:
        raise storage_error(exc) from None
    if not deleted:
        raise HTTPJSONError(404, "unknown_voice", "no such voice")
    svc.sources.forget_voice(svc.current_engine(), voice_id)
    return web.json_response({"status": "deleted", "voice_id": voice_id})
