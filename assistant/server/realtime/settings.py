"""A Realtime session's settings: what ``session.update`` may change, parsed in either shape, and what they
mean for our conversation (its VAD and turn-taking settings, its voice).

Both shapes are read: the GA one (``audio.input.format``, ``audio.output.voice``, ``output_modalities``) and the
beta one (``input_audio_format``, ``voice``, ``modalities``), which some clients still send; a field given both
ways is refused. Each field stands alone: a wrong or unsupported one is refused with an error of its own and the
rest of the update applies (:meth:`Settings.apply`). The session is written back in the client's dialect
(:meth:`Settings.to_json`). ``response.create``'s own parameters are read here too (:func:`parse_response`).

Turn detection maps onto our own turn-taking:

- ``semantic_vad`` (our default): our end of turn, the transcript rule and the audio end-of-turn model;
  ``eagerness`` scales how long it may wait for a user who is not done;
- ``server_vad``: plain silence endpointing, ``silence_duration_ms`` of it, at ``threshold``; ``idle_timeout_ms``
  asks for a response when nobody has spoken that long after the last one;
- ``null``: no VAD; the client commits the input buffer and asks for responses itself.

``create_response: false`` keeps the turn detection (speech is committed and transcribed) but leaves the
responses to the client.

``interrupt_response`` is our barge-in; a barge-in cancels the reply at once, as the reference does (our
backchannel pause, which lets "mm-hmm" through, is off for Realtime sessions).
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from assistant.config import Config, TurnConfig, VADConfig
from assistant.server.realtime.formats import PCM16, AudioFormat, FormatError, parse_format

MODALITIES = ("audio", "text")
# 'auto', 'none', 'required', or {"type": "function", "name": ...}
ToolChoice = str | dict[str, str]
EAGERNESS = {"low": 2.0, "medium": 1.0, "auto": 1.0, "high": 0.5}  # × our longest wait for an unfinished turn
# The reference's own voice names: clients hard-code them, so they speak in our default voice.
REFERENCE_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin",
                              "cedar", "fable", "onyx", "nova"})
SPEED_RANGE = (0.25, 1.5)  # what the reference accepts for audio.output.speed
MAX_INSTRUCTIONS_CHARS = 100_000
# Fields the reference has that change nothing a client can hear; accepted so that clients that send them work
# (tracing is OpenAI's own dashboard; the conversation is truncated at realtime.max_items whatever it says; our
# responders write one reply at a time, without a reasoning budget).
ACCEPTED_IGNORED = ("tracing", "truncation", "include", "client_secret", "expires_at", "object", "id",
                    "parallel_tool_calls", "reasoning")
MAX_OUTPUT_TOKENS = 4096  # the reference's cap on max_output_tokens
IDLE_TIMEOUT_RANGE_MS = (5_000, 30_000)  # what the reference takes for server_vad's idle_timeout_ms
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class SettingsError(ValueError):
    """A field the session cannot take; ``param`` names it as the reference would (``session.audio.…``)."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def unknown(param: str) -> SettingsError:
    return SettingsError(f"Unknown parameter: '{param}'.", param, "unknown_parameter")


@dataclass
class TurnDetection:
    """The reference's ``turn_detection`` object (None on :class:`Settings` means off)."""

    type: str = "semantic_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 96
    silence_duration_ms: int = 500
    eagerness: str = "auto"
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None  # server_vad: a response is asked for after this much silence

    def to_json(self) -> dict[str, object]:
        common = {"type": self.type, "create_response": self.create_response,
                  "interrupt_response": self.interrupt_response}
        if self.type == "semantic_vad":
            return {**common, "eagerness": self.eagerness}
        return {**common, "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "idle_timeout_ms": self.idle_timeout_ms}


@dataclass
class Settings:
    """Everything ``session.created`` shows and ``session.update`` may change."""

    id: str
    model: str
    instructions: str
    voice: str
    input_format: AudioFormat = PCM16
    output_format: AudioFormat = PCM16
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None
    speed: float = 1.0
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: int | None = None  # None: "inf" (the responder's own limit)
    temperature: float | None = None  # None: the responder's own

    @classmethod
    def defaults(cls, cfg: Config, model: str) -> Settings:
        vad = cfg.vad
        return cls(
            id="sess_" + secrets.token_urlsafe(12),
            model=model,
            # The operator's prompt, if set; else none: the responder's own applies (the embedded model's persona,
            # the openai responder's note), and a client's instructions replace it as the reference's do.
            instructions=cfg.respond.system_prompt or "",
            voice="default",
            turn_detection=TurnDetection(threshold=vad.threshold, prefix_padding_ms=vad.speech_pad_ms,
                                         silence_duration_ms=vad.end_silence_ms),
            transcription={"model": f"{cfg.asr.engine}:{cfg.asr.model}", "language": cfg.asr.language or None,
                           "prompt": ""},
        )

    @property
    def audio_out(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def server_responses(self) -> bool:
        """Turn detection answers each turn itself (on, with create_response)."""
        return self.turn_detection is not None and self.turn_detection.create_response

    @property
    def idle_timeout_ms(self) -> int | None:
        td = self.turn_detection
        return td.idle_timeout_ms if td is not None and td.type == "server_vad" else None

    # --- what it means for the conversation ---------------------------------------------------------
    def vad_config(self, base: VADConfig) -> VADConfig:
        td = self.turn_detection
        if td is None or td.type != "server_vad":
            return base
        return replace(base, threshold=td.threshold, neg_threshold=max(0.0, min(base.neg_threshold, td.threshold)),
                       speech_pad_ms=td.prefix_padding_ms, end_silence_ms=td.silence_duration_ms)

    def turn_config(self, base: TurnConfig) -> TurnConfig:
        td = self.turn_detection
        cut = replace(base, backchannel_ms=0, backchannel_words=0)  # barge-in cancels at once, as the reference does
        if td is None:
            return cut
        if td.type == "server_vad":
            return replace(cut, barge_in=td.interrupt_response, smart_endpoint=False, end_of_turn_model=False)
        scale = EAGERNESS[td.eagerness]
        return replace(cut, barge_in=td.interrupt_response,
                       max_silence_ms=int(base.max_silence_ms * scale),
                       incomplete_endpoint_ms=int(base.incomplete_endpoint_ms * scale),
                       unsure_endpoint_ms=int(base.unsure_endpoint_ms * scale))

    # --- session.update -------------------------------------------------------------------------------
    def apply(self, update: object) -> tuple[Settings, list[SettingsError], int]:
        """A copy with every right field of ``update`` (the ``session`` of a ``session.update``) applied, an
        error for each wrong, unknown or unsupported one (which changes nothing), and how many were taken."""
        if not isinstance(update, dict):
            return self, [SettingsError("'session' must be an object", "session")], 0
        new = copy.deepcopy(self)
        seen: set[str] = set()
        errors: list[SettingsError] = []
        taken = 0

        def take(name: str, value: object, param: str) -> None:
            nonlocal taken
            try:
                if name in seen:
                    raise SettingsError(f"'{param}' is given twice (GA and beta shapes)", param)
                seen.add(name)
                new._set(name, value, param)
                taken += 1
            except SettingsError as exc:
                errors.append(exc)

        for key, value in update.items():
            p = f"session.{key}"
            if key == "type":
                if value not in ("realtime", None):
                    errors.append(SettingsError(f"Invalid value: {value!r}. Supported values are: 'realtime'.", p))
                else:
                    taken += 1
            elif key == "audio":
                _audio(value, p, take, errors)
            elif key in ("output_modalities", "modalities"):
                take("modalities", value, p)
            elif key == "input_audio_format":
                take("input_format", value, p)
            elif key == "output_audio_format":
                take("output_format", value, p)
            elif key == "input_audio_transcription":
                take("transcription", value, p)
            elif key == "input_audio_noise_reduction":
                take("noise_reduction", value, p)
            elif key in ("max_output_tokens", "max_response_output_tokens"):
                take("max_output_tokens", value, p)
            elif key in ("instructions", "voice", "turn_detection", "speed", "tools", "tool_choice", "model",
                         "temperature", "prompt"):
                take(key, value, p)
            elif key in ACCEPTED_IGNORED:
                taken += 1
            else:
                errors.append(unknown(p))
        return new, errors, taken

    def updated(self, update: object) -> Settings:
        """A copy with ``update`` applied; the first wrong field raises :class:`SettingsError` (a session asked
        for whole, as a call's offer does, is taken whole or not at all)."""
        new, errors, _ = self.apply(update)
        if errors:
            raise errors[0]
        return new

    def _set(self, name: str, value: object, param: str) -> None:
        if name == "modalities":
            if not isinstance(value, list) or not value or any(m not in MODALITIES for m in value):
                raise SettingsError("output modalities must be ['audio'] or ['text'] (or both)", param)
            self.output_modalities = list(dict.fromkeys(value))
        elif name in ("input_format", "output_format"):
            try:
                setattr(self, name, parse_format(value, param))
            except FormatError as exc:
                raise SettingsError(str(exc), exc.param) from None
        elif name == "instructions":
            if not isinstance(value, str) or len(value) > MAX_INSTRUCTIONS_CHARS:
                raise SettingsError(f"'instructions' must be a string of at most {MAX_INSTRUCTIONS_CHARS} chars", param)
            self.instructions = value
        elif name == "model":
            if not isinstance(value, str):
                raise SettingsError("'model' must be a string", param)
            self.model = value
        elif name == "voice":
            if not isinstance(value, str) or not value or len(value) > 128:
                raise SettingsError("'voice' must be a voice name or id", param)
            self.voice = value
        elif name == "speed":
            if not isinstance(value, int | float) or not SPEED_RANGE[0] <= value <= SPEED_RANGE[1]:
                raise SettingsError(f"'speed' must be a number from {SPEED_RANGE[0]} to {SPEED_RANGE[1]}", param)
            self.speed = float(value)
        elif name == "transcription":
            if value is not None and not isinstance(value, dict):
                raise SettingsError("transcription must be an object or null", param)
            self.transcription = value
        elif name == "noise_reduction":
            if value is not None and not isinstance(value, dict):
                raise SettingsError("noise_reduction must be an object or null", param)
            self.noise_reduction = value
        elif name == "turn_detection":
            self.turn_detection = _turn_detection(value, self.turn_detection, param)
        elif name == "tools":
            self.tools = parse_tools(value, param)
        elif name == "tool_choice":
            self.tool_choice = parse_tool_choice(value, param)
        elif name == "max_output_tokens":
            self.max_output_tokens = parse_max_tokens(value, param)
        elif name == "temperature":
            self.temperature = parse_temperature(value, param)
        elif name == "prompt" and value is not None:
            raise SettingsError("stored prompts are not supported by this server: give 'instructions'", param,
                                "unsupported")

    # --- the session object -----------------------------------------------------------------------------
    def to_json(self, beta: bool = False) -> dict[str, object]:
        td = self.turn_detection.to_json() if self.turn_detection is not None else None
        if beta:
            return {
                "id": self.id, "object": "realtime.session", "model": self.model,
                "modalities": self.output_modalities, "instructions": self.instructions, "voice": self.voice,
                "input_audio_format": self.input_format.beta_name, "output_audio_format": self.output_format.beta_name,
                "input_audio_transcription": self.transcription, "input_audio_noise_reduction": self.noise_reduction,
                "turn_detection": td, "tools": self.tools, "tool_choice": self.tool_choice,
                "temperature": self.temperature if self.temperature is not None else 0.8,
                "max_response_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
                "speed": self.speed, "tracing": None,
            }
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "output_modalities": self.output_modalities, "instructions": self.instructions,
            "tools": self.tools, "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
            "tracing": None, "truncation": "auto", "prompt": None, "expires_at": 0, "include": None,
            "audio": {
                "input": {"format": self.input_format.to_json(), "transcription": self.transcription,
                          "noise_reduction": self.noise_reduction, "turn_detection": td},
                "output": {"format": self.output_format.to_json(), "voice": self.voice, "speed": self.speed},
            },
        }


def _audio(value: object, param: str, take: Callable[[str, object, str], None],
           errors: list[SettingsError]) -> None:
    if not isinstance(value, dict):
        errors.append(SettingsError("'audio' must be an object", param))
        return
    for side, fields in value.items():
        p = f"{param}.{side}"
        if side not in ("input", "output"):
            errors.append(unknown(p))
        elif not isinstance(fields, dict):
            errors.append(SettingsError(f"'{p}' must be an object", p))
        else:
            for key, v in fields.items():
                q = f"{p}.{key}"
                if side == "input" and key in ("format", "transcription", "noise_reduction", "turn_detection"):
                    take("input_format" if key == "format" else str(key), v, q)
                elif side == "output" and key in ("format", "voice", "speed"):
                    take("output_format" if key == "format" else str(key), v, q)
                else:
                    errors.append(unknown(q))


def _turn_detection(value: object, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SettingsError("'turn_detection' must be an object or null", param)
    kind = value.get("type", current.type if current is not None else "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise SettingsError(f"Invalid value: {kind!r}. Supported values are: 'server_vad', 'semantic_vad'.",
                            f"{param}.type")
    td = replace(current, type=kind) if current is not None else TurnDetection(type=kind)
    allowed = {"type", "create_response", "interrupt_response"} | (
        {"eagerness"} if kind == "semantic_vad" else {"threshold", "prefix_padding_ms", "silence_duration_ms",
                                                      "idle_timeout_ms"})
    for key, v in value.items():
        p = f"{param}.{key}"
        if key not in allowed:
            raise unknown(p)
        if key == "threshold":
            if not isinstance(v, int | float) or not 0.0 < v < 1.0:
                raise SettingsError("'threshold' must be a number between 0 and 1", p)
            td.threshold = float(v)
        elif key in ("prefix_padding_ms", "silence_duration_ms"):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 10_000:
                raise SettingsError(f"'{key}' must be an integer from 0 to 10000", p)
            if key == "silence_duration_ms" and v < 100:
                raise SettingsError("'silence_duration_ms' must be at least 100", p)
            setattr(td, key, v)
        elif key == "eagerness":
            if v not in EAGERNESS:
                raise SettingsError(f"Invalid value: {v!r}. Supported values are: 'low', 'medium', 'high', 'auto'.", p)
            td.eagerness = v
        elif key == "idle_timeout_ms":
            low, high = IDLE_TIMEOUT_RANGE_MS
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high):
                raise SettingsError(f"'idle_timeout_ms' must be null or an integer from {low} to {high}", p)
            td.idle_timeout_ms = v
        elif key == "create_response":
            if not isinstance(v, bool):
                raise SettingsError(f"'{key}' must be a boolean", p)
            td.create_response = v
        elif key == "interrupt_response":
            if not isinstance(v, bool):
                raise SettingsError(f"'{key}' must be a boolean", p)
            td.interrupt_response = v
    return td


def parse_tools(value: object, param: str) -> list[dict[str, Any]]:
    """Function tools (``{"type": "function", "name", "description", "parameters"}``); MCP tools are refused."""
    if not isinstance(value, list):
        raise SettingsError("'tools' must be a list", param)
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        p = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise SettingsError("a tool is an object", p)
        if tool.get("type", "function") != "function":
            raise SettingsError(f"tools of type {tool.get('type')!r} are not supported (function only)",
                                f"{p}.type", "unsupported")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise SettingsError("a function tool needs a 'name'", f"{p}.name")
        params = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise SettingsError("'parameters' must be a JSON schema object", f"{p}.parameters")
        out.append({"type": "function", "name": name, "description": str(tool.get("description", "")),
                    "parameters": params})
    return out


def parse_max_tokens(value: object, param: str) -> int | None:
    """``max_output_tokens``: an integer from 1 to 4096, or ``"inf"`` (None: the responder's own limit)."""
    if value == "inf" or value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_OUTPUT_TOKENS:
        return value
    raise SettingsError(f"'max_output_tokens' must be an integer from 1 to {MAX_OUTPUT_TOKENS}, or 'inf'", param)


def parse_temperature(value: object, param: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 2.0:
        return float(value)
    raise SettingsError("'temperature' must be a number from 0 to 2", param)


def parse_metadata(value: object, param: str) -> dict[str, str] | None:
    """Up to 16 string pairs (keys up to 64 characters, values up to 512), as the reference takes them."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS:
        raise SettingsError(f"'metadata' must be an object of at most {MAX_METADATA_PAIRS} string pairs", param)
    for key, v in value.items():
        if not isinstance(v, str) or len(key) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE:
            raise SettingsError(f"metadata keys are strings of at most {MAX_METADATA_KEY} characters, values of "
                                f"at most {MAX_METADATA_VALUE}", f"{param}.{str(key)[:64]}")
    return dict(value)


def parse_tool_choice(value: object, param: str) -> ToolChoice:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "name": value["name"]}
    raise SettingsError("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\"}",
                        param)


# ``response.create``'s parameters: what they change, and what is accepted and ignored (voice and format per
# response: the session's apply).
RESPONSE_FIELDS = {"instructions", "output_modalities", "modalities", "conversation", "input", "tools", "tool_choice",
                   "metadata", "max_output_tokens", "max_response_output_tokens", "temperature", "voice", "audio",
                   "prompt", "output_audio_format", "parallel_tool_calls", "reasoning"}


@dataclass
class ResponseRequest:
    """What one response is asked to be: ``response.create``'s parameters over the session's settings."""

    instructions: str
    modalities: list[str]
    tools: list[dict[str, Any]]
    tool_choice: ToolChoice
    given_instructions: bool = False  # the response brought its own instructions
    metadata: dict[str, str] | None = None
    out_of_band: bool = False  # conversation "none": its output stays out of the conversation
    input: list[object] | None = None  # its own context (items, or references to items), parsed by the caller
    max_output_tokens: int | None = None
    temperature: float | None = None


def parse_response(params: object, settings: Settings) -> ResponseRequest:
    """``response.create``'s ``response`` (None: all from the session) → :class:`ResponseRequest`."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise SettingsError("'response' must be an object", "response")
    for key in params:
        if key not in RESPONSE_FIELDS:
            raise SettingsError(f"Unknown parameter: 'response.{key}'.", f"response.{key}", "unknown_parameter")
    req = ResponseRequest(instructions=settings.instructions, modalities=list(settings.output_modalities),
                          tools=settings.tools, tool_choice=settings.tool_choice,
                          max_output_tokens=settings.max_output_tokens, temperature=settings.temperature)
    instructions = params.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str) or len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise SettingsError(f"'instructions' must be a string of at most {MAX_INSTRUCTIONS_CHARS} chars",
                                "response.instructions")
        req.instructions, req.given_instructions = instructions, True
    modalities = params.get("output_modalities", params.get("modalities"))
    if modalities is not None:
        if not isinstance(modalities, list) or not modalities or any(m not in MODALITIES for m in modalities):
            raise SettingsError("output modalities must be ['audio'] or ['text']", "response.output_modalities")
        req.modalities = list(dict.fromkeys(modalities))
    conversation = params.get("conversation", "auto")
    if conversation not in ("auto", "none", None):
        raise SettingsError(f"Invalid value: {conversation!r}. Supported values are: 'auto', 'none'.",
                            "response.conversation")
    req.out_of_band = conversation == "none"
    if "input" in params:
        if not isinstance(params["input"], list):
            raise SettingsError("'input' must be a list of items", "response.input")
        req.input = list(params["input"])
    if "tools" in params:
        req.tools = parse_tools(params["tools"], "response.tools")
    if "tool_choice" in params:
        req.tool_choice = parse_tool_choice(params["tool_choice"], "response.tool_choice")
    req.metadata = parse_metadata(params.get("metadata"), "response.metadata")
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in params:
            req.max_output_tokens = parse_max_tokens(params[key], f"response.{key}")
    if "temperature" in params:
        req.temperature = parse_temperature(params["temperature"], "response.temperature")
    if params.get("prompt") is not None:
        raise SettingsError("stored prompts are not supported by this server: give 'instructions'",
                            "response.prompt", "unsupported")
    return req
