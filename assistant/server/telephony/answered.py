"""The calls already answered: a carrier's call id gets one media token, ever, within a call's longest life.

A Twilio signature carries no timestamp, so a captured webhook stays valid for ever; the replay guard
(``signatures.ReplayGuard``) remembers signatures only for ``telephony.replay_window_s``, in memory, on one gateway.
A call id (Twilio's CallSid, Telnyx's call control id) is unique per call, so remembering the ids answered is what
refuses a replay after that window, after a restart, or at another gateway: for ``telephony.max_call_s`` (a call
lasts no longer; past it the call is closed) plus the token's life.

The ids live in one SQLite file under ``server.data_dir`` (``telephony/answered_calls.sqlite3``), the folder the
gateways of one deployment already share for voices: every gateway that sees the file sees every answer. A row is
about 100 bytes (docs/telephony.md has the measured cost); rows past the memory are swept as new ones come.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "telephony/answered_calls.sqlite3"
SWEEP_EVERY = 256  # answers between two sweeps of the rows past their memory
BUSY_TIMEOUT_S = 2.0  # another gateway writing: wait this long for its lock


class AnsweredCalls:
    """``first_answer(carrier, call_id)`` is True once per call id within ``memory_s`` (see the module docstring)."""

    def __init__(self, path: Path, memory_s: float, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.memory_s = memory_s
        self.clock = clock  # wall clock: the file outlives this process and is shared with other gateways
        self._db: sqlite3.Connection | None = None  # opened at the first answer: a server without calls writes none
        self._lock = threading.Lock()
        self._since_sweep = 0

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS answered (carrier TEXT NOT NULL, call_id TEXT NOT NULL, "
                       "at REAL NOT NULL, PRIMARY KEY (carrier, call_id)) WITHOUT ROWID")
            db.execute("CREATE INDEX IF NOT EXISTS answered_at ON answered (at)")
            self._db = db
        return self._db

    def first_answer(self, carrier: str, call_id: str) -> bool:
        """Record ``call_id`` as answered; False when it already was (within the memory): a replay."""
        now = self.clock()
        with self._lock:
            db = self._open()
            self._since_sweep += 1
            if self._since_sweep >= SWEEP_EVERY:
                self._since_sweep = 0
                db.execute("DELETE FROM answered WHERE at < ?", (now - self.memory_s,))
            # An old row past the memory is taken over; a live one is kept and the insert does nothing.
            cur = db.execute("INSERT INTO answered (carrier, call_id, at) VALUES (?, ?, ?) ON CONFLICT (carrier, "
                             "call_id) DO UPDATE SET at = excluded.at WHERE answered.at < ?",
                             (carrier, call_id, now, now - self.memory_s))
            return cur.rowcount == 1

    def __len__(self) -> int:
        with self._lock:
            return int(self._open().execute("SELECT count(*) FROM answered").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
