"""What a voice's prompt costs the model, computed once: an LRU bounded by bytes, keyed by content hash.

Three kinds of entries, all derived from a voice (or its reference clip) and nothing else:

``clip``  reference clip bytes + rate + transcript → the voice's prompt (speech tokens, prompt mel, x-vector):
          the same clip passed again as ``speaker_wav`` skips the ONNX front end.
``flow``  the prompt's flow state (`flow_prefix.FlowPrefix`): encoder output and estimator keys/values of every
          prompt frame at every Euler step. By far the largest (≈ 4.6 MB per prompt frame for the 0.5B flow
          in float32: 56 attention layers x 10 steps x 2 CFG rows x K and V x 512), and what a cold first
          chunk would otherwise recompute.
``llm``   the speech LLM's keys/values of the fixed start of its input (``sos`` + the prompt text's ids).

Keys are hashes of the tensors' bytes (`digest`), so two prompt objects with equal content share an entry
and a changed voice never hits a stale one. The vocoder has no prompt-dependent state: its streaming state
starts from zeros for every request.

Thread-safe. Entries are built outside the lock (two threads may build the same entry once each; the
second result is kept); an entry larger than the whole budget is returned but not kept.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar, cast

import numpy as np
import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
KINDS = ("clip", "flow", "llm")
DEFAULT_MAX_BYTES = 4 << 30


def digest(*parts: object) -> str:
    """A content hash of tensors, arrays and plain values (dtype and shape included)."""
    h = hashlib.sha1()
    for part in parts:
        if isinstance(part, torch.Tensor):
            t = part.detach().to("cpu").contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(part, np.ndarray):
            a = np.ascontiguousarray(part)
            h.update(f"A{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
        else:
            h.update(repr(part).encode())
        h.update(b"|")
    return h.hexdigest()


def nbytes_of(obj: object) -> int:
    """Bytes of the tensors in ``obj`` (an object with ``nbytes``, a tensor, or nested dicts/lists/tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    size = getattr(obj, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(obj, dict):
        return sum(nbytes_of(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes_of(v) for v in obj)
    fields = getattr(obj, "__dict__", None)
    if isinstance(fields, dict):
        return sum(nbytes_of(v) for v in fields.values() if isinstance(v, (torch.Tensor, dict, list, tuple)))
    return 0


class PromptCache:
    """LRU of computed voice prompts by content hash, bounded by ``max_bytes`` (see the module doc)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict[tuple[str, str], tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = dict.fromkeys(KINDS, 0)
        self.misses = dict.fromkeys(KINDS, 0)
        self.evictions = 0
        self.oversize = 0

    def get(self, kind: str, key: str) -> object | None:
        """The entry, refreshed in the LRU order, or None (counted as a hit or a miss)."""
        with self._lock:
            item = self._items.get((kind, key))
            if item is None:
                self.misses[kind] = self.misses.get(kind, 0) + 1
                return None
            self._items.move_to_end((kind, key))
            self.hits[kind] = self.hits.get(kind, 0) + 1
            return item[0]

    def put(self, kind: str, key: str, value: object) -> None:
        size = nbytes_of(value)
        with self._lock:
            old = self._items.pop((kind, key), None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                self.oversize += 1
                log.warning("prompt cache: %s entry of %.0f MB exceeds the %.0f MB budget; not kept",
                            kind, size / 2**20, self.max_bytes / 2**20)
                return
            self._items[(kind, key)] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes and self._items:
                (k, _), (_, s) = self._items.popitem(last=False)
                self.bytes -= s
                self.evictions += 1
                log.info("prompt cache: evicted kind=%s size_mb=%.1f", k, s / 2**20)

    def resize(self, kind: str, key: str) -> None:
        """Re-measure an entry that grew in place (e.g. a flow prefix that built a reduced-step solver)."""
        with self._lock:
            item = self._items.get((kind, key))
        if item is not None:
            self.put(kind, key, item[0])

    def get_or_make(self, kind: str, key: str, make: Callable[[], T]) -> T:
        """The entry, or ``make()`` kept as it. Each kind has one maker (its call site), so what is found under
        a kind is what that maker makes."""
        found = self.get(kind, key)
        if found is not None:
            return cast(T, found)
        value = make()
        self.put(kind, key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def stats(self) -> dict[str, object]:
        """Counters for logs, the bench and /metrics."""
        with self._lock:
            per_kind = {k: sum(1 for (kind, _) in self._items if kind == k) for k in KINDS}
            return {
                "entries": len(self._items),
                "entries_by_kind": per_kind,
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "hits": dict(self.hits),
                "misses": dict(self.misses),
                "evictions": self.evictions,
                "oversize": self.oversize,
            }


__all__ = ["PromptCache", "digest", "nbytes_of"]
