"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /api/openapi.json``.

Written by hand next to the routes it describes (no framework generates it); limits come from the config,
so the document states the numbers this server enforces.
"""

from __future__ import annotations

from typing import Any

from assistant.config import Config
from assistant.server.tts_service import (
    ENERGY_RANGE,
    FORMATS,
    MAX_INSTRUCT_CHARS,
    PITCH_RANGE,
    SAMPLE_RATE_RANGE,
    SPEED_RANGE,
)
from assistant.tts.base import LANGUAGES

OPENAPI_VERSION = "3.1.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def build_openapi(cfg: Config) -> dict[str, Any]:
    """The whole document, with this server's limits filled in."""
    api = cfg.tts_api
    audio_headers = {
        "X-Sample-Rate": {"schema": {"type": "integer"}, "description": "samples per second of the audio"},
        "X-Channels": {"schema": {"type": "integer", "const": 1}, "description": "always 1 (mono)"},
        "X-Sample-Format": {"schema": {"type": "string", "const": "s16le"}, "description": "16-bit little-endian"},
    }
    tts_request = {
        "type": "object",
        "additionalProperties": False,
        "required": ["text"],
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": cfg.tts.max_text_chars,
                     "description": "what to say; a leading tag such as [cheerful] or [关心] becomes the "
                                    "instruction on engines with instruct mode and is dropped on others"},
            "voice": {"type": "string", "description": "a voice_id from /api/voices (or the engine's own voice "
                                                       "name); omit for the default voice"},
            "speaker_wav": {"type": "string",
                            "description": "reference clip to clone: base64 audio, a data: URI, or an http(s) "
                                           "URL on tts_api.url_allowlist; in multipart, a file part instead. "
                                           f"{api.min_upload_seconds:g}-{api.max_upload_seconds:g} s, "
                                           f"≤ {api.max_upload_bytes} bytes"},
            "prompt_text": {"type": "string", "description": "what speaker_wav says (improves cloning)"},
            "language": {"type": "string", "enum": list(LANGUAGES),
                         "description": "must also be one the engine speaks"},
            "instruct": {"type": "string", "maxLength": MAX_INSTRUCT_CHARS,
                         "description": "style instruction; 400 unsupported on engines without instruct mode"},
            "speed": {"type": "number", "minimum": SPEED_RANGE[0], "maximum": SPEED_RANGE[1], "default": 1.0},
            "pitch": {"type": "number", "minimum": PITCH_RANGE[0], "maximum": PITCH_RANGE[1], "default": 0,
                      "description": "semitones"},
            "energy": {"type": "number", "minimum": ENERGY_RANGE[0], "maximum": ENERGY_RANGE[1], "default": 1.0,
                       "description": "loudness gain, limited so that it never clips"},
            "streaming": {"type": "boolean", "default": False,
                          "description": "chunked raw PCM as each chunk is made"},
            "format": {"type": "string", "enum": list(FORMATS),
                       "description": "default wav (whole) / pcm (streaming); wav with streaming sends a "
                                      "header of unknown length first"},
            "sample_rate": {"type": "integer", "minimum": SAMPLE_RATE_RANGE[0], "maximum": SAMPLE_RATE_RANGE[1],
                            "description": "resample the output to this rate (default: the engine's)"},
            "seed": {"type": "integer", "minimum": 0, "description": "sampling seed (engines that sample)"},
        },
    }
    voice = {
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
    bearer = [{"bearer": []}] if cfg.server.auth_token else []
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "assistant",
            "version": "0.1.0",
            "description": "Real-time spoken assistant: WebRTC voice chat and a TTS API. Errors are JSON "
                           "{error, detail}. With server.auth_token set, /api/* and /ws/* need "
                           "'Authorization: Bearer <token>' (WebSocket: ?token=<token>).",
        },
        "security": bearer,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "detail"],
                    "properties": {
                        "error": {"type": "string", "description": "short code: bad_request, bad_json, "
                                  "too_large, text_too_long, clip_too_long, clip_too_short, bad_audio, "
                                  "unsupported, unknown_voice, url_not_allowed, url_fetch_failed, rate_limited, "
                                  "busy, not_ready, timeout, voice_limit, unauthorized, synthesis_failed"},
                        "detail": {"type": "string", "description": "what was wrong, naming the field"},
                    },
                },
                "TTSRequest": tts_request,
                "Voice": voice,
                "WSStart": {
                    "type": "object",
                    "properties": {"type": {"const": "start"}, "sample_rate": {"type": "integer"},
                                   "channels": {"const": 1}, "format": {"const": "s16le"}},
                },
                "Offer": {
                    "type": "object", "required": ["sdp", "type"],
                    "properties": {"sdp": {"type": "string", "maxLength": cfg.server.max_sdp_bytes},
                                   "type": {"const": "offer"}, "voice": {"type": "string"},
                                   "responder": {"type": "string"}},
                },
                "Answer": {
                    "type": "object", "required": ["sdp", "type", "session_id"],
                    "properties": {"sdp": {"type": "string"}, "type": {"const": "answer"},
                                   "session_id": {"type": "string"}},
                },
            },
        },
        "paths": {
            "/api/tts": {"post": {
                "summary": "Synthesise speech",
                "description": "Whole WAV/PCM, or with streaming=true chunked raw s16le mono PCM sent as each "
                               "chunk exists. With pitch or speed done by DSP (engines without native support) "
                               "the stream moves one sentence at a time.",
                "requestBody": {"required": True, "content": {
                    "application/json": {"schema": _ref("TTSRequest")},
                    "multipart/form-data": {"schema": {
                        "type": "object", "required": ["request"],
                        "properties": {"request": {"type": "string", "description": "the TTSRequest JSON"},
                                       "speaker_wav": {"type": "string", "format": "binary"}},
                    }},
                }},
                "responses": {
                    "200": {"description": "audio", "headers": audio_headers | {
                        "X-TTS-First-Chunk-Ms": {"schema": {"type": "integer"}},
                        "X-TTS-Total-Ms": {"schema": {"type": "integer"}, "description": "whole responses only"},
                    }, "content": {
                        "audio/wav": {"schema": {"type": "string", "format": "binary"}},
                        "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                                     "description": "raw s16le mono PCM"},
                    }},
                    "400": _error("bad field value, unknown field, bad JSON, undecodable audio, "
                                  "unsupported option for this engine, URL not allowed"),
                    "401": _error("missing or wrong bearer token"),
                    "404": _error("unknown voice"),
                    "413": _error("text, body or reference clip over its limit"),
                    "429": _error("rate_limited (Retry-After) or busy (all synthesis slots taken)"),
                    "503": _error("models still loading"),
                    "504": _error("synthesis over tts.timeout_s"),
                },
            }},
            "/ws/tts": {"get": {
                "summary": "Streaming TTS over a WebSocket",
                "description": "Upgrade to a WebSocket (token as ?token= when auth is on). Send a TTSRequest as "
                               "a JSON text message (streaming/format are ignored). The server answers a text "
                               "message {type: start, sample_rate, channels: 1, format: s16le}, then binary "
                               "s16le mono PCM chunks, then the binary message END. A failed request gets one "
                               "text message {error, detail} instead, and the socket stays usable. Send "
                               "{type: cancel} to stop the current request (END follows). One request at a "
                               "time per socket (a second gets error busy); open several sockets for more.",
                "responses": {"101": {"description": "switching protocols"},
                              "401": _error("missing or wrong token")},
            }},
            "/api/voices": {
                "get": {"summary": "List stored voices", "responses": {"200": _json({
                    "type": "object",
                    "properties": {"voices": {"type": "array", "items": _ref("Voice")},
                                   "engine": {"type": ["string", "null"]}, "cloning": {"type": "boolean"},
                                   "max_voices": {"type": "integer"}},
                }, "stored voices, oldest first")}},
                "post": {
                    "summary": "Register a voice from a reference clip",
                    "description": f"Clip {api.min_upload_seconds:g}-{api.max_upload_seconds:g} s, ≤ "
                                   f"{api.max_upload_bytes} bytes, any format FFmpeg decodes. With a cloning "
                                   "engine its speaker embedding and prompt tokens are computed and cached; "
                                   "otherwise the clip is stored and the answer says cloning: false.",
                    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                        "type": "object", "required": ["clip", "transcript"],
                        "properties": {"clip": {"type": "string", "format": "binary"},
                                       "transcript": {"type": "string"}, "name": {"type": "string",
                                                                                 "maxLength": 64}},
                    }}}},
                    "responses": {
                        "201": _json(_ref("Voice"), "created"),
                        "400": _error("missing part, bad audio, clip too short"),
                        "409": _error(f"voice_limit: already {api.max_voices} voices"),
                        "413": _error("clip too large or too long"),
                        "429": _error("rate limited"),
                    },
                },
            },
            "/api/voices/{voice_id}": {"delete": {
                "summary": "Delete a voice",
                "parameters": [{"name": "voice_id", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9a-f]{16}$"}}],
                "responses": {"200": _json({"type": "object"}, "deleted"), "404": _error("no such voice")},
            }},
            "/api/offer": {"post": {
                "summary": "Start a voice chat session (WebRTC offer → answer)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Offer")}}},
                "responses": {
                    "200": _json(_ref("Answer"), "SDP answer and the session id"),
                    "400": _error("bad offer"), "413": _error("SDP too large"),
                    "503": _error("not ready, or all session slots busy"), "504": _error("ICE gathering timeout"),
                },
            }},
            "/api/sessions/{session_id}": {"delete": {
                "summary": "Hang up a session",
                "parameters": [{"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": _json({"type": "object"}, "closed"), "404": _error("unknown session")},
            }},
            "/api/openapi.json": {"get": {"summary": "This document",
                                          "responses": {"200": {"description": "OpenAPI 3.1 JSON"}}}},
            "/healthz": {"get": {"summary": "Liveness", "security": [],
                                 "responses": {"200": _json({"type": "object"}, "{status: ok}")}}},
            "/readyz": {"get": {"summary": "Readiness: models loaded and warmed", "security": [],
                                "responses": {"200": _json({"type": "object"}, "ready"),
                                              "503": _json({"type": "object"}, "still loading")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition format"}}}},
        },
    }
