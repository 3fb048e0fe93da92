"""Streaming client for any OpenAI-compatible chat-completions server (vLLM, Ollama, llama.cpp, ...).

One ``aiohttp.ClientSession`` per responder (connection reuse across turns), closed by :meth:`aclose`.
Every failure becomes a :class:`ResponderError` whose text can be spoken to the user; details go to the log.

Timeouts, all from :class:`RespondConfig`:
  * ``connect_timeout_s`` — TCP connect to the server;
  * ``first_token_timeout_s`` — request sent → first content delta (covers a server that never answers);
  * ``total_timeout_s`` — the whole reply, measured from the request.
No ``asyncio.timeout`` block spans a ``yield``: each read carries its own deadline, so a timeout can never
cancel the caller's code while this generator is suspended.

A server that closes the stream early (no ``[DONE]`` and no ``finish_reason``): the deltas already received
have been yielded (they may already be spoken), then :class:`ResponderError` is raised so the turn ends with
an error event instead of silently truncated text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from assistant import languages
from assistant.body import BodyTooLarge, read_capped
from assistant.config import RespondConfig
from assistant.respond.base import Message, ReplyOptions, ResponderError, ToolCall, ToolCallDelta, Usage

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20        # one SSE line; a longer one means the server is not speaking SSE
MAX_STREAM_BYTES = 16 << 20     # a whole reply; max_tokens keeps real replies far below this
MAX_JSON_BODY_BYTES = 4 << 20   # a non-streamed JSON answer (a server that ignores ``stream``)
MAX_TOOL_CALLS = 16             # tool calls in one reply

# What the server's model is told when respond.system_prompt is unset: that its words are heard. Nothing about what
# it cannot do: a model here may call the tools a Realtime client gives it.
SYSTEM_PROMPT = ("You are a voice assistant: the user speaks to you and hears your answer. Answer in short spoken "
                 "sentences, with no lists, no markdown and no emojis.")

MSG_UNREACHABLE = "I could not reach the language model server."
MSG_TIMEOUT_FIRST = "The language model took too long to answer."
MSG_TIMEOUT_TOTAL = "The language model took too long to finish its answer."
MSG_AUTH = "The language model server refused the request: check the API key."
MSG_NOT_FOUND = "The language model server does not know this model or address."
MSG_BUSY = "The language model server is busy. Please try again."
MSG_HTTP = "The language model server returned an error."
MSG_BAD_STREAM = "The language model sent an answer I could not read."
MSG_CUT = "The language model stopped in the middle of its answer."
MSG_SERVER_ERROR = "The language model server reported an error."


class _StreamDone(Exception):
    """Internal: ``[DONE]`` seen."""


class OpenAIResponder:
    """Chat-completions with ``stream: true``; yields ``choices[0].delta.content`` pieces as they arrive."""

    name = "openai"

    def __init__(self, cfg: RespondConfig | None = None, *, debug_content: bool = False) -> None:
        self.cfg = cfg or RespondConfig()
        self.debug_content = debug_content
        self.url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        self._api_key = self.cfg.api_key or os.environ.get("OPENAI_API_KEY", "")
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        """The shared session, made on first use (it needs a running event loop)."""
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self.cfg.connect_timeout_s, sock_connect=self.cfg.connect_timeout_s
            )
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(limit=64), read_bufsize=1 << 16
            )
        return self._session

    async def aclose(self) -> None:
        """Close the shared HTTP session (idempotent)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def build_payload(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> dict[str, Any]:
        """The request body: system prompt (unless ``history`` brings its own) + history + this turn."""
        return self.messages_payload([*history, Message("user", text)], options=options)

    def messages_payload(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                         tool_choice: Any = "auto", options: ReplyOptions | None = None) -> dict[str, Any]:
        """The request body for a whole conversation (the system prompt first unless it brings its own) and
        function tools given in the Realtime API's flat shape (``{"type", "name", "description", "parameters"}``).

        ``options``: the turn's language (the model is told to answer in it, after the system prompt),
        temperature and token limit (None: ``[respond]``'s; unset there too, none is sent)."""
        out: list[dict[str, Any]] = []
        system = SYSTEM_PROMPT if self.cfg.system_prompt is None else self.cfg.system_prompt
        if system and not (messages and messages[0].role == "system"):
            out.append({"role": "system", "content": system})
        language = options.language if options is not None else None
        if language:
            said = languages.name(language)
            rule = (f"The user is speaking {said}. Answer in {said}, whatever language earlier turns or these "
                    "instructions are in.")
            if out:  # our system prompt: the rule follows it
                out[0]["content"] = f"{out[0]['content']} {rule}"
            else:  # the conversation's own system message (or none configured): the rule right after it
                at = 1 if messages and messages[0].role == "system" else 0
                messages = [*messages[:at], Message("system", rule), *messages[at:]]
        for m in messages:
            msg: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                msg["content"] = m.content or None
                msg["tool_calls"] = [{"id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
            if m.role == "tool":
                msg["tool_call_id"] = m.call_id
            out.append(msg)
        payload: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": out,
            "stream": True,
            "stream_options": {"include_usage": True},  # the token counts come in a last chunk
        }
        # Sampling limits only when someone set them (the turn, else [respond]); unset, the server's own apply: no
        # token cap cuts a reply or a tool call's arguments, and the model samples as its server serves it.
        temperature = options.temperature if options is not None and options.temperature is not None \
            else self.cfg.temperature
        max_tokens = options.max_tokens if options is not None and options.max_tokens is not None \
            else self.cfg.max_tokens
        if temperature is not None:
            payload["temperature"] = temperature
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if tools:
            payload["tools"] = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description", ""),
                "parameters": t.get("parameters", {"type": "object", "properties": {}})}} for t in tools]
            if isinstance(tool_choice, dict):
                payload["tool_choice"] = {"type": "function", "function": {"name": tool_choice["name"]}}
            else:
                payload["tool_choice"] = tool_choice
        return payload

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncIterator[str]:
        payload = self.build_payload(text, history, options)
        async for out in self._stream(payload, len(history), len(text), options):
            if isinstance(out, str):
                yield out

    async def respond_messages(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (),
                               tool_choice: Any = "auto", options: ReplyOptions | None = None,
                               ) -> AsyncIterator[str | ToolCall | ToolCallDelta]:
        """The whole conversation in, text deltas, the pieces of each tool call as they come, and each tool call
        once complete out."""
        payload = self.messages_payload(messages, tools, tool_choice, options)
        async for out in self._stream(payload, len(messages), sum(len(m.content) for m in messages), options):
            yield out

    async def _stream(self, payload: dict[str, Any], n_history: int, n_chars_in: int,
                      options: ReplyOptions | None = None) -> AsyncIterator[str | ToolCall | ToolCallDelta]:
        cfg = self.cfg
        t0 = time.monotonic()
        total_deadline = t0 + cfg.total_timeout_s
        first_deadline = min(total_deadline, t0 + cfg.first_token_timeout_s)
        log.info("respond.request engine=openai model=%s history=%d chars=%d tools=%d",
                 cfg.model, n_history, n_chars_in, len(payload.get("tools", ())))
        if self.debug_content:
            log.info("respond.request_text text=%r", payload["messages"][-1].get("content"))
        calls: dict[int, _Call] = {}  # tool calls being streamed, by index
        usage: dict[str, int] = {}  # the server's token counts (stream_options.include_usage)

        def remaining(first: bool) -> float:
            return max(0.0, (first_deadline if first else total_deadline) - time.monotonic())

        def timeout_error(first: bool) -> ResponderError:
            log.warning("respond.error kind=timeout stage=%s after_ms=%.0f",
                        "first_token" if first else "total", (time.monotonic() - t0) * 1000)
            return ResponderError(MSG_TIMEOUT_FIRST if first else MSG_TIMEOUT_TOTAL)

        try:
            resp = await asyncio.wait_for(
                self._client().post(self.url, json=payload, headers=self._headers()), remaining(True)
            )
        except aiohttp.ClientError as exc:
            # Connection refused, DNS, and the connect timeout (ConnectionTimeoutError, also a TimeoutError).
            log.warning("respond.error kind=connect error=%s url=%s", type(exc).__name__, self.url)
            raise ResponderError(MSG_UNREACHABLE) from exc
        except TimeoutError as exc:
            raise timeout_error(True) from exc

        n_chars = 0
        clean = False
        try:
            if resp.status != 200:
                raise self._http_error(resp.status)
            ctype = resp.headers.get("Content-Type", "")
            if ctype.startswith("application/json"):
                # A server that ignored ``stream``: the whole answer in one JSON body.
                content = await self._read_json_answer(resp, remaining(True), timeout_error)
                if content:
                    n_chars = len(content)
                    yield content
                clean = True
                return
            first = True
            finished = False
            read_bytes = 0
            pending: list[str] = []  # data lines of an SSE event not yet complete
            while True:
                try:
                    raw = await asyncio.wait_for(resp.content.readline(), remaining(first))
                except aiohttp.ClientError as exc:
                    log.warning("respond.error kind=stream_cut error=%s chars=%d",
                                type(exc).__name__, n_chars)
                    raise ResponderError(MSG_CUT) from exc
                except TimeoutError as exc:
                    raise timeout_error(first) from exc
                except ValueError as exc:  # "Line is too long"
                    log.warning("respond.error kind=bad_stream reason=line_too_long")
                    raise ResponderError(MSG_BAD_STREAM) from exc
                if not raw:  # EOF
                    if pending:
                        for delta in self._event("\n".join(pending), calls, usage, strict=True) or []:
                            finished = finished or delta is None
                    if finished:
                        break  # some servers end with finish_reason and no [DONE]
                    log.warning("respond.error kind=stream_cut reason=eof_before_done chars=%d", n_chars)
                    raise ResponderError(MSG_CUT)
                read_bytes += len(raw)
                if len(raw) > MAX_LINE_BYTES or read_bytes > MAX_STREAM_BYTES:
                    log.warning("respond.error kind=bad_stream reason=too_large bytes=%d", read_bytes)
                    raise ResponderError(MSG_BAD_STREAM)
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                deltas: list[str | ToolCallDelta | None] = []
                if not line:  # blank line ends an event
                    if pending:
                        deltas = self._event("\n".join(pending), calls, usage, strict=True) or []
                        pending.clear()
                elif line.startswith(":") or not line.startswith("data:"):
                    continue  # comment / keep-alive, or event:, id:, retry: fields
                else:
                    pending.append(line[5:].removeprefix(" "))
                    # Lenient: most servers send one JSON object per data line; handle it right away.
                    parsed = self._event("\n".join(pending), calls, usage, strict=False)
                    if parsed is not None or pending[-1] == "[DONE]":
                        pending.clear()  # handled: a blank line after it must not parse it again
                    deltas = parsed or []
                for delta in deltas:
                    if delta is None:
                        finished = True
                        continue
                    if first:
                        first = False
                        log.info("respond.first_token engine=openai ms=%.0f", (time.monotonic() - t0) * 1000)
                    if isinstance(delta, str):
                        n_chars += len(delta)
                    yield delta
        except _StreamDone:
            clean = True
        except (GeneratorExit, asyncio.CancelledError):
            log.info("respond.cancelled engine=openai ms=%.0f chars=%d",
                     (time.monotonic() - t0) * 1000, n_chars)
            raise
        finally:
            if clean:
                resp.release()
            else:
                resp.close()  # drop the connection so the server stops generating (barge-in, errors)
        log.info("respond.done engine=openai ms=%.0f chars=%d tool_calls=%d usage=%s",
                 (time.monotonic() - t0) * 1000, n_chars, len(calls), usage or "-")
        if options is not None and "prompt_tokens" in usage and "completion_tokens" in usage:
            options.usage = Usage(usage["prompt_tokens"], usage["completion_tokens"], exact=True)
        for index in sorted(calls):
            call = calls[index]
            if not call.name:
                log.warning("respond.error kind=bad_stream reason=tool_call_without_name")
                raise ResponderError(MSG_BAD_STREAM)
            yield ToolCall(call.call_id(index), call.name, call.arguments)

    def _event(self, data: str, calls: dict[int, _Call], usage: dict[str, int], *,
               strict: bool) -> list[str | ToolCallDelta | None] | None:
        """Parse one SSE ``data`` payload into content deltas (tool call pieces go to ``calls``); ``None`` in the
        list marks ``finish_reason``.

        Raises ``_StreamDone`` on ``[DONE]``. With ``strict=False`` an unparsable payload returns None (it may
        be the first line of a multi-line event); with ``strict=True`` it is an error.
        """
        if data.strip() == "[DONE]":
            raise _StreamDone
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            if not strict:
                return None
            log.warning("respond.error kind=bad_stream reason=json bytes=%d", len(data))
            raise ResponderError(MSG_BAD_STREAM) from exc
        if not isinstance(obj, dict):
            log.warning("respond.error kind=bad_stream reason=not_object")
            raise ResponderError(MSG_BAD_STREAM)
        if "error" in obj:
            log.warning("respond.error kind=server_error_in_stream")
            raise ResponderError(MSG_SERVER_ERROR)
        counts = obj.get("usage")
        if isinstance(counts, dict):
            usage.update({k: v for k, v in counts.items() if k in ("prompt_tokens", "completion_tokens")
                          and isinstance(v, int) and not isinstance(v, bool) and v >= 0})
        out: list[str | ToolCallDelta | None] = []
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise ResponderError(MSG_BAD_STREAM)
        for choice in choices[:1]:
            if not isinstance(choice, dict):
                raise ResponderError(MSG_BAD_STREAM)
            delta = choice.get("delta") or {}
            if isinstance(delta, dict) and isinstance(delta.get("tool_calls"), list):
                out.extend(_gather_tool_calls(delta["tool_calls"], calls))
            content = delta.get("content") if isinstance(delta, dict) else None
            if content is None and isinstance(choice.get("text"), str):
                content = choice["text"]  # legacy completions-style chunk
            if isinstance(content, str) and content:
                out.append(content)
            if choice.get("finish_reason"):
                out.append(None)
        return out

    async def _read_json_answer(self, resp: aiohttp.ClientResponse, timeout: float, on_timeout: Any) -> str:
        try:
            body = await asyncio.wait_for(read_capped(resp, MAX_JSON_BODY_BYTES), timeout)
        except TimeoutError as exc:
            raise on_timeout(True) from exc
        except aiohttp.ClientError as exc:
            raise ResponderError(MSG_CUT) from exc
        except BodyTooLarge as exc:
            raise ResponderError(MSG_BAD_STREAM) from exc
        try:
            obj = json.loads(body)
            content = obj["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            log.warning("respond.error kind=bad_json_answer bytes=%d", len(body))
            raise ResponderError(MSG_BAD_STREAM) from exc
        return content if isinstance(content, str) else ""

    @staticmethod
    def _http_error(status: int) -> ResponderError:
        log.warning("respond.error kind=http status=%d", status)
        if status in (401, 403):
            return ResponderError(MSG_AUTH)
        if status == 404:
            return ResponderError(MSG_NOT_FOUND)
        if status in (429, 503):
            return ResponderError(MSG_BUSY)
        return ResponderError(MSG_HTTP)


@dataclass
class _Call:
    """One tool call as its pieces arrive: the id and name come once, the arguments in pieces."""

    id: str = ""
    name: str = ""
    arguments: str = ""
    sent_id: str = ""  # the id its pieces went out with (the server's, or ours when it gave none)
    sent: int = -1  # arguments passed on so far (-1: nothing yet)

    def call_id(self, index: int) -> str:
        if not self.sent_id:
            self.sent_id = self.id or f"call_{index}"
        return self.sent_id


def _gather_tool_calls(deltas: list[Any], calls: dict[int, _Call]) -> list[ToolCallDelta]:
    """Add one chunk's ``delta.tool_calls`` pieces to the calls being streamed (id and name come once, the
    arguments in pieces); at most ``MAX_TOOL_CALLS`` calls (the arguments count toward the stream's bytes).
    Returns the pieces to pass on: each call's arguments since the last piece, once its name is known."""
    out: list[ToolCallDelta] = []
    for piece in deltas:
        if not isinstance(piece, dict):
            raise ResponderError(MSG_BAD_STREAM)
        index = piece.get("index", 0)
        if not isinstance(index, int) or not 0 <= index < MAX_TOOL_CALLS:
            raise ResponderError(MSG_BAD_STREAM)
        call = calls.setdefault(index, _Call())
        if isinstance(piece.get("id"), str):
            call.id = piece["id"]
        fn = piece.get("function") or {}
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str) and not call.name:
                call.name = fn["name"]
            if isinstance(fn.get("arguments"), str):
                call.arguments += fn["arguments"]
        if call.name and call.sent < len(call.arguments):
            out.append(ToolCallDelta(index, call.call_id(index), call.name, call.arguments[max(0, call.sent):]))
            call.sent = len(call.arguments)
    return out
