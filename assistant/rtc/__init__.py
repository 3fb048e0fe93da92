"""WebRTC transport only, no conversation logic: audio in (``inbound``: frames → 16 kHz mono), the receive buffer
(``jitter``), the outgoing reply track (``outbound``: 20 ms frames, paced), and pacing helpers."""
