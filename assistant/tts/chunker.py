"""Cut a stream of reply text into pieces a TTS engine can speak: the first clause as early as possible
(time to first audio), then whole sentences (natural prosody), never longer than ``max_chars``.

Sentence ends are :mod:`assistant.tts.text`'s (newlines, ``. ! ? …`` before a space but not after ``Mr.``
or inside ``3.5``, CJK ``。！？；`` anywhere). On top of them, the chunker adds:
  * before the first chunk only: a clause break (``, ; : —`` followed by a space, or CJK ``，、：``) ends it
    once the clause is ``first_min_chars`` long (a CJK letter counts as two: it takes as long to say); and a
    later chunk too while the chunks before it hold fewer than ``runway_chars`` (a voice-chat reply: after "No,"
    comes "I'm sorry," on its own, not the whole sentence the model is still writing);
  * where a clause break may end a chunk, a clause the responder has been writing for ``phrase_break_ms`` with no
    mark yet is cut before a joining word (:func:`~assistant.tts.text.phrase_break`: "20 ounces of iced coffee |
    with whole milk and ..."), rather than leave the listener in silence while a slow model writes the rest; text
    that comes quickly (an echo, a model with a core to itself) reaches its clause mark first and is not cut;
  * a chunk longer than ``max_chars`` is cut at its last space (or CJK clause mark) before the limit;
  * every piece is shaped for the ear (:mod:`assistant.tts.speakable`: Markdown, lists, URLs, symbols and units
    in the reply's language), and pieces with nothing to say are dropped. Every responder's text comes through
    here, so the shaping is the same for all of them; it works per piece, which is safe for a stream because
    pieces end at newlines (where Markdown's line syntax starts) and only whole pieces are shaped.
A trailing ``.`` is held until the next character arrives, since ``3.`` may become ``3.5``; :meth:`flush`
releases everything at the end of the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from assistant.config import ChunkerConfig
from assistant.tts.speakable import Speakable, speakable
from assistant.tts.text import DASHES, find_break, is_cjk, is_clause_break, phrase_break, spoken_length

HARD_LIMIT_FACTOR = 2  # text with no space at all (a URL, CJK with no marks) is cut hard at 2 × max_chars


class TextChunker:
    """Incremental chunker for one reply: ``push(delta)`` as text streams in, ``flush()`` at the end.

    After :meth:`flush` the chunker is ready for the next reply (the first-clause rule applies again).
    """

    def __init__(self, cfg: ChunkerConfig | None = None, *, first_min_chars: int | None = None,
                 max_chars: int | None = None, strip_markdown: bool = True, language: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        cfg = cfg or ChunkerConfig()
        self.first_min_chars = cfg.first_min_chars if first_min_chars is None else first_min_chars
        self.max_chars = max(8, cfg.max_chars if max_chars is None else max_chars)
        self.runway_chars = cfg.runway_chars
        self.phrase_break_s = cfg.phrase_break_ms / 1000
        self.clock = clock
        self.strip_markdown = strip_markdown
        self.shape = Speakable(language)  # the reply's language when known (else each piece's script says)
        self._buf = ""
        self._sent_first = False
        self._released = 0  # spoken length of the chunks released so far (for runway_chars)
        self._pending_since: float | None = None  # when the text not yet released began to come (phrase_break_ms)

    def reset(self) -> None:
        """Drop pending text (barge-in) and start a new reply."""
        self._buf = ""
        self._sent_first = False
        self._released = 0
        self._pending_since = None
        self.shape.reset()

    @property
    def pending(self) -> str:
        """Text received but not yet released."""
        return self._buf

    def push(self, delta: str) -> list[str]:
        """Add a text delta; return the chunks that are now complete (often none)."""
        if self._pending_since is None and delta.strip():
            self._pending_since = self.clock()
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of the reply: return every remaining chunk and reset for the next reply."""
        out = self._drain(final=True)
        rest = self._emit(self._buf)
        if rest:
            out.append(rest)
        self.reset()
        return out

    # --- internals -----------------------------------------------------------------------------------

    def _drain(self, *, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            at_clause = not self._sent_first or self._released < self.runway_chars
            end = find_break(self._buf, final=final, clause_min_chars=self.first_min_chars if at_clause else None)
            if end is None and at_clause and not final and self._waited_long():
                end = phrase_break(self._buf)
            if end is None:
                end = self._forced_break(self._buf)
            if end is None:
                return out
            piece, self._buf = self._buf[:end], self._buf[end:].lstrip()
            self._pending_since = self.clock() if self._buf.strip() else None
            chunk = self._emit(piece)
            if chunk:
                out.append(chunk)
                self._sent_first = True
                self._released += spoken_length(chunk)

    def _waited_long(self) -> bool:
        """The text not yet released has been coming for ``phrase_break_ms`` (0: never)."""
        return (self.phrase_break_s > 0 and self._pending_since is not None
                and self.clock() - self._pending_since >= self.phrase_break_s)

    def _emit(self, piece: str) -> str:
        text = self.shape(piece) if self.strip_markdown else piece.strip()
        # Nothing to say (only punctuation or markup): drop it rather than send TTS an empty request.
        return text if any(c.isalnum() for c in text) else ""

    def _forced_break(self, buf: str) -> int | None:
        """A cut for text with no sentence end within ``max_chars``.

        Preference: the last clause mark past a third of the limit, else the last space, else a CJK
        character boundary, else the first space after the limit; a hard cut only at twice the limit.
        """
        limit = self.max_chars
        if len(buf) <= limit:
            return None
        for k in range(limit, limit // 3, -1):
            if is_clause_break(buf, k - 1) and buf[k - 1] not in DASHES:
                return k
        space = max(buf.rfind(" ", 0, limit + 1), buf.rfind("\t", 0, limit + 1))
        if space > 0:
            return space + 1
        for k in range(limit, 0, -1):
            if is_cjk(buf[k - 1]) or is_cjk(buf[k]):
                return k
        space = buf.find(" ", limit)
        if space > 0:
            return space + 1
        if len(buf) >= HARD_LIMIT_FACTOR * limit:
            return limit
        return None


__all__ = ["HARD_LIMIT_FACTOR", "TextChunker", "speakable"]
