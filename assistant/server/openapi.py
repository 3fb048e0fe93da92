"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /api/openapi.json``.

The request bodies of the TTS routes come from the request table (``tts_request``) that the parsers use, so
the document and the checks cannot drift apart; the rest is written next to the routes it describes. Limits
come from the config, so the document states the numbers this server enforces.
"""

from __future__ import annotations

from typing import Any

from assistant.config import Config
from assistant.server.tts_request import SpeechParams, SynthesisParams, WSOptions, schema

OPENAPI_VERSION = "3.1.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


READYZ = {
    "type": "object", "required": ["status", "gateway", "sessions", "max_sessions"],
    "properties": {
        "status": {"type": "string", "enum": ["ready", "loading"]},
        "gateway": {"type": "string", "description": "server.gateway_id (empty: none)"},
        "sessions": {"type": "integer", "description": "open voice sessions"},
        "max_sessions": {"type": "integer"},
        "load_seconds": {"type": "object", "description": "time each model took to load (when ready)"},
    },
}


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
    tts_request = schema(SynthesisParams, cfg)
    ws_request = schema(SynthesisParams, cfg, extra=schema(WSOptions, cfg)["properties"])
    openai_error = {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": ["invalid_request_error", "authentication_error",
                                                   "rate_limit_error", "server_error"]},
                "param": {"type": ["string", "null"], "description": "the request field at fault"},
                "code": {"type": ["string", "null"], "description": "as Error.error, or model_not_found, "
                                                                    "invalid_api_key"},
            },
        }},
    }

    def _oai(description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": _ref("OpenAIError")}}}

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
                           "{error, detail} (OpenAI's shape under /v1). With server.auth_token set, /api/*, "
                           "/v1/* and /ws/* need "
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
                                  "busy, not_ready, timeout, voice_limit, unauthorized, synthesis_failed, bad_offer, "
                                  "bad_fragment, unknown_session, unsupported_media_type, precondition_failed, "
                                  "ice_restart_unsupported, too_many_candidates"},
                        "detail": {"type": "string", "description": "what was wrong, naming the field"},
                    },
                },
                "TTSRequest": tts_request,
                "WSRequest": ws_request,
                "SpeechRequest": schema(SpeechParams, cfg),
                "OpenAIError": openai_error,
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
                                   "session_id": {"type": "string"},
                                   "location": {"type": "string", "description": "the session resource: PATCH "
                                                "trickled candidates there, DELETE to hang up"},
                                   "etag": {"type": "string", "description": "If-Match value for PATCH"}},
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
                                  "unsupported option for this engine (vocoder, cloning, language, instruct), URL "
                                  "not allowed, unknown_voice (the detail lists what exists)"),
                    "401": _error("missing or wrong bearer token"),
                    "413": _error("text, body or reference clip over its limit"),
                    "429": _error("rate_limited (Retry-After) or busy (all synthesis slots taken)"),
                    "503": _error("models still loading"),
                    "504": _error("synthesis over tts.timeout_s"),
                },
            }},
            "/ws/tts": {"get": {
                "summary": "Streaming TTS over a WebSocket",
                "description": "Upgrade to a WebSocket (token as ?token= when auth is on). The handshake answer "
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
                "parameters": [
                    {"name": "metadata", "in": "query", "required": False, "schema": {"type": "boolean"}},
                    {"name": "keep_open", "in": "query", "required": False, "schema": {"type": "boolean"}},
                ],
                "responses": {"101": {"description": "switching protocols", "headers": audio_headers},
                              "400": _error("bad query parameter"),
                              "401": _error("missing or wrong token"),
                              "503": _error("models still loading")},
            }},
            "/v1/audio/speech": {"post": {
                "summary": "OpenAI-compatible speech (for the openai SDK and tools that speak its API)",
                "description": "The file's bytes are streamed as they are made (chunked; stream_format audio), "
                               "or server-sent events 'data: {type: speech.audio.delta, audio: <base64>}' and "
                               "a final 'data: {type: speech.audio.done, usage}' (stream_format sse; usage "
                               "counts characters in and 20 ms of audio out). All formats at 24 kHz mono. "
                               "Errors use OpenAI's shape. The bearer token applies as on /api/*.",
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": _ref("SpeechRequest")}}},
                "responses": {
                    "200": {"description": "audio", "content": {
                        t: {"schema": {"type": "string", "format": "binary"}}
                        for t in ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm",
                                  "text/event-stream")
                    }},
                    "400": _oai("bad field (param names it), unknown voice (the message lists what exists), a "
                                "format FFmpeg cannot write, an option the engine cannot honour"),
                    "401": _oai("missing or wrong bearer token (code invalid_api_key)"),
                    "404": _oai("unknown model (code model_not_found)"),
                    "413": _oai("input or body over its limit"),
                    "429": _oai("rate_limited or busy (Retry-After)"),
                    "503": _oai("models still loading"),
                    "504": _oai("synthesis over tts.timeout_s"),
                },
            }},
            "/v1/models": {"get": {"summary": "The model names /v1/audio/speech accepts (OpenAI list shape)",
                                   "responses": {"200": _json({"type": "object"}, "{object: list, data}"),
                                                 "401": _oai("missing or wrong bearer token")}}},
            "/v1/models/{model}": {"get": {
                "summary": "One model",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": _json({"type": "object"}, "the model"), "404": _oai("model_not_found")},
            }},
            "/v1/audio/models": {"get": {"summary": "The same names as {models: [{id}]} (Open WebUI's shape)",
                                         "responses": {"200": _json({"type": "object"}, "models")}}},
            "/v1/audio/voices": {"get": {
                "summary": "Every name 'voice' accepts: registered voices, the engine's voices, clip files in "
                           "the voices folder, OpenAI's stock names (aliases of the default voice)",
                "responses": {"200": _json({"type": "object", "properties": {"voices": {"type": "array", "items": {
                    "type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                                                     "kind": {"type": "string"}, "usable": {"type": "boolean"}},
                }}}}, "voices")},
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
            "/api/ice": {"get": {
                "summary": "ICE configuration for a page: STUN/TURN servers (TURN REST credentials minted per "
                           "call), iceTransportPolicy, trickle, expires_at",
                "responses": {"200": _json({"type": "object"}, "what RTCPeerConnection takes, plus trickle")},
            }},
            "/api/whip": {"post": {
                "summary": "WHIP (RFC 9725): the offer as application/sdp → 201, the answer, Location (the session "
                           "resource), ETag and Link rel=ice-server headers; ?voice= and ?responder= optional",
                "requestBody": {"required": True, "content": {"application/sdp": {"schema": {
                    "type": "string", "maxLength": cfg.server.max_sdp_bytes}}}},
                "responses": {
                    "201": {"description": "SDP answer",
                            "content": {"application/sdp": {"schema": {"type": "string"}}}},
                    "400": _error("bad offer"), "413": _error("SDP too large"),
                    "415": _error("Content-Type is not application/sdp"),
                    "503": _error("not ready, or all session slots busy"), "504": _error("ICE gathering timeout"),
                },
            }},
            "/api/sessions/{session_id}": {
                "delete": {
                    "summary": "Hang up a session (WHIP DELETE too)",
                    "parameters": [{"name": "session_id", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _json({"type": "object"}, "closed"), "404": _error("unknown session")},
                },
                "patch": {
                    "summary": "Trickle ICE: the client's candidates as an RFC 8840 fragment (If-Match: the ETag)",
                    "parameters": [{"name": "session_id", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "requestBody": {"required": True, "content": {"application/trickle-ice-sdpfrag": {"schema": {
                        "type": "string", "maxLength": cfg.ice.max_fragment_bytes}}}},
                    "responses": {
                        "204": {"description": "candidates applied"}, "400": _error("bad fragment"),
                        "404": _error("unknown session"), "412": _error("If-Match is not this session's ETag"),
                        "413": _error("fragment too large"), "415": _error("wrong Content-Type"),
                        "422": _error("ICE restart (new ufrag/pwd) or too many candidates"),
                    },
                },
            },
            "/api/openapi.json": {"get": {"summary": "This document",
                                          "responses": {"200": {"description": "OpenAPI 3.1 JSON"}}}},
            "/healthz": {"get": {"summary": "Liveness", "security": [],
                                 "responses": {"200": _json({"type": "object"}, "{status: ok}")}}},
            "/readyz": {"get": {"summary": "Readiness: models loaded and warmed; with this gateway's load (the "
                                           "heartbeat `assistant dispatch` reads)", "security": [],
                                "responses": {"200": _json(READYZ, "ready"), "503": _json(READYZ, "still loading")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition format"}}}},
        },
    }
