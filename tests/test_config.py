"""Config: defaults < TOML < environment < flags, with clear errors for unknown names and bad values."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from assistant.asr.whisper import model_name
from assistant.cli import build_parser, main
from assistant.config import Config, ConfigError, add_config_flags, flag_overrides, load_config


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[vad]\nthreshold = 0.6\nend_silence_ms = 400\n[server]\ncors_origins = ["https://a"]\n')
    env = {"ASSISTANT_VAD__END_SILENCE_MS": "300", "ASSISTANT_TURN__BARGE_IN": "false", "OTHER": "x"}
    cfg = load_config(toml, environ=env, overrides={"vad": {"end_silence_ms": "250"}})
    assert cfg.vad.threshold == 0.6  # file
    assert cfg.turn.barge_in is False  # environment
    assert cfg.vad.end_silence_ms == 250  # flag beats environment beats file
    assert cfg.server.cors_origins == ["https://a"]


def test_default_file_is_the_cpu_stack() -> None:
    cfg = load_config(environ={})
    assert (model_name(cfg.asr), cfg.tts.engine, cfg.respond.engine) == ("tiny.en", "piper", "llama")
    assert cfg.respond.model_path == "auto"  # the machine's model (respond/auto.py); the packaged SmolLM2 until then
    gpu = load_config(Path(__file__).resolve().parents[1] / "configs/gpu.toml", environ={})
    assert (gpu.tts.engine, gpu.tts.device, gpu.tts.dtype) == ("cosyvoice2", "cuda", "bfloat16")
    assert (gpu.respond.engine, gpu.respond.gpu_layers) == ("llama", -1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ASSISTANT_VAD__NOPE": "1"}, "unknown setting vad.nope"),
        ({"ASSISTANT_NOPE__X": "1"}, "unknown section"),
        ({"ASSISTANT_VAD__MIN_SPEECH_MS": "soon"}, "expected an integer"),
        ({"ASSISTANT_TURN__BARGE_IN": "maybe"}, "expected true/false"),
        # The fallback answers while the engine is down: one that loads a model (on the event loop, in the server's
        # own process) is refused, not built.
        ({"ASSISTANT_RESPOND__FALLBACK": "llama"}, "respond.fallback must be echo, rules or empty"),
        ({"ASSISTANT_RESPOND__FALLBACK": "tests.fault_engines:CrashAtWarmup"}, "respond.fallback must be"),
        ({"ASSISTANT_TURN__CONFIRM_SURE_MS": "-1"}, "turn.confirm_sure_ms must be ≥ 0"),
        ({"ASSISTANT_ASR__CPU_THREADS": "-2"}, "asr.cpu_threads must be ≥ 0"),
    ],
)
def test_bad_settings_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ=env)


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[vad\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(bad, environ={})


def test_every_setting_has_a_flag_with_help() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = {a.dest: a for a in parser._actions if a.dest.startswith("cfg__")}
    cfg = Config()
    expected = {f"cfg__{sec}__{key}" for sec, values in cfg.to_dict().items() for key in values}
    assert set(flags) == expected
    assert all(a.help and "default" in a.help and len(a.help) > 20 for a in flags.values())
    args = parser.parse_args(["--vad.threshold", "0.7", "--server.port", "9000"])
    assert flag_overrides(args) == {"vad": {"threshold": "0.7"}, "server": {"port": "9000"}}


def test_cli_help_and_bad_flag_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--vad.end_silence_ms" in out and "--respond.engine" in out and "--turn.barge_in" in out
    assert main(["doctor", "--vad.min_speech_ms", "soon"]) == 2
    assert "expected an integer" in capsys.readouterr().err


def test_default_toml_holds_only_differences_and_help_tells_the_truth() -> None:
    """``configs/default.toml`` repeats no typed default, and ``--help`` shows what really applies."""
    import tomllib

    from assistant.config import DEFAULT_CONFIG

    typed = Config()
    file_values = tomllib.loads(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    for section, entries in file_values.items():
        for key, value in entries.items():
            assert getattr(getattr(typed, section), key) != value, f"{section}.{key} repeats the typed default"
    effective = load_config(environ={})
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    helps = {a.dest: a.help for a in parser._actions if a.dest.startswith("cfg__")}
    assert helps, "no config flags"
    for dest, text in helps.items():
        _, section, key = dest.split("__", 2)
        assert text.endswith(f"(default: {getattr(getattr(effective, section), key)!r})"), (dest, text)


def test_say_speaks_through_the_speech_path(tmp_path: Path) -> None:
    """``assistant say`` writes a WAV of the configured voice: two sentences, both spoken."""
    import soundfile as sf

    out = tmp_path / "say.wav"
    assert main(["say", "Hello there. How are you today?", "--out", str(out)]) == 0
    audio, rate = sf.read(out)
    assert rate == 22_050 and len(audio) / rate > 1.2 and abs(audio).max() > 0.05


def test_gpu_config_hears_every_language() -> None:
    gpu = load_config(Path(__file__).resolve().parents[1] / "configs/gpu.toml", environ={})
    assert (gpu.asr.model, gpu.asr.language) == ("large-v3-turbo", "auto")
    assert set(gpu.asr.languages) == {"en", "zh", "ja", "ko", "yue"}
    assert gpu.tts.voices == {}  # CosyVoice2 speaks them all itself


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"asr": {"language": "jp"}}, "asr.language: 'jp' is not a language code; did you mean 'ja'?"),
        ({"asr": {"languages": ["en", "klingon"]}}, "asr.languages: 'klingon' is not a language code"),
        ({"tts": {"language": "xx"}}, "tts.language: 'xx' is not a language code"),
        ({"tts": {"voices": {"cn": "piper"}}}, "tts.voices: 'cn' is not a language code; did you mean 'zh'?"),
        ({"tts": {"voices": {"ja": ""}}}, "tts.voices: the voice for 'ja' must be ENGINE or ENGINE:VOICE"),
    ],
)
def test_unknown_language_codes_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("?", r"\?").replace(".", r"\.")):
        load_config(environ={}, overrides=overrides)
    with pytest.raises(ConfigError, match="Use 'auto' or one of"):
        load_config(environ={}, overrides={"asr": {"language": "x"}})


def test_auto_and_empty_language_mean_detection() -> None:
    assert load_config(environ={}, overrides={"asr": {"language": ""}}).asr.language == "auto"
    cfg = load_config(environ={"ASSISTANT_ASR__LANGUAGE": "auto", "ASSISTANT_ASR__LANGUAGES": "en,ja"})
    assert (cfg.asr.language, cfg.asr.languages, model_name(cfg.asr)) == ("auto", ["en", "ja"], "base")


def test_unknown_language_code_stops_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--asr.language", "english"]) == 2
    assert "did you mean 'en'?" in capsys.readouterr().err
