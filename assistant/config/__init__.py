"""Typed configuration: ``configs/*.toml`` < environment (``ASSISTANT_SECTION__KEY``) < command-line flags.

One module per section, beside what it configures in name: ``server`` (with ``[ice]``, ``[keys]``, ``[log]``,
``[dispatch]``), ``audio`` (``[audio]``, ``[vad]``), ``asr``, ``respond``, ``tts`` (with ``[chunker]``,
``[tts_api]``), ``turn``, ``realtime``, ``telephony``, ``sip``, ``ray``, ``telemetry``; ``fields`` is what a setting is
made of, ``loader`` the whole ``Config`` and how files, the environment and flags fill it. Import from here.
"""

from __future__ import annotations

from assistant.config.asr import MAX_WINDOW_S, MIN_WINDOW_S, ASRConfig, check_min_window
from assistant.config.audio import AudioConfig, VADConfig
from assistant.config.fields import ConfigError, setting
from assistant.config.loader import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    ENV_PREFIX,
    PROJECT_ROOT,
    Config,
    Overrides,
    add_config_flags,
    apply_overrides,
    check_languages,
    flag_overrides,
    load_config,
)
from assistant.config.ray import RayConfig
from assistant.config.realtime import RealtimeConfig
from assistant.config.respond import FALLBACKS, REQUANTIZE, RespondConfig
from assistant.config.server import (
    GATEWAY_ID,
    DispatchConfig,
    ICEConfig,
    KeysConfig,
    LogConfig,
    ServerConfig,
    check_gateway_id,
)
from assistant.config.sip import SIP_CODECS, SIP_TRANSPORTS, SIPConfig
from assistant.config.telemetry import TelemetryConfig
from assistant.config.telephony import TelephonyConfig
from assistant.config.tts import ChunkerConfig, TTSAPIConfig, TTSConfig
from assistant.config.turn import TURN_CUES, TURN_POLICIES, TurnConfig

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_CONFIG",
    "ENV_PREFIX",
    "FALLBACKS",
    "GATEWAY_ID",
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "PROJECT_ROOT",
    "REQUANTIZE",
    "SIP_CODECS",
    "SIP_TRANSPORTS",
    "TURN_CUES",
    "TURN_POLICIES",
    "ASRConfig",
    "AudioConfig",
    "ChunkerConfig",
    "Config",
    "ConfigError",
    "DispatchConfig",
    "ICEConfig",
    "KeysConfig",
    "LogConfig",
    "Overrides",
    "RayConfig",
    "RealtimeConfig",
    "RespondConfig",
    "SIPConfig",
    "ServerConfig",
    "TTSAPIConfig",
    "TTSConfig",
    "TelemetryConfig",
    "TelephonyConfig",
    "TurnConfig",
    "VADConfig",
    "add_config_flags",
    "apply_overrides",
    "check_gateway_id",
    "check_languages",
    "check_min_window",
    "flag_overrides",
    "load_config",
    "setting",
]
