"""What the engine's two threads (decode: `decode_worker.py`, chunks: `chunk_scheduler.py`) have in common: a
daemon thread on a CUDA stream of its own (on CUDA), with grad off and the CPU thread count set, that sleeps on
one condition until it is woken, and a close that stops it and waits for it."""

from __future__ import annotations

import contextlib
import threading

import torch

CLOSE_WAIT_S = 5.0  # how long close() waits for the thread (it ends after the round or step under way)


class EngineThread:
    """A worker thread of the engine: subclasses write :meth:`_loop` (return once :attr:`_stop` is set) and
    :meth:`_after` (what is left when it returned: fail the jobs still held)."""

    def __init__(self, name: str, device: torch.device, cpu_threads: int) -> None:
        self.device = device
        self.cpu_threads = cpu_threads
        self._cond = threading.Condition()
        self._stop = False
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=CLOSE_WAIT_S)

    def _follow_default_stream(self) -> None:
        """On CUDA: this thread's next work waits for what was queued on the default stream (voices, prefixes,
        warm-up made elsewhere), never for the whole device."""
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.default_stream(self.device))

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            self._loop()
        self._after()

    def _loop(self) -> None:
        raise NotImplementedError

    def _after(self) -> None:
        """After the loop: nothing by default."""
