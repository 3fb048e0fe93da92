"""Our CosyVoice2 inference: the official checkpoints in our own modules, streamed by one engine per process.

Model code: `llm.py` (speech LLM), `flow.py` with `flow_encoder.py` and `flow_decoder.py` (tokens to mel),
`hift.py` with `hift_source.py` (mel to audio), `cosyvoice2.py` (the loaded model, text front end, voices).
Streaming: `schedule.py` (when a chunk is due), `vocoding.py` (how a chunk is made), `flow_cache.py` (what a
stream's flow keeps between chunks) with `flow_arena.py` (every stream's in one static arena), `flow_prefix.py`
(a voice's share of the flow state), `streaming.py` (one request's stream). Serving: `engine.py` (the TTS
engine protocol), `batching.py` with `admission.py`, `decode_worker.py` (the decode thread) over
`decode_state.py`, `slot_decoder.py`, `prefill_graphs.py` and `sampling.py` (its model side),
`chunk_scheduler.py` with `prefix_builds.py` and `batch_work.py` (the chunk thread and what it batches).
Graphs (`graphs.py`: captured on CUDA, run directly elsewhere): the decode step, the prefill, and a voice's first
chunk (`first_chunk.py` over `flow_graphs.py` and `hift_graphs.py`); `device_time.py`: timings and uploads that
never make the chunk path wait for the device.
"""

SAMPLE_RATE = 24000  # CosyVoice2's audio rate: HiFT's output, and the rate a prompt clip is analysed at
