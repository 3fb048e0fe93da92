"""Benchmarks that print tables and draw plots: voice-to-voice through a real WebRTC client (``v2v``), TTS latency
(``tts``), feature comparisons, one process against gateways on Ray (``ray_hop``), the offline GPU check
(``gpu_check``). ``processes`` starts ``assistant`` children; it lives here because ``bench ray`` needs it, and the
multi-process tests borrow it."""
