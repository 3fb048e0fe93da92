"""A Realtime session's settings: what ``session.update`` may change, parsed in either shape, and what they
mean for our conversation (its VAD and turn-taking settings, its voice).

Both shapes are read: the GA one (``audio.input.format``, ``audio.output.voice``, ``output_modalities``) and the
beta one (``input_audio_format``, ``voice``, ``modalities``), which some clients still send; a field given both
ways is refused. The session is written back in the client's dialect (:meth:`Settings.to_json`).

Turn detection maps onto our own turn-taking:

- ``semantic_vad`` (our default): our end of turn, the transcript rule and the audio end-of-turn model;
  ``eagerness`` scales how long it may wait for a user who is not done;
- ``server_vad``: plain silence endpointing, ``silence_duration_ms`` of it, at ``threshold``;
- ``null``: no VAD; the client commits the input buffer and asks for responses itself.

``interrupt_response`` is our barge-in; a barge-in cancels the reply at once, as the reference does (our
backchannel pause, which lets "mm-hmm" through, is off for Realtime sessions).
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from assistant.config import Config, TurnConfig, VADConfig
from assistant.server.realtime.formats import PCM16, AudioFormat, FormatError, parse_format

MODALITIES = ("audio", "text")
EAGERNESS = {"low": 2.0, "medium": 1.0, "auto": 1.0, "high": 0.5}  # × our longest wait for an unfinished turn
# The reference's own voice names: clients hard-code them, so they speak in our default voice.
REFERENCE_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin",
                              "cedar", "fable", "onyx", "nova"})
SPEED_RANGE = (0.25, 1.5)  # what the reference accepts for audio.output.speed
MAX_INSTRUCTIONS_CHARS = 100_000
# Fields the reference has that change nothing here; accepted so that clients that send them work.
ACCEPTED_IGNORED = ("tracing", "truncation", "prompt", "include", "client_secret", "expires_at", "object", "id")
TEMPERATURE_RANGE = (0.0, 2.0)
MAX_OUTPUT_TOKENS = 4096  # the reference's ceiling for max_output_tokens ("inf": the responder's own limit)


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

    def to_json(self) -> dict[str, Any]:
        common = {"type": self.type, "create_response": self.create_response,
                  "interrupt_response": self.interrupt_response}
        if self.type == "semantic_vad":
            return {**common, "eagerness": self.eagerness}
        return {**common, "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, "idle_timeout_ms": None}


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
    tool_choice: Any = "auto"
    temperature: float | None = None  # None: respond.temperature
    max_output_tokens: int | None = None  # None ("inf"): respond.max_tokens

    @classmethod
    def defaults(cls, cfg: Config, model: str) -> Settings:
        vad = cfg.vad
        return cls(
            id="sess_" + secrets.token_urlsafe(12),
            model=model,
            instructions=cfg.respond.system_prompt,
            voice="default",
            turn_detection=TurnDetection(threshold=vad.threshold, prefix_padding_ms=vad.speech_pad_ms,
                                         silence_duration_ms=vad.end_silence_ms),
            transcription={"model": f"{cfg.asr.engine}:{cfg.asr.model}", "language": cfg.asr.language or None,
                           "prompt": ""},
        )

    @property
    def audio_out(self) -> bool:
        return "audio" in self.output_modalities

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
    def updated(self, update: object) -> Settings:
        """A copy with ``update`` (the ``session`` of a ``session.update``) applied; :class:`SettingsError` and
        no change at all if any field is wrong."""
        if not isinstance(update, dict):
            raise SettingsError("'session' must be an object", "session")
        new = copy.deepcopy(self)
        seen: set[str] = set()

        def take(name: str, value: Any, param: str) -> None:
            if name in seen:
                raise SettingsError(f"'{param}' is given twice (GA and beta shapes)", param)
            seen.add(name)
            new._set(name, value, param)

        for key, value in update.items():
            p = f"session.{key}"
            if key == "type":
                if value not in ("realtime", None):
                    raise SettingsError(f"Invalid value: {value!r}. Supported values are: 'realtime'.", p)
            elif key == "audio":
                _audio(value, p, take)
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
            elif key in ("instructions", "voice", "turn_detection", "speed", "tools", "tool_choice", "model",
                         "temperature"):
                take(key, value, p)
            elif key in ("max_output_tokens", "max_response_output_tokens"):
                take("max_output_tokens", value, p)
            elif key in ACCEPTED_IGNORED:
                continue
            else:
                raise unknown(p)
        return new

    def _set(self, name: str, value: Any, param: str) -> None:
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
        elif name == "temperature":
            self.temperature = parse_temperature(value, param)
        elif name == "max_output_tokens":
            self.max_output_tokens = parse_max_output_tokens(value, param)

    # --- the session object -----------------------------------------------------------------------------
    def to_json(self, beta: bool = False) -> dict[str, Any]:
        td = self.turn_detection.to_json() if self.turn_detection is not None else None
        if beta:
            return {
                "id": self.id, "object": "realtime.session", "model": self.model,
                "modalities": self.output_modalities, "instructions": self.instructions, "voice": self.voice,
                "input_audio_format": self.input_format.beta_name, "output_audio_format": self.output_format.beta_name,
                "input_audio_transcription": self.transcription, "input_audio_noise_reduction": self.noise_reduction,
                "turn_detection": td, "tools": self.tools, "tool_choice": self.tool_choice,
                "temperature": 0.8 if self.temperature is None else self.temperature,
                "max_response_output_tokens": self.max_output_tokens or "inf", "speed": self.speed, "tracing": None,
            }
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "output_modalities": self.output_modalities, "instructions": self.instructions,
            "tools": self.tools, "tool_choice": self.tool_choice, "max_output_tokens": self.max_output_tokens or "inf",
            "tracing": None, "truncation": "auto", "prompt": None, "expires_at": 0, "include": None,
            "audio": {
                "input": {"format": self.input_format.to_json(), "transcription": self.transcription,
                          "noise_reduction": self.noise_reduction, "turn_detection": td},
                "output": {"format": self.output_format.to_json(), "voice": self.voice, "speed": self.speed},
            },
        }


def _audio(value: object, param: str, take: Any) -> None:
    if not isinstance(value, dict):
        raise SettingsError("'audio' must be an object", param)
    for side, fields in value.items():
        p = f"{param}.{side}"
        if side not in ("input", "output"):
            raise unknown(p)
        if not isinstance(fields, dict):
            raise SettingsError(f"'{p}' must be an object", p)
        for key, v in fields.items():
            q = f"{p}.{key}"
            if side == "input" and key in ("format", "transcription", "noise_reduction", "turn_detection"):
                take({"format": "input_format"}.get(key, key), v, q)
            elif side == "output" and key in ("format", "voice", "speed"):
                take({"format": "output_format"}.get(key, key), v, q)
            else:
                raise unknown(q)


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
            if v is not None:
                raise SettingsError("'idle_timeout_ms' is not supported by this server (null only)", p,
                                    "unsupported")
        elif key == "create_response":
            if v is not True:
                raise SettingsError("create_response false is not supported by this server: with turn detection "
                                    "on, every turn gets its response (turn detection null leaves turns to you)",
                                    p, "unsupported")
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


def parse_temperature(value: object, param: str) -> float:
    """The model's sampling temperature (it reaches the responder in ``ReplyOptions``)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not (
            TEMPERATURE_RANGE[0] <= value <= TEMPERATURE_RANGE[1]):
        raise SettingsError(f"'temperature' must be a number from {TEMPERATURE_RANGE[0]} to {TEMPERATURE_RANGE[1]}",
                            param)
    return float(value)


def parse_max_output_tokens(value: object, param: str) -> int | None:
    """An integer from 1 to 4096, or ``"inf"`` (None: the responder's own ``respond.max_tokens``)."""
    if value == "inf":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise SettingsError(f"'max_output_tokens' must be an integer from 1 to {MAX_OUTPUT_TOKENS}, or 'inf'", param)
    return value


def parse_tool_choice(value: object, param: str) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "name": value["name"]}
    raise SettingsError("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\"}",
                        param)
