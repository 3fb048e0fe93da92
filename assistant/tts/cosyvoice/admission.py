"""Admission to the CosyVoice2 engine: ``slots`` requests run, ``max_waiting`` more may wait, the rest are
turned away at once with `EngineBusy` (429 busy on the TTS API)."""

from __future__ import annotations

import threading

from assistant.tts.base import TTSBusy


class EngineBusy(TTSBusy):
    """Every synthesis slot and every waiting place is taken; try again later (429 busy on the TTS API)."""


class Admission:
    """Places for requests: at most ``slots + max_waiting`` tickets out at once."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        self.slots, self.max_waiting = slots, max_waiting
        self._lock = threading.Lock()
        self._tickets = 0
        self._closed = False

    @property
    def capacity(self) -> int:
        return self.slots + self.max_waiting

    @property
    def tickets(self) -> int:
        return self._tickets

    def reserve(self) -> Ticket:
        """A place for one request, or `EngineBusy` when all are held (or the engine is closing)."""
        with self._lock:
            if self._closed:
                raise EngineBusy("the synthesis engine is shutting down")
            if self._tickets >= self.capacity:
                raise EngineBusy(
                    f"all {self.slots} synthesis slots and {self.max_waiting} waiting places are taken"
                )
            self._tickets += 1
        return Ticket(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _release(self) -> None:
        with self._lock:
            self._tickets -= 1


class Ticket:
    """An admission place held by one request (several jobs in turn); `release` frees it at once."""

    def __init__(self, owner: Admission) -> None:
        self._owner: Admission | None = owner

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release()


__all__ = ["Admission", "EngineBusy", "Ticket"]
