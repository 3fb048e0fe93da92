"""Per-pause evidence for ``python -m lab eot``: the real VAD, Smart Turn and ASR over each corpus clip, cached.

For each clip the real :class:`~assistant.vad.endpoint.Endpointer` (Silero, the server's ``VADConfig``) hears
the file as the server would, with no end silence of its own, so every pause of the turn is seen. At each
pause of at least ``turn.speculative_pause_ms`` (where the server starts a speculative turn):

- the ASR (the server's default, tiny.en) transcribes the audio so far, as the speculative turn's pass does;
- Smart Turn v3.2 hears the audio so far (since the utterance's latest earlier pause, as turn-taking gives it) at
  each of :data:`MODEL_MARKS` ms of silence the pause reaches;
- the pause's length (how much silence the VAD saw before speech came back; the turn's real end has none).

Each inference's compute time is kept with its answer, so a policy replayed on the evidence cannot decide
before the answer it used could have arrived (on this machine, at the time of the run). The cache is keyed by
the file's content hash, its labels (``label_digest``) and :data:`VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from assistant.asr.tail import HeardBefore, join_tail, lost_tail
from assistant.audio import SPEECH_RATE, read_audio
from assistant.config import ASRConfig, TurnConfig, VADConfig
from assistant.pipeline.end_of_turn import last_word_probability, since_pause
from assistant.vad.endpoint import Endpointer
from assistant.vad.silero import WINDOW_SAMPLES

log = logging.getLogger(__name__)

# 2: each pause's last word's probability (the doubtful cue); 3: a turn's pass that lost the words after an earlier
# pause has them heard by a pass over the tail, as the pipeline does (asr/tail.py); 4: Smart Turn hears the speech
# since the utterance's latest earlier pause (turn.end_of_turn_since_pause)
VERSION = 4
# Silences (ms) at which the model hears a pause: the speculative pause, then every few Silero windows.
MODEL_MARKS = (96, 192, 320, 480, 704, 1024, 1504)
END_TOLERANCE_S = 0.3  # a pause starting this close before the labelled speech end is the turn's end
NO_VAD_END_SILENCE_MS = 60_000  # the endpointer hears the whole clip as one utterance


class Transcriber(Protocol):
    def transcribe(self, audio: np.ndarray, *, prompt: str | None = None) -> Any: ...


class TurnModel(Protocol):
    def probability(self, audio: np.ndarray) -> float: ...


@dataclass
class PauseEvidence:
    start_s: float  # where the VAD's silence started (stream seconds)
    is_end: bool  # the turn's real end (else a mid-turn pause)
    silence_ms: int | None  # the silence the VAD saw before speech came back (None: the end)
    labelled: str | None  # the corpus's pause kind when this pause is one written in
    text: str = ""
    asr_ms: float = 0.0
    probs: list[list[float]] = field(default_factory=list)  # [mark_ms, probability, compute_ms]
    last_p: float | None = None  # the ASR's probability of the transcript's last word (None: not known)
    tail: bool = False  # the text is an earlier pause's and a pass over the tail after it (asr/tail.py)
    untailed: str = ""  # ... and what the turn's own pass heard instead (the text without the tail's pass)
    untailed_last_p: float | None = None


@dataclass
class ClipEvidence:
    file: str
    split: str
    engine: str
    voice: str
    lang: str
    kind: str
    speech_ends_s: float
    status: str  # ok, no_speech, missed_end
    pauses: list[PauseEvidence]
    phone: bool = False
    sha: str = ""
    version: int = VERSION
    asr: str = ""  # the ASR that made the transcripts (its model and language)
    labels: str = ""  # label_digest() of the manifest entry it was collected with

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ClipEvidence:
        d = dict(d)
        d["pauses"] = [PauseEvidence(**p) for p in d["pauses"]]
        return ClipEvidence(**d)


def vad_pauses(x: np.ndarray, vad: VADConfig, spec_ms: int) -> tuple[list[tuple[int, int, int | None]], bool]:
    """The pauses the endpointer hears in ``x``: (silence start sample, utterance audio start, silence samples
    before speech came back or None when it never did), and whether speech was heard at all."""
    cfg = VADConfig(**{**asdict(vad), "end_silence_ms": NO_VAD_END_SILENCE_MS})
    ep = Endpointer(cfg)
    spec = spec_ms * SPEECH_RATE // 1000
    out: list[tuple[int, int, int | None]] = []
    current: list[Any] | None = None
    heard = False
    for i in range(0, len(x) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES):
        ep.feed(x[i : i + WINDOW_SAMPLES])
        heard = heard or ep.speaking
        sil = ep.silence_samples
        if current is not None and (sil == 0 or not ep.speaking):
            current[2] = current[3]  # speech came back: the silence it had reached
            out.append((current[0], current[1], current[2]))
            current = None
        if sil >= spec and current is None:
            utt = ep.utterance()
            audio_start = ep.samples_fed - (0 if utt is None else len(utt))
            current = [ep.utterance_end, audio_start, None, sil]
        elif current is not None:
            current[3] = sil
    if current is not None:
        out.append((current[0], current[1], None))
    return out, heard


def collect_clip(
    path: Path,
    entry: dict[str, Any],
    asr: Transcriber,
    model: TurnModel,
    vad: VADConfig | None = None,
    turn: TurnConfig | None = None,
) -> ClipEvidence:
    """The evidence at every pause of one clip."""
    vad, turn = vad or VADConfig(), turn or TurnConfig()
    raw = path.read_bytes()
    x, sr = read_audio(path)
    if sr != SPEECH_RATE:
        raise ValueError(f"{path.name}: {sr} Hz, the corpus is 16 kHz")
    found, heard = vad_pauses(x, vad, turn.speculative_pause_ms)
    end_s = float(entry["speech_ends_s"])
    labels = list(zip(entry.get("pauses_s", []), entry.get("pause_kinds", []), strict=False))
    ev = ClipEvidence(
        file=entry["file"], split=entry.get("split", ""), engine=entry.get("engine", ""), voice=entry.get("voice", ""),
        lang=entry.get("lang", "en"), kind=entry.get("kind", ""), speech_ends_s=end_s, status="ok", pauses=[],
        phone=bool(entry.get("variation", {}).get("phone", False)), sha=hashlib.sha256(raw).hexdigest()[:16],
        labels=label_digest(entry),
    )
    if not heard:
        ev.status = "no_speech"
        return ev
    spec = turn.speculative_pause_ms * SPEECH_RATE // 1000
    # The latest earlier pause of the utterance whose pass landed before the speech came back, as turn-taking keeps
    # it: (utterance audio start, its transcript, the samples it covered, where the speech came back).
    before: tuple[int, Any, int, int] | None = None
    for start, audio_start, silence in found:
        start_s = start / SPEECH_RATE
        is_end = start_s >= end_s - END_TOLERANCE_S
        if is_end and any(p.is_end for p in ev.pauses):
            continue  # noise the VAD took for speech after the real end: the turn was over already
        labelled = next((k for (a, b), k in labels if a - 0.15 <= start_s <= b), None)
        pe = PauseEvidence(start_s=round(start_s, 3), is_end=is_end,
                           silence_ms=None if is_end or silence is None else silence * 1000 // SPEECH_RATE,
                           labelled=labelled)
        spec_audio = x[audio_start : start + spec]
        t0 = time.perf_counter()
        said_here: Any = asr.transcribe(spec_audio)
        if before is not None and before[0] != audio_start:
            before = None  # another utterance
        if before is not None:
            _, said, covered, resumed = before
            known = HeardBefore(said, covered, tail_speech_ms=max(0, start - resumed) * 1000 // SPEECH_RATE)
            if known.tail_worth_a_pass() and lost_tail(str(said_here.text), said.text):
                joined = join_tail(said, asr.transcribe(spec_audio[covered:], prompt=said.text.strip()))
                if joined is not said:
                    pe.untailed = str(said_here.text).strip()
                    pe.untailed_last_p = last_word_probability(getattr(said_here, "words", ()))
                    pe.tail, said_here = True, joined
        pe.text = str(said_here.text).strip()
        pe.last_p = last_word_probability(getattr(said_here, "words", ()))
        pe.asr_ms = round((time.perf_counter() - t0) * 1000, 1)
        # The user spoke on after this pause, and its pass had landed by then: what it heard is kept.
        if (not is_end and silence is not None and pe.text
                and silence * 1000 // SPEECH_RATE >= turn.speculative_pause_ms + pe.asr_ms):
            before = (audio_start, said_here, len(spec_audio), start + silence)
        limit_ms = turn.max_silence_ms if pe.silence_ms is None else pe.silence_ms
        # What the model hears, as turn-taking gives it (turn.end_of_turn_since_pause): the speech since the
        # utterance's latest earlier pause.
        came_back = max((s + sil for s, a, sil in found if a == audio_start and s < start and sil is not None),
                        default=None) if turn.end_of_turn_since_pause else None
        for mark in MODEL_MARKS:
            if mark > limit_ms:
                break
            t0 = time.perf_counter()
            so_far = x[audio_start : start + mark * SPEECH_RATE // 1000]
            p = model.probability(since_pause(so_far, None if came_back is None else came_back - audio_start))
            pe.probs.append([mark, round(float(p), 4), round((time.perf_counter() - t0) * 1000, 1)])
        ev.pauses.append(pe)
    if not any(p.is_end for p in ev.pauses):
        ev.status = "missed_end"
    return ev


DEFAULT_MIN_WINDOW_S = ASRConfig().min_window_s  # evidence named without a window suffix was collected with it


def asr_name(engine: Any, lang: str) -> str:
    """Which ASR made a transcript: the model folder's name, the language it was told, whether it decoded with
    timestamps, and its smallest fitted window when not the default (``+window10``; so the name of evidence
    collected with the default window is what it always was)."""
    path = getattr(engine, "model_path", None)
    cfg = getattr(engine, "cfg", None)
    stamps = "+timestamps" if getattr(cfg, "window_timestamps", False) else ""
    window = getattr(cfg, "min_window_s", DEFAULT_MIN_WINDOW_S)
    if getattr(cfg, "fit_window", False) and window != DEFAULT_MIN_WINDOW_S:
        stamps += f"+window{window}"
    return f"{Path(path).name if path else type(engine).__name__}:{getattr(cfg, 'language', lang)}{stamps}"


def label_digest(entry: dict[str, Any]) -> str:
    """What of a manifest entry the evidence depends on besides the audio (which pauses are ends, which are
    labelled): the same audio relabelled is evidence to collect again."""
    labels = {k: entry.get(k) for k in ("speech_ends_s", "pauses_s", "pause_kinds")}
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def load_cache(path: Path) -> dict[str, ClipEvidence]:
    out: dict[str, ClipEvidence] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                ce = ClipEvidence.from_dict(json.loads(line))
                if ce.version == VERSION:
                    out[ce.file] = ce
    return out


def collect_files(files: list[Path], cache: Path, asr: Transcriber | dict[str, Transcriber],
                  model: TurnModel) -> list[ClipEvidence]:
    """Evidence for speech files outside the corpus (``../shared/audio``, the pause files): each file's labels
    come from ``manifest.json`` beside it (``speech_ends_s``, and its pauses when given)."""
    out: list[ClipEvidence] = []
    for folder in sorted({f.parent for f in files}):
        entries = {e["file"]: e for e in json.loads((folder / "manifest.json").read_text(encoding="utf-8"))}
        names = {f.name for f in files if f.parent == folder}
        missing = names - set(entries)
        if missing:
            raise ValueError(f"not in {folder}/manifest.json: {sorted(missing)}")
        out += collect(folder.parent, folder.name, cache, asr, model, only=names)
    return out


def collect(
    corpus: Path,
    half: str,
    cache: Path,
    asr: Transcriber | dict[str, Transcriber],
    model: TurnModel,
    limit: int | None = None,
    only: set[str] | None = None,
) -> list[ClipEvidence]:
    """Evidence for every clip of one half (``corpus/half/manifest.json``; ``only``: these files), reusing the
    cache (appended to as each clip is done, so an interrupted run loses nothing)."""
    manifest = json.loads((corpus / half / "manifest.json").read_text(encoding="utf-8"))
    if only is not None:
        manifest = [e for e in manifest if e["file"] in only]
    return collect_entries(corpus / half, half, manifest[:limit], cache, asr, model)


def collect_entries(
    folder: Path,
    half: str,
    manifest: list[dict[str, Any]],
    cache: Path,
    asr: Transcriber | dict[str, Transcriber],
    model: TurnModel,
) -> list[ClipEvidence]:
    """Evidence for the clips of ``manifest`` (entries of files in ``folder``; the human set's come from
    ``human_set.load_human``), reusing and appending to the cache as :func:`collect` does."""
    have = load_cache(cache)
    out: list[ClipEvidence] = []
    cache.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with cache.open("a", encoding="utf-8") as f:
        for i, entry in enumerate(manifest):
            path = folder / entry["file"]
            sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            entry = {"split": half, **entry}
            lang = entry.get("lang", "en")
            # One ASR per language (the server's default for English; asr.language = ja takes the multilingual one).
            engine = asr.get(lang) or asr["en"] if isinstance(asr, dict) else asr
            name = asr_name(engine, lang)
            ce = have.get(entry["file"])
            if ce is None or ce.sha != sha or ce.labels != label_digest(entry) or (ce.asr and ce.asr != name):
                ce = collect_clip(path, entry, engine, model)
                ce.asr = name
                f.write(json.dumps(asdict(ce), ensure_ascii=False) + "\n")
                f.flush()
                if (i + 1) % 20 == 0:
                    log.warning("eot.evidence half=%s clips=%d/%d s=%.0f", half, i + 1, len(manifest),
                                time.perf_counter() - t0)
            out.append(ce)
    return out
