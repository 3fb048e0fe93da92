"""Who the embedded model plays: its system prompt, the example turns that show a small model its role, and its
sampling settings. They are the embedded engine's own defaults (:func:`embedded`): ``respond.system_prompt``,
``respond.temperature`` and ``respond.max_tokens`` left unset mean these where the embedded model answers, and
other engines' own conventions elsewhere (an ``openai`` server gets no token cap and no temperature unless set,
and is not told it cannot do what a client's tools do).

SmolLM2-135M follows a one-line system prompt loosely: it swaps roles with the user ("Could you please call your
mother?"), apologises for misunderstandings nobody had, and writes Markdown lists. A few example turns before the
history show it the shape of a reply: the assistant answers, in a sentence or two of plain speech, and says plainly
what it cannot do (a real timer, a message, music) instead of pretending or handing the request back. They were
chosen, with the prompt, the temperature and the reply's length bound, on the tuning half of ``assistant bench
replies`` (``lab/data/replies_tuning.json``); the held-out half's figures are in
``docs/figures/replies.md``. What the tuning half said (answered % / short % / right % of factual, n = 48):

  * the prompt before issue 39, no examples, temperature 0.7, 256 tokens: 79 / 60 / 57;
  * the new prompt alone, greedy: 92 / 62 / 50 (replies run long: lists and loops);
  * the new prompt and four examples (a factual answer, a timer refused, a how-to, a dinner idea), greedy:
    88 / 83 / 71, at temperature 0.3 79 / 85 / 79, at 0.7 77 / 83 / 71: the dinner example leaked into other
    answers ("a vegetable stir fry" for a timer) and "cannot" requests were often answered as something else;
  * these five examples (two refusals: timers, messages; a neutral suggestion), greedy: 96 / 94 / 71 at 64 or
    48 tokens alike, 94 / 90 / 71 at temperature 0.3; adding a sixth (the weather refused) gave 96 / 90 / 64.
Greedy decoding won (and makes the bench repeatable); 48 tokens bound a reply the model loops in (no repetition
penalty in the sampler) to about 13 seconds of speech. The misses left are the small model's: facts it does
not know (a bicycle's "eight wheels"), and Chinese and Japanese, which SmolLM2 does not speak.

:data:`PRESETS` names the settings the bench compares: ``before`` is what the voice chat ran until issue 39.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from assistant.config import RespondConfig
from assistant.respond.base import Message

# The system prompt chosen with the examples below (the tuning half of `python -m lab replies`); what it says the
# assistant cannot do is true of the embedded engine, which calls no tools.
SYSTEM_PROMPT = (
    "You are a voice assistant: the user speaks to you and hears your answer. Answer the question yourself, in one or "
    "two short spoken sentences, with no lists, no markdown and no emojis. You cannot set timers or alarms, send "
    "messages, make calls, play music or control devices: when asked, say plainly that you cannot, and offer what "
    "you can do instead. Never ask the user to do what they asked you to do."
)
TEMPERATURE = 0.0  # greedy: the small model's best, and a repeatable bench
MAX_TOKENS = 48  # a reply the model loops in is cut at about 13 s of speech (at the clause end before it)

# English example turns (the persona's language is respond.language; other languages get none: the small model
# has no other language to copy, and an English example would pull a Japanese turn's answer into English).
EXAMPLES: tuple[Message, ...] = (
    Message("user", "What is the capital of Canada?"),
    Message("assistant", "Ottawa is the capital of Canada."),
    Message("user", "Set a timer for five minutes."),
    Message("assistant", "Sorry, I can't set timers or alarms. I can only talk with you."),
    Message("user", "How do I soften butter quickly?"),
    Message("assistant", "Cut it into small cubes and leave it out for about fifteen minutes."),
    Message("user", "Text my sister that I'm running late."),
    Message("assistant", "Sorry, I can't send messages or make calls."),
    Message("user", "Suggest something to drink on a hot day."),
    Message("assistant", "Iced tea with lemon is refreshing on a hot day."),
)
EXAMPLES_BY_LANGUAGE: dict[str, tuple[Message, ...]] = {"en": EXAMPLES}

# What the voice chat ran before issue 39, for the bench's "before" column.
BEFORE_SYSTEM_PROMPT = "You are a helpful voice assistant. Answer briefly in plain spoken sentences."


def embedded(cfg: RespondConfig) -> RespondConfig:
    """``cfg`` with what it leaves unset (None) filled with the embedded model's own defaults."""
    return replace(cfg, system_prompt=SYSTEM_PROMPT if cfg.system_prompt is None else cfg.system_prompt,
                   temperature=TEMPERATURE if cfg.temperature is None else cfg.temperature,
                   max_tokens=MAX_TOKENS if cfg.max_tokens is None else cfg.max_tokens)


def examples(language: str) -> tuple[Message, ...]:
    """The example turns for a persona speaking ``language`` (``en``, or ``en-GB``); none for other languages."""
    return EXAMPLES_BY_LANGUAGE.get(language.split("-")[0].strip().lower(), ())


def example_messages(cfg: RespondConfig) -> list[dict[str, str]]:
    """The example turns as chat messages, or none when ``respond.examples`` is off."""
    if not cfg.examples:
        return []
    return [{"role": m.role, "content": m.content} for m in examples(cfg.language)]


# name → the settings the bench runs (on top of the config it is given); "config" is the config as it is.
PRESETS: dict[str, dict[str, Any]] = {
    "before": {"system_prompt": BEFORE_SYSTEM_PROMPT, "examples": False, "temperature": 0.7, "max_tokens": 256},
    "config": {},
    "prompt-only": {"examples": False},
    "t0.3": {"temperature": 0.3},
    "t0.7": {"temperature": 0.7},
    "tokens-96": {"max_tokens": 96},
}


def preset(cfg: RespondConfig, name: str) -> RespondConfig:
    """``cfg`` with the named preset's settings (over the embedded model's own defaults)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(embedded(cfg), **PRESETS[name])


__all__ = ["BEFORE_SYSTEM_PROMPT", "EXAMPLES", "EXAMPLES_BY_LANGUAGE", "MAX_TOKENS", "PRESETS", "SYSTEM_PROMPT",
           "TEMPERATURE", "embedded", "example_messages", "examples", "preset"]
