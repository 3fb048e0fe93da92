"""The latency benchmarks a user runs on their own deployment, and their clients: voice-to-voice through a real
WebRTC client, the Realtime API or a phone carrier's protocol (``v2v``, ``v2v_cli``, ``realtime_client``,
``telephony_client``), TTS latency (``tts``), the embedded model's first token (``llm``), their tables, plots and
figures. ``processes`` starts ``assistant`` children for the benches and the multi-process tests. The team's own
studies live outside the package, in ``lab/``."""
