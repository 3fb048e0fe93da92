"""Does the ASR's confidence in a whole transcript tell a made-up ending from a real one? (issue 38)

    python lab/scripts/eot_word_confidence.py [--corpus bench-out/eot-corpus] [--evidence bench-out/eot/evidence]

Every English pause of the corpus halves and the human set is transcribed again as `bench eot` collects its
evidence (`eot_evidence.collect_clip`, the server's English ASR; Smart Turn left out: it plays no part here), this
time keeping each word's probability. Each pause is then replayed at the shipped defaults on the cached evidence
(the transcripts must match it), and the table gives, per set, the least, the mean and the last word probability
at the real ends, at the mid-turn pauses the defaults cut (afterthoughts apart) and at those they wait through.
A cue could use the confidence only if the cut pauses' transcripts were less sure than the ends'.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lab.eot_evidence as evidence
from assistant.asr.whisper import FasterWhisperEngine
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, TurnConfig, VADConfig
from lab.eot import AFTERTHOUGHT, VAD_WINDOW_MS, flatten, replay_decision
from lab.eot_evidence import load_cache
from lab.human_set import load_human


class _NoModel:
    """Smart Turn's stand-in: the word probabilities need only the ASR."""

    def probability(self, audio: Any) -> float:
        return 0.5


def transcribe_again(corpus: Path, human: Path) -> dict[tuple[str, str, int], tuple[str, list[Any]]]:
    """(set, file, the pause's place in the clip) → (transcript, its words with probabilities), for every English
    clip."""
    seen: list[list[Any]] = []
    original = evidence.last_word_probability

    def keep(words: Sequence[Any]) -> float | None:  # collect_clip asks it of every transcript it keeps
        seen.append(list(words))
        return original(words)

    evidence.last_word_probability = keep
    asr = FasterWhisperEngine(ASRConfig())  # the server's English ASR, as bench eot collects with it
    clips: list[tuple[str, Path, dict[str, Any]]] = []
    for half in ("tune", "heldout"):
        manifest = json.loads((corpus / half / "manifest.json").read_text(encoding="utf-8"))
        clips += [(half, corpus / half, e) for e in manifest if e.get("lang", "en") == "en"]
    clips += [("human", human, e) for e in load_human(human)]
    out: dict[tuple[str, str, int], tuple[str, list[Any]]] = {}
    try:
        for half, folder, entry in clips:
            seen.clear()
            clip = evidence.collect_clip(folder / entry["file"], {"split": half, **entry}, asr, _NoModel())
            calls = iter(seen)
            for i, p in enumerate(clip.pauses):
                if p.tail:
                    next(calls)  # the turn's own pass, asked before the pass over its lost tail
                out[(half, entry["file"], i)] = (p.text, next(calls))
    finally:
        evidence.last_word_probability = original
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("bench-out/eot-corpus"))
    parser.add_argument("--evidence", type=Path, default=Path("bench-out/eot/evidence"))
    args = parser.parse_args(argv)
    words = transcribe_again(args.corpus, shared_path("audio/human"))
    cfg, fixed = TurnConfig(), VADConfig().end_silence_ms
    groups: dict[tuple[str, str], list[list[float]]] = {}
    unmatched = 0
    for half in ("tune", "heldout", "human"):
        turns = flatten(list(load_cache(args.evidence / f"{half}.jsonl").values()))
        place: dict[int, int] = {}  # flatten keeps each clip's pauses in their order
        for p in turns.pauses:
            clip = turns.clips[p.clip]
            place[p.clip] = i = place.get(p.clip, -1) + 1
            text, ws = words.get((half, clip.file, i), ("", []))
            probs = [prob for w, prob in ws if any(ch.isalnum() for ch in w)]
            if clip.lang != "en" or not probs or text.strip() != p.text.strip():
                unmatched += clip.lang == "en"
                continue
            t, _ = replay_decision(cfg, p, fixed)
            if p.is_end:
                kind = "real ends"
            elif p.silence_ms is not None and t < p.silence_ms + VAD_WINDOW_MS:
                if p.labelled == AFTERTHOUGHT:
                    continue
                kind = "mid-turn pauses cut"
            else:
                kind = "mid-turn pauses waited through"
            groups.setdefault((half, kind), []).append([min(probs), statistics.fmean(probs), probs[-1]])
    print("| set | pauses | n | least word p, p50 | mean word p, p50 | last word p, p50 |")
    print("|---|---|---:|---:|---:|---:|")
    for (half, kind), rows in groups.items():
        cols = [statistics.median(r[i] for r in rows) for i in range(3)]
        print(f"| {half} | {kind} | {len(rows)} | " + " | ".join(f"{c:.2f}" for c in cols) + " |")
    print(f"\n{unmatched} English pauses left out (no word heard, or heard differently from the cached evidence)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
