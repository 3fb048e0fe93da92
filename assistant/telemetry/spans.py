"""One call's spans, built from each turn's own marks once the turn has ended.

The tree (names in ``names.py``)::

    call                                  the session: transport, codec, key id, language, responder, gateway
    └── turn                              one per committed turn: number, interrupted, end-of-turn reason, v2v
        ├── vad.endpoint                  speech end → the silence the rule required had passed
        ├── end_of_turn                   speech end → committed (reason, what evidence it used)
        │   └── end_of_turn.model         the audio model's call, when the decision used it
        ├── asr                           the turn's pass (speculative or final), its worker wait
        │   └── ray.hop                   its way to a Ray replica and back, when the ASR runs there
        ├── chat {model}                  the responder: TTFT, tokens in and out (GenAI conventions)
        │   └── execute_tool {name}       each tool call the model wrote (the Realtime API's tools)
        ├── tts                           first text in → last audio out: TTFB, characters, voice, engine
        └── playout                       first audio → the last frame sent (or cut)
        events: barge_in (what was heard), first_token, first_audio, first_frame_sent

Other processes add theirs to the same trace: the dispatcher's ``dispatch`` span is the call span's parent, and
the Ray Serve replicas hang ``ray.replica.asr|tts|llm`` under the call span (the one whose context exists while a
turn runs: ``carry.py``, ``serve_ray/traced.py``).

Every time is one the turn took itself (wall seconds from ``time.time()``, as ``TurnTrace`` has them), so the
spans' durations are the turn's metrics, and the turn span carries its ``turn_metrics`` durations as attributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from assistant.pipeline.trace import GAPS
from assistant.pipeline.turn import Turn
from assistant.telemetry import names


class Observe(Protocol):
    """Records one measurement (seconds) of a histogram named in :mod:`names` (``setup.Telemetry.observe``)."""

    def __call__(self, name: str, seconds: float | None, **attributes: str) -> None: ...


Attributes = dict[str, Any]
PROPAGATOR = TraceContextTextMapPropagator()


def ns(seconds: float) -> int:
    """Wall seconds → the nanoseconds OpenTelemetry's times are in."""
    return int(seconds * 1e9)


def parent_context(traceparent: str, tracestate: str = "") -> Context:
    """The W3C trace context a caller sent (an empty context, so a new trace, when it sent none or a bad one)."""
    carrier = {"traceparent": traceparent.strip()}
    if tracestate:
        carrier["tracestate"] = tracestate
    return PROPAGATOR.extract(carrier) if traceparent else Context()


def clean_attributes(attributes: Mapping[str, Any]) -> Attributes:
    """Only values OTLP carries: None and empty strings are left out."""
    return {k: v for k, v in attributes.items() if v is not None and v != ""}


class CallTrace:
    """The spans of one session. :meth:`turn_ended` for each committed turn, :meth:`end` at its close; both run on
    the event loop and only create spans (the export is the processor's thread's)."""

    def __init__(self, tracer: trace.Tracer, observe: Observe, session_id: str, started: float,
                 traceparent: str = "", describe: Callable[[], Mapping[str, Any]] | None = None,
                 include_text: bool = False) -> None:
        self.tracer, self.observe = tracer, observe
        self.session_id = session_id
        self.started = started
        self.traceparent = traceparent
        self.describe = describe
        self.include_text = include_text
        self.engine = ""
        self.model = ""
        self.span: trace.Span | None = None
        self._headers: dict[str, str] | None = None
        self.turns = 0
        self.ended = False

    @property
    def context(self) -> Context:
        return trace.set_span_in_context(self._call())

    def headers(self) -> dict[str, str]:
        """The call span's W3C trace context as headers: what this call's engine requests carry to another
        process (``carry.py``), whose spans then join this trace under the call span. Empty when unsampled."""
        if self._headers is None:
            carrier: dict[str, str] = {}
            PROPAGATOR.inject(carrier, context=self.context)
            self._headers = carrier
        return dict(self._headers)

    def _call(self) -> trace.Span:
        """The call span, started (in memory) the first time it is needed, when the call's attributes are known."""
        if self.span is None:
            attrs: Attributes = {names.SESSION_ID: self.session_id, names.CONVERSATION_ID: self.session_id}
            if self.describe is not None:
                attrs.update(self.describe())
            self.engine = str(attrs.get(names.PROVIDER, ""))
            self.model = str(attrs.get(names.REQUEST_MODEL, ""))
            self.span = self.tracer.start_span(
                names.CALL, context=parent_context(self.traceparent), kind=SpanKind.SERVER,
                attributes=clean_attributes(attrs), start_time=ns(self.started))
        return self.span

    def end(self, reason: str, at: float | None = None) -> None:
        """The session closed: the call span ends (and goes to the exporter with its turn count and reason)."""
        if self.ended:
            return
        self.ended = True
        span = self._call()
        if self.describe is not None:  # the call span may have started before all was known (an engine request)
            span.set_attributes(clean_attributes(dict(self.describe())))
        span.set_attributes(clean_attributes({names.CALL_TURNS: self.turns, names.CLOSE_REASON: reason}))
        span.end(end_time=ns(time.time() if at is None else at))

    # --- one turn -----------------------------------------------------------------------------------------
    def turn_ended(self, turn: Turn) -> None:
        """The turn's span and its stages' (module docstring), and its measurements into the histograms."""
        if self.ended:
            return
        tracer = self.tracer
        tr, notes, marks = turn.trace, turn.notes, turn.trace.marks
        ending, asr = tr.ending, tr.asr
        end = notes.ended or time.time()
        durations, gaps = tr.durations_ms(), tr.gaps_ms()
        begins = [marks.get("speech_end"), notes.respond_started, asr.asked if asr is not None else None,
                  ending.model.asked if ending is not None and ending.model is not None else None]
        start = min([t for t in begins if t is not None], default=end)
        cut = [b for b in notes.barge_ins if not b.paused]
        attrs: Attributes = {
            names.TURN_NUMBER: turn.number, names.INTERRUPTED: bool(cut), names.SPECULATIVE: turn.speculative,
            names.TURN_LANGUAGE: turn.language, names.FAILED_STAGE: turn.failed,
            **{names.TURN_PREFIX + k: v for k, v in durations.items()},
            **{names.TURN_PREFIX + k: v for k, v in gaps.items() if k in GAPS},
        }
        if ending is not None:
            attrs |= {names.EOT_REASON: ending.reason, names.EOT_DELAY_MS: _ms(ending.decided - ending.speech_end)}
        if self.include_text:
            attrs |= {names.INPUT: turn.transcript, names.OUTPUT: turn.reply.text}
        span = tracer.start_span(names.TURN, context=self.context, attributes=clean_attributes(attrs),
                                 start_time=ns(start))
        self.turns += 1
        for b in notes.barge_ins:
            event: Attributes = {names.BARGE_IN_REASON: b.reason, names.BARGE_IN_PAUSED: b.paused,
                                 names.BARGE_IN_HEARD_CHARS: len(b.heard)}
            if self.include_text:
                event[names.BARGE_IN_HEARD] = b.heard
            span.add_event(names.BARGE_IN, clean_attributes(event), timestamp=ns(b.at))
        if turn.failed:
            span.set_status(Status(StatusCode.ERROR, f"the {turn.failed} stage failed"))
        ctx = trace.set_span_in_context(span)

        def child(name: str, begin: float | None, finish: float | None, attributes: Attributes | None = None,
                  parent: Context = ctx, kind: SpanKind = SpanKind.INTERNAL) -> trace.Span | None:
            if begin is None:
                return None
            s = tracer.start_span(name, context=parent, kind=kind, attributes=clean_attributes(attributes or {}),
                                  start_time=ns(begin))
            s.end(end_time=ns(max(begin, finish if finish is not None else end)))
            return s

        speech_end = marks.get("speech_end")
        if ending is not None:
            child(names.ENDPOINT, speech_end, ending.silence_met)
            eot_attrs = {names.EOT_REASON: ending.reason, names.EOT_USED_TEXT: ending.text,
                         names.EOT_USED_MODEL: ending.model is not None,
                         names.EOT_DELAY_MS: _ms(ending.decided - ending.speech_end)}
            eot = tracer.start_span(names.END_OF_TURN, context=ctx, start_time=ns(ending.speech_end),
                                    attributes=clean_attributes(eot_attrs))
            if ending.model is not None:
                m = ending.model
                child(names.END_OF_TURN_MODEL, m.asked, m.done, {names.QUEUE_MS: _ms(m.started - m.asked)},
                      parent=trace.set_span_in_context(eot))
            eot.end(end_time=ns(max(ending.decided, ending.speech_end)))
        if asr is not None:
            asr_attrs: Attributes = {names.ASR_PASS: notes.asr_kind, names.QUEUE_MS: _ms(asr.started - asr.asked),
                                     names.ASR_CHARS: len(turn.transcript or "")}
            if notes.asr_tail:
                asr_attrs[names.ASR_TAIL] = True
            if self.include_text:
                asr_attrs[names.OUTPUT] = turn.transcript
            remote = notes.asr_remote
            if remote is not None:
                asr_attrs[names.RAY_HOP_MS] = _ms((remote[0] - asr.asked) + (asr.done - remote[1]))
            asr_span = child(names.ASR, asr.asked, asr.done, asr_attrs)
            if asr_span is not None and turn.failed == "asr":
                asr_span.set_status(Status(StatusCode.ERROR))
            if asr_span is not None and remote is not None:  # the replica's clock: on another machine, NTP's
                hop = trace.set_span_in_context(asr_span)
                child(names.RAY_HOP, asr.asked, remote[0], {names.RAY_LEG: "request"}, parent=hop)
                child(names.RAY_HOP, min(remote[1], asr.done), asr.done, {names.RAY_LEG: "response"}, parent=hop)
        self._llm(turn, ctx, end)
        self._speech(turn, ctx, end, durations)
        span.end(end_time=ns(max(start, end)))
        self._observe(turn, durations)

    def _llm(self, turn: Turn, ctx: Context, end: float) -> None:
        notes, marks = turn.notes, turn.trace.marks
        begin = notes.respond_started
        if begin is None:
            return
        attrs: Attributes = {names.OPERATION: names.LLM_OPERATION, names.PROVIDER: self.engine,
                             names.SYSTEM: self.engine, names.REQUEST_MODEL: self.model,
                             names.RESPONSE_CHARS: len(turn.reply.text)}
        if "first_text" in marks:
            attrs[names.TTFT_MS] = _ms(marks["first_text"] - begin)
        if notes.usage is not None:
            attrs |= {names.INPUT_TOKENS: notes.usage.input_tokens, names.OUTPUT_TOKENS: notes.usage.output_tokens}
        if self.include_text:
            attrs |= {names.PROMPT: turn.transcript, names.INPUT: turn.transcript,
                      names.COMPLETION: turn.reply.text, names.OUTPUT: turn.reply.text}
        name = f"{names.LLM_OPERATION} {self.model}" if self.model else names.LLM_OPERATION
        span = self.tracer.start_span(name, context=ctx, kind=SpanKind.CLIENT, attributes=clean_attributes(attrs),
                                                start_time=ns(begin))
        if "first_text" in marks:
            span.add_event(names.FIRST_TOKEN, timestamp=ns(marks["first_text"]))
        if turn.failed == "responder":
            span.set_status(Status(StatusCode.ERROR))
        tool_ctx = trace.set_span_in_context(span)
        for call in notes.tool_calls:
            tool: Attributes = {names.OPERATION: "execute_tool", names.TOOL_NAME: call.name,
                                names.TOOL_CALL_ID: call.call_id}
            if self.include_text:
                tool[names.TOOL_ARGUMENTS] = call.arguments
            t = self.tracer.start_span(f"{names.TOOL} {call.name}", context=tool_ctx,
                                                 attributes=clean_attributes(tool), start_time=ns(call.begun))
            t.end(end_time=ns(max(call.begun, call.done)))
        span.end(end_time=ns(max(begin, notes.respond_done or end)))

    def _speech(self, turn: Turn, ctx: Context, end: float, durations: Mapping[str, float]) -> None:
        notes, marks, tracer = turn.notes, turn.trace.marks, self.tracer
        if "first_tts_text" in marks:
            begin = marks["first_tts_text"]
            spoken = " ".join(piece.strip() for _, piece in turn.reply.spoken)  # the pieces as TTS got them
            attrs: Attributes = {names.TTS_CHARS: len(spoken), names.TTS_ENGINE: notes.tts_engine,
                                 names.TTS_VOICE: notes.tts_voice, names.TTS_LANGUAGE: notes.tts_language}
            if "first_audio" in marks:
                attrs[names.TTS_TTFB_MS] = _ms(marks["first_audio"] - begin)
            if self.include_text:
                attrs[names.INPUT] = spoken
            span = tracer.start_span(names.TTS, context=ctx, attributes=clean_attributes(attrs), start_time=ns(begin))
            if "first_audio" in marks:
                span.add_event(names.FIRST_AUDIO, timestamp=ns(marks["first_audio"]))
            if turn.failed == "tts":
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=ns(max(begin, notes.tts_done or end)))
        if "first_audio" in marks:
            begin = marks["first_audio"]
            playout = {names.PLAYOUT_QUEUE_MS: durations.get("playout_ms"),
                       names.PLAYOUT_REPLY_MS: durations.get("reply_ms")}
            span = tracer.start_span(names.PLAYOUT, context=ctx, start_time=ns(begin),
                                     attributes=clean_attributes(playout))
            if "first_frame_sent" in marks:
                span.add_event(names.FIRST_FRAME, timestamp=ns(marks["first_frame_sent"]))
            span.end(end_time=ns(max(begin, marks.get("reply_done", end))))

    def _observe(self, turn: Turn, durations: Mapping[str, float]) -> None:
        """The turn's latencies into the histograms: the same numbers as its spans and /metrics."""
        observe, tr, notes = self.observe, turn.trace, turn.notes
        for stage, value in durations.items():
            observe(names.H_STAGE, value / 1000, stage=stage.removesuffix("_ms"))
        if "server_v2v_ms" in durations:
            observe(names.H_V2V, durations["server_v2v_ms"] / 1000)
        if tr.ending is not None:
            observe(names.H_EOT, tr.ending.decided - tr.ending.speech_end)
        if tr.asr is not None:
            observe(names.H_ASR, tr.asr.done - tr.asr.asked)
        if notes.respond_started is not None and "first_text" in tr.marks:
            observe(names.H_TTFT, tr.marks["first_text"] - notes.respond_started)
        if "first_tts_text" in tr.marks and "first_audio" in tr.marks:
            observe(names.H_TTS_TTFB, tr.marks["first_audio"] - tr.marks["first_tts_text"])


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
