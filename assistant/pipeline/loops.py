"""No loops: a reply that starts to repeat itself is stopped at the end of the last new sentence, whatever
responder wrote it.

A small model decoding greedily falls into loops ("I'm not a phonebot. I'm a voice assistant. I'm not a
phonebot. …", "la France, la France, la France"); a bigger one sometimes does too. :class:`LoopGuard` sits
between the responder's text deltas and the speech path (``turn_runner.py``) and decides, sentence by sentence,
what may be said:

  * the **first sentence** goes on clause by clause as it comes (the speech path waits for a clause mark before
    its first words anyway, so this holds nothing back from the ear); only a stutter inside it (one word said
    :data:`STUTTER_TIMES` times in a row, or a run of two to :data:`STUTTER_WORDS` words twice) stops the reply
    where the stutter began;
  * **every later sentence** is held until it is complete (its voice would wait for its end anyway: the first
    one is still playing), then said unless it repeats: the same words as an earlier sentence or clause, a run of
    :data:`RUN_WORDS` words already said, or a stutter. The first repeat ends the reply: the responder's stream
    is closed, and nothing after the last new sentence is said.

Words are compared lower-cased without punctuation; CJK text, which has no spaces, by its characters.
"""

from __future__ import annotations

import re

from assistant.tts.text import ends_on_letter_clause_mark, find_break, has_cjk, is_cjk

RUN_WORDS = 5  # a run this long said again is a loop ("a chatbot designed to" is 4: a turn of phrase, not one)
STUTTER_WORDS = 4  # a run of two to this many words said twice in a row ("la France, la France"), or one word
STUTTER_TIMES = 3  # said this many times in a row ("1 1 1"), is a loop inside one sentence
CJK_RUN_CHARS = 8  # CJK: a run of this many letters said again is a loop
MIN_CLAUSE_WORDS = 3  # a later sentence that says an earlier clause of this many words again is a loop
MAX_HELD_CHARS = 200  # text with no mark this long goes on as it is (below the chunker's forced break, 220)

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_CJK_PIECE = re.compile(r"[0-9a-z]+|[^\W\d_a-z]", re.I)  # in CJK text: a number or Latin word, or one letter
_CLAUSE_END = re.compile(r"[,;:.!?…—](?=\s)\s*|[，、：；。！？]")  # where the speech path may break a first sentence


def words(text: str) -> list[str]:
    """``text``'s words, lower-cased, punctuation dropped; CJK letters one by one, and a number or a Latin word
    among them whole ("1公斤等于1000克" → 1, 公, 斤, 等, 于, 1000, 克: "1000" is no stutter)."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        if has_cjk(w):
            out.extend(_CJK_PIECE.findall(w))
        else:
            out.append(w)
    return out


def stutter_at(ws: list[str]) -> int | None:
    """Where the first stutter in ``ws`` starts repeating (the index of its first repeat's first word), or None:
    one word said :data:`STUTTER_TIMES` times in a row, or a run of 2 to :data:`STUTTER_WORDS` words twice."""
    found: list[int] = []
    for size in range(1, STUTTER_WORDS + 1):
        times = STUTTER_TIMES if size == 1 else 2
        for start in range(0, len(ws) - size * times + 1):
            run = ws[start:start + size]
            if all(ws[start + k * size:start + (k + 1) * size] == run for k in range(1, times)):
                found.append(start + size)
                break
    return min(found) if found else None


def _runs(ws: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(ws[i:i + size]) for i in range(len(ws) - size + 1)}


def _run_size(ws: list[str]) -> int:
    return CJK_RUN_CHARS if ws and all(len(w) == 1 and is_cjk(w) for w in ws) else RUN_WORDS


class LoopGuard:
    """Text deltas in (:meth:`feed`), what may be said out; :attr:`stopped` once the reply repeats itself (the
    caller closes the responder's stream then). :meth:`finish` gives what was held when the reply ends."""

    def __init__(self) -> None:
        self.said = ""  # what went on
        self.held = ""  # a later sentence still coming
        self.first_done = False  # the first sentence has ended
        self.sentences: list[str] = []  # the sentences said, as words joined
        self.spoken: list[str] = []  # every word said so far
        self.stopped = False
        self.dropped = ""  # what a loop kept from being said

    def feed(self, delta: str) -> str:
        """What of ``delta`` may be said now ("" while a sentence is held, or once stopped)."""
        if self.stopped:
            self.dropped += delta
            return ""
        self.held += delta
        out = self._first() if not self.first_done else ""
        while self.first_done and self.held and not self.stopped:
            end = find_break(self.held, final=False)
            if end is None:
                if len(self.held) <= MAX_HELD_CHARS:
                    break
                end = len(self.held)
            out += self._sentence(self.held[:end])
            self.held = self.held[end:]
        return out

    def finish(self) -> str:
        """The reply ended: what is still held, if it is new."""
        if self.stopped or not self.held:
            return ""
        if not self.first_done:
            return self._first(final=True)
        held, self.held = self.held, ""
        return self._sentence(held)

    def _first(self, final: bool = False) -> str:
        """The first sentence: said up to its latest clause mark as it comes (the speech path waits for one
        anyway), unless it stutters."""
        text = self.said + self.held
        end = find_break(text, final=final)
        cut = self._first_cut(text[:end] if end is not None else text)
        if cut is not None:
            return self._stop(cut)
        if end is not None or final:
            upto = end if end is not None else len(text)
        else:
            marks = list(_CLAUSE_END.finditer(text, len(self.said)))
            upto = marks[-1].end() if marks else len(self.said)
            if ends_on_letter_clause_mark(text):  # "I'm sorry," as it comes, as the speech path breaks it
                upto = len(text)
            if len(text) - upto > MAX_HELD_CHARS:  # no mark for long: up to the last space, as the chunker cuts
                upto = max(upto, text.rfind(" ") + 1)
        upto = max(upto, len(self.said))
        out = text[len(self.said):upto]
        self.said, self.held = text[:upto], text[upto:]
        if end is not None or final:
            self.first_done = True
            self._note_sentence(self.said)
            if self.held:
                return out + self.feed("")
        return out

    # --- deciding ----------------------------------------------------------------------------------------
    def _first_cut(self, text: str) -> int | None:
        """Where a stutter in the first sentence begins in ``text`` (a character index), or None."""
        ws = words(text)
        at = stutter_at(ws)
        if at is None:
            return None
        return _char_index(text, at)

    def _stop(self, cut: int) -> str:
        """Stop at character ``cut`` of said + held: what of the held text may still go on."""
        whole = self.said + self.held
        keep = max(cut, len(self.said))
        out = whole[len(self.said):keep].rstrip(" ,;:—–-")
        self.dropped = whole[keep:]
        self.said += out
        self.held = ""
        self.stopped = True
        return out

    def _sentence(self, sentence: str) -> str:
        ws = words(sentence)
        if not ws:
            self.said += sentence
            return sentence
        joined = " ".join(ws)
        size = _run_size(ws)
        if (joined in self.sentences or _runs(ws, size) & _runs(self.spoken, size)
                or stutter_at(ws) is not None):
            self.dropped = sentence
            self.held = ""
            self.stopped = True
            return ""
        self._note_sentence(sentence)
        self.said += sentence
        return sentence

    def _note_sentence(self, sentence: str) -> None:
        ws = words(sentence)
        self.sentences.append(" ".join(ws))
        # Its clauses too: "I'm sorry, I'm not a phonebot." then "I'm not a phonebot." is said again.
        self.sentences += [" ".join(c) for c in map(words, _CLAUSE_END.split(sentence)) if len(c) >= MIN_CLAUSE_WORDS]
        self.spoken += ws


def _char_index(text: str, word_index: int) -> int:
    """The character index in ``text`` where its ``word_index``-th word (as :func:`words` counts) starts."""
    seen = 0
    for m in _WORD.finditer(text.lower()):
        w = m.group(0)
        starts = [p.start() for p in _CJK_PIECE.finditer(w)] if has_cjk(w) else [0]
        for offset in starts:
            if seen == word_index:
                return m.start() + offset
            seen += 1
    return len(text)


def loops(text: str) -> bool:
    """Whether a whole reply repeats itself (the guard would stop it)."""
    guard = LoopGuard()
    guard.feed(text)
    guard.finish()
    return guard.stopped


def without_loops(text: str) -> str:
    """A whole reply as the guard lets it be said."""
    guard = LoopGuard()
    return guard.feed(text) + guard.finish()


__all__ = ["LoopGuard", "loops", "stutter_at", "without_loops", "words"]
