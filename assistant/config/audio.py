"""Audio in and the VAD (``[audio]``, ``[vad]``)."""

from __future__ import annotations

from dataclasses import dataclass

from assistant.config.fields import setting


@dataclass
class AudioConfig:
    own_receive_buffer: bool = setting(
        True, "replace aiortc's receive jitter buffer (80 ms prefetch; 280 ms behind after any lost packet) with ours"
    )
    jitter_buffer_packets: int = setting(
        1,
        "later packets that may overtake a missing one before it is given up as lost (the user's audio is "
        "released in order with no prefetch; aiortc's own buffer adds 80 ms, and 280 ms after any loss)",
    )
    jitter_buffer_max_packets: int = setting(6, "the most that wait grows to under measured jitter")
    jitter_adaptive: bool = setting(True, "size that wait to the measured interarrival jitter")
    reply_queue_ms: int = setting(60, "most reply audio queued in the outgoing track; bounds barge-in delay")


@dataclass
class VADConfig:
    threshold: float = setting(0.5, "speech probability above which a 32 ms window counts as speech")
    neg_threshold: float = setting(0.35, "probability below which a window counts as silence (hysteresis)")
    min_speech_ms: int = setting(160, "speech shorter than this is ignored (coughs, clicks)")
    end_silence_ms: int = setting(500, "silence that ends an utterance (the endpoint hangover)")
    speech_pad_ms: int = setting(96, "audio kept before the detected speech start and sent to ASR")
    max_utterance_s: float = setting(30.0, "an utterance longer than this is cut and transcribed")
