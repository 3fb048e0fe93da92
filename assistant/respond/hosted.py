"""Where a responder runs, and the responder that answers from a supervised child process.

``respond.backend`` places the responder:

- ``auto`` (default): the embedded model (``llama``) in a child process, everything else (echo, rules, openai,
  plug-ins) in this one;
- ``process``: in a supervised child process (any responder but echo and rules, which load nothing native);
- ``local``: in this process (a native crash there ends every call);
- ``ray``: on the Ray Serve LLM deployment (``serve_ray``).

All three speak one protocol: the :class:`~assistant.respond.base.Responder` face (``respond(text, history,
options)``, ``describe()``, ``warmup()``, ``aclose()``); the child and the Ray replica each serve it as a stream
of text deltas, then the reply's :class:`~assistant.respond.base.Usage`.

:class:`HostedResponder` is that face over :class:`~assistant.engine_host.supervisor.EngineProcess`. When the
child dies mid-reply the turn fails with a :class:`ResponderError` (the pipeline's spoken apology) and the
engine restarts. A reply it died under before its first words is asked again of the restarted engine, once (a
prompt that kills the engine costs two crashes, not a loop). A turn that comes while it restarts waits up to
``respond.restart_wait_s`` for it; past that (or when the engine is failed for good, a crash loop) the fallback
responder (``respond.fallback``) answers, and the reply's options say so (``ReplyOptions.fallback``: the page
shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from assistant.config import RespondConfig
from assistant.engine_host.supervisor import (
    EngineDied,
    EngineProcess,
    EngineUnavailable,
    Health,
    RemoteError,
)
from assistant.respond.base import (
    Message,
    ReplyOptions,
    Responder,
    ResponderError,
    ToolCall,
    ToolCallDelta,
    Usage,
    closing,
    kept_text,
    reply_stream,
    takes_options,
)

log = logging.getLogger(__name__)

PLACEMENTS = ("auto", "process", "local", "ray")
IN_PROCESS_ONLY = ("echo", "rules")  # nothing native to isolate
FACTORY = "assistant.respond.hosted:serve_responder"

MAX_KEPT = 256  # replies a child holds open for the server's word on what was kept (a few per live call)

MSG_DIED = "The language model stopped while answering. It is restarting."
MSG_FAILED = "The language model failed to answer."


def placement(cfg: RespondConfig) -> str:
    """Where ``cfg``'s responder runs: ``local``, ``process`` or ``ray`` (``auto`` resolved)."""
    backend = cfg.backend.strip()
    if backend not in PLACEMENTS:
        raise ValueError(f"respond.backend must be one of {', '.join(PLACEMENTS)}, got {backend!r}")
    engine = cfg.engine.strip()
    if backend == "auto":
        return "process" if engine == "llama" else "local"
    if backend == "process" and engine in IN_PROCESS_ONLY:
        return "local"
    return backend


# What a reply's frames hold besides plain values: the history in, text, tool calls and the usage out.
WIRE_TYPES = (Message, ToolCall, ToolCallDelta, Usage)
TEXT_ONLY = ("llama", *IN_PROCESS_ONLY)  # call no server (the OpenAI key stays in the server), take no tools


def child_config(cfg: RespondConfig) -> dict[str, Any]:
    """The settings the child is started with: all of ``[respond]``, less the OpenAI key where nothing uses it."""
    config = dataclasses.asdict(cfg)
    if cfg.engine.strip() in TEXT_ONLY:
        config["api_key"] = ""
    return config


def child_env(cfg: RespondConfig) -> tuple[str, ...]:
    """Environment variables the child gets beyond the base ones: the OpenAI key's for the openai responder, and
    those ``respond.child_env`` names (a plug-in's)."""
    return (*(("OPENAI_API_KEY",) if cfg.engine.strip() == "openai" else ()), *cfg.child_env)


# --- the child's side ------------------------------------------------------------------------------------------
class ResponderService:
    """The responder as the child serves it: made from the config, warmed up, replies streamed."""

    CALLS = ("describe", "stats", "keep")
    STREAMS = ("respond", "respond_messages")

    def __init__(self, config: dict[str, Any]) -> None:
        from assistant.respond import create_responder

        cfg = RespondConfig(**{**config, "backend": "local"})
        self.responder: Any = create_responder(cfg)
        # Replies whose turn the server has not yet kept or dropped (ReplyOptions.kept), by the server's key.
        self.kept: OrderedDict[int, asyncio.Future[str]] = OrderedDict()

    async def start(self) -> dict[str, Any]:
        warmup = getattr(self.responder, "warmup", None)
        if warmup is not None:
            await warmup()
        return self.describe()

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.responder, "describe", None)
        return dict(describe()) if describe is not None else {"engine": getattr(self.responder, "name", "?"),
                                                              "model": ""}

    def stats(self) -> dict[str, int]:
        stats = getattr(self.responder, "stats", None)
        return dict(stats()) if stats is not None else {}

    def progress(self) -> tuple[bool, int, float] | None:
        engine = getattr(self.responder, "engine", None)
        progress = getattr(engine, "progress", None)
        return progress() if progress is not None else None

    async def respond(self, text: str, history: list[Message], asks: dict[str, Any]) -> AsyncGenerator[Any, None]:
        asks = dict(asks)
        key = asks.pop("kept", None)
        options = ReplyOptions(**asks)
        if isinstance(key, int):
            options.kept = self._kept(key)
        async with closing(reply_stream(self.responder, text, history, options)) as stream:
            async for delta in stream:  # a cancelled reply frees its slot now (closing)
                yield delta
        if options.usage is not None:
            yield options.usage

    def _kept(self, key: int) -> asyncio.Future[str]:
        """Reply ``key``'s future: the one :meth:`keep` already settled (its word came first), else a new one held
        for :meth:`keep` to settle."""
        future = self.kept.pop(key, None)
        if future is None:
            future = self._hold(key)
        return future

    def _hold(self, key: int) -> asyncio.Future[str]:
        future = self.kept[key] = asyncio.get_running_loop().create_future()
        while len(self.kept) > MAX_KEPT:  # a server that never answered: the oldest wait no longer
            _, oldest = self.kept.popitem(last=False)
            oldest.cancel()
        return future

    async def keep(self, key: int, said: str | None) -> None:
        """The server kept reply ``key`` in its history as ``said`` (None: it dropped the turn)."""
        future = self.kept.pop(key, None)
        if future is None:  # before the reply itself (or for one this child never ran): held for it
            future = self._hold(key)
        if not future.done():
            if said is None:
                future.cancel()
            else:
                future.set_result(said)

    async def respond_messages(self, messages: list[Message], tools: list[dict[str, Any]], tool_choice: Any,
                               asks: dict[str, Any]) -> AsyncGenerator[Any, None]:
        """The whole conversation with tools: text deltas, the pieces of each tool call and the calls, the usage."""
        method = getattr(self.responder, "respond_messages", None)
        if method is None:
            raise AttributeError(f"the {getattr(self.responder, 'name', '?')} responder takes no tools")
        options = ReplyOptions(**asks)
        stream = (method(messages, tools, tool_choice, options=options) if takes_options(method)
                  else method(messages, tools, tool_choice))
        async with closing(stream):
            async for item in stream:
                yield item
        if options.usage is not None:
            yield options.usage

    async def aclose(self) -> None:
        aclose = getattr(self.responder, "aclose", None)
        if aclose is not None:
            await aclose()


def serve_responder(config: dict[str, Any]) -> ResponderService:
    """The child's factory (``FACTORY``)."""
    return ResponderService(config)


# --- the server's side -----------------------------------------------------------------------------------------
class HostedResponder:
    """``respond.engine``'s responder in a supervised child process, with a fallback while it is down."""

    def __init__(self, cfg: RespondConfig, fallback: Responder | None = None,
                 on_change: Callable[[Health], None] | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.engine.strip()
        self.fallback = fallback
        self.host = EngineProcess(
            "llm" if self.name == "llama" else self.name, FACTORY, child_config(cfg),
            backoff_s=cfg.restart_backoff_s, max_failures=cfg.max_failures, hang_timeout_s=cfg.hang_timeout_s,
            start_timeout_s=cfg.start_timeout_s, on_change=on_change, wire_types=WIRE_TYPES, env=child_env(cfg))
        self.fallback_replies = 0
        self._keys = itertools.count(1)
        self._forwards: set[asyncio.Task[None]] = set()

    def _forward_kept(self, key: int, kept: asyncio.Future[str]) -> None:
        """Tell the child what the conversation kept of reply ``key`` (or that it dropped it), when it knows."""

        async def forward() -> None:
            said = await kept_text(kept)
            with contextlib.suppress(Exception):  # a child gone or restarting: its engine's wait ends with it
                await self.host.call("keep", key, said, timeout=5.0)

        task = asyncio.get_running_loop().create_task(forward(), name=f"respond-kept-{key}")
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    @property
    def health(self) -> Health:
        return self.host.health

    async def start(self) -> None:
        """Start the child; returns when it is ready or failed for good (then the fallback answers).
        :class:`~assistant.engine_host.supervisor.EngineLoadError` for a clean load error (a bad model file)."""
        await self.host.start()

    async def warmup(self) -> None:
        """The child warms up before it says ready (:meth:`start`)."""

    def describe(self) -> dict[str, Any]:
        info = dict(self.host.info or {"engine": self.name, "model": ""})
        health = self.host.health
        if not health.ready:
            info["state"], info["reason"] = health.state, health.reason
        return info

    async def stats(self) -> dict[str, int]:
        return dict(await self.host.call("stats", timeout=5.0))

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncGenerator[str, None]:
        opts = options if options is not None else ReplyOptions()
        async for item in self._hosted("respond", (text, list(history)), opts, text, history):
            if isinstance(item, str):
                yield item

    async def _hosted(self, method: str, args: tuple[Any, ...], opts: ReplyOptions, text: str,
                      history: Sequence[Message]) -> AsyncGenerator[str | ToolCall | ToolCallDelta, None]:
        """The child's ``method(*args, asks)`` stream: text deltas (and tool calls), its usage into ``opts``; the
        fallback answers ``text`` after ``history`` while the engine is down."""
        asks: dict[str, Any] = {"language": opts.language, "temperature": opts.temperature,
                                "max_tokens": opts.max_tokens, "session": opts.session}
        if method == "respond" and opts.kept is not None:  # the child's engine waits to hear what was kept
            asks["kept"] = key = next(self._keys)
            self._forward_kept(key, opts.kept)
        for attempt in range(2):  # a reply the child died under before its first words is asked again, once
            if not await self.host.wait_ready(self.cfg.restart_wait_s):
                async for delta in self._fall_back(text, history, opts):
                    yield delta
                return
            said = False
            stream = self.host.stream(method, *args, asks)
            try:
                async for item in stream:
                    if isinstance(item, Usage):
                        opts.usage = item
                    elif item:
                        said = True
                        yield item
                return
            except (EngineDied, EngineUnavailable) as exc:  # unavailable: it died between the wait and the call
                log.warning("respond.engine_died engine=%s reason=%s said=%s attempt=%d", self.name, exc, said,
                            attempt + 1)
                if said or attempt:
                    raise ResponderError(MSG_DIED) from exc
            except RemoteError as exc:
                if exc.kind == "user_safe":
                    raise ResponderError(str(exc)) from exc
                log.warning("respond.engine_error engine=%s kind=%s error=%s", self.name, exc.kind, exc)
                raise ResponderError(MSG_FAILED) from exc
            finally:
                await stream.aclose()

    async def _fall_back(self, text: str, history: Sequence[Message], opts: ReplyOptions) -> AsyncGenerator[str, None]:
        health = self.host.health
        why = f"the {self.name} engine is {health.state}" + (f": {health.reason}" if health.reason else "")
        if self.fallback is None:
            raise ResponderError(f"The language model is unavailable ({health.state}).")
        self.fallback_replies += 1
        opts.fallback = f"{self.fallback.name} answers: {why}"
        log.info("respond.fallback engine=%s fallback=%s state=%s", self.name, self.fallback.name, health.state)
        async with closing(reply_stream(self.fallback, text, history, opts)) as stream:
            async for delta in stream:
                yield delta

    async def aclose(self) -> None:
        for task in list(self._forwards):
            task.cancel()
        await self.host.close()


class HostedMessagesResponder(HostedResponder):
    """A responder that takes tools (``respond_messages``: the openai one, a plug-in's), in its child process: the
    Realtime API's tools reach it there as they do in process."""

    async def respond_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                               tool_choice: Any = "auto", options: ReplyOptions | None = None,
                               ) -> AsyncGenerator[str | ToolCall | ToolCallDelta, None]:
        opts = options if options is not None else ReplyOptions()
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        text, before = (messages[users[-1]].content, messages[: users[-1]]) if users else ("", messages)
        history = [m for m in before if m.role in ("user", "assistant") and m.content]  # what a fallback can read
        async for item in self._hosted("respond_messages", (list(messages), list(tools), tool_choice), opts, text,
                                       history):
            yield item


def takes_tools(cfg: RespondConfig) -> bool:
    """``cfg``'s responder takes the whole conversation with tools (a ``respond_messages`` method): its class is
    looked at here, not built (the embedded model and the built-in text responders take none)."""
    name = cfg.engine.strip()
    if name in TEXT_ONLY:
        return False
    from assistant.loading import load_named
    from assistant.respond import BUILTIN

    return callable(getattr(load_named(name, BUILTIN, kind="responder"), "respond_messages", None))


def hosted_responder(cfg: RespondConfig, fallback: Responder | None = None,
                     on_change: Callable[[Health], None] | None = None) -> HostedResponder:
    """``cfg``'s responder in its child process, with the face it has in process (tools or not)."""
    cls = HostedMessagesResponder if takes_tools(cfg) else HostedResponder
    return cls(cfg, fallback, on_change)
