"""The chunk path's dealings with the host that must not make it wait for the device: stage timings and uploads.

On CUDA a chunk's work is queued and runs later; anything that makes the host wait for it (``synchronize``, a
copy of a pageable host tensor to the device, which PyTorch follows with a stream sync) stalls the launches of
everything queued behind, which is what made the first chunk launch-bound. So:

- `StageClock` times a chunk's stages with CUDA events recorded on the current stream and reads them only once
  the chunk's audio has reached the host (which had to wait for them anyway); elsewhere it reads the clock.
- `upload` copies host values to the device from pinned memory without blocking (the caching host allocator
  keeps the pinned block until the copy has run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


class StageClock:
    """Marks along one chunk (``mark(name)``), read as the milliseconds between consecutive marks (`ms`)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, torch.cuda.Event | float]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((name, event))
        else:
            self._marks.append((name, time.perf_counter()))

    def ms(self) -> dict[str, float]:
        """``{name: ms from the mark before it}`` for every mark but the first (on CUDA: waits for the last
        event, so read it after the chunk's audio is on the host)."""
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self._marks, self._marks[1:], strict=False):
            if isinstance(a, float) and isinstance(b, float):
                out[name] = 1000 * (b - a)
            elif isinstance(a, torch.cuda.Event) and isinstance(b, torch.cuda.Event):
                b.synchronize()
                out[name] = a.elapsed_time(b)
        return out


def upload(values: Sequence[int] | Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, without waiting for the device (pinned memory, non-blocking copy)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload_into(dst: torch.Tensor, values: Sequence[int] | Sequence[Sequence[int]]) -> None:
    """Copy a host list into a device buffer (a static graph input) without waiting for the device."""
    host = torch.tensor(values, dtype=dst.dtype)
    dst.copy_(host.pin_memory() if dst.device.type == "cuda" else host, non_blocking=True)


__all__ = ["StageClock", "upload", "upload_into"]
