"""``python -m lab hearing``: does the ASR hear the human set's words, and in the right language?

Each clip of the human set (``lab/human_set.py``; a tuning set) is heard as the voice chat hears it:
the real :class:`~assistant.vad.endpoint.Endpointer` finds every pause of at least ``turn.speculative_pause_ms``
(``eot_evidence.vad_pauses``), and at each one the audio so far (from the VAD's pad before the speech to the
speculative pause) is transcribed, as the speculative pass does. Two engines hear every pass: ``tiny.en`` with
``asr.language = en`` (the CPU default) and the multilingual ``base`` with ``auto`` (detection in every pass).

- **Slots**: on the pass at the turn's end (the pause that starts within ``END_TOLERANCE_S`` of the labelled
  end), how often each slot's words appear in the transcript, per slot type and overall. Both sides are
  normalised by :func:`normalise`: lower case; every character but letters and digits is a space (so
  punctuation, hyphens and apostrophes go: "12-ounce" → "12 ounce", "don't" → "don t"); digits glued to letters
  are split ("8oz" → "8 oz"); a number is written in words ("16" → "sixteen"); "oz" and "ounces" are "ounce",
  "shots" is "shot". A slot is heard when its words appear in that order, next to each other.
- **Language**: what ``base`` + ``auto`` detected at every pass (the turn's end and the mid-turn pauses apart),
  with its probability; and the same for the synthetic English clips beside it (``../shared/audio`` and the
  pause files), where detection is checked, not chosen.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from assistant.audio import SPEECH_RATE, read_audio
from assistant.bench.figures import markdown_table, provenance, write_markdown
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, TurnConfig, VADConfig
from lab.eot_evidence import END_TOLERANCE_S, vad_pauses
from lab.human_set import TUNING_NOTE, human_dir, load_human

# label → the ASR settings of that engine (asr.model = auto picks tiny.en for en, the multilingual base for auto)
ENGINES: dict[str, dict[str, Any]] = {"tiny.en+en": {"language": "en"}, "base+auto": {"language": "auto"}}
# --with-timestamps adds these: the same engines decoding the fitted window with Whisper's timestamps
STAMPED: dict[str, dict[str, Any]] = {f"{label}, timestamps": {**kw, "window_timestamps": True}
                                      for label, kw in ENGINES.items()}
DETECTING = "base+auto"
SYNTHETIC = ("audio", "../tests/data/pauses")  # English clips with a manifest.json: shared/audio, the pause files
TREE = Path(__file__).resolve().parents[1]

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SAME = {"oz": "ounce", "ounces": "ounce", "shots": "shot"}


def number_words(n: int) -> str:
    """0–999 in words ("sixteen", "twenty four", "one hundred twenty"); larger numbers stay digits."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    return str(n)


def normalise(text: str) -> list[str]:
    """The words of ``text`` as slots are matched (module docstring)."""
    t = re.sub(r"(\d)([a-z])", r"\1 \2", text.lower())
    t = re.sub(r"[^a-z0-9]+", " ", t)
    words: list[str] = []
    for w in t.split():
        words += number_words(int(w)).split() if w.isdigit() else [_SAME.get(w, w)]
    return words


def heard(slot: str, transcript: str) -> bool:
    """Whether the slot's words appear, in order and next to each other, in the transcript (both normalised)."""
    want, got = normalise(slot), normalise(transcript)
    return bool(want) and any(got[i : i + len(want)] == want for i in range(len(got) - len(want) + 1))


@dataclass
class Pass:
    at_s: float  # where the VAD's silence started
    is_end: bool
    audio_s: float
    text: dict[str, str] = field(default_factory=dict)  # engine label → transcript
    language: str = ""  # base+auto's
    p: float = 0.0


@dataclass
class Clip:
    set: str
    file: str
    slots: dict[str, str]
    passes: list[Pass]
    text: str = ""  # the whole text, where it is known (the synthetic clips)


def passes_of(x: np.ndarray, end_s: float, engines: dict[str, Any], spec_ms: int) -> list[Pass]:
    """Every speculative pass the voice chat would make on the clip, heard by each engine (module docstring)."""
    found, _ = vad_pauses(x, VADConfig(), spec_ms)
    spec = spec_ms * SPEECH_RATE // 1000
    out: list[Pass] = []
    for start, audio_start, _ in found:
        is_end = start / SPEECH_RATE >= end_s - END_TOLERANCE_S
        if is_end and any(p.is_end for p in out):
            break  # noise after the end: the turn was over
        audio = x[audio_start : start + spec]
        p = Pass(round(start / SPEECH_RATE, 3), is_end, round(len(audio) / SPEECH_RATE, 2))
        for label, engine in engines.items():
            t = engine.transcribe(audio)
            p.text[label] = t.text
            if label == DETECTING:
                p.language, p.p = t.language, round(float(t.language_probability), 4)
        out.append(p)
    return out


def hear_set(name: str, folder: Path, entries: list[dict[str, Any]], engines: dict[str, Any]) -> list[Clip]:
    spec_ms = TurnConfig().speculative_pause_ms
    clips = []
    for i, e in enumerate(entries):
        x, rate = read_audio(folder / e["file"])
        if rate != SPEECH_RATE:
            raise ValueError(f"{e['file']}: {rate} Hz, not {SPEECH_RATE}")
        clip = Clip(name, e["file"], e.get("slots", {}), passes_of(x, float(e["speech_ends_s"]), engines, spec_ms),
                    e.get("text", "") if name != "human" else "")
        clips.append(clip)
        end = next((p for p in clip.passes if p.is_end), None)
        print(f"{name:9s} {i + 1:3d}/{len(entries)} {e['file']:26s} passes={len(clip.passes)} "
              f"lang={end.language if end else '-'} p={end.p if end else 0:.2f} "
              f"tiny.en: {end.text.get('tiny.en+en', '') if end else '(no end heard)'!r}", flush=True)
    return clips


def slot_table(clips: list[Clip], labels: list[str]) -> str:
    """Per slot type and overall: how many slots, and the share each engine heard at the turn's end."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for c in clips:
        end = next((p for p in c.passes if p.is_end), None)
        said = {label: end.text.get(label, "") if end is not None else "" for label in labels}  # none: not heard
        for kind, words in c.slots.items():
            for key in (kind, "all slots"):
                counts[key]["slots"] += 1
                for label in labels:
                    counts[key][label] += heard(words, said[label])
        whole = {label: all(heard(w, said[label]) for w in c.slots.values()) for label in labels}
        counts["whole order (every slot)"]["slots"] += 1
        for label in labels:
            counts["whole order (every slot)"][label] += whole[label]
    order = sorted(k for k in counts if k not in ("all slots", "whole order (every slot)"))
    rows = []
    for key in [*order, "all slots", "whole order (every slot)"]:
        n = counts[key]["slots"]
        rows.append({"slot type": key, "slots": n,
                     **{f"heard by {label}": f"{counts[key][label]} ({100 * counts[key][label] / n:.1f} %)"
                        for label in labels}})
    return markdown_table(rows)


def words_table(clips: list[Clip], labels: list[str]) -> str:
    """The synthetic clips (whose whole text is known): per engine, the share of the text's words its transcript
    at the turn's end holds (each word at most as often as it is said), and the clips heard whole."""
    rows = []
    for label in labels:
        said = total = whole = 0
        for c in clips:
            end = next((p for p in c.passes if p.is_end), None)
            want = Counter(normalise(c.text))
            got = Counter(normalise(end.text.get(label, "") if end is not None else ""))
            hit = sum(min(n, got[w]) for w, n in want.items())
            said, total, whole = said + hit, total + sum(want.values()), whole + (hit == sum(want.values()))
        rows.append({"engine": label, "clips": len(clips),
                     "words heard": f"{said} of {total} ({100 * said / max(total, 1):.1f} %)",
                     "clips heard whole": f"{whole} ({100 * whole / max(len(clips), 1):.0f} %)"})
    return markdown_table(rows)


def language_table(clips: list[Clip], sure: float) -> str:
    """base+auto's detected languages: per set and pass kind, each language's count and probabilities."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for c in clips:
        for p in c.passes:
            groups[(c.set, "turn end" if p.is_end else "mid-turn pause", p.language)].append(p.p)
    rows = []
    for (name, kind, lang), ps in sorted(groups.items()):
        rows.append({"set": name, "pass": kind, "language": lang, "passes": len(ps),
                     f"unsure (p < {sure}: the first of asr.languages)": sum(p < sure for p in ps),
                     "p min": round(min(ps), 3), "p p50": round(statistics.median(ps), 3)})
    return markdown_table(rows)


def synthetic_english() -> list[tuple[Path, list[dict[str, Any]]]]:
    out = []
    for rel in SYNTHETIC:
        folder = (shared_path(rel) if not rel.startswith("..") else TREE / rel[3:]).resolve()
        if (folder / "manifest.json").is_file():
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
            out.append((folder, [e for e in manifest if e.get("lang", "en") == "en"]))
    return out


def add_hearing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=None, help="only the first N clips of the human set")
    parser.add_argument("--no-synthetic", action="store_true",
                        help="skip the synthetic English clips (../shared/audio, tests/data/pauses)")
    parser.add_argument("--with-timestamps", action="store_true",
                        help="hear with each engine decoding with Whisper's timestamps too (asr.window_timestamps)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/hearing"), help="output folder")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables to FILE under a line naming this command, the git commit and "
                        "the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")


def run_hearing(args: argparse.Namespace) -> int:
    from assistant.asr.whisper import FasterWhisperEngine

    origin = provenance()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = {**ENGINES, **(STAMPED if args.with_timestamps else {})}
    engines = {label: FasterWhisperEngine(ASRConfig(model="auto", **kw)) for label, kw in wanted.items()}
    labels = list(engines)
    for engine in engines.values():
        engine.warmup()
    sure = engines[DETECTING].cfg.language_sure
    entries = load_human()[: args.limit]
    clips = hear_set("human", human_dir(), entries, engines)
    if not args.no_synthetic:
        for folder, manifest in synthetic_english():
            clips += hear_set("synthetic en", folder, manifest, engines)
    human = [c for c in clips if c.set == "human"]
    slots, langs = slot_table(human, labels), language_table(clips, sure)
    synthetic = [c for c in clips if c.set != "human"]
    missed = sum(not any(p.is_end for p in c.passes) for c in clips)
    note = (f"{len(human)} clips of the human set ({TUNING_NOTE}); every pass the voice chat would make (the VAD's "
            f"pauses of at least {TurnConfig().speculative_pause_ms} ms), {sum(len(c.passes) for c in clips)} in "
            f"all over {len(clips)} clips ({missed} with no pass at the labelled end).")
    body = (f"{note}\n\nSlots heard at the turn's end (words normalised: `lab/hearing.py`):\n\n{slots}\n\n"
            f"Language detected by base + auto (asr.languages {', '.join(engines[DETECTING].languages)}; "
            f"asr.language_sure {sure}):\n\n{langs}")
    if synthetic:
        words = words_table(synthetic, labels)
        body += (f"\n\nWords of the synthetic English clips' texts heard at the turn's end ({len(synthetic)} clips: "
                 f"../shared/audio and the pause files, whose pauses are written in):\n\n{words}")
    print(f"\n{body}")
    (out / "hearing.json").write_text(json.dumps([asdict(c) for c in clips], ensure_ascii=False, indent=1),
                                      encoding="utf-8")
    print(f"\nwrote {out / 'hearing.json'}")
    if args.markdown is not None:
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    return 0
