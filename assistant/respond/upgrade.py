"""The better model, fetched in the background: ``respond.model_path = auto`` when the machine's model
(``auto.py``) has not been pulled yet.

The bundled model answers from the start. Meanwhile the chosen model is pulled with ``hub.pull`` (size, sha256
and GGUF header checked) on a thread of its own, so neither the calls nor a shutdown wait for it; then it is made
the way the server makes its responder (in its supervised child process: loaded and warmed up, the check that it
runs) and swapped in between turns (``swap.py``). Offline, or when the pulled model does not load, the bundled
model goes on answering and :class:`ModelStatus` says why (``/readyz``, the page).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from assistant.respond.auto import Choice
from assistant.respond.base import Responder
from assistant.respond.hub import PullError, pull
from assistant.respond.swap import SwappableResponder

log = logging.getLogger(__name__)

STATES = ("bundled", "pulling", "loading", "ready", "offline", "failed")
PROGRESS_EVERY_S = 1.0  # how often a pull's progress reaches the status


class PullCancelled(Exception):
    """The server is closing: the pull stops (what it fetched stays, for the next start to resume)."""


@dataclass
class ModelStatus:
    """Which model answers, and why; while the machine's model is on its way, how far it has come."""

    answers: str
    why: str
    state: str = "bundled"
    target: str = ""  # the model chosen for this machine ("" when the bundled one is the choice)
    progress: float | None = None  # of a pull, 0 … 1

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


Make = Callable[[str, int], Awaitable[Responder]]  # (GGUF path, GPU layers) → a loaded, warm responder


class ModelUpgrade:
    """Pull ``choice``, make it with ``make``, swap it into ``responder``; ``on_change`` hears every new status
    (see the module's docstring)."""

    def __init__(self, choice: Choice, responder: SwappableResponder, make: Make, status: ModelStatus,
                 on_change: Callable[[ModelStatus], None]) -> None:
        self.choice = choice
        self.responder = responder
        self.make = make
        self.status = status
        self.on_change = on_change
        self.task: asyncio.Task[None] | None = None
        self._cancel = threading.Event()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="model-upgrade")

    def _set(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self.status, key, value)
        try:
            self.on_change(self.status)
        except Exception:
            log.exception("respond.model_status_listener_failed")

    async def _run(self) -> None:
        choice = self.choice
        self._set(state="pulling", progress=0.0)
        try:
            path = await self._pull()
        except PullError as exc:
            log.warning("respond.upgrade_offline model=%s reason=%s", choice.model, exc)
            self._set(state="offline", progress=None,
                      why=f"{choice.model} could not be pulled, so the bundled model answers: {exc}")
            return
        self._set(state="loading", progress=None,
                  why=f"{choice.model} pulled and checked; loading it (the bundled model answers until then)")
        t0 = time.monotonic()
        try:
            new = await self.make(str(path), choice.gpu_layers)
        except Exception as exc:
            log.warning("respond.upgrade_failed model=%s error=%s", choice.model, exc)
            self._set(state="failed", why=f"{choice.model} was pulled but did not load, so the bundled model "
                                          f"answers: {str(exc)[:200]}")
            return
        why = f"{choice.why}; pulled in the background and swapped in"
        self.responder.swap(new, why)
        log.info("respond.upgraded model=%s path=%s load_s=%.1f", choice.model, path, time.monotonic() - t0)
        self._set(state="ready", answers=choice.model, why=why)

    async def _pull(self) -> Path:
        """``hub.pull`` on a daemon thread of its own (a shutdown does not wait for a download)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Path] = loop.create_future()
        last = [0.0]

        def progress(have: int, size: int) -> None:
            if self._cancel.is_set():
                raise PullCancelled
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or have >= size:
                last[0] = now
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                    loop.call_soon_threadsafe(self._set_progress, have / size if size else 1.0)

        def settle(path: Path | None, error: PullError | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(path)  # type: ignore[arg-type]

        def work() -> None:
            path, error = None, None
            try:
                path = pull(self.choice.model, progress=False, on_progress=progress)
            except PullCancelled:
                return
            except Exception as exc:
                error = exc if isinstance(exc, PullError) else PullError(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(settle, path, error)

        threading.Thread(target=work, name="model-pull", daemon=True).start()
        return await done

    def _set_progress(self, fraction: float) -> None:
        if self.status.state == "pulling":
            self._set(progress=round(fraction, 3))

    async def close(self) -> None:
        """Stop: a pull in progress stops at its next block, a model being made is dropped."""
        self._cancel.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


__all__ = ["STATES", "ModelStatus", "ModelUpgrade", "PullCancelled"]
