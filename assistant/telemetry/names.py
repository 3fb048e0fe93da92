"""The names our spans, events, attributes and histograms carry, in one place, each with why it is that name.

The rule: a standard OpenTelemetry name wherever one means exactly what we measure (``session.id``, the GenAI
semantic conventions' ``gen_ai.*`` for the language model and its tools), so backends that know those conventions
(Langfuse, LangSmith, Datadog LLM Observability, Honeycomb's GenAI boards) show them without a custom processor;
our own names, under ``assistant.``, for what no convention covers (turn-taking, the critical-path parts of the
voice-to-voice, TTS). Durations we already report in ``turn_metrics`` keep their names there (``*_ms``), so one
number reads the same on the page, on ``/metrics`` and in a trace.

Span names are few and fixed (low cardinality, as the spec asks): which model, voice or call is an attribute.
"""

from __future__ import annotations

# --- spans ---------------------------------------------------------------------------------------------------
CALL = "call"  # one session, whatever its transport (Pipecat's "conversation", LiveKit's "agent_session")
TURN = "turn"  # one user utterance and its reply (both frameworks say "turn")
ENDPOINT = "vad.endpoint"  # the user's speech end → the silence the turn-taking rule required had passed
END_OF_TURN = "end_of_turn"  # the user's speech end → the turn committed (LiveKit: "eou_detection")
END_OF_TURN_MODEL = "end_of_turn.model"  # the audio end-of-turn model's call, when the decision used it
ASR = "asr"  # the turn's ASR pass, speculative or final (Pipecat: "stt")
TOOL = "execute_tool"  # GenAI conventions: a tool call's span is "execute_tool {gen_ai.tool.name}"
TTS = "tts"  # the reply's synthesis: first text in → last audio out (LiveKit: "tts_request")
PLAYOUT = "playout"  # first audio made → the reply's last frame sent (or cut)
# The responder's span is named as the GenAI conventions say: "{gen_ai.operation.name} {gen_ai.request.model}".
LLM_OPERATION = "chat"
# Spans of other processes in the same trace. Not "asr"/"chat"/"tts" again: a backend that counts generations or
# ASR calls by name would count each twice (the gateway's span is the turn's stage; these are the work behind it).
DISPATCH = "dispatch"  # the dispatcher placing an offer or a WebSocket on a gateway (parent of the call span)
REPLICA_ASR = "ray.replica.asr"  # a transcription on a Ray Serve ASR replica (under the call span)
REPLICA_TTS = "ray.replica.tts"  # one piece of text spoken on a TTS replica
REPLICA_LLM = "ray.replica.llm"  # a reply written on an LLM replica

# --- the call ------------------------------------------------------------------------------------------------
SESSION_ID = "session.id"  # OTel's session convention; Langfuse and LangSmith group traces into sessions by it
CONVERSATION_ID = "gen_ai.conversation.id"  # the GenAI conventions' name for the same thing
TRANSPORT = "assistant.transport"  # page, whip, realtime_webrtc, realtime_websocket, phone
CODEC = "assistant.codec"  # what the audio travels as (opus/48000/2, pcm16, g711_ulaw, ...)
KEY_ID = "assistant.key_id"  # the key that opened the call (its id, never the key): admin, or a minted key's kid
LANGUAGE = "assistant.language"  # the language the call is heard in (a code, or auto)
GATEWAY = "assistant.gateway_id"  # server.gateway_id: which gateway behind `assistant dispatch` held it
CARRIER = "assistant.carrier"  # a phone call's carrier (twilio, ...)
CALL_TURNS = "assistant.call.turns"
CLOSE_REASON = "assistant.call.close_reason"  # hangup, idle_timeout, peer_failed, ...

# --- the process (resource attributes) -------------------------------------------------------------------------
ROLE = "assistant.role"  # gateway, dispatch, asr, tts or llm; service.name is "<service_name>-<role>" off gateways

# --- the dispatcher and the replicas -----------------------------------------------------------------------------
HTTP_METHOD = "http.request.method"  # OTel's HTTP conventions
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
DISPATCH_GATEWAY = "assistant.dispatch.gateway"  # the gateway that took it (server.gateway_id)
DISPATCH_TRIES = "assistant.dispatch.tries"  # gateways asked (one more than those that were down or busy)
RAY_DEPLOYMENT = "assistant.ray.deployment"  # ASR, TTS or LLM
RAY_REPLICA = "assistant.ray.replica"  # the replica's id (its actor is in Serve's namespace)
AUDIO_S = "assistant.asr.audio_s"  # seconds of audio transcribed
TTS_CHUNKS = "assistant.tts.chunks"
CANCELLED = "assistant.cancelled"  # the caller stopped it (a barge-in, a gateway gone)
LLM_MODEL = "assistant.llm.model"  # not gen_ai.*: the replica's span is not a second generation
LLM_INPUT_TOKENS = "assistant.llm.input_tokens"
LLM_OUTPUT_TOKENS = "assistant.llm.output_tokens"

# --- the GenAI conventions (gen_ai.*) ---------------------------------------------------------------------------
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"  # the current conventions' name for the responder's engine
SYSTEM = "gen_ai.system"  # its older name, which many backends still read
REQUEST_MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"  # only with telemetry.include_text
# The user's words and the reply, only with telemetry.include_text: the older GenAI string attributes
# (gen_ai.prompt / gen_ai.completion), which Langfuse maps to a generation's input and output, and OpenInference's
# input.value / output.value, which Langfuse, LangSmith and Arize Phoenix all show as the span's input and output.
PROMPT = "gen_ai.prompt"
COMPLETION = "gen_ai.completion"
INPUT = "input.value"
OUTPUT = "output.value"

# --- the turn --------------------------------------------------------------------------------------------------
TURN_NUMBER = "assistant.turn.number"
INTERRUPTED = "assistant.turn.interrupted"  # the user spoke over the reply and it was cut (barge-in)
SPECULATIVE = "assistant.turn.speculative"  # its reply was prepared before the turn was committed
FAILED_STAGE = "assistant.turn.failed_stage"  # asr, responder, tts, ... (the span's status is then ERROR)
TURN_LANGUAGE = "assistant.turn.language"  # the language the turn was heard (and answered) in
EOT_REASON = "assistant.end_of_turn.reason"  # the turn-taking policy's own words for why it committed
EOT_USED_TEXT = "assistant.end_of_turn.used_transcript"
EOT_USED_MODEL = "assistant.end_of_turn.used_model"
EOT_DELAY_MS = "assistant.end_of_turn.delay_ms"  # speech end → committed
# Every duration and gap of the turn's turn_metrics (pipeline/trace.py: DURATIONS, GAPS) as
# "assistant.turn.<name>", e.g. assistant.turn.server_v2v_ms, assistant.turn.asr_ms: the same numbers.
TURN_PREFIX = "assistant.turn."

BARGE_IN = "barge_in"  # an event on the turn: the user spoke over the reply
BARGE_IN_REASON = "assistant.barge_in.reason"
BARGE_IN_PAUSED = "assistant.barge_in.paused"  # the reply was only held (it may resume)
BARGE_IN_HEARD_CHARS = "assistant.barge_in.heard_chars"  # how much of the reply the user had heard
BARGE_IN_HEARD = "assistant.barge_in.heard"  # that text, only with telemetry.include_text

# --- stages ----------------------------------------------------------------------------------------------------
QUEUE_MS = "assistant.queue_ms"  # a call's wait for a free worker before it ran (ASR, end-of-turn model)
ASR_PASS = "assistant.asr.pass"  # speculative (asked at a pause, before the turn was committed) or final
# True when the pass lost the words after a pause and a pass over the tail heard them (asr/tail.py): the span then
# covers both passes, one after the other.
ASR_TAIL = "assistant.asr.tail"
ASR_CHARS = "assistant.asr.characters"
RAY_HOP = "ray.hop"  # a leg of the Ray hop (engines on Ray Serve): the request's way there, or the answer's back
RAY_LEG = "assistant.ray.leg"  # request or response
RAY_HOP_MS = "assistant.ray.hop_ms"  # both legs together, on the stage's span (as /metrics' assistant_ray_hop_seconds)
TTFT_MS = "assistant.llm.time_to_first_token_ms"  # the responder asked → its first text
RESPONSE_CHARS = "assistant.llm.characters"
TTS_TTFB_MS = "assistant.tts.time_to_first_byte_ms"  # first text handed to TTS → its first audio
TTS_CHARS = "assistant.tts.characters"
TTS_ENGINE = "assistant.tts.engine"
TTS_VOICE = "assistant.tts.voice"
TTS_LANGUAGE = "assistant.tts.language"
PLAYOUT_QUEUE_MS = "assistant.playout.queue_ms"  # first audio made → its first frame sent (playout_ms)
PLAYOUT_REPLY_MS = "assistant.playout.reply_ms"  # first frame sent → last frame sent
FIRST_TOKEN = "first_token"  # events at the moment they name, on the stage's span
FIRST_AUDIO = "first_audio"
FIRST_FRAME = "first_frame_sent"

# --- histograms (seconds, as the OTel conventions ask of durations) ---------------------------------------------
H_V2V = "assistant.turn.server_v2v"  # end to end: the user's speech end → the reply's first frame sent
H_EOT = "assistant.turn.end_of_turn_delay"  # the user's speech end → the turn committed
H_ASR = "assistant.asr.duration"  # the turn's ASR pass, worker wait included
H_TTFT = "assistant.llm.time_to_first_token"  # the responder asked → its first text
H_TTS_TTFB = "assistant.tts.time_to_first_byte"  # first text to TTS → first audio
H_STAGE = "assistant.turn.stage"  # every part of turn_metrics' durations, by its "stage" (as /metrics has it)
STAGE = "stage"

# --- the processor's own counts -------------------------------------------------------------------------------
DROPPED_METRIC = "assistant_telemetry_spans_dropped_total"  # Prometheus, beside the other /metrics
