"""The whole config and how it is read: ``configs/*.toml`` < environment (``ASSISTANT_SECTION__KEY``) < flags.

Each section is a dataclass in the module of its owner (``turn.py``, ``asr.py``, ``respond.py``, ``tts.py``,
``server.py``…); every setting is a field with a ``help`` text, from which the CLI builds one ``--section.key``
flag, so ``--help`` documents every knob and nothing is named twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from assistant import languages
from assistant.config.asr import ASRConfig, check_min_window
from assistant.config.audio import AudioConfig, VADConfig
from assistant.config.fields import ConfigError
from assistant.config.ray import RayConfig
from assistant.config.realtime import RealtimeConfig
from assistant.config.respond import FALLBACKS, REQUANTIZE, RespondConfig, check_skills
from assistant.config.server import DispatchConfig, ICEConfig, KeysConfig, LogConfig, ServerConfig
from assistant.config.sip import DIGEST_ALGORITHMS, SIP_CODECS, SIP_TRANSPORTS, SIPConfig
from assistant.config.telemetry import TelemetryConfig
from assistant.config.telephony import TelephonyConfig
from assistant.config.tts import ChunkerConfig, TTSAPIConfig, TTSConfig
from assistant.config.turn import PHONE_PLANS, TURN_CUES, TURN_POLICIES, TurnConfig

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
ENV_PREFIX = "ASSISTANT_"


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    ice: ICEConfig = field(default_factory=ICEConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    vad: VADConfig = field(default_factory=VADConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    respond: RespondConfig = field(default_factory=RespondConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    tts_api: TTSAPIConfig = field(default_factory=TTSAPIConfig)
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    telephony: TelephonyConfig = field(default_factory=TelephonyConfig)
    sip: SIPConfig = field(default_factory=SIPConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    log: LogConfig = field(default_factory=LogConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    keys: KeysConfig = field(default_factory=KeysConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Every section's settings (what crosses to a Ray replica; :func:`apply_overrides` reads it back)."""
        return dataclasses.asdict(self)


def _field_types(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _coerce(value: object, typ: object, where: str) -> object:
    """Turn a TOML value or a string (environment, flags) into the field's type."""
    origin = typing.get_origin(typ)
    if origin in (list,):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(typ) or (str,)
        return [_coerce(v, item, where) for v in value]
    if origin in (dict,):
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: expected a JSON object, got {value!r}") from exc
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table/object, got {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(typ):  # unset (Config.to_dict gives it back as None)
            return None
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        return _coerce(value, args[0], where)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from exc
    if typ is float:
        if not isinstance(value, int | float | str):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from exc
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


# Settings by section, as a TOML file, the environment, flags or ``Config.to_dict`` give them: {section: {key: value}}.
Overrides = Mapping[str, Mapping[str, object]]


def apply_overrides(cfg: Config, values: Overrides, source: str) -> None:
    """Set ``values[section][key]`` on ``cfg``, checking names and types."""
    for section, entries in values.items():
        if not hasattr(cfg, section) or not dataclasses.is_dataclass(getattr(cfg, section)):
            raise ConfigError(f"{source}: unknown section [{section}]")
        if not isinstance(entries, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table")
        obj = getattr(cfg, section)
        types_ = _field_types(type(obj))
        for key, value in entries.items():
            if key not in types_:
                raise ConfigError(f"{source}: unknown setting {section}.{key}")
            setattr(obj, key, _coerce(value, types_[key], f"{source}: {section}.{key}"))


def _env_overrides(environ: dict[str, str]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        out.setdefault(section.lower(), {})[key.lower()] = value
    return out


def load_config(
    path: str | Path | None = None,
    *,
    environ: dict[str, str] | None = None,
    overrides: Overrides | None = None,
) -> Config:
    """Defaults < TOML file (default ``configs/default.toml``) < environment < explicit overrides."""
    cfg = Config()
    file = Path(path) if path else DEFAULT_CONFIG
    if path or file.exists():
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {file}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: {exc}") from exc
        apply_overrides(cfg, data, str(file))
    apply_overrides(cfg, _env_overrides(dict(os.environ if environ is None else environ)), "environment")
    if overrides:
        apply_overrides(cfg, overrides, "command line")
    if cfg.turn.policy not in TURN_POLICIES:
        raise ConfigError(f"turn.policy must be one of {', '.join(TURN_POLICIES)}, got {cfg.turn.policy!r}")
    if cfg.turn.phone_plan not in PHONE_PLANS:
        raise ConfigError(f"turn.phone_plan must be nanp or empty (none), got {cfg.turn.phone_plan!r}")
    for name in ("model_alone_veto", "falling_late_veto"):
        bad_cues = [c for c in getattr(cfg.turn, name) if c not in TURN_CUES]
        if bad_cues:
            raise ConfigError(f"turn.{name}: {bad_cues[0]!r} is no cue; choose from {', '.join(TURN_CUES)}")
    if cfg.asr.cpu_threads < 0:
        raise ConfigError(f"asr.cpu_threads must be ≥ 0 (0: a share of the CPUs), got {cfg.asr.cpu_threads}")
    if cfg.turn.confirm_sure_ms < 0:  # above turn.confirm_ms it is that (end_of_turn.confirm_hold_ms)
        raise ConfigError(f"turn.confirm_sure_ms must be ≥ 0 (0: a sure end's reply is heard at once), got "
                          f"{cfg.turn.confirm_sure_ms}")
    for name in ("phrase_cache_mb", "phrase_cache_chars"):
        if getattr(cfg.tts, name) < 0:
            raise ConfigError(f"tts.{name} must be ≥ 0 (0: no phrase cache), got {getattr(cfg.tts, name)}")
    check_min_window(cfg.asr.min_window_s)
    if cfg.respond.requantize not in REQUANTIZE:
        raise ConfigError(f"respond.requantize must be one of {', '.join(REQUANTIZE)}, got {cfg.respond.requantize!r}")
    if cfg.respond.fallback.strip() not in FALLBACKS:
        raise ConfigError(f"respond.fallback must be echo, rules or empty (none), got {cfg.respond.fallback!r}: it "
                          "answers while the responder's engine is down, so it must load nothing that can fail")
    check_skills(cfg.respond)
    check_languages(cfg)
    check_sip(cfg)
    return cfg


def check_sip(cfg: Config) -> None:
    """``[sip]``'s lists and ranges name what exists (the addresses and the trunk are checked when the listener
    starts: ``server/sip/``)."""
    sip = cfg.sip
    bad = [t for t in sip.transports if t not in SIP_TRANSPORTS]
    if bad or not sip.transports:
        raise ConfigError(f"sip.transports: choose from {', '.join(SIP_TRANSPORTS)} (got {sip.transports!r})")
    bad = [c for c in sip.codecs if c not in SIP_CODECS]
    if bad or not sip.codecs:
        raise ConfigError(f"sip.codecs: choose from {', '.join(SIP_CODECS)} (got {sip.codecs!r})")
    if sip.srtp not in ("off", "optional", "required"):
        raise ConfigError(f"sip.srtp must be off, optional or required (got {sip.srtp!r})")
    bad = [a for a in sip.digest_algorithms if a not in DIGEST_ALGORITHMS]
    if bad or not sip.digest_algorithms:
        raise ConfigError(f"sip.digest_algorithms: choose from {', '.join(DIGEST_ALGORITHMS)} "
                          f"(got {sip.digest_algorithms!r})")
    if not 1024 <= sip.rtp_port_min < sip.rtp_port_max <= 65_535 or sip.rtp_port_max - sip.rtp_port_min < 3:
        raise ConfigError("sip.rtp_port_min and sip.rtp_port_max must be a range of at least 4 ports within "
                          f"1024-65535 (got {sip.rtp_port_min}-{sip.rtp_port_max})")
    if sip.language:
        try:
            languages.check(sip.language, "sip.language", auto=True)
        except languages.UnknownLanguage as exc:
            raise ConfigError(str(exc)) from None


def check_languages(cfg: Config) -> None:
    """Every language setting names a known code (``asr.language`` may be ``auto``; empty is taken as ``auto``),
    else a ConfigError that says which setting and what it may be."""
    try:
        if not cfg.asr.language.strip():
            cfg.asr.language = languages.AUTO
        languages.check(cfg.asr.language, "asr.language", auto=True)
        for code in cfg.asr.languages:
            languages.check(code, "asr.languages")
        languages.check(cfg.tts.language, "tts.language")
        for code in cfg.tts.voices:
            languages.check(code, "tts.voices")
    except languages.UnknownLanguage as exc:
        raise ConfigError(str(exc)) from None
    for code, voice in cfg.tts.voices.items():
        if not isinstance(voice, str) or not voice.strip():
            raise ConfigError(f"tts.voices: the voice for {code!r} must be ENGINE or ENGINE:VOICE, got {voice!r}")


def add_config_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """One ``--section.key`` flag per setting, with its help text and default (``sections``: only those)."""
    defaults = Config()
    for sec in dataclasses.fields(Config):
        if sections is not None and sec.name not in sections:
            continue
        group = parser.add_argument_group(f"[{sec.name}]")
        obj = getattr(defaults, sec.name)
        hints = _field_types(type(obj))
        for f in dataclasses.fields(obj):
            default = getattr(obj, f.name)
            # An optional setting (None: unset) takes its type's values: ``str | None`` → STR.
            hint = hints[f.name]
            optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kind = next(t for t in typing.get_args(hint) if t is not type(None)) if optional else type(default)
            group.add_argument(
                f"--{sec.name}.{f.name}",
                dest=f"cfg__{sec.name}__{f.name}",
                metavar=getattr(kind, "__name__", "VALUE").upper(),
                default=None,
                help=f"{f.metadata.get('help', '')} (default: {default!r})",
            )


def flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, value in vars(args).items():
        if name.startswith("cfg__") and value is not None:
            _, section, key = name.split("__", 2)
            out.setdefault(section, {})[key] = value
    return out
