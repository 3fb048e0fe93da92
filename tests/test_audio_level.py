"""The sent packets' audio level (RFC 6465) from numpy is aiortc's own figure, frame for frame, and is the one
aiortc's sender uses once a peer is made."""

from __future__ import annotations

import re
from pathlib import Path

import aiortc.rtcrtpsender
import av
import numpy as np
import pytest

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


@pytest.fixture(autouse=True)
def installed() -> None:
    audio_level.install()  # as the modules that make peers do


def test_aiortcs_sender_uses_it() -> None:
    assert aiortc.rtcrtpsender.rtp.compute_audio_level_dbov is audio_level.audio_level_dbov
    audio_level.install()  # again: nothing changes, aiortc's own is still the one kept
    assert audio_level.aiortc_audio_level is not audio_level.audio_level_dbov


def test_the_servers_and_the_benchs_peers_install_it() -> None:
    """Every module that makes a peer installs it first (a new one should too: only speed is lost without)."""
    package = Path(audio_level.__file__).resolve().parents[1]
    made = re.compile(r"=\s*RTCPeerConnection\(")  # a peer made, not one named in a docstring
    makers: dict[Path, int] = {}
    for path in package.rglob("*.py"):
        if (found := made.search(path.read_text(encoding="utf-8"))) is not None:
            makers[path] = found.start()
    assert {p.relative_to(package).as_posix() for p in makers} == {"server/voice/session.py", "bench/v2v.py"}
    for path, at in makers.items():
        assert path.read_text(encoding="utf-8").index("audio_level.install()") < at, path
