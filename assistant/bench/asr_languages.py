"""The price of hearing every language on a CPU: ASR time of the multilingual ``base`` with ``auto`` (detection
in every pass) against ``tiny.en`` with ``en``, on the same English turns, in one run.

    python -m assistant.bench.asr_languages [--repeat 5] [--out bench-out/asr_languages.json]

Each turn is the shared clip cut as the voice chat cuts it (the VAD's pad before the speech, the speculative
pause after), transcribed by both engines in alternation (``repeat`` times each; the median is reported), with
the engines' own settings as the voice chat runs them (int8, ``asr.cpu_threads``, the fitted window).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from assistant.asr.whisper import FasterWhisperEngine
from assistant.audio import SPEECH_RATE, read_audio
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, VADConfig

PAUSE_S = 0.096  # the speculative pause: the audio a speculative pass gets after the speech


def english_turns(folder: Path) -> list[tuple[str, str, np.ndarray]]:
    """(file, text, 16 kHz audio from the VAD's pad before the speech to the speculative pause after it)."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    pad = VADConfig().speech_pad_ms / 1000
    out = []
    for entry in manifest:
        if entry.get("lang") != "en":
            continue
        audio, rate = read_audio(folder / entry["file"])
        assert rate == SPEECH_RATE, entry["file"]
        start = max(0, int((entry["speech_starts_s"] - pad) * rate))
        end = int((entry["speech_ends_s"] + PAUSE_S) * rate)
        out.append((entry["file"], entry["text"], audio[start:end]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="passes per turn and engine (median reported)")
    parser.add_argument("--audio", type=Path, default=shared_path("audio"), help="folder of the shared clips")
    parser.add_argument("--out", type=Path, default=Path("bench-out/asr_languages.json"))
    args = parser.parse_args(argv)
    engines = {
        "tiny.en+en": FasterWhisperEngine(ASRConfig(model="auto", language="en")),
        "base+auto": FasterWhisperEngine(ASRConfig(model="auto", language="auto")),
    }
    for engine in engines.values():
        engine.warmup()
    rows = []
    for name, text, audio in english_turns(args.audio):
        times: dict[str, list[float]] = {k: [] for k in engines}
        heard: dict[str, tuple[str, str, float]] = {}
        for _ in range(args.repeat):
            for label, engine in engines.items():  # alternating: both see the same machine state
                t0 = time.perf_counter()
                result = engine.transcribe(audio)
                times[label].append(time.perf_counter() - t0)
                heard[label] = (result.text, result.language, result.language_probability)
        row = {"file": name, "audio_s": round(len(audio) / SPEECH_RATE, 2), "text": text}
        for label in engines:
            row[label] = {"median_ms": round(1000 * statistics.median(times[label]), 1), "text": heard[label][0],
                          "language": heard[label][1], "language_probability": heard[label][2]}
        row["ratio"] = round(row["base+auto"]["median_ms"] / row["tiny.en+en"]["median_ms"], 2)  # type: ignore[index]
        rows.append(row)
        print(f"{name:28s} {row['audio_s']:5.2f} s  tiny.en+en {row['tiny.en+en']['median_ms']:7.1f} ms  "  # type: ignore[index]
              f"base+auto {row['base+auto']['median_ms']:7.1f} ms  ×{row['ratio']:.2f}  "  # type: ignore[index]
              f"heard {row['base+auto']['language']} p={row['base+auto']['language_probability']:.2f}")  # type: ignore[index]
    total = {label: sum(r[label]["median_ms"] for r in rows) for label in engines}  # type: ignore[index]
    summary = {"turns": len(rows), "repeat": args.repeat, "sum_median_ms": total,
               "ratio": round(total["base+auto"] / total["tiny.en+en"], 2)}
    print(f"all {len(rows)} turns: tiny.en+en {total['tiny.en+en']:.0f} ms, base+auto {total['base+auto']:.0f} ms, "
          f"ratio ×{summary['ratio']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "summary": summary}, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
