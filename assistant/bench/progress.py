"""The bench's progress while it runs, on stderr (the tables go to stdout): one line rewritten in place on a
terminal, one line per turn otherwise (a log, a CI job)."""

from __future__ import annotations

import sys
from typing import TextIO

from assistant.bench.report import TurnResult


class Progress:
    """Counts turns across every protocol of a run and says where the run is after each."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.heard = 0
        self.label = ""
        self._width = 0

    def run(self, label: str) -> None:
        """A new protocol's turns start."""
        self.label = label

    def say(self, text: str) -> None:
        """A line about the run (a step before the turns begin)."""
        self._write(f"bench v2v: {text}")

    def turn(self, turn: TurnResult) -> None:
        """One turn measured."""
        self.done += 1
        self.heard += turn.status == "ok"
        v2v = turn.columns.get("v2v_ms")
        what = f"v2v {v2v:.0f} ms" if v2v is not None else (turn.reason or turn.status)
        self._write(f"bench v2v: [{self.label}] turn {self.done}/{self.total} {turn.file}: {turn.status}, {what} "
                    f"({self.heard} heard so far)")

    def close(self) -> None:
        if self.live and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0

    def _write(self, line: str) -> None:
        if self.live:
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


__all__ = ["Progress"]
