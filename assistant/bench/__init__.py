"""The latency benchmarks a user runs on their own deployment, and their clients: voice-to-voice through a real
WebRTC client, the Realtime API, a phone carrier's protocol or SIP (``v2v``, ``v2v_cli``, ``realtime_client``,
``telephony_client``, ``sip_client``, what a phone line says and plays: ``phone_line``), TTS latency (``tts``), the
embedded model's first token (``llm``), their tables, plots and figures. ``processes`` starts ``assistant``
children for the benches and the multi-process tests. The team's own studies live outside the package, in
``lab/``."""
