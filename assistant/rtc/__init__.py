"""WebRTC transport only, no conversation logic: audio in (``inbound``: frames → 16 kHz mono), the receive buffer
(``jitter``), the outgoing reply track (``outbound``: 20 ms frames, paced), pacing helpers, the sent packets' audio
level from numpy (``audio_level``, installed here for every peer of the process), and loopback ICE for clients and
servers on one machine (``loopback_ice``: tests and benches only)."""

from assistant.rtc.audio_level import install as _install_audio_level

_install_audio_level()
