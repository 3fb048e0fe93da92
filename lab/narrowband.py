"""``python -m lab narrowband``: what a phone line costs the ASR, as word error on the test speech.

Each English file of ``../shared/audio`` is transcribed twice by the configured ASR (``--asr.*`` flags, default
faster-whisper ``tiny.en``): as recorded (16 kHz), and after the round trip a phone call puts it through: down to
8 kHz (soxr, anti-aliased), μ-law coded and decoded, and up to 16 kHz by the server's own inbound path for calls
(``server/telephony/caller.CallerAudio``, the resampler the call's VAD and ASR hear through). The word error rate
(substitutions + deletions + insertions over the reference's words, after lower-casing and dropping punctuation)
is against the manifest's text. Beside it, the end-of-turn model (Smart Turn v3.2, also trained on 16 kHz speech)
is asked the same way whether the turn is complete, 300 ms after the manifest's speech end (it should say yes)
and, for a file with a mid-sentence pause, 300 ms into that pause (it should say no).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path

import numpy as np

from assistant.audio import SPEECH_RATE, read_audio, resample
from assistant.bench.audio_source import read_manifest
from assistant.bench.shared_data import SHARED_AUDIO
from assistant.bench.telephony_client import FRAME, phone_audio
from assistant.config import add_config_flags, flag_overrides, load_config

WORD = re.compile(r"[a-z0-9']+")
EOT_AFTER_S = 0.3  # the model is asked this long into a pause, as turn-taking asks it (about)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower().replace("’", "'"))


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, words in the reference)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)


def word_error_rate(reference: str, hypothesis: str) -> float:
    errors, n = word_errors(reference, hypothesis)
    return errors / max(1, n)


def phone_line(x: np.ndarray, rate: int) -> np.ndarray:
    """``x`` as a call's ASR hears it: 8 kHz μ-law, then the server's inbound resampler back to 16 kHz."""
    from assistant.server.telephony.caller import CallerAudio

    data = phone_audio(x, rate)
    caller = CallerAudio(max_payload_bytes=FRAME, clock=float("-inf"))
    parts = []
    for at in range(0, len(data), FRAME):
        chunk = caller.push(data[at : at + FRAME], 0.0)
        if chunk is not None:
            parts.append(chunk.samples)
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def add_narrowband_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="WAV",
                        help=f"speech files with a manifest beside them (default: {SHARED_AUDIO}/en_*.wav)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for narrowband.json")
    parser.add_argument("--config", default=None, help="config file (default: configs/default.toml)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as Markdown to FILE under a line naming this command, the commit "
                        "and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    add_config_flags(parser, sections=("asr",))


async def run_narrowband(args: argparse.Namespace) -> int:
    from assistant.asr import create_asr
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    cfg = load_config(args.config, overrides=flag_overrides(args))
    files = [Path(f) for f in (args.audio or sorted(SHARED_AUDIO.glob("en_*.wav")))]
    from assistant.vad.end_of_turn import SmartTurnModel

    asr = create_asr(cfg.asr)
    await asyncio.to_thread(asr.warmup)
    eot = SmartTurnModel()
    rows = []
    totals = {"wide": [0, 0], "phone": [0, 0]}
    for path in files:
        entry = read_manifest(path.parent).get(path.name)
        if entry is None or not entry.get("text"):
            print(f"{path.name}: no text in the manifest, skipped")
            continue
        x, rate = read_audio(path)
        row: dict[str, object] = {"file": path.name, "reference": entry["text"]}
        end = int((float(entry["speech_ends_s"]) + EOT_AFTER_S) * SPEECH_RATE)
        pause = entry.get("pause_s")
        for name, audio in (("wide", resample(x, rate, SPEECH_RATE)), ("phone", phone_line(x, rate))):
            t0 = time.perf_counter()
            text = (await asyncio.to_thread(asr.transcribe, audio)).text.strip()
            errors, n = word_errors(str(entry["text"]), text)
            totals[name][0] += errors
            totals[name][1] += n
            row[name] = {"text": text, "errors": errors, "words": n, "wer": round(errors / max(1, n), 3),
                         "seconds": round(time.perf_counter() - t0, 2),
                         "eot_at_end": round(eot.probability(audio[:end]), 3)}
            if isinstance(pause, list) and pause:
                mid = int((float(pause[0]) + EOT_AFTER_S) * SPEECH_RATE)
                row[name]["eot_mid_pause"] = round(eot.probability(audio[:mid]), 3)  # type: ignore[index]
        rows.append(row)
    print(f"ASR {cfg.asr.engine} {cfg.asr.model} ({cfg.asr.compute_type}, beam {cfg.asr.beam_size}): word error "
          "against the manifest, 16 kHz as recorded vs a phone line (8 kHz μ-law, the server's resampler)")
    print(f"{'file':28s} {'words':>5s} {'WER 16k':>8s} {'phone':>8s}   {'P(done) at the end 16k':>22s} {'phone':>6s}")
    for row in rows:
        wide, phone = row["wide"], row["phone"]
        assert isinstance(wide, dict) and isinstance(phone, dict)
        print(f"{row['file']!s:28s} {wide['words']:5d} {wide['wer']:8.3f} {phone['wer']:8.3f}   "
              f"{wide['eot_at_end']:22.3f} {phone['eot_at_end']:6.3f}")
        if "eot_mid_pause" in wide:
            print(f"    P(done) 300 ms into the mid-sentence pause: 16 kHz {wide['eot_mid_pause']:.3f}, "
                  f"phone {phone['eot_mid_pause']:.3f}")
        if wide["text"] != phone["text"]:
            print(f"    16 kHz: {wide['text']!r}\n    phone:  {phone['text']!r}")
    wide_wer = totals["wide"][0] / max(1, totals["wide"][1])
    phone_wer = totals["phone"][0] / max(1, totals["phone"][1])
    print(f"{'all':28s} {totals['wide'][1]:5d} {wide_wer:8.3f} {phone_wer:8.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "narrowband.json").write_text(json.dumps({"asr": {"engine": cfg.asr.engine, "model": cfg.asr.model},
                                                     "rows": rows, "wer": {"wide": wide_wer, "phone": phone_wer}},
                                                    indent=1, ensure_ascii=False))
    print(f"\nwrote {out / 'narrowband.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, narrowband_markdown(rows, wide_wer, phone_wer, totals["wide"][1]), origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0


def narrowband_markdown(rows: list[dict[str, object]], wide_wer: float, phone_wer: float, words_total: int) -> str:
    lines = ["| file | words | WER 16 kHz | WER phone | P(done) at the end, 16 kHz | phone |",
             "|---|---:|---:|---:|---:|---:|"]
    notes = []
    for row in rows:
        wide, phone = row["wide"], row["phone"]
        assert isinstance(wide, dict) and isinstance(phone, dict)
        lines.append(f"| {row['file']} | {wide['words']} | {wide['wer']:.3f} | {phone['wer']:.3f} | "
                     f"{wide['eot_at_end']:.3f} | {phone['eot_at_end']:.3f} |")
        if "eot_mid_pause" in wide:
            notes.append(f"{row['file']}, 300 ms into its mid-sentence pause: P(done) {wide['eot_mid_pause']:.3f} at "
                         f"16 kHz, {phone['eot_mid_pause']:.3f} on the phone line.")
    lines.append(f"| all | {words_total} | {wide_wer:.3f} | {phone_wer:.3f} | | |")
    return "\n".join(lines + (["", *notes] if notes else []))
