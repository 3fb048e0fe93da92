"""A microphone stand-in for the bench client: an aiortc audio track that plays utterances in real time.

Between utterances it sends digital silence, so the peer sees one continuous stream (20 ms frames at
48 kHz, continuous pts), exactly like a browser microphone that stays open. Each queued utterance carries
one marked sample (where the manifest says the speech ends); the track stamps the moment the frame
holding that sample is handed to aiortc, on the bench's clock (:func:`now`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from assistant.audio import FRAME_MS, FRAME_SAMPLES, WEBRTC_RATE, float_to_s16, read_audio, resample
from assistant.rtc.pacing import FramePacer, s16_mono_frame

log = logging.getLogger(__name__)

# The bench's clock: epoch seconds (comparable with the server's ``time.time()`` marks on one host) that
# advance with ``perf_counter`` so an NTP step during a run cannot bend a measured interval.
_EPOCH0 = time.time()
_PERF0 = time.perf_counter()


def now() -> float:
    """Epoch seconds on a monotonic clock (see the module comment)."""
    return _EPOCH0 + (time.perf_counter() - _PERF0)


@dataclass(frozen=True)
class Utterance:
    """One spoken file, ready to play: 48 kHz mono int16 and the sample where the speech ends."""

    name: str
    text: str
    pcm: np.ndarray  # int16, 48 kHz mono
    speech_end_sample: int  # index into ``pcm``

    @property
    def seconds(self) -> float:
        return len(self.pcm) / WEBRTC_RATE

    @property
    def speech_end_s(self) -> float:
        return self.speech_end_sample / WEBRTC_RATE


def read_manifest(audio_dir: Path) -> dict[str, dict]:
    """``manifest.json`` of a speech folder, keyed by file name; for a folder labelled as the human set is
    (``labels.json`` and no manifest, :func:`read_labels`) its labels in the manifest's names; empty if there is
    neither."""
    path = audio_dir / "manifest.json"
    if not path.is_file():
        if (audio_dir / LABELS).is_file():
            return {entry["file"]: entry for entry in read_labels(audio_dir)}
        return {}
    return {entry["file"]: entry for entry in json.loads(path.read_text(encoding="utf-8"))}


LABELS = "labels.json"  # the human recordings' labels (``../shared/audio/human``; its README)


def read_labels(folder: Path) -> list[dict[str, Any]]:
    """One manifest entry per clip of a folder labelled as the human set is, in the labels' order.

    Those labels name the fields differently from the manifests (``speech_end_s`` for ``speech_ends_s``;
    ``pauses_s`` holds the *lengths* of the gaps, not where they lie): each clip comes back as a manifest entry
    (``speech_starts_s``, ``speech_ends_s``, no labelled pause positions: the VAD finds the pauses) that keeps the
    rest (``pause_lengths_s``, ``slots``, ``intent``)."""
    out = []
    for row in json.loads((folder / LABELS).read_text(encoding="utf-8")):
        lengths = [float(p) for p in row.get("pauses_s", [])]
        out.append({
            "file": row["file"], "split": "human", "lang": "en", "engine": "human", "voice": "human",
            "kind": "pauses" if lengths else "fluent",
            "speech_starts_s": float(row["speech_start_s"]), "speech_ends_s": float(row["speech_end_s"]),
            "pause_lengths_s": lengths, "slots": {k: v.strip() for k, v in row.get("slots", {}).items()},
            "intent": row.get("intent", ""),
        })
    return out


def load_utterance(path: Path, manifest: dict[str, dict] | None = None) -> Utterance:
    """Read a speech file and resample it to 48 kHz; its speech end comes from the manifest.

    A file missing from the manifest must still be playable: its speech end is then the last sample
    above −45 dBFS in 10 ms frames, the manifest's own rule.
    """
    path = Path(path)
    entry = (manifest if manifest is not None else read_manifest(path.parent)).get(path.name)
    x, sr = read_audio(path)
    if entry is not None and "speech_ends_s" in entry:
        end_s = float(entry["speech_ends_s"])
        text = str(entry.get("text", ""))
    else:
        end_s = _energy_speech_end(x, sr)
        text = ""
        log.warning("bench.audio no_manifest_entry file=%s speech_end_s=%.2f (from level)", path.name, end_s)
    pcm = float_to_s16(resample(x, sr, WEBRTC_RATE))
    end = min(len(pcm) - 1, max(0, round(end_s * WEBRTC_RATE)))
    return Utterance(name=path.name, text=text, pcm=pcm, speech_end_sample=end)


def _energy_speech_end(x: np.ndarray, sr: int, floor_dbfs: float = -45.0, frame_s: float = 0.01) -> float:
    n = max(1, int(sr * frame_s))
    frames = len(x) // n
    if frames == 0:
        return len(x) / sr
    rms = np.sqrt(np.mean(x[: frames * n].reshape(frames, n).astype(np.float64) ** 2, axis=1))
    loud = np.nonzero(rms >= 10 ** (floor_dbfs / 20))[0]
    return float((loud[-1] + 1) * frame_s) if loud.size else len(x) / sr


@dataclass
class Playback:
    """One queued utterance; the two futures resolve on the bench clock as the track plays it."""

    utterance: Utterance
    speech_end_at: asyncio.Future[float]  # frame holding the speech-end sample handed to aiortc
    finished_at: asyncio.Future[float]  # last frame of the file handed to aiortc
    on_speech_end: Callable[[float], None] | None = None  # called synchronously at that moment
    position: int = 0
    started_at: float | None = None


class UtteranceSource(MediaStreamTrack):
    """Plays queued utterances one after another in real time, silence otherwise.

    Frame k is released at ``start + k × 20 ms`` on the monotonic clock. When the event loop stalls,
    late frames go out back to back (a real microphone buffers too); pts stay continuous either way.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Playback] = deque()
        self._pacer = FramePacer(WEBRTC_RATE)
        self._pts = 0
        self._silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        self.frames_sent = 0
        self.late_frames = 0  # frames released more than one frame after they were due (loop stalls)

    def play(self, utterance: Utterance, on_speech_end: Callable[[float], None] | None = None) -> Playback:
        """Queue ``utterance`` after whatever is playing; returns its :class:`Playback`."""
        loop = asyncio.get_running_loop()
        pb = Playback(utterance, loop.create_future(), loop.create_future(), on_speech_end)
        self._queue.append(pb)
        return pb

    @property
    def playing(self) -> bool:
        return bool(self._queue)

    def _next_samples(self) -> tuple[np.ndarray, Playback | None, int]:
        """The next 960 samples, the playback they came from, and where it was before this frame."""
        while self._queue and self._queue[0].position >= len(self._queue[0].utterance.pcm):
            self._queue.popleft()
        if not self._queue:
            return self._silence, None, 0
        pb = self._queue[0]
        pcm = pb.utterance.pcm
        start = pb.position
        chunk = pcm[start : start + FRAME_SAMPLES]
        if len(chunk) < FRAME_SAMPLES:
            chunk = np.concatenate([chunk, np.zeros(FRAME_SAMPLES - len(chunk), dtype=np.int16)])
        pb.position = start + FRAME_SAMPLES
        return chunk, pb, start

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if await self._pacer.wait(self._pts) > FRAME_MS / 1000:
            self.late_frames += 1
        samples, pb, start = self._next_samples()
        frame = s16_mono_frame(samples, WEBRTC_RATE, self._pts)
        self._pts += FRAME_SAMPLES
        self.frames_sent += 1
        if pb is not None:
            # The frame is handed over when recv returns; stamping here is the same instant to within
            # the few instructions below (the caller encodes it right away).
            t = now()
            if pb.started_at is None:
                pb.started_at = t
            end = pb.utterance.speech_end_sample
            if start <= end < start + FRAME_SAMPLES and not pb.speech_end_at.done():
                if pb.on_speech_end is not None:
                    pb.on_speech_end(t)
                pb.speech_end_at.set_result(t)
            if pb.position >= len(pb.utterance.pcm) and not pb.finished_at.done():
                pb.finished_at.set_result(t)
        return frame

    def stop(self) -> None:
        super().stop()
        for pb in self._queue:
            for fut in (pb.speech_end_at, pb.finished_at):
                if not fut.done():
                    fut.cancel()
        self._queue.clear()
