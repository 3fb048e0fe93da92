"""The OpenAI Realtime API (``[realtime]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class RealtimeConfig:
    """The OpenAI Realtime API (``/v1/realtime``): limits and what is ours beyond the reference."""

    max_event_bytes: int = setting(
        1_048_576, "largest client event accepted; a bigger one gets an error event and the session goes on (a "
        "WebSocket message over 4x this closes the socket)"
    )
    max_buffer_s: float = setting(60.0, "most audio a client may append before it commits (turn detection off)")
    max_items: int = setting(200, "conversation items a session keeps (oldest go first): the responder's history")
    audio_lead_ms: int = setting(
        1000, "WebSocket: reply audio sent this far ahead of the client's playout (by the server's clock); barge-in "
        "drops what is ahead, the rest is what the client already holds"
    )
    max_pending_events: int = setting(
        1024, "server events queued for a WebSocket client that reads slowly; past it, closed")
    extensions: bool = setting(
        False, "send our own server events (assistant.turn_metrics: the per-turn latency breakdown; "
        "assistant.notice) to every session; off, only sessions that ask with ?extensions=1 get them (a strict "
        "client of the reference sees only the reference's events)"
    )
