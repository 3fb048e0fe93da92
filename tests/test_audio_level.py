"""The sent packets' audio level (RFC 6465) from numpy is aiortc's own figure, frame for frame, and is the one
aiortc's sender uses once ``assistant.rtc`` is imported."""

from __future__ import annotations

import aiortc.rtcrtpsender
import av
import numpy as np
import pytest

import assistant.rtc  # noqa: F401  (installs it)
from assistant.rtc import audio_level


def _frame(samples: np.ndarray, layout: str) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate = 48_000
    return frame


@pytest.mark.parametrize("layout", ["mono", "stereo"])
def test_the_level_is_aiortcs_on_every_kind_of_frame(layout: str) -> None:
    original = audio_level.aiortc_audio_level
    assert original is not None and original is not audio_level.audio_level_dbov
    rng = np.random.default_rng(7)
    channels = 2 if layout == "stereo" else 1
    for n in (1, 160, 960):
        for peak in (0, 1, 3, 100, 3000, 20_000, 32_767):
            pcm = rng.integers(-peak, peak + 1, n * channels, dtype=np.int16)
            frame = _frame(pcm, layout)
            assert audio_level.audio_level_dbov(frame) == original(frame), (layout, n, peak)
    full = _frame(np.full(960 * channels, -32_768, dtype=np.int16), layout)  # louder than full scale: clamped to 0
    assert audio_level.audio_level_dbov(full) == original(full) == 0


def test_aiortcs_sender_uses_it() -> None:
    assert aiortc.rtcrtpsender.rtp.compute_audio_level_dbov is audio_level.audio_level_dbov
    audio_level.install()  # again: nothing changes, aiortc's own is still the one kept
    assert audio_level.aiortc_audio_level is not audio_level.audio_level_dbov
