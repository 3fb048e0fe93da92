"""WebRTC transport only, no conversation logic: audio in (``inbound``: frames → 16 kHz mono), the receive buffer
(``jitter``), the outgoing reply track (``outbound``: 20 ms frames, paced), pacing helpers, and loopback ICE for
clients and servers on one machine (``loopback_ice``: tests and benches only)."""
