"""``respond.engine = "llama"``: the embedded model as a responder, in the process that calls it. Where it runs by
default (a supervised child process) is ``respond/hosted.py``'s business; this class is what runs there."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import TypedDict

from assistant.config import RespondConfig
from assistant.respond import persona
from assistant.respond.base import Message, ReplyOptions, ResponderError, Usage, kept_text
from assistant.respond.llama.clauses import VOICED_CHARS, ClauseLimit, clauses_length
from assistant.respond.llama.doubt import DoubtGate, is_factual_question, not_sure
from assistant.respond.llama.engine import MSG_CLOSED, MSG_FAILED, LlamaEngine, _End, _Request, _Token
from assistant.respond.llama.model_file import ModelFileError, is_bundled, resolve_model_path
from assistant.respond.llama.prompt import NEXT_TURN, Chat, ChatPrompt, PromptBuilder
from assistant.respond.llama.weights import weights_path

log = logging.getLogger(__name__)


class ModelInfo(TypedDict):
    """What answers (the page, the logs, a Ray replica's or a child process's ``info``)."""

    engine: str
    model: str  # the GGUF file's name
    description: str  # llama.cpp's: architecture, size, quantization
    slots: int
    context_tokens: int  # per slot
    file_mb: float
    kv_mb_per_slot: float


class LlamaResponder:
    """The embedded model: the system prompt, the history and the turn in, text deltas out, as the model makes
    them. Takes :class:`ReplyOptions` and reports exact token counts in them."""

    name = "llama"

    def __init__(self, cfg: RespondConfig | None = None) -> None:
        self.cfg = persona.embedded(cfg or RespondConfig())  # what the config leaves unset: the persona's
        source = resolve_model_path(self.cfg)
        path = weights_path(source, self.cfg)  # the packaged Q4_1 as Q8_0 on a CPU (weights.py)
        c = self.cfg

        def engine(file: Path) -> LlamaEngine:
            return LlamaEngine(file, slots=c.slots, context_tokens=c.context_tokens, threads=c.threads,
                               prompt_threads=c.prompt_threads,
                               gpu_layers=c.gpu_layers, prefill_chunk=c.prefill_chunk, max_waiting=c.max_waiting,
                               extra_buffers=c.extra_buffers)

        try:
            self.engine = engine(path)
        except ModelFileError:
            if path == source:
                raise
            # A rewrite in the cache that llama.cpp cannot load (damaged since it was written): the source loads,
            # and the next start writes the rewrite again.
            log.warning("llm.rewrite_unloadable file=%s (removed; loading %s as it is)", path, source)
            path.unlink(missing_ok=True)
            path = source
            self.engine = engine(path)
        e = self.engine
        chat = ChatPrompt(e.template, e.token_text(e.L.llama_vocab_bos(e.vocab)),
                          e.token_text(e.L.llama_vocab_eos(e.vocab)))
        self.prompts = PromptBuilder(chat, e.tokenize, e.n_ctx_seq, c.system_prompt or "", c.language,
                                     persona.example_messages(c))
        self.model = source.name
        self.weights = path  # the file loaded: the source, or its rewrite
        self.last_doubt: DoubtGate | None = None  # the latest reply's gate, when it had one (the lab, diagnostics)
        self.last_prompt_text = ""  # the latest reply's prompt, as rendered (tests, diagnostics)
        self.last_request: _Request | None = None  # the latest reply's request: its reuse, tokens (diagnostics)
        self._kept_waits: set[asyncio.Task[None]] = set()  # prepares waiting for their turn to be kept

    @property
    def temperature(self) -> float:
        """Sampling when the turn asks for none (``respond.temperature``, else the persona's)."""
        return self.cfg.temperature if self.cfg.temperature is not None else persona.TEMPERATURE

    @property
    def max_tokens(self) -> int:
        """A reply's token cap when the turn asks for none (``respond.max_tokens``, else the persona's)."""
        return self.cfg.max_tokens if self.cfg.max_tokens is not None else persona.MAX_TOKENS

    @property
    def prompt(self) -> ChatPrompt:
        return self.prompts.prompt

    def doubts(self) -> bool:
        """Honest doubt is on (doubt.py): ``respond.doubt``, whose ``auto`` means the bundled model (its thresholds
        were tuned for it)."""
        return self.cfg.doubt == "on" or (self.cfg.doubt == "auto" and is_bundled(self.cfg))

    def describe(self) -> ModelInfo:
        """What answers: for the page and logs."""
        e = self.engine
        return {"engine": self.name, "model": self.model, "description": e.description, "slots": e.slots_n,
                "context_tokens": e.n_ctx_seq, "file_mb": round(e.file_bytes / 2**20, 1),
                "kv_mb_per_slot": round(e.kv_bytes_per_slot / 2**20, 1)}

    def stats(self) -> dict[str, int]:
        """The engine's counters and its load now (Ray replica, child process, metrics)."""
        return {**self.engine.stats, "active": self.engine.active, "waiting": self.engine.waiting}

    # --- prompt (kept for callers of the old names) ------------------------------------------------------------
    def messages(self, text: str, history: Sequence[Message], options: ReplyOptions) -> Chat:
        return self.prompts.messages(text, history, options)

    def prompt_for(self, messages: Chat, reserve: int) -> tuple[Chat, str, list[int]]:
        return self.prompts.fit(messages, reserve)

    def next_prompt_start(self, messages: Chat) -> list[int]:
        return self.prompts.next_prompt_start(messages)

    # --- reply -------------------------------------------------------------------------------------------------
    async def respond(self, text: str, history: Sequence[Message],
                      options: ReplyOptions | None = None) -> AsyncGenerator[str, None]:
        opts = options if options is not None else ReplyOptions()
        max_tokens = max(1, opts.max_tokens if opts.max_tokens is not None else self.max_tokens)
        temperature = opts.temperature if opts.temperature is not None else self.temperature
        reserve = min(max_tokens, self.engine.n_ctx_seq // 2)
        # Off the event loop: a long history costs a few renders and tokenizations of the whole conversation.
        _, self.last_prompt_text, prompt = await asyncio.to_thread(
            self.prompts.fit, self.prompts.messages(text, history, opts), reserve)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Token | _End] = asyncio.Queue()

        def deliver(item: _Token | _End) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a reply: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, item)

        t0 = time.monotonic()
        language = opts.language or self.cfg.language
        gate = DoubtGate(language) if self.doubts() and is_factual_question(text, language) else None
        self.last_doubt = gate
        request = self.engine.submit(prompt, max_tokens, temperature, deliver, logprobs=gate is not None,
                                     key=opts.session)
        self.last_request = request
        limit = ClauseLimit(request.max_tokens)
        end: _End | None = None
        n_out = 0
        started = False  # the reply's first words came (the whitespace a model puts before them is dropped)
        said: list[str] = []
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    end = item
                    break
                if n_out == 0 and item.text:
                    log.info("llm.first_token ms=%.0f prompt=%d reused=%d slot=%d session=%s",
                             (time.monotonic() - t0) * 1000, len(prompt), request.reused, request.slot, opts.session)
                n_out = item.n_tokens
                piece = item.text if started else item.text.lstrip()
                started = started or bool(piece)
                if gate is not None and not gate.decided:  # a factual answer's first sentence, held and judged
                    piece = gate.feed(piece, item.logprob)
                    if gate.doubted:
                        break
                say = limit.feed(piece, item.n_tokens)
                if say:
                    said.append(say)
                    if not request.voiced and clauses_length("".join(said)) >= VOICED_CHARS:
                        self.engine.voiced(request)  # its caller has speech ahead: others' first clauses go first
                    yield say
                self.engine.consumed(request, item.n_tokens)
            if gate is not None and gate.doubted:
                log.info("llm.doubt score=%.2f threshold=%.2f language=%s", gate.score, gate.limit, language)
                said.append(not_sure(language))
                yield said[-1]
                self.engine.cancel(request)  # before the prepare: it waits for an idle slot
                await self._after_reply(request, history, text, "".join(said), opts)
                return
            assert end is not None
            if end.reason == "error":
                raise ResponderError(MSG_FAILED)
            if end.reason == "cancelled":  # the engine closed under us
                raise ResponderError(end.error or MSG_CLOSED)
            if gate is not None and not gate.decided:  # the reply ended inside its first sentence
                held = gate.decide()
                if gate.doubted:
                    said.append(not_sure(language))
                    yield said[-1]
                    await self._after_reply(request, history, text, "".join(said), opts)
                    return
                say = limit.feed(held, n_out)
                if say:
                    said.append(say)
                    yield say
            tail = limit.finish(cut=end.reason == "length")
            if tail:
                said.append(tail)
                yield tail
            await self._after_reply(request, history, text, "".join(said), opts)
            if limit.dropped:
                log.info("llm.cut_at_clause max_tokens=%d dropped_chars=%d", request.max_tokens, len(limit.dropped))
        finally:
            if end is None:
                self.engine.cancel(request)
            opts.usage = Usage(len(prompt), end.output_tokens if end is not None else request.generated, exact=True)
            log.info("llm.reply reason=%s prompt=%d reused=%d tokens=%d ms=%.0f", end.reason if end else "cancelled",
                     len(prompt), request.reused, opts.usage.output_tokens, (time.monotonic() - t0) * 1000)

    def next_history(self, history: Sequence[Message], text: str, said: str) -> list[Message]:
        """The history the next turn will bring, as the voice chat keeps it (``ConversationHistory``): this turn
        added, and once ``respond.history_turns`` pairs are held, the oldest pair gone."""
        head = [m for m in history[:1] if m.role == "system"]
        turns = [*history[len(head):], Message("user", text), *([Message("assistant", said)] if said else [])]
        users = [i for i, m in enumerate(turns) if m.role == "user"]
        cap = max(0, self.cfg.history_turns)
        if len(users) > cap:
            turns = turns[users[len(users) - cap]:] if cap else []
        return [*head, *turns]

    async def _after_reply(self, request: _Request, history: Sequence[Message], text: str, said: str,
                           opts: ReplyOptions) -> None:
        """The reply is over: get the next prompt ready, now from what was said, or once the conversation says
        what it kept (``ReplyOptions.kept``)."""
        if opts.kept is None:
            await asyncio.to_thread(self._prepare_next, request, self.next_history(history, text, said))
        else:
            self._prepare_when_kept(request, history, text, opts.kept)

    def _prepare_when_kept(self, request: _Request, history: Sequence[Message], text: str,
                           kept: asyncio.Future[str]) -> None:
        """Get the next prompt ready once the conversation keeps this reply (``ReplyOptions.kept``), from what it
        kept; never for a turn it drops. Prepared at once, a speculative reply the user talked over had put a
        history that never happened in the slot, and once the history was full had shifted the oldest turn out,
        which the real next prompt still held: that turn evaluated the whole history again (2.1 s, 1 turn in 40)."""

        async def when_kept() -> None:
            said = await kept_text(kept)
            if said is None:
                log.debug("llm.prepare_dropped slot=%d", request.slot)
                return
            await asyncio.to_thread(self._prepare_next, request, self.next_history(history, text, said))

        task = asyncio.get_running_loop().create_task(when_kept(), name="llm-prepare-when-kept")
        self._kept_waits.add(task)
        task.add_done_callback(self._kept_waits.discard)

    def _prepare_next(self, request: _Request, history: list[Message]) -> None:
        """The reply is over: while the user speaks, its slot evaluates the start of the next prompt (the messages
        the next turn will be built from, rendered as the template writes them, and the user turn's opening).
        Built as the next turn will be, the oldest pair already gone once the history is full: the slot's cache
        is shifted into place now, not when the user is waiting for the reply (a shift re-ropes the whole cache:
        once the history was full it doubled the first token's wait, 81-105 → 183-219 ms in a one-off probe)."""
        try:
            # No language asked: a note ("Answer in French.") goes on the new turn only, which is not part of it.
            messages = self.prompts.messages(NEXT_TURN, history, ReplyOptions())
            if not messages or messages[-1]["content"] != NEXT_TURN:  # the turn merged into an unanswered one
                return
            tokens = self.prompts.next_prompt_start(messages[:-1])
        except Exception:  # a template that cannot render this: the next turn evaluates it instead
            log.debug("llm.prepare_skipped", exc_info=True)
            return
        self.engine.prepare(request, tokens)

    async def warmup(self) -> None:
        """Evaluate the system prompt in every slot (so no session's first turn pays for it) and run a few
        decode steps (so the first reply does not pay for the graph's first run)."""
        msgs = self.prompts.messages("Hello.", [], ReplyOptions())
        _, _, prompt = await asyncio.to_thread(self.prompts.fit, msgs, 8)
        loop = asyncio.get_running_loop()
        done = [loop.create_future() for _ in range(self.engine.slots_n)]

        def deliver_to(fut: asyncio.Future[None]) -> Callable[[_Token | _End], None]:
            def settle() -> None:
                if not fut.done():
                    fut.set_result(None)

            def deliver(item: _Token | _End) -> None:
                if isinstance(item, _End):
                    loop.call_soon_threadsafe(settle)
            return deliver

        t0 = time.monotonic()
        requests = [self.engine.submit(prompt, 4, 0.0, deliver_to(fut), warmup=True) for fut in done]
        await asyncio.gather(*done)
        start = self.prompts.next_prompt_start(msgs[:-1])  # all but "Hello.": the system prompt and the examples
        for request in requests:  # every slot: the system prompt, the examples and the first user turn's opening
            self.engine.prepare(request, start)
        while not self.engine.settled:
            await asyncio.sleep(0.005)
        log.info("llm.warm slots=%d prompt=%d ms=%.0f", len(done), len(prompt), (time.monotonic() - t0) * 1000)

    async def aclose(self) -> None:
        for task in list(self._kept_waits):
            task.cancel()
        await asyncio.to_thread(self.engine.close)

