"""The calls already answered: a carrier's call id gets one media token, ever, within a call's longest life.

A Twilio signature carries no timestamp, so a captured webhook stays valid for ever; the replay guard
(``signatures.ReplayGuard``) remembers signatures only for ``telephony.replay_window_s``, in memory, on one gateway.
A call id (Twilio's CallSid, Telnyx's call control id) is unique per call, so remembering the ids answered is what
refuses a replay after that window, after a restart, or at another gateway: for ``telephony.max_call_s`` (a call
lasts no longer; past it the call is closed) plus the token's life.

The ids live in one SQLite file under ``server.data_dir`` (``telephony/answered_calls.sqlite3``), the folder the
gateways of one deployment already share for voices: every gateway that sees the file sees every answer. A row is
about 100 bytes (docs/telephony.md has the measured cost); rows past the memory are swept as new ones come.

The file is written off the event loop (the webhook awaits :meth:`AnsweredCalls.first_answer_async`): another
gateway's write lock (up to ``BUSY_TIMEOUT_S``) and WAL syncs delay that call's answer, never another call. When the
file cannot be used (a read-only ``data_dir``, a full disk, a network file system whose locks fail), the call is
still answered: this gateway's own memory of the ids it answered (always kept beside the file) decides, and the log
says once that the shared record is down, and once that it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FILE = "telephony/answered_calls.sqlite3"
SWEEP_EVERY = 256  # answers between two sweeps of the rows past their memory
BUSY_TIMEOUT_S = 2.0  # another gateway writing: wait this long for its lock
MAX_REMEMBERED = 100_000  # ids this gateway keeps in memory (a few MB); the oldest go first past it


class AnsweredCalls:
    """``first_answer(carrier, call_id)`` is True once per call id within ``memory_s`` (see the module docstring)."""

    def __init__(self, path: Path, memory_s: float, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.memory_s = memory_s
        self.clock = clock  # wall clock: the file outlives this process and is shared with other gateways
        self.busy_timeout_s = BUSY_TIMEOUT_S
        self._db: sqlite3.Connection | None = None  # opened at the first answer: a server without calls writes none
        self._lock = threading.Lock()
        self._since_sweep = 0
        self._remembered: OrderedDict[tuple[str, str], float] = OrderedDict()  # this gateway's own, oldest first
        self.failure = ""  # why the shared file is not used now ("" while it is)

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None,
                                 check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("CREATE TABLE IF NOT EXISTS answered (carrier TEXT NOT NULL, call_id TEXT NOT NULL, "
                           "at REAL NOT NULL, PRIMARY KEY (carrier, call_id)) WITHOUT ROWID")
                db.execute("CREATE INDEX IF NOT EXISTS answered_at ON answered (at)")
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def first_answer(self, carrier: str, call_id: str) -> bool:
        """Record ``call_id`` as answered; False when it already was (within the memory): a replay. Blocking (the
        file's lock, its syncs): the server calls :meth:`first_answer_async`."""
        now = self.clock()
        with self._lock:
            try:
                shared = self._record(carrier, call_id, now)
            except (sqlite3.Error, OSError) as exc:
                self._down(exc)
                return self._remember(carrier, call_id, now)
            if self.failure:
                log.warning("telephony.answered_store_back path=%s", self.path)
                self.failure = ""
            # Only an id this gateway answered enters its own memory, at the time it answered: a replay refused by
            # the shared record must not restart the id's memory here (past it, the id is answerable again). The
            # own memory still refuses an id this gateway answered while the file was down.
            return shared and self._remember(carrier, call_id, now)

    async def first_answer_async(self, carrier: str, call_id: str) -> bool:
        """:meth:`first_answer` on a worker thread: the event loop serves every other call meanwhile."""
        return await asyncio.to_thread(self.first_answer, carrier, call_id)

    def _record(self, carrier: str, call_id: str, now: float) -> bool:
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

    def _remember(self, carrier: str, call_id: str, now: float) -> bool:
        """This gateway's own record: True the first time within the memory."""
        while self._remembered and (len(self._remembered) >= MAX_REMEMBERED or
                                    next(iter(self._remembered.values())) < now - self.memory_s):
            self._remembered.popitem(last=False)
        key = (carrier, call_id)
        if key in self._remembered:
            return False
        self._remembered[key] = now
        return True

    def _down(self, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"
        if self._db is not None:  # a connection that failed may be stuck in a bad state: the next answer reopens
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        if why != self.failure:
            log.warning("telephony.answered_store_down path=%s error=%s (calls are answered from this gateway's "
                        "memory of the ids it answered; other gateways' answers are not seen)", self.path, why)
        self.failure = why

    def __len__(self) -> int:
        with self._lock:
            return int(self._open().execute("SELECT count(*) FROM answered").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
