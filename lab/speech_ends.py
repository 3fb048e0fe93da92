"""``python -m lab speech-ends``: where the server says the speech ended (``SpeechEnd.speech_end``, the turn's
``speech_end`` mark and the clock its held reply counts from) against labelled speech ends.

Each clip is fed to the server's ``Endpointer`` (Silero, the configured ``[vad]``) in 20 ms chunks, as a call
delivers it; its last utterance's end is compared with the clip's label (``labels.json``'s ``speech_end_s``, the
human set's, or a ``manifest.json``'s ``speech_ends_s``). The floor under which a frame is no longer speech is swept
(``--below-peak-db``: how far under the utterance's loudest frame, at most ``AUDIBLE_DBFS``; ``abs``: −45 dBFS
alone, the rule before). An end more than one VAD window before its label is one the client's clock cannot agree
with (``bench v2v`` flags the turn ``client_below_server``). Chosen on the tuning half: the smallest median
distance, then the fewest early ends; reported on the held-out half.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from assistant.audio import SPEECH_RATE, read_audio, resample
from assistant.bench.audio_source import read_manifest
from assistant.bench.report import SPEECH_END_RESOLUTION_MS, percentile
from assistant.config import VADConfig, load_config
from assistant.vad.endpoint import Endpointer, SpeechEnd
from assistant.vad.silero import SileroModel
from lab.human_set import HELD_OUT, held_out, human_dir

log = logging.getLogger(__name__)

CHUNK = SPEECH_RATE // 50  # 20 ms, as the inbound reader delivers


@dataclass(frozen=True)
class Row:
    """One floor on one half: the server's end minus the label, in ms."""

    half: str
    floor: str
    n: int
    p10: float
    p50: float
    p90: float
    lowest: float
    highest: float
    early: int  # more than one VAD window before the label
    late: int  # more than one VAD window after it
    abs_p50: float


def server_end(audio: np.ndarray, below_peak_db: float | None, model: SileroModel, vad: VADConfig) -> float | None:
    """Where the server puts the end of the clip's last utterance (s); None: it heard none."""
    endpointer = Endpointer(vad, model)
    endpointer.below_peak_db = below_peak_db
    last: SpeechEnd | None = None
    for i in range(0, len(audio), CHUNK):
        for ev in endpointer.feed(audio[i : i + CHUNK]):
            if isinstance(ev, SpeechEnd):
                last = ev
    return None if last is None else last.speech_end / SPEECH_RATE


def summarize(half: str, floor: str, errors_ms: list[float]) -> Row:
    e = np.asarray(errors_ms)
    r = SPEECH_END_RESOLUTION_MS
    return Row(half, floor, len(e), round(percentile(errors_ms, 10)), round(percentile(errors_ms, 50)),
               round(percentile(errors_ms, 90)), round(float(e.min())), round(float(e.max())), int((e < -r).sum()),
               int((e > r).sum()), round(percentile([abs(v) for v in errors_ms], 50)))


def sweep(folder: Path, held_out: set[str], floors: list[float | None]) -> list[Row]:
    labels = {name: float(entry["speech_ends_s"]) for name, entry in read_manifest(folder).items()
              if entry.get("speech_ends_s") is not None}
    if not labels:
        raise SystemExit(f"{folder}: no labelled speech ends (labels.json or manifest.json)")
    model, vad = SileroModel.shared(), load_config().vad
    errors: dict[tuple[str, str], list[float]] = {}
    for name, label in sorted(labels.items()):
        audio, rate = read_audio(folder / name)
        audio = resample(audio, rate, SPEECH_RATE) if rate != SPEECH_RATE else audio
        half = "held-out" if name in held_out else "tuning"
        for floor in floors:
            end = server_end(audio, floor, model, vad)
            if end is None:
                log.warning("speech_ends.no_speech file=%s", name)
                continue
            errors.setdefault((half, _name(floor)), []).append((end - label) * 1000)
    order = {_name(f): i for i, f in enumerate(floors)}
    return [summarize(half, floor, errs) for (half, floor), errs in
            sorted(errors.items(), key=lambda kv: (kv[0][0] != "tuning", order[kv[0][1]]))]


def _name(floor: float | None) -> str:
    return "abs" if floor is None else f"{floor:g}"


def choose(rows: list[Row]) -> str:
    """The tuning half's best floor: the smallest median distance, then the fewest early ends."""
    tuning = [r for r in rows if r.half == "tuning"]
    return min(tuning, key=lambda r: (r.abs_p50, r.early)).floor


def markdown(rows: list[Row], chosen: str) -> str:
    w = f"{SPEECH_END_RESOLUTION_MS:g}"
    lines = [f"| half | floor | n | p10 | p50 | p90 | min | max | early > {w} ms | late > {w} ms | median distance |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        floor = ("−45 dBFS" if r.floor == "abs" else f"peak − {r.floor} dB") + (" ←" if r.floor == chosen else "")
        lines.append(f"| {r.half} | {floor} | {r.n} | {r.p10} | {r.p50} | {r.p90} | {r.lowest} | {r.highest} | "
                     f"{r.early} | {r.late} | {r.abs_p50} |")
    return "\n".join(lines) + "\n"


def add_speech_ends_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", type=Path, default=None, help="a folder of clips with labels.json or "
                        "manifest.json (default: the human set, ../shared/audio/human)")
    parser.add_argument("--held-out", type=Path, default=HELD_OUT, help="the held-out clips' names, one a line "
                        "(none found: every clip is tuning)")
    parser.add_argument("--below-peak-db", default="abs,30,35,40,45,50",
                        help="floors to sweep: dB under the utterance's loudest frame, or abs (−45 dBFS alone)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for speech_ends.json")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="also write the table here")


def run_speech_ends(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    floors = [None if v.strip() == "abs" else float(v) for v in args.below_peak_db.split(",") if v.strip()]
    held = held_out(args.held_out) if args.held_out.exists() else set()
    rows = sweep(args.audio or human_dir(), held, floors)
    chosen = choose(rows) if any(r.half == "tuning" for r in rows) else ""
    table = markdown(rows, chosen)
    print(table, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speech_ends.json").write_text(json.dumps({"chosen": chosen, "rows": [asdict(r) for r in rows]},
                                                          indent=1))
    if args.markdown is not None:
        write_markdown(args.markdown, table, origin)
    return 0
