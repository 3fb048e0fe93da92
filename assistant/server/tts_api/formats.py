"""Speech as the files OpenAI's speech API promises: wav, pcm, flac, opus, mp3, aac, encoded as it streams.

:class:`StreamEncoder` takes float32 mono chunks and gives back the bytes of one file, a piece at a time, so a
client can play the first words while the rest is still being synthesised. wav and pcm are written here; the
compressed formats go through PyAV (FFmpeg) into a sink that cannot seek, so every muxer writes a streamable
file (ogg pages for opus, ADTS frames for aac, a FLAC stream without a total length).
"""

from __future__ import annotations

import contextlib
import struct
from typing import TYPE_CHECKING

import numpy as np

from assistant.audio import float_to_s16
from assistant.server.tts_api.service import pcm_bytes

if TYPE_CHECKING:
    import av
    from av.container import OutputContainer

# response_format → (container, codec, the codec's sample format)
CODECS: dict[str, tuple[str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "s16p"),
    "opus": ("ogg", "libopus", "s16"),
    "aac": ("adts", "aac", "fltp"),
    "flac": ("flac", "flac", "s16"),
}
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
BITRATES = {"mp3": 64_000, "opus": 32_000, "aac": 64_000}
# ogg holds a page until it has a second of audio: flush every 100 ms so opus streams too.
MUXER_OPTIONS = {"ogg": {"page_duration": "100000"}}


class EncoderUnavailable(RuntimeError):
    """This PyAV/FFmpeg build cannot write the format; the message names the codec."""


def streaming_wav_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes 0xFFFFFFFF, as ffmpeg and browsers accept)."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", unknown))


def available_formats() -> tuple[str, ...]:
    """The formats this installation can write (wav and pcm always; the rest if FFmpeg has the encoder)."""
    out = ["wav", "pcm"]
    for fmt, (_, codec, _) in CODECS.items():
        try:
            import av

            av.Codec(codec, "w")
            out.append(fmt)
        except Exception:  # PyAV missing or built without this encoder
            continue
    return tuple(out)


class _Sink:
    """A write-only file for PyAV: no ``seek``, so muxers write streamable output; ``take`` empties it."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class StreamEncoder:
    """float32 mono chunks at ``sample_rate`` → pieces of one ``fmt`` file; ``finish`` gives the tail."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate
        self.content_type = CONTENT_TYPES[fmt]
        self._header_sent = False
        self._container: OutputContainer | None = None
        if fmt in CODECS:
            self._open(*CODECS[fmt])

    def _open(self, container: str, codec: str, sample_format: str) -> None:
        try:
            import av
        except ImportError as exc:  # pragma: no cover - av is a core dependency
            raise EncoderUnavailable(f"{self.fmt} needs PyAV (pip install av)") from exc
        self._sink = _Sink()
        try:
            self._container = av.open(self._sink, mode="w", format=container,
                                      options=MUXER_OPTIONS.get(container, {}))
            stream = self._container.add_stream(codec, rate=self.sample_rate, layout="mono")
        except Exception as exc:  # FFmpeg without this muxer or encoder
            raise EncoderUnavailable(f"this server's FFmpeg cannot write {self.fmt} ({codec}): {exc}") from None
        if not isinstance(stream, av.audio.stream.AudioStream):
            raise EncoderUnavailable(f"{codec} is not an audio codec in this server's FFmpeg")
        if self.fmt in BITRATES:
            stream.bit_rate = BITRATES[self.fmt]
        self._stream = stream
        self._format = sample_format

    def _frame(self, chunk: np.ndarray) -> av.AudioFrame:
        import av

        s16 = self._format.startswith("s16")
        data = float_to_s16(chunk).reshape(1, -1) if s16 else np.asarray(chunk, np.float32).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(data, format=self._format, layout="mono")
        frame.sample_rate = self.sample_rate
        return frame

    def encode(self, chunk: np.ndarray) -> bytes:
        """The bytes this chunk completes (maybe none yet: codecs work in frames)."""
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self.fmt == "pcm":
            return pcm_bytes(chunk)
        if self.fmt == "wav":
            head = b"" if self._header_sent else streaming_wav_header(self.sample_rate)
            self._header_sent = True
            return head + pcm_bytes(chunk)
        if chunk.size and self._container is not None:
            for packet in self._stream.encode(self._frame(chunk)):
                self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        """Flush the codec and close the file; the last bytes."""
        if self.fmt == "wav" and not self._header_sent:
            self._header_sent = True
            return streaming_wav_header(self.sample_rate)
        if self._container is None:
            return b""
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None
        return self._sink.take()

    def close(self) -> None:
        """Release the encoder without writing the tail (a cancelled stream)."""
        if self._container is not None:
            with contextlib.suppress(Exception):  # closing a half-written file may fail; nothing to keep
                self._container.close()
            self._container = None
