"""An engine's child process: ``python -m assistant.engine_host.child FD PARENT_PID``.

The parent hands over one end of a socket pair as ``FD``, and its own pid (a server started as a container's
command is PID 1: "reparented to init" cannot be told from "started by init" without it). The first frame names a
factory (``module:function``) and its config; the child builds the hosted object, calls its ``start()`` (load and
warm up) and answers ``ready`` with what it returns, or ``failed`` with why (a clean error: a bad model file, say).
Then it serves:

- ``call``: ``method(*args)`` of the hosted object (only those it lists in ``CALLS``), answered once; a blocking
  method runs on a thread, so the child answers pings while it works;
- ``stream``: an async generator method (``STREAMS``), sent item by item; the parent acknowledges each item it
  takes (``ack``), and at most ``WINDOW`` items are in flight, so the engine stays as far ahead of the listener
  as it would in process; ``cancel`` closes the generator (the engine drops the request within a step);
- ``ping``: answered at once (the parent's watchdog);
- ``close``, or the parent gone (the socket closes; and on Linux the kernel sends SIGKILL when the parent dies):
  the hosted object is closed and the process ends.

When memory runs out, the kernel's OOM killer takes this child before the server (``oom_score_adj`` raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from assistant.engine_host.wire import Frame, Wire, encode, read_frame
from assistant.loading import load_named

log = logging.getLogger("assistant.engine_host.child")

WINDOW = 8  # stream items sent and not yet taken by the parent's reader
OOM_SCORE_ADJ = 500  # of -1000..1000: well before the server (0) when memory runs out


class _Child:
    def __init__(self, obj: Any, writer: asyncio.StreamWriter) -> None:
        self.obj = obj
        self.writer = writer
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.credits: dict[int, asyncio.Semaphore] = {}

    async def send(self, frame: Frame) -> None:
        self.writer.write(encode(frame))
        await self.writer.drain()

    async def call(self, rid: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            if method not in getattr(self.obj, "CALLS", ()):
                raise AttributeError(f"{method!r} is not a call this engine serves")
            fn = getattr(self.obj, method)
            # A blocking method runs on a thread: the loop keeps answering pings (and other calls) meanwhile.
            value = await fn(*args) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, *args)
            await self.send({"op": "result", "id": rid, "value": value})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.send(_error(rid, exc))

    async def stream(self, rid: int, method: str, args: tuple[Any, ...]) -> None:
        credit = self.credits[rid] = asyncio.Semaphore(WINDOW)
        try:
            if method not in getattr(self.obj, "STREAMS", ()):
                raise AttributeError(f"{method!r} is not a stream this engine serves")
            gen: AsyncGenerator[Any, None] = getattr(self.obj, method)(*args)
            async with contextlib.aclosing(gen):  # a cancel closes it now, not when it is collected
                async for item in gen:
                    await credit.acquire()
                    await self.send({"op": "item", "id": rid, "value": item})
            await self.send({"op": "end", "id": rid})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.send(_error(rid, exc))
        finally:
            self.credits.pop(rid, None)

    def spawn(self, rid: int, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks[rid] = task
        task.add_done_callback(lambda _t: self.tasks.pop(rid, None))

    async def serve(self, reader: asyncio.StreamReader, wire: Wire) -> None:
        while (frame := await read_frame(reader, wire)) is not None:
            op, rid = frame.get("op"), int(frame.get("id", 0))
            if op == "call":
                self.spawn(rid, self.call(rid, str(frame["method"]), tuple(frame.get("args", ()))))
            elif op == "stream":
                self.spawn(rid, self.stream(rid, str(frame["method"]), tuple(frame.get("args", ()))))
            elif op == "ack":
                credit = self.credits.get(rid)
                if credit is not None:
                    credit.release()
            elif op == "cancel":
                task = self.tasks.get(rid)
                if task is not None:
                    task.cancel()
            elif op == "ping":  # with the engine's progress (busy, a counter), for the parent's watchdog
                progress = getattr(self.obj, "progress", None)
                await self.send({"op": "pong", "id": rid, "value": progress() if progress is not None else None})
            elif op == "close":
                return

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        aclose = getattr(self.obj, "aclose", None)
        if aclose is not None:
            await aclose()


def _error(rid: int, exc: BaseException) -> Frame:
    """An exception as a frame: ``kind`` ``user_safe`` for one whose message a user may hear (an exception class
    that says so with ``user_safe = True``, as ``ResponderError`` does), else its class name."""
    kind = "user_safe" if getattr(exc, "user_safe", False) else type(exc).__name__
    return {"op": "error", "id": rid, "kind": kind, "message": str(exc)}


async def _main(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    hello = await read_frame(reader)
    if hello is None:
        return 2
    logging.basicConfig(level=int(hello.get("log_level", logging.INFO)),
                        format=f"%(asctime)s %(levelname)s [{hello.get('name', 'engine')} child] %(name)s %(message)s")
    wire = Wire(str(name) for name in hello.get("wire", ()))  # the types its host's frames may hold
    t0 = time.perf_counter()
    try:
        factory = load_named(str(hello["factory"]), {}, kind="engine factory")
        obj = await asyncio.to_thread(factory, hello.get("config", {}))
        info = await obj.start()
    except Exception as exc:
        log.error("engine_child.load_failed error=%s: %s", type(exc).__name__, exc)
        writer.write(encode({"op": "failed", "kind": type(exc).__name__, "message": str(exc)}))
        await writer.drain()
        return 3
    writer.write(encode({"op": "ready", "info": info, "pid": os.getpid(),
                         "start_s": round(time.perf_counter() - t0, 3)}))
    await writer.drain()
    child = _Child(obj, writer)
    try:
        await child.serve(reader, wire)
    except (ConnectionError, OSError) as exc:
        log.info("engine_child.parent_gone error=%s", type(exc).__name__)
    finally:
        await child.close()
    return 0


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent ends, however it ends (prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _first_for_the_oom_killer() -> None:
    """Linux: when memory runs out, the kernel should kill this child (the engine: restarted, one turn lost) before
    the server (every call). Raising one's own ``oom_score_adj`` needs no privilege."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text(str(OOM_SCORE_ADJ))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(a.isdigit() for a in args):
        print("usage: python -m assistant.engine_host.child FD PARENT_PID (started by the server, not by hand)",
              file=sys.stderr)
        return 2
    _die_with_parent()
    _first_for_the_oom_killer()
    if os.getppid() != int(args[1]):  # the parent died before the line above took effect (we were reparented)
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches the group: the parent decides
    return asyncio.run(_main(int(args[0])))


if __name__ == "__main__":
    sys.exit(main())
