"""Make the English speech the package ships for ``assistant bench v2v`` (``assistant/bench/data/``): five clips of
the human set (``../shared/audio/human``, Picovoice's recordings, Apache-2.0), re-encoded as Ogg Opus, with a
manifest of their labelled speech starts and ends.

Why these five: a clip whose end two reasonable rules place differently makes every figure from it ambiguous by that
much, so the five come from the clips whose labelled end agrees with both Silero VAD's last speech window (within
50 ms: 112 of the 120) and our endpointer's, the last 10 ms frame above −45 dBFS (within 20 ms: 64 of those; on a
quietly spoken ending that absolute floor puts the end up to 100 ms before the label). Among those they vary what a
turn's end depends on: a short order (1.8 s of speech), a long one in a noisy room (4.7 s, noise floor −70 dBFS),
another room noisier still (−67 dBFS), one with a pause inside the sentence and one with two. Each was also played
to our server live, twice: its speech-end mark fell within the uplink of the label on every turn (54e3ae14, the
first choice for one pause, had it 65-80 ms early both times, past what the bench calls a late mark, and was
replaced).

Each clip is written by libsndfile (soundfile) as Opus in Ogg at about 55 kbit/s: libsndfile and FFmpeg (PyAV)
decode what libsndfile wrote to the same sample (an FFmpeg-written file, by contrast, decodes 6.5 ms late through
libsndfile, which then skips no pre-skip), so the labelled speech end holds whichever decoder reads it. The script
checks that: every decoded clip lines up with its original to the sample, and Silero's last speech window on the
decoded audio is the one it finds on the original (at about 32 kbit/s one clip's moved 64 ms earlier: the codec
had thinned its quiet last syllable), within 50 ms of the label.

Run again to rebuild: ``python lab/scripts/make_bench_speech.py`` (needs the shared data).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from assistant.audio import _read_with_av, read_audio, resample  # noqa: E402
from assistant.bench.audio_source import read_labels  # noqa: E402
from assistant.bench.shared_data import shared_path  # noqa: E402
from assistant.vad.endpoint import Endpointer, SpeechEnd  # noqa: E402
from assistant.vad.silero import WINDOW_SAMPLES, SileroStream  # noqa: E402

HUMAN = shared_path("audio/human")
OUT = ROOT / "assistant" / "bench" / "data"
# (original file, why it is here)
CLIPS = (
    ("d06e5a5b.flac", "short: 1.8 s of speech"),
    ("a2e8d91c.flac", "a noisy room: noise floor -67 dBFS"),
    ("bca7e170.flac", "long: 4.7 s of speech, noise floor -70 dBFS"),
    ("e12e9e60.flac", "one pause inside the sentence (0.25 s)"),
    ("f141586d.flac", "two pauses inside the sentence (0.28 s, 0.26 s)"),
)
OPUS_LEVEL = 0.8  # libsndfile's compression level for Opus: 40-60 kbit/s on these clips (0.85: ~32, too thin)
SILERO_AGREES_S = 0.05
ENDPOINTER_AGREES_S = 0.02
ALIGN_SEARCH = 400  # samples either way the decoded clip is searched for its original


def silero_end(x: np.ndarray, rate: int) -> float:
    """The end of Silero's last window at or above 0.5 (seconds)."""
    stream = SileroStream()
    probs = [stream.prob(x[i : i + WINDOW_SAMPLES]) for i in range(0, len(x) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES)]
    speech = [i for i, p in enumerate(probs) if p >= 0.5]
    return (speech[-1] + 1) * WINDOW_SAMPLES / rate if speech else 0.0


def endpointer_end(x: np.ndarray, rate: int) -> float:
    """Where our server's endpointer puts the end of the last utterance (seconds)."""
    endpointer = Endpointer()
    ends = [e for e in endpointer.feed(x) + endpointer.finish() if isinstance(e, SpeechEnd)]
    return ends[-1].speech_end / rate if ends else 0.0


def lag(original: np.ndarray, decoded: np.ndarray) -> int:
    """How many samples ``decoded`` runs behind ``original`` (cross-correlation peak)."""
    n = min(len(original), len(decoded))
    core = original[ALIGN_SEARCH : n - ALIGN_SEARCH]
    corr = np.correlate(decoded[:n], core, "valid")
    return int(np.argmax(corr)) - ALIGN_SEARCH


def main() -> int:
    labels = {row["file"]: row for row in read_labels(HUMAN)}
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = []
    total = 0
    for name, why in CLIPS:
        x, rate = read_audio(HUMAN / name)
        buf = io.BytesIO()
        sf.write(buf, x, rate, format="OGG", subtype="OPUS", compression_level=OPUS_LEVEL)
        data = buf.getvalue()
        row = labels[name]
        for decoder in ("soundfile", "pyav"):
            y, r = read_audio(data) if decoder == "soundfile" else _read_with_av(io.BytesIO(data))
            y = resample(y, r, rate)
            if (off := lag(x, y)) != 0:
                raise SystemExit(f"{name}: {decoder} decodes {off} samples off the original")
            end = silero_end(y, rate)
            if end != silero_end(x, rate) or abs(end - row["speech_ends_s"]) > SILERO_AGREES_S:
                raise SystemExit(f"{name}: Silero's end moved through the codec ({decoder}): {end} s")
            if abs(endpointer_end(y, rate) - row["speech_ends_s"]) > ENDPOINTER_AGREES_S:
                raise SystemExit(f"{name}: the endpointer's end is off the label ({decoder})")
        out = f"en_coffee_{Path(name).stem}.opus"
        (OUT / out).write_bytes(data)
        total += len(data)
        manifest.append({
            "file": out, "source": name, "why": why, "lang": "en", "engine": "human", "voice": "human",
            "kind": row["kind"], "seconds": round(len(x) / rate, 3), "speech_starts_s": row["speech_starts_s"],
            "speech_ends_s": row["speech_ends_s"], "pause_lengths_s": row["pause_lengths_s"],
            "intent": row["intent"], "slots": row["slots"], "text": "",
        })
        print(f"{out}: {len(data) / 1024:.1f} KiB, {row['kind']}, speech ends at {row['speech_ends_s']} s")
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(manifest)} clips, {total / 1024:.0f} KiB of audio in {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
