"""OpenAI's speech API on this server, so tools that speak it (the ``openai`` SDK, Open WebUI, LibreChat, home
automation plug-ins) work unchanged with ``base_url=http://host:8080/v1``.

    POST /v1/audio/speech   {model, input, voice, instructions?, speed?, response_format?, stream_format?}
    GET  /v1/models, GET /v1/models/{id}, GET /v1/audio/models, GET /v1/audio/voices

Its routes live on the ``/v1`` sub-application (``server/openai_front.py``), whose middleware turns every
refusal into OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` and applies the bearer token
(``server.auth_token``).
Synthesis goes through the same :class:`TTSService` as ``/api/tts`` (same voices, limits, tags, effects).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
from aiohttp import web

from assistant.server.http import CONFIG, WriteStalled, read_json, write_within
from assistant.server.openai_front import from_api_error, openai_error
from assistant.server.openapi import documented, json_body, ref
from assistant.server.openapi import openai_error as oai
from assistant.server.tts_api import TTS_SERVICE
from assistant.server.tts_api.formats import EncoderUnavailable, StreamEncoder, available_formats
from assistant.server.tts_api.outcome import StreamAborted, request_outcome, synthesis_errors
from assistant.server.tts_api.request import SpeechParams, SynthesisParams, TTSError, bad_field, parse, schema
from assistant.server.tts_api.service import TTSService
from assistant.server.tts_api.voice_lookup import engine_voice_names

log = logging.getLogger(__name__)

OUTPUT_RATE = 24_000          # OpenAI's pcm is 24 kHz s16le; every format here is made at that rate
# OpenAI's model names: each speaks with this server's engine (so does the engine's own name).
MODEL_IDS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# OpenAI's stock voices: tools send one by default; here each speaks with the engine's default voice,
# unless a registered voice has that name.
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")
MAX_BODY_BYTES = 65_536       # text (≤ tts.max_text_chars) and a few short fields
SSE_USAGE_FRAME_S = 0.020     # usage.output_tokens counts 20 ms of audio as one token


# --- models and voices ----------------------------------------------------------------------------------
def model_ids(svc: TTSService) -> list[str]:
    engine = svc.current_engine()
    return [*MODEL_IDS, *([engine.name] if engine is not None else [])]


def _model(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "assistant"}


@documented("The model names /v1/audio/speech accepts (OpenAI list shape)",
            responses={"200": json_body({"type": "object"}, "{object: list, data}"),
                       "401": oai("missing or wrong bearer token")})
async def list_models(request: web.Request) -> web.Response:
    ids = model_ids(request.config_dict[TTS_SERVICE])
    return web.json_response({"object": "list", "data": [_model(m) for m in ids]})


@documented("One model",
            parameters=[{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            responses={"200": json_body({"type": "object"}, "the model"), "404": oai("model_not_found")})
async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model"]
    if model_id not in model_ids(request.config_dict[TTS_SERVICE]):
        return openai_error(404, f"The model '{model_id}' does not exist", "model_not_found", "model")
    return web.json_response(_model(model_id))


@documented("The same names as {models: [{id}]} (Open WebUI's shape)",
            responses={"200": json_body({"type": "object"}, "models")})
async def list_audio_models(request: web.Request) -> web.Response:
    """Open WebUI's shape: ``{"models": [{"id"}]}``."""
    return web.json_response({"models": [{"id": m} for m in model_ids(request.config_dict[TTS_SERVICE])]})


@documented(
    "Every name 'voice' accepts: registered voices, the engine's voices, clip files in "
    "the voices folder, OpenAI's stock names (aliases of the default voice)",
    responses={"200": json_body({"type": "object", "properties": {"voices": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                                         "kind": {"type": "string"}, "usable": {"type": "boolean"}},
    }}}}, "voices")},
)
async def list_voices(request: web.Request) -> web.Response:
    """Every name ``voice`` takes: registered voices, the engine's, clip files, OpenAI's stock names."""
    svc = request.config_dict[TTS_SERVICE]
    engine = svc.engine()
    cloning = engine.capabilities.voice_cloning
    voices: list[dict[str, object]] = []
    for v in await asyncio.to_thread(svc.voices.list):
        voices.append({"id": v.voice_id, "name": v.name, "kind": "registered", "usable": cloning})
    for name in engine_voice_names(engine):
        voices.append({"id": name, "name": name, "kind": "engine", "usable": True})
    for name in await asyncio.to_thread(svc.sources.folder.names):
        voices.append({"id": name, "name": name, "kind": "file", "usable": cloning})
    for name in OPENAI_VOICES:
        voices.append({"id": name, "name": name, "kind": "alias of default", "usable": True})
    return web.json_response({"voices": voices})


# --- POST /v1/audio/speech ------------------------------------------------------------------------------
def _voice_name(svc: TTSService, voice: str) -> str | None:
    """OpenAI's stock names speak with the default voice, unless a registered voice is called that."""
    stock = voice.casefold() in OPENAI_VOICES
    if stock and not any(v.name.casefold() == voice.casefold() for v in svc.voices.list()):
        return None
    return voice


@documented(
    "OpenAI-compatible speech (for the openai SDK and tools that speak its API)",
    description="The file's bytes are streamed as they are made (chunked; stream_format audio), "
                "or server-sent events 'data: {type: speech.audio.delta, audio: <base64>}' and "
                "a final 'data: {type: speech.audio.done, usage}' (stream_format sse; usage "
                "counts characters in and 20 ms of audio out). All formats at 24 kHz mono. "
                "Errors use OpenAI's shape. The bearer token applies as on /api/*.",
    request={"application/json": {"schema": ref("SpeechRequest")}},
    responses={
        "200": {"description": "audio", "content": {
            t: {"schema": {"type": "string", "format": "binary"}}
            for t in ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm",
                      "text/event-stream")
        }},
        **synthesis_errors(oai, {
            "400": "bad field (param names it), unknown voice (the message lists what exists), a format FFmpeg "
                   "cannot write, an option the engine cannot honour",
            "401": "missing or wrong bearer token (code invalid_api_key)",
            "404": "unknown model (code model_not_found)",
            "413": "input or body over its limit",
            "429": "rate_limited or busy (Retry-After)",
        }),
    },
    schemas={"SpeechRequest": lambda cfg: schema(SpeechParams, cfg)},
)
async def speech(request: web.Request) -> web.StreamResponse:
    svc = request.config_dict[TTS_SERVICE]
    cfg = request.config_dict[CONFIG]
    with request_outcome(svc, "openai") as outcome:
        try:
            data = await read_json(request, MAX_BODY_BYTES + 4 * cfg.tts.max_text_chars)  # HTTPJSONError: middleware
            sp = parse(SpeechParams, data, cfg)
            if sp.model not in model_ids(svc):
                raise TTSError(404, "model_not_found", f"The model '{sp.model}' does not exist; this server has "
                               f"{', '.join(model_ids(svc))}", param="model")
            if sp.response_format not in available_formats():
                raise bad_field("response_format", f"{sp.response_format!r} cannot be encoded by this server's "
                                f"FFmpeg; available: {', '.join(available_formats())}")
            params = SynthesisParams(
                text=sp.input,
                voice=await asyncio.to_thread(_voice_name, svc, sp.voice),
                instruct=sp.instructions.strip() if sp.instructions and sp.instructions.strip() else None,
                speed=sp.speed,
                sample_rate=OUTPUT_RATE,
            )
            try:
                job = await svc.prepare(params)
            except TTSError as exc:  # the service names its own fields; say OpenAI's
                exc.param = {"instruct": "instructions", "text": "input"}.get(exc.param or "", exc.param)
                exc.detail = exc.detail.replace("'instruct'", "'instructions'").replace("field 'text'", "field 'input'")
                raise
            encoder = StreamEncoder(sp.response_format, job.sample_rate)
            chunks = svc.stream(job)
            try:
                resp = await _respond(request, sp, encoder, chunks, outcome.t0)
            finally:
                await chunks.aclose()
                encoder.close()
            outcome.value = "ok"
            return resp
        except EncoderUnavailable as exc:
            outcome.value = "unsupported"
            return openai_error(400, str(exc), "unsupported", "response_format")
        except TTSError as exc:
            outcome.value = exc.error
            return from_api_error(exc)
        except StreamAborted as exc:
            outcome.value = exc.outcome
            return exc.response


async def _encode(encoder: StreamEncoder, chunk: np.ndarray | None) -> bytes:
    """Encode off the event loop when a codec does the work (pcm and wav are a copy)."""
    work = (lambda: encoder.encode(chunk)) if chunk is not None else encoder.finish
    if encoder.fmt in ("pcm", "wav"):
        return work()
    return await asyncio.to_thread(work)


async def _respond(request: web.Request, sp: SpeechParams, encoder: StreamEncoder, chunks: AsyncIterator[np.ndarray],
                   t0: float) -> web.StreamResponse:
    """Stream the file (or SSE events) as it is made; the first chunk comes before the headers, so a request
    that fails early still gets its status."""
    try:
        first: np.ndarray | None = await anext(chunks)
    except StopAsyncIteration:
        first = None
    sse = sp.stream_format == "sse"
    resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream" if sse else encoder.content_type,
        "Cache-Control": "no-store",
        "X-Sample-Rate": str(encoder.sample_rate),
        "X-TTS-First-Chunk-Ms": f"{(time.perf_counter() - t0) * 1000:.0f}",
    })
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    samples = 0
    timeout = request.config_dict[CONFIG].tts_api.write_timeout_s

    async def send(data: bytes) -> None:
        if not data:
            return
        if sse:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            data = f"data: {json.dumps(event)}\n\n".encode()
        await write_within(request, resp.write(data), timeout)

    try:
        if first is not None:
            samples += len(first)
            await send(await _encode(encoder, first))
            async for chunk in chunks:
                samples += len(chunk)
                await send(await _encode(encoder, chunk))
        await send(await _encode(encoder, None))
        if sse:
            out_tokens = round(samples / encoder.sample_rate / SSE_USAGE_FRAME_S)
            usage = {"input_tokens": len(sp.input), "output_tokens": out_tokens,
                     "total_tokens": len(sp.input) + out_tokens}
            done = {"type": "speech.audio.done", "usage": usage}
            await write_within(request, resp.write(f"data: {json.dumps(done)}\n\n".encode()), timeout)
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:  # the client went away: its request line says so, at info
        raise StreamAborted("client_gone", resp) from None
    except WriteStalled:
        log.warning("tts_stream_aborted transport=openai outcome=write_timeout")
        raise StreamAborted("write_timeout", resp) from None  # the connection is already cut
    except Exception as exc:
        outcome = exc.error if isinstance(exc, TTSError) else "synthesis_failed"
        log.warning("tts_stream_aborted transport=openai outcome=%s", outcome)
        if sse:  # SSE can still say why before it ends
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                message = exc.detail if isinstance(exc, TTSError) else "the engine failed to synthesise this text"
                err = {"type": "error", "error": {"message": message, "type": "server_error", "param": None,
                                                  "code": outcome}}
                await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                await resp.write_eof()
        elif request.transport is not None:
            request.transport.abort()  # a cut transfer, never a short "complete" file
        raise StreamAborted(outcome, resp) from None
    await resp.write_eof()
    return resp
