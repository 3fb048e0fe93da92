"""The audio level aiortc puts on each sent audio packet (RFC 6465), computed with numpy.

aiortc's sender computes the level of every audio frame it sends (``aiortc.rtp.compute_audio_level_dbov``) in a
Python loop over the frame's samples: ~0.13 ms of the event loop for a 20 ms mono frame at 48 kHz, 50 times a
second per call, on the one thread that carries every call's packets (a py-spy profile of a four-call server
on the 2-core Xeon found it at 3 % of the server's busy samples, about as much as SRTP). :func:`audio_level_dbov`
is the same figure (the same samples, the same formula, the same rounding) from numpy, and :func:`install` puts
it in aiortc's place for the process; the two places that make peers (``server/voice/session.py``, the voice chat's
and the Realtime WebRTC calls'; ``bench/v2v.py``, the bench's callers) call it before they make one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from av import AudioFrame

MAX_SAMPLE_VALUE = 32767
MIN_AUDIO_LEVEL = -127  # dBov: silence


def audio_level_dbov(frame: AudioFrame) -> int:
    """The level of ``frame`` in dBov (-127 to 0), exactly as aiortc computes it: every 16-bit value of the first
    plane, over ``frame.samples`` full-scale samples (a stereo frame's two channels both count, as there)."""
    plane = frame.planes[0]
    x = np.frombuffer(memoryview(plane), dtype=np.int16, count=plane.buffer_size // 2).astype(np.float64)
    energy = float(np.dot(x, x))
    if energy <= 0.0 or frame.samples <= 0:
        return MIN_AUDIO_LEVEL
    rms = math.sqrt(energy / (frame.samples * MAX_SAMPLE_VALUE * MAX_SAMPLE_VALUE))
    return round(min(max(20 * math.log10(rms), MIN_AUDIO_LEVEL), 0))


# aiortc's own function, kept when it is replaced (the test compares the two on the same frames).
aiortc_audio_level: Callable[[AudioFrame], int] | None = None


def install() -> None:
    """Use :func:`audio_level_dbov` for every audio frame aiortc sends in this process (idempotent)."""
    global aiortc_audio_level
    import aiortc.rtp

    if aiortc.rtp.compute_audio_level_dbov is not audio_level_dbov:
        aiortc_audio_level = aiortc.rtp.compute_audio_level_dbov
        aiortc.rtp.compute_audio_level_dbov = audio_level_dbov
