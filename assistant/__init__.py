"""assistant: a real-time spoken assistant over WebRTC with measured voice-to-voice latency."""

__version__ = "0.1.0"
