"""Short pieces a CPU voice has already spoken, kept to speak again at once (``tts.phrase_cache_mb``).

A voice chat's replies open with few phrases ("Sure,", "I'm sorry,", "You said:"), and the chunker sends such a
first clause to the voice on its own (``chunker.reply_first_min_chars``): the caller waits for it, and on two cores
Piper took ~125 ms (p50) to make "I'm sorry," in one call, ~205 ms (p50; p90 ~330-380) beside three other calls
(docs/latency.md). The second time a piece is asked for
with the same voice, language, speed and pitch, its audio is already here.

What is kept and who may read it:

- only pieces of at most ``tts.phrase_cache_chars`` characters (openers repeat; a whole sentence seldom does), and
  only audio made to its end (a synthesis stopped by a barge-in keeps nothing);
- only requests that ask for it (``TTSRequest.reuse_audio``: the conversation's replies) read or fill it, so a TTS
  API caller cannot learn by timing what the assistant said to someone else, and never a cloned voice
  (``reference``) or an instruction;
- least recently used first out, bounded by the audio's bytes.

A repeat sounds the same each time: Piper samples its noise afresh per synthesis, a cached piece does not.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from assistant.tts.base import TTSRequest

PhraseKey = tuple[Hashable, ...]


class PhraseCache:
    """Audio by (text, voice, language, speed, pitch, seed): least recently used out past ``max_bytes``."""

    def __init__(self, max_bytes: int, max_chars: int) -> None:
        if max_bytes < 0 or max_chars < 0:
            raise ValueError("the phrase cache's size and its longest piece must be ≥ 0")
        self.max_bytes = max_bytes
        self.max_chars = max_chars
        self._items: OrderedDict[PhraseKey, tuple[np.ndarray, ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # an engine's requests may come from several event loops' threads
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def key(self, text: str, request: TTSRequest) -> PhraseKey | None:
        """The key for ``text`` (already stripped) spoken as ``request`` asks, or None where nothing is kept: the
        cache off, a request that did not ask, a piece too long, a cloned voice or an instruction."""
        if (self.max_bytes == 0 or not request.reuse_audio or len(text) > self.max_chars
                or request.reference is not None or request.instruct):
            return None
        return (text, request.voice or "", request.language or "", round(request.speed, 4),
                round(request.pitch, 4), request.seed)

    def get(self, key: PhraseKey) -> tuple[np.ndarray, ...] | None:
        """The piece's chunks (read-only), or None; a hit becomes the most recently used."""
        with self._lock:
            chunks = self._items.get(key)
            if chunks is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return chunks

    def put(self, key: PhraseKey, chunks: list[np.ndarray]) -> None:
        """Keep a piece made to its end; the least recently used go while the bytes exceed the bound (a piece larger
        than the whole bound is not kept). The cache takes the arrays themselves (made read-only): a caller hands it
        copies of its own."""
        kept = tuple(_frozen(c) for c in chunks)
        size = sum(c.nbytes for c in kept)
        if not kept or size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= sum(c.nbytes for c in old)
            self._items[key] = kept
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= sum(c.nbytes for c in dropped)


def _frozen(chunk: np.ndarray) -> np.ndarray:
    """The chunk as kept: float32, flat, read-only (a copy only where it was not float32 already)."""
    kept = np.asarray(chunk, dtype=np.float32).reshape(-1)
    kept.setflags(write=False)
    return kept
