"""The server's side of an engine's child process: start it, watch it, restart it, and say plainly when it is down.

:class:`EngineProcess` runs ``python -m assistant.engine_host.child`` with one end of a socket pair and keeps it
alive:

- **Ready means ready.** :meth:`EngineProcess.start` returns once the child has loaded and warmed up its engine;
  a clean load error (a bad model file) raises :class:`EngineLoadError` with the child's reason.
- **Deaths are noticed at once** (the process's exit), with the reason read off it (``killed by SIGSEGV``); what
  was in flight fails with :class:`EngineDied`, so each turn that was waiting gets its apology at once.
- **Hangs are noticed within** ``hang_timeout_s``: the watchdog pings the child, and asks it whether its engine
  is making progress while it has work; a child that answers no ping, or whose engine is stuck, is killed. An
  engine may say how long its current unit of work may take (a big model's prompt step on a CPU takes longer than
  ``hang_timeout_s``): progress is then awaited that long.
- **Restarts back off**: the first at once, then ``backoff_s``, doubling per failure in a row, at most
  ``max_backoff_s``. A child that dies before it is ready, or before it has served ``stable_s`` since it got
  ready (loading and warming up do not count: a slow model that dies at its first turn is a crash loop), adds to
  the failures in a row; one that served longer starts the count again.
- **Closing is quick**: a child still loading is killed at once (it holds nothing to save); a ready one is asked
  to close its engine and given ``close_timeout_s``.
- **A crash loop does not spin**: after ``max_failures`` failures in a row the engine is ``failed`` (logged once,
  shown by ``health``), and tried again only every ``retry_failed_s``.

``health`` is the state (``starting``, ``ready``, ``restarting``, ``failed``, ``closed``) with its reason, the
restarts so far and the child's pid; ``on_change`` is told each change (metrics, ``/readyz``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from assistant.engine_host.wire import Frame, Wire, WireError, encode, read_frame

log = logging.getLogger(__name__)

CHILD_MODULE = "assistant.engine_host.child"


class EngineDied(RuntimeError):
    """The child died (or was killed as hung) while this call or stream was in flight."""


class EngineUnavailable(RuntimeError):
    """The engine is not ready (starting, restarting or failed); ``str()`` says which and why."""


class EngineLoadError(RuntimeError):
    """The child could not load its engine and said why (a clean error, not a crash): restarting would not help."""


class RemoteError(RuntimeError):
    """The hosted object raised: ``kind`` is ``user_safe`` for an exception whose message a user may hear (a
    ``ResponderError``), else the exception's class name; ``str()`` is its message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Health:
    """An engine's state now, and why."""

    name: str
    state: str  # starting | ready | restarting | failed | closed
    reason: str = ""
    restarts: int = 0  # children started after the first
    failures: int = 0  # failures in a row
    pid: int | None = None
    since: float = field(default_factory=time.time)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "reason": self.reason, "restarts": self.restarts, "failures": self.failures,
                "pid": self.pid, "since": round(self.since, 3)}


@dataclass(eq=False)
class _Stream:
    items: asyncio.Queue[Frame]
    waiting_since: float | None = None  # the reader waits for the next item since (monotonic)


# What a death by these signals usually means, for whoever reads /readyz or the log.
EXIT_HINTS: dict[int, str] = {
    signal.SIGKILL: " (out of memory, or killed by hand)",
    # A native library built for another CPU: llama-cpp-python compiles llama.cpp with -march=native, so an image
    # built on a machine with AVX-512 stops here on one without it.
    signal.SIGILL: " (an instruction this CPU does not have: a native library built on another machine, e.g. "
                   "llama-cpp-python compiled with -march=native; rebuild it here, or with "
                   "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\")",
}


def describe_exit(returncode: int | None) -> str:
    """A child's exit as words: ``killed by SIGSEGV``, ``exited with status 3``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}{EXIT_HINTS.get(-returncode, '')}"
    return f"exited with status {returncode}"


class EngineProcess:
    """One engine in a supervised child process (see the module docstring)."""

    def __init__(self, name: str, factory: str, config: dict[str, Any], *, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, max_failures: int = 5, hang_timeout_s: float = 10.0,
                 start_timeout_s: float = 300.0, stable_s: float = 30.0, retry_failed_s: float = 300.0,
                 close_timeout_s: float = 30.0, on_change: Callable[[Health], None] | None = None,
                 wire_types: Sequence[type] = (), env: Sequence[str] = ()) -> None:
        if hang_timeout_s <= 0 or max_failures < 1 or backoff_s < 0:
            raise ValueError("hang_timeout_s > 0, max_failures >= 1 and backoff_s >= 0 are required")
        self.name = name
        self.factory = factory
        self.config = config
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_failures = max_failures
        self.hang_timeout_s = hang_timeout_s
        self.start_timeout_s = start_timeout_s
        self.stable_s = stable_s
        self.retry_failed_s = retry_failed_s
        self.close_timeout_s = close_timeout_s
        self.on_change = on_change
        self.wire = Wire(wire_types)  # what the child's frames may hold besides plain values (wire.py)
        self.env = tuple(env)  # environment variables the child gets beyond the base ones (_child_env)
        self.health = Health(name, "starting")
        self.info: Any = None  # what the child's start() returned (the engine's description)
        self.start_seconds = 0.0  # the latest child's load and warm-up
        self.deaths: list[str] = []  # every death's reason, in order (diagnostics, tests)
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, _Stream] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._kill_reason = ""
        self._closing = False
        self._ready = asyncio.Event()
        self._gave_up = asyncio.Event()  # failed for good, or closed: nobody need wait for ready
        self._first: asyncio.Future[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None

    # --- life --------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the child and supervise it; return once it is ready, or failed for good (a crash loop: the
        engine then stays ``failed`` and callers fall back). :class:`EngineLoadError` if the child could not load
        its engine and said why."""
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        self._supervisor = loop.create_task(self._supervise(), name=f"engine-{self.name}-supervisor")
        await asyncio.shield(self._first)

    async def wait_ready(self, timeout: float) -> bool:
        """True once the engine is ready, within ``timeout`` seconds; False at once if it is failed or closed, or
        as soon as it becomes so."""
        if self._ready.is_set():
            return True
        if self.health.state in ("failed", "closed") or timeout <= 0:
            return False
        waits = [asyncio.ensure_future(self._ready.wait()), asyncio.ensure_future(self._gave_up.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self._ready.is_set()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def close(self) -> None:
        """Stop supervising, ask the child to close its engine, and make sure it has ended. A child not ready yet
        (loading, warming up, or between restarts) is killed at once: it reads no frames until it is ready."""
        self._closing = True
        self._set(state="closed", reason="")
        writer, proc = self._writer, self._proc
        if writer is not None and self._ready.is_set():
            with contextlib.suppress(Exception):
                writer.write(encode({"op": "close"}))
                await writer.drain()
            if proc is not None and proc.returncode is None:
                try:
                    async with asyncio.timeout(self.close_timeout_s):
                        await proc.wait()
                except TimeoutError:
                    log.warning("engine.close_timeout engine=%s pid=%d: killing it", self.name, proc.pid)
        if self._supervisor is not None:  # its child, if still there, is killed as the task ends (_run_child)
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._settle_first(EngineUnavailable(f"the {self.name} engine was closed before it was ready"))
        self._fail_in_flight(EngineDied(f"the {self.name} engine is shutting down"))

    def kill(self, sig: int = signal.SIGKILL, reason: str = "") -> None:
        """Send ``sig`` to the child (a watchdog's kill, or an operator's); its death is handled as any other."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        if reason:
            self._kill_reason = reason
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)

    # --- calls -------------------------------------------------------------------------------------------------
    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """``method(*args)`` in the child; :class:`EngineUnavailable` if it is not ready, :class:`EngineDied` if it
        dies first, :class:`RemoteError` if the method raised."""
        writer = self._writer_or_raise()
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[rid] = fut
        try:
            writer.write(encode({"op": "call", "id": rid, "method": method, "args": args}))
            async with asyncio.timeout(timeout):
                return await fut
        finally:
            self._calls.pop(rid, None)

    async def stream(self, method: str, *args: Any) -> AsyncGenerator[Any, None]:
        """The items ``method(*args)`` yields in the child, as they come; each one taken is acknowledged (the
        child keeps at most its window in flight). Closing this generator cancels the child's."""
        writer = self._writer_or_raise()
        rid = next(self._ids)
        st = _Stream(asyncio.Queue())
        self._streams[rid] = st
        ended = False
        try:
            writer.write(encode({"op": "stream", "id": rid, "method": method, "args": args}))
            while True:
                st.waiting_since = time.monotonic()
                try:
                    frame = await st.items.get()
                finally:
                    st.waiting_since = None
                op = frame["op"]
                if op == "item":
                    yield frame["value"]
                    self._send_quietly({"op": "ack", "id": rid}, writer)
                elif op == "end":
                    ended = True
                    return
                elif op == "error":
                    ended = True
                    raise RemoteError(str(frame.get("kind", "")), str(frame.get("message", "")))
                else:  # died: put by _fail_in_flight
                    ended = True
                    raise EngineDied(str(frame.get("message", "")))
        finally:
            self._streams.pop(rid, None)
            if not ended:
                self._send_quietly({"op": "cancel", "id": rid}, writer)

    def _writer_or_raise(self) -> asyncio.StreamWriter:
        writer = self._writer
        if not self._ready.is_set() or writer is None:
            h = self.health
            raise EngineUnavailable(f"the {self.name} engine is {h.state}" + (f": {h.reason}" if h.reason else ""))
        return writer

    def _send_quietly(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        if writer is self._writer and not writer.is_closing():
            with contextlib.suppress(Exception):
                writer.write(encode(frame))

    # --- supervision -------------------------------------------------------------------------------------------
    def _set(self, **changes: Any) -> None:
        if self.health.state == "closed" and changes.get("state") != "closed":
            return
        self.health = replace(self.health, since=time.time(), **changes)
        if self.health.state in ("failed", "closed"):
            self._gave_up.set()
        else:
            self._gave_up.clear()
        if self.on_change is not None:
            try:
                self.on_change(self.health)
            except Exception:
                log.exception("engine.on_change_failed engine=%s", self.name)

    def _settle_first(self, error: BaseException | None = None) -> None:
        if self._first is not None and not self._first.done():
            if error is None:
                self._first.set_result(None)
            else:
                self._first.set_exception(error)

    async def _supervise(self) -> None:
        failures = 0
        try:
            while not self._closing:
                try:
                    reason, ready_at = await self._run_child()
                except EngineLoadError as exc:
                    self._set(state="failed", reason=str(exc), failures=failures + 1)
                    log.error("engine.load_failed engine=%s reason=%s", self.name, exc)
                    self._settle_first(exc)
                    return
                if self._closing:
                    return
                served = time.monotonic() - ready_at if ready_at is not None else 0.0  # since it got ready
                failures = 1 if ready_at is not None and served >= self.stable_s else failures + 1
                self.deaths.append(reason)
                if failures >= self.max_failures:
                    why = f"{failures} failures in a row (the last: {reason})"
                    self._set(state="failed", reason=why, failures=failures, pid=None)
                    log.error("engine.crash_loop engine=%s failures=%d last=%s retry_in_s=%.0f", self.name, failures,
                              reason, self.retry_failed_s)
                    self._settle_first()
                    await asyncio.sleep(self.retry_failed_s)
                    continue
                # The first failure restarts at once (a turn is waiting); a second in a row waits backoff_s, then
                # twice that each time.
                delay = 0.0 if failures <= 1 else min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 2))
                self._set(state="restarting", reason=reason, failures=failures, pid=None)
                log.warning("engine.died engine=%s reason=%s failures=%d restart_in_s=%.1f", self.name, reason,
                            failures, delay)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the supervisor itself must not die silently
            log.exception("engine.supervisor_failed engine=%s", self.name)
            self._set(state="failed", reason=f"supervisor failed: {type(exc).__name__}: {exc}", pid=None)
            self._settle_first()

    async def _run_child(self) -> tuple[str, float | None]:
        """Start one child, serve it until it ends; (why it ended, when it got ready: None if it never did)."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc: asyncio.subprocess.Process | None = None
        writer: asyncio.StreamWriter | None = None
        tasks: list[asyncio.Task[Any]] = []
        try:
            child_sock.set_inheritable(True)
            proc = self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", CHILD_MODULE, str(child_sock.fileno()), str(os.getpid()),
                pass_fds=(child_sock.fileno(),),
                stdin=asyncio.subprocess.DEVNULL, env=_child_env(self.env))
            child_sock.close()
            reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
            self._kill_reason = ""
            self._set(pid=proc.pid, state="starting" if self.health.restarts == 0 and not self.deaths
                      else "restarting")
            log.info("engine.child_started engine=%s pid=%d", self.name, proc.pid)
            writer.write(encode({"op": "hello", "name": self.name, "factory": self.factory, "config": self.config,
                                 "wire": list(self.wire.types),
                                 "log_level": logging.getLogger().getEffectiveLevel()}))
            exited = asyncio.ensure_future(proc.wait())
            tasks.append(exited)
            first = asyncio.ensure_future(read_frame(reader, self.wire))
            tasks.append(first)
            done, _ = await asyncio.wait({exited, first}, timeout=self.start_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                self.kill(reason=f"not ready within {self.start_timeout_s:.0f} s")
                await exited
                return self._kill_reason, None
            if first not in done or first.exception() is not None or first.result() is None:
                if first in done and first.exception() is not None:  # alive, but its first frame is broken
                    self.kill(reason=f"broken connection while loading: {first.exception()}")
                await exited
                return self._kill_reason or describe_exit(proc.returncode) + " while loading", None
            hello = first.result()
            assert hello is not None
            if hello.get("op") == "failed":
                await exited
                raise EngineLoadError(str(hello.get("message") or hello.get("kind") or "the engine failed to load"))
            self.info = hello.get("info")
            self.start_seconds = float(hello.get("start_s", 0.0))
            self._writer = writer
            self._set(state="ready", reason="", pid=proc.pid,
                      restarts=self.health.restarts + (1 if self.deaths else 0))
            self._ready.set()
            log.info("engine.ready engine=%s pid=%d start_s=%.2f restarts=%d", self.name, proc.pid,
                     self.start_seconds, self.health.restarts)
            ready_at = time.monotonic()
            self._settle_first()
            tasks.append(asyncio.ensure_future(self._read(reader, exited)))
            tasks.append(asyncio.ensure_future(self._watch(writer)))
            await exited
            return self._kill_reason or describe_exit(proc.returncode), ready_at
        finally:
            self._ready.clear()
            self._writer = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if proc is not None and proc.returncode is None:  # we are being cancelled (close): no orphan
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(asyncio.CancelledError):
                    await proc.wait()
            why = self._kill_reason or (describe_exit(proc.returncode) if proc is not None else "not started")
            self._fail_in_flight(EngineDied(f"the {self.name} engine stopped: {why}"))
            if writer is not None:
                writer.close()
            with contextlib.suppress(OSError):
                parent_sock.close()
            with contextlib.suppress(OSError):
                child_sock.close()

    async def _read(self, reader: asyncio.StreamReader, exited: asyncio.Future[int]) -> None:
        """Frames from the child to whoever waits for them. When the connection ends the child is ending too (its
        exit says how); one that keeps running without it is killed."""
        try:
            while (frame := await read_frame(reader, self.wire)) is not None:
                rid = int(frame.get("id", 0))
                op = frame.get("op")
                if op in ("item", "end") or (op == "error" and rid in self._streams):
                    st = self._streams.get(rid)
                    if st is not None:
                        st.items.put_nowait(frame)
                    continue
                fut = self._calls.get(rid)
                if fut is None or fut.done():
                    continue
                if op in ("result", "pong"):
                    fut.set_result(frame.get("value"))
                elif op == "error":
                    fut.set_exception(RemoteError(str(frame.get("kind", "")), str(frame.get("message", ""))))
        except WireError as exc:  # it sent what may not cross: broken (or worse), not to be read any further
            log.warning("engine.wire_failed engine=%s reason=%s", self.name, exc)
            self.kill(reason=f"broken connection: {exc}")
            return
        except (ConnectionError, OSError) as exc:
            broken = f"broken connection ({type(exc).__name__})"
        else:
            broken = "closed its connection"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await asyncio.shield(exited)
        if not exited.done():
            log.warning("engine.wire_failed engine=%s reason=%s", self.name, broken)
            self.kill(reason=broken)

    async def _watch(self, writer: asyncio.StreamWriter) -> None:
        """Ping the child; kill it if it answers none within ``hang_timeout_s``, or if its engine has work and
        makes no progress for that long, or for as long as the engine said its current work may take (a pong of
        ``(busy, counter, grace_s)``), whichever is longer."""
        period = max(0.05, self.hang_timeout_s / 4)
        last_progress: Any = None
        progress_at = time.monotonic()
        while True:
            await asyncio.sleep(period)
            rid = next(self._ids)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._calls[rid] = fut
            try:
                writer.write(encode({"op": "ping", "id": rid}))
                async with asyncio.timeout(self.hang_timeout_s):
                    pong = await fut
            except TimeoutError:
                self.kill(reason=f"hung: answered no ping for {self.hang_timeout_s:g} s")
                return
            finally:
                self._calls.pop(rid, None)
            now = time.monotonic()
            busy, counter, grace = _progress(pong)
            limit = max(self.hang_timeout_s, grace)
            if not busy or counter != last_progress:
                last_progress, progress_at = counter, now
            elif now - progress_at >= limit:
                self.kill(reason=f"hung: its engine made no progress for {limit:g} s")
                return

    def _fail_in_flight(self, error: EngineDied) -> None:
        for fut in list(self._calls.values()):
            if not fut.done():
                fut.set_exception(error)
        self._calls.clear()
        for st in list(self._streams.values()):
            st.items.put_nowait({"op": "died", "message": str(error)})


def _progress(pong: Any) -> tuple[bool, Any, float]:
    """A pong's ``(busy, counter)`` or ``(busy, counter, grace_s)``; an engine that reports none is never busy."""
    if isinstance(pong, tuple) and len(pong) in (2, 3):
        grace = float(pong[2]) if len(pong) == 3 else 0.0
        return bool(pong[0]), pong[1], grace if grace > 0 else 0.0
    return False, None, 0.0


# What a child's environment holds of ours: where programs, libraries and the home are, the locale, the time zone,
# Python's own switches, thread and GPU settings of the native libraries, and the model caches. Not the server's
# secrets (carrier tokens, an OpenAI or hub key, ASSISTANT_* settings: the child's config comes in its hello).
CHILD_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "TERM", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONWARNINGS",
    "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONMALLOC", "XDG_CACHE_HOME",
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE", "ASSISTANT_MODELS_DIR",
})
CHILD_ENV_PREFIXES = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "CUDA_", "NVIDIA_", "CUDNN_", "GGML_",
                      "CT2_", "ORT_")


def _child_env(extra: Sequence[str] = ()) -> dict[str, str]:
    """The child's environment: the allow-listed part of ours (``CHILD_ENV``), the ``extra`` names its host asks
    for (a responder's API key), and our import path (so it imports the same package and plug-ins)."""
    env = {k: v for k, v in os.environ.items()
           if k in CHILD_ENV or k.startswith(CHILD_ENV_PREFIXES) or k in extra}
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if os.getcwd() not in paths:
        paths.insert(0, os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
