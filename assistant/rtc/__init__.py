"""WebRTC transport only, no conversation logic: audio in (``inbound``: frames → 16 kHz mono), the receive buffer
(``jitter``), the outgoing reply track (``outbound``: 20 ms frames, paced), pacing helpers, the sent packets' audio
level from numpy (``audio_level``: the modules that make peers install it), and loopback ICE for clients and servers
on one machine (``loopback_ice``: tests and benches only).

Nothing is imported here: the CLI reads ``loopback_ice`` without loading aiortc or PyAV."""
