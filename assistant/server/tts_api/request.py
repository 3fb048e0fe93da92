"""The TTS request table: every field of a synthesis request, once.

Each request dataclass below declares its fields with :func:`spec` (type, default, range or choices, size
limit, description). From that one declaration come:

- the parser (:func:`parse`): unknown fields refused, each value checked, a 400/413 naming the field;
- the field list (:func:`field_names`), used in error messages;
- the OpenAPI schema (:func:`schema`), with this server's limits filled in.

So a field added or changed here changes the parser, the error messages and ``/api/openapi.json`` together.
``SynthesisParams`` is ``POST /api/tts`` and ``/ws/tts``; ``WSOptions`` the WebSocket's own opt-ins;
``SpeechParams`` OpenAI's ``POST /v1/audio/speech``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from assistant import languages
from assistant.config import Config
from assistant.server.http import APIError
from assistant.tts.base import STRETCH_RANGE

PITCH_RANGE = (-12.0, 12.0)           # semitones: one octave either way
ENERGY_RANGE = (0.5, 2.0)
SAMPLE_RATE_RANGE = (8000, 48000)
FORMATS = ("wav", "pcm")
MAX_INSTRUCT_CHARS = 500
MAX_NAME_CHARS = 255                  # a voice id, a voice's name or a file name in the voices folder
MAX_VOCODER_CHARS = 32
MAX_SEED = 2**31 - 1
# OpenAI's speech API: what ``response_format`` and ``stream_format`` may say (PyAV encodes all of them).
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
STREAM_FORMATS = ("audio", "sse")

Limit = int | Callable[[Config], int]


class TTSError(APIError):
    """A synthesis request the service refuses (see :class:`~assistant.server.http.APIError`)."""


def bad_field(name: str, detail: str, status: int = 400, error: str = "bad_request") -> TTSError:
    return TTSError(status, error, f"field '{name}': {detail}", param=name)


@dataclass(frozen=True)
class FieldSpec:
    """How one request field is checked and described."""

    kind: str                                   # string, number, integer, boolean, voice (string or {"id"}),
                                                # language (a known code: assistant/languages.py)
    description: str
    required: bool = False
    lo: float | None = None                     # numbers: inclusive range
    hi: float | None = None
    choices: tuple[str, ...] = ()
    max_chars: Limit | None = None              # strings: longer → 413 too_large (or ``too_long_error``)
    too_long_error: str = "too_large"
    non_empty: bool = False                     # strings: must hold something besides whitespace
    docs_default: str | float | None = None     # the default as the schema states it (None: not stated)


def spec(default: object = None, **kw: Any) -> Any:
    """A dataclass field carrying its :class:`FieldSpec` (``required=True`` fields still get a default of
    None so that the dataclass can list them in any order). Typed Any as ``dataclasses.field`` is: it stands
    for the field's value in the class body; ``kw`` are FieldSpec's fields."""
    return field(default=default, metadata={"spec": FieldSpec(**kw)})


def _text_limit(cfg: Config) -> int:
    return cfg.tts.max_text_chars


def _clip_b64_limit(cfg: Config) -> int:
    return 8 * cfg.tts_api.max_upload_bytes


# --- the tables -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SynthesisParams:
    """A validated ``POST /api/tts`` or ``/ws/tts`` request, before the engine is consulted."""

    text: str = spec(kind="string", required=True, non_empty=True, max_chars=_text_limit,
                     too_long_error="text_too_long",
                     description="what to say; a leading tag such as [cheerful] or [关心] becomes the instruction "
                                 "on engines with instruct mode and is dropped on others")
    voice: str | None = spec(kind="string", max_chars=MAX_NAME_CHARS,
                             description="a registered voice's id or name (GET /api/voices), the engine's own "
                                         "voice name, or a clip's file name in the voices folder "
                                         "(tts_api.voices_dir); omit for the default voice")
    speaker_wav: bytes | str | None = spec(
        kind="string", max_chars=_clip_b64_limit,
        description="the voice to speak in: what 'voice' takes, or a reference clip to clone as base64, a data: "
                    "URI, an http(s) URL whose host is on tts_api.url_allowlist, or (multipart) a file part")
    prompt_text: str = spec("", kind="string", max_chars=_text_limit,
                            description="what the reference clip says (improves cloning); a file in the voices "
                                        "folder says it in a <name>.txt next to it, and this is used only where "
                                        "there is none (the file's voice is prepared once, with the first text)")
    language: str | None = spec(kind="language", max_chars=8,
                                description="a language code (en, zh, ja, ko, yue, ...) the engine speaks (with "
                                            "tts.voices, by the voice for it); 400 names the ones it does")
    instruct: str | None = spec(kind="string", max_chars=MAX_INSTRUCT_CHARS,
                                description="style instruction; 400 unsupported on engines without instruct mode")
    speed: float = spec(1.0, kind="number", lo=STRETCH_RANGE[0], hi=STRETCH_RANGE[1], docs_default=1.0,
                        description="native on engines that support it, else time-stretched")
    pitch: float = spec(0.0, kind="number", lo=PITCH_RANGE[0], hi=PITCH_RANGE[1], docs_default=0,
                        description="semitones")
    energy: float = spec(1.0, kind="number", lo=ENERGY_RANGE[0], hi=ENERGY_RANGE[1], docs_default=1.0,
                         description="loudness gain, limited so that it never clips")
    vocoder: str | None = spec(kind="string", max_chars=MAX_VOCODER_CHARS,
                               description="the engine's vocoder by name (cosyvoice2: hifigan or hift; piper: "
                                           "vits); any other value is refused naming what the engine has")
    streaming: bool = spec(False, kind="boolean", docs_default=False,
                           description="POST /api/tts: chunked raw PCM as each chunk is made (/ws/tts: ignored)")
    format: str | None = spec(kind="string", choices=FORMATS,
                              description="POST /api/tts: default wav (whole) / pcm (streaming); wav with "
                                          "streaming sends a header of unknown length first (/ws/tts: ignored)")
    sample_rate: int | None = spec(kind="integer", lo=SAMPLE_RATE_RANGE[0], hi=SAMPLE_RATE_RANGE[1],
                                   description="resample the output to this rate (default: the engine's)")
    seed: int | None = spec(kind="integer", lo=0, hi=MAX_SEED, description="sampling seed (engines that sample)")


@dataclass(frozen=True)
class WSOptions:
    """What a ``/ws/tts`` client may opt into, as request fields or as query parameters of the URL."""

    metadata: bool = spec(False, kind="boolean", docs_default=False,
                          description="send a text message {type: start, sample_rate, channels, format} before "
                                      "the audio of each request")
    keep_open: bool = spec(False, kind="boolean", docs_default=False,
                           description="on an error send the JSON error and keep the socket open for the next "
                                       "request (default: send it, then close with code 4000+status)")


@dataclass(frozen=True)
class SpeechParams:
    """A validated OpenAI ``POST /v1/audio/speech`` request."""

    model: str = spec(kind="string", required=True, max_chars=64,
                      description="tts-1, tts-1-hd, gpt-4o-mini-tts or this server's engine name (all speak "
                                  "with the running engine); see GET /v1/models")
    input: str = spec(kind="string", required=True, non_empty=True, max_chars=_text_limit,
                      too_long_error="text_too_long", description="the text; leading tags as in /api/tts")
    voice: str = spec(kind="voice", required=True, max_chars=MAX_NAME_CHARS,
                      description="a name, or {\"id\": ...}: a registered voice's id or name, the engine's own "
                                  "voice, a file name in the voices folder, or one of OpenAI's stock names "
                                  "(alloy, …), which speak with the default voice; see GET /v1/audio/voices")
    instructions: str | None = spec(kind="string", max_chars=MAX_INSTRUCT_CHARS,
                                    description="style instruction, as 'instruct' in /api/tts")
    speed: float = spec(1.0, kind="number", lo=STRETCH_RANGE[0], hi=STRETCH_RANGE[1], docs_default=1.0,
                        description="as in /api/tts")
    response_format: str = spec("mp3", kind="string", choices=SPEECH_FORMATS, docs_default="mp3",
                                description="pcm is raw 24 kHz s16le mono; the others are files at 24 kHz")
    stream_format: str = spec("audio", kind="string", choices=STREAM_FORMATS, docs_default="audio",
                              description="audio: the file's bytes as they are made; sse: server-sent events "
                                          "speech.audio.delta (base64 audio) and speech.audio.done")


Params = TypeVar("Params")


# --- the parser -----------------------------------------------------------------------------------------
def specs(cls: type) -> dict[str, FieldSpec]:
    """The table of a request class: field name → spec, in declaration order."""
    return {f.name: f.metadata["spec"] for f in fields(cls)}


def field_names(cls: type) -> list[str]:
    return sorted(specs(cls))


def _limit(limit: Limit | None, cfg: Config) -> int | None:
    return limit(cfg) if callable(limit) else limit


def _check(name: str, s: FieldSpec, value: object, cfg: Config) -> bool | int | float | str:
    """One present, non-null JSON value checked against its spec; returns it (numbers as float)."""
    if s.kind == "boolean":
        if not isinstance(value, bool):
            raise bad_field(name, "must be true or false")
        return value
    if s.kind in ("number", "integer"):
        integer = s.kind == "integer"
        lo, hi = s.lo, s.hi
        span = f"from {lo:g} to {hi:g}" if lo is not None and hi is not None else ""
        if (isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int))
                or not math.isfinite(value)):
            raise bad_field(name, f"must be {'an integer' if integer else 'a number'} {span}".rstrip())
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise bad_field(name, f"{value:g} is out of range; allowed {lo:g} to {hi:g}")
        return value if integer else float(value)
    if s.kind == "voice" and isinstance(value, dict):
        if set(value) != {"id"} or not isinstance(value["id"], str):
            raise bad_field(name, 'must be a name or an object {"id": "<voice>"}')
        value = value["id"]
    if not isinstance(value, str):
        raise bad_field(name, "must be a string" if s.kind != "voice" else 'must be a name or {"id": "<voice>"}')
    if s.kind == "language":
        try:
            languages.check(value, name)
        except languages.UnknownLanguage as exc:
            raise bad_field(name, exc.problem) from None
    if s.choices and value not in s.choices:
        raise bad_field(name, f"{value!r} is not supported; allowed: {', '.join(s.choices)}")
    cap = _limit(s.max_chars, cfg)
    if cap is not None and len(value) > cap:
        raise TTSError(413, s.too_long_error, f"field '{name}' is {len(value)} characters; the limit is {cap}",
                       param=name)
    if s.non_empty and not value.strip():
        raise bad_field(name, "must be a non-empty string")
    return value


def parse(cls: type[Params], data: Mapping[str, object], cfg: Config) -> Params:
    """Check every field of ``data`` against the table of ``cls``; raise ``TTSError`` naming the first bad one."""
    table = specs(cls)
    unknown = sorted(set(data) - set(table))
    if unknown:
        raise bad_field(unknown[0], f"unknown field; allowed fields: {', '.join(sorted(table))}")
    values: dict[str, object] = {}
    for name, s in table.items():
        value = data.get(name)
        if value is None:
            if s.required:
                raise bad_field(name, "is required" if s.kind != "string" or not s.non_empty
                                else "must be a non-empty string")
            continue
        values[name] = _check(name, s, value, cfg)
    return cls(**values)


def parse_params(data: Mapping[str, object], cfg: Config, upload: bytes | None = None) -> SynthesisParams:
    """``SynthesisParams`` from a JSON body (and a multipart file part): the table, then the cross-field rules."""
    p = parse(SynthesisParams, data, cfg)
    speaker_wav: bytes | str | None = p.speaker_wav or None
    if upload is not None:
        if speaker_wav is not None:
            raise bad_field("speaker_wav", "give it either as a file part or in the JSON, not both")
        speaker_wav = upload
    voice = p.voice or None
    if voice and speaker_wav is not None:
        raise bad_field("voice", "give either 'voice' or 'speaker_wav', not both")
    instruct = p.instruct.strip() if p.instruct and p.instruct.strip() else None
    vocoder = p.vocoder.strip().lower() if p.vocoder and p.vocoder.strip() else None
    return replace(p, voice=voice, speaker_wav=speaker_wav, instruct=instruct, vocoder=vocoder)


def ws_options(query: Mapping[str, str], data: dict[str, object], cfg: Config,
               current: WSOptions | None = None) -> WSOptions:
    """The WebSocket opt-ins: the socket's ``current`` ones (at first: the query parameters,
    ``?metadata=1&keep_open=1``), changed by fields of a request, which then hold for the rest of the socket."""
    names = specs(WSOptions)
    values: dict[str, object] = {}
    if current is not None:
        values = {name: getattr(current, name) for name in names}
    else:
        for name in names:
            raw = query.get(name)
            if raw is not None:
                if raw.lower() not in ("1", "true", "yes", "0", "false", "no", ""):
                    raise bad_field(name, f"query parameter must be 1/true or 0/false, got {raw!r}")
                values[name] = raw.lower() in ("1", "true", "yes", "")
    values |= {k: data.pop(k) for k in names if k in data}
    return parse(WSOptions, values, cfg)


# --- the schema -----------------------------------------------------------------------------------------
def properties(cls: type, cfg: Config) -> dict[str, object]:
    """The JSON schema of each field of a request class, with this server's limits."""
    props: dict[str, object] = {}
    for name, s in specs(cls).items():
        if s.kind == "voice":
            prop: dict[str, object] = {"oneOf": [
                {"type": "string", "maxLength": _limit(s.max_chars, cfg)},
                {"type": "object", "required": ["id"], "additionalProperties": False,
                 "properties": {"id": {"type": "string"}}},
            ]}
        elif s.kind == "language":
            prop = {"type": "string", "enum": sorted(languages.CODES)}
        else:
            prop = {"type": s.kind}
        if s.lo is not None:
            prop["minimum"] = s.lo
        if s.hi is not None:
            prop["maximum"] = s.hi
        if s.choices:
            prop["enum"] = list(s.choices)
        if s.kind == "string":
            cap = _limit(s.max_chars, cfg)
            if cap is not None:
                prop["maxLength"] = cap
            if s.non_empty:
                prop["minLength"] = 1
        if s.docs_default is not None:
            prop["default"] = s.docs_default
        prop["description"] = s.description
        props[name] = prop
    return props


def schema(cls: type, cfg: Config, extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """The JSON schema (OpenAPI 3.1) of a request class, with this server's limits (and ``extra`` properties)."""
    out: dict[str, object] = {"type": "object", "additionalProperties": False,
                              "properties": properties(cls, cfg) | dict(extra or {})}
    required = [name for name, s in specs(cls).items() if s.required]
    if required:
        out["required"] = required
    return out
