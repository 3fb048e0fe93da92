"""Prometheus metrics: one registry per app (so several apps in one test process do not collide)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from assistant.pipeline.trace import DURATIONS, GAPS

if TYPE_CHECKING:
    from assistant.engine_host.supervisor import Health

# Buckets in seconds, dense where conversational latency lives (50 ms … 2 s).
# The Ray hop: sub-millisecond to tens of milliseconds on loopback and in one data centre.
HOP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)
# Idle gaps: exactly 0 (the usual case), a few ms (a loop hop), up to a speculative turn's lead of a second or two.
GAP_BUCKETS = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sessions_active = Gauge("assistant_sessions_active", "open voice chat sessions", registry=self.registry)
        self.sessions_total = Counter("assistant_sessions_total", "voice chat sessions opened", registry=self.registry)
        self.turns_total = Counter("assistant_turns_total", "user turns answered", registry=self.registry)
        self.interruptions_total = Counter(
            "assistant_interruptions_total", "replies cut by barge-in", registry=self.registry
        )
        self.errors_total = Counter(
            "assistant_errors_total", "errors by where they happened", ["stage"], registry=self.registry
        )
        self.stage_seconds = Histogram(
            "assistant_stage_seconds",
            "duration of each turn stage (names as in turn_metrics)",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.gap_seconds = Histogram(
            "assistant_turn_gap_seconds",
            "idle gaps of a turn, each >= 0 (names as in turn_metrics gaps_ms): evidence_to_commit, "
            "commit_to_tts_text, and tts_text_before_commit (a speculative turn's text was ready that early)",
            ["gap"],
            buckets=GAP_BUCKETS,
            registry=self.registry,
        )
        self.tts_requests_total = Counter(
            "assistant_tts_requests_total", "TTS API requests by outcome", ["outcome"], registry=self.registry
        )
        self.tts_first_chunk_seconds = Histogram(
            "assistant_tts_first_chunk_seconds",
            "TTS API time to first audio chunk",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        # Phone calls (server/telephony/): reasons and outcomes are the code's own words, never a caller's.
        self.telephony_answers_total = Counter(
            "assistant_telephony_answers_total", "carrier webhooks answered: answered (a media token given) or busy",
            ["carrier", "outcome"], registry=self.registry,
        )
        self.telephony_refusals_total = Counter(
            "assistant_telephony_refusals_total", "carrier webhooks and media streams refused, by reason "
            "(unsigned, bad_signature, replayed, unknown_token, media_flood, ...)", ["carrier", "reason"],
            registry=self.registry,
        )

        # SIP (server/sip/): calls by direction and outcome; messages dropped unread (floods, garbage) by reason.
        self.sip_calls_total = Counter(
            "assistant_sip_calls_total", "SIP calls by direction (inbound, outbound) and outcome (answered, busy, "
            "no_answer, failed, refused, cancelled, ended_by_peer)", ["direction", "outcome"], registry=self.registry,
        )
        self.sip_dropped_total = Counter(
            "assistant_sip_dropped_total", "SIP messages and requests dropped without an answer, by reason (rate, "
            "too_large, malformed, not_allowed, transactions, connections, ...)", ["reason"], registry=self.registry,
        )

        self.ray_hop_seconds = Histogram(
            "assistant_ray_hop_seconds",
            "cost of the Ray Serve hop: call (request in + first chunk back), chunk (each later chunk back), "
            "asr (a transcription's way to the replica and back), asr_wait (its wait there for a free worker)",
            ["kind"],
            buckets=HOP_BUCKETS,
            registry=self.registry,
        )

        # Engines in supervised child processes (engine_host/): their state now, and why they restarted.
        self.engine_up = Gauge(
            "assistant_engine_up", "1 while an engine's child process is ready; 0 while it starts, restarts or has "
            "failed for good", ["engine"], registry=self.registry,
        )
        self.engine_state = Gauge(
            "assistant_engine_state", "1 for the state an engine is in (starting, ready, restarting, failed, closed)",
            ["engine", "state"], registry=self.registry,
        )
        self.engine_deaths_total = Counter(
            "assistant_engine_deaths_total", "engine child processes that died or were killed, by the kind of end "
            "(SIGSEGV, SIGKILL, hung, exit)", ["engine", "how"], registry=self.registry,
        )
        self.telemetry_spans_dropped_total = Counter(
            "assistant_telemetry_spans_dropped_total", "OpenTelemetry spans that never reached the collector: its "
            "queue was full (telemetry.max_queue_size) or the collector refused or did not answer in time",
            registry=self.registry,
        )

    def observe_engine(self, health: Health) -> None:
        """An engine's state changed (``EngineProcess.on_change``)."""
        self.engine_up.labels(engine=health.name).set(1 if health.ready else 0)
        for state in ENGINE_STATES:
            self.engine_state.labels(engine=health.name, state=state).set(1 if state == health.state else 0)
        if health.state in ("restarting", "failed") and health.reason and health.pid is None:
            self.engine_deaths_total.labels(engine=health.name, how=_how(health.reason)).inc()

    def count_dropped_spans(self, n: int) -> None:
        self.telemetry_spans_dropped_total.inc(n)

    def observe_ray_hop(self, kind: str, seconds: float) -> None:
        self.ray_hop_seconds.labels(kind=kind).observe(max(seconds, 0.0))

    def observe_turn(self, durations_ms: dict[str, float], gaps_ms: dict[str, float] | None = None) -> None:
        self.turns_total.inc()
        for name, value in durations_ms.items():
            if name in DURATIONS:
                self.stage_seconds.labels(stage=name.removesuffix("_ms")).observe(max(value, 0.0) / 1000.0)
        for name, value in (gaps_ms or {}).items():
            if name in GAPS:
                self.gap_seconds.labels(gap=name.removesuffix("_ms")).observe(max(value, 0.0) / 1000.0)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


ENGINE_STATES = ("starting", "ready", "restarting", "failed", "closed")


def _how(reason: str) -> str:
    """A death's kind, from its reason's words (a bounded label set)."""
    if reason.startswith("hung"):
        return "hung"
    for name in ("SIGSEGV", "SIGKILL", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE", "SIGTERM"):
        if name in reason:
            return name
    return "exit"
