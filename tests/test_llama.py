"""The embedded llama.cpp responder on the real packaged model (SmolLM2-135M-Instruct Q4_1): prompts, the KV
cache across turns, slots, cancellation, limits, bad model files. No stubs: every reply here is the model's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from assistant.config import RespondConfig
from assistant.respond import create_responder, persona
from assistant.respond.base import Message, ReplyOptions, ResponderError, Usage
from assistant.respond.history import ConversationHistory
from assistant.respond.llama import (
    AHEAD_TOKENS,
    ChatPrompt,
    ClauseLimit,
    LlamaResponder,
    ModelFileError,
    clause_end,
    default_model_path,
    ends_clause,
    plan_reuse,
    slot_cost,
)
from assistant.respond.llama import engine as engine_module
from assistant.respond.llama.clauses import clauses_length
from tests.waiting import until

pytestmark = [pytest.mark.slow]
LOOP = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are a helpful voice assistant. Answer briefly in plain spoken sentences."
LONG_ASK = "Write a long essay about the history of Rome."  # greedy SmolLM2 runs to 300 tokens on it


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llama() -> AsyncIterator[LlamaResponder]:
    """The default model, 2 slots of 1024 tokens, one thread (the suite shares 2 cores), warmed up."""
    # The engine's mechanics under a fixed prompt: no persona examples (tests/lab/test_bench_replies.py has those).
    r = LlamaResponder(RespondConfig(engine="llama", slots=2, context_tokens=1024, threads=1, max_waiting=1,
                                     system_prompt=SYSTEM, temperature=0.0, examples=False))
    await r.warmup()
    yield r
    await r.aclose()


async def reply(r: LlamaResponder, text: str, history: list[Message] | None = None,
                options: ReplyOptions | None = None) -> str:
    return "".join([d async for d in r.respond(text, history or [], options)])


async def drain(stream: AsyncIterator[str]) -> str:
    return "".join([d async for d in stream])


async def wait_idle(r: LlamaResponder) -> None:
    await until(lambda: r.engine.active == 0, "every slot to be free", 30)


@contextlib.asynccontextmanager
async def long_reply_being_read(r: LlamaResponder) -> AsyncIterator[engine_module._Request]:
    """``LONG_ASK`` answered and read as it is made (a listener); stopped, and every slot free, at the end."""
    await wait_idle(r)
    long = r.respond(LONG_ASK, [], ReplyOptions(max_tokens=300))
    await anext(long)
    request = r.last_request
    assert request is not None
    reader = asyncio.ensure_future(drain(long))
    try:
        yield request
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await long.aclose()
        await wait_idle(r)


# --- pure parts: the KV reuse plan, clause ends, templates -------------------------------------------------------
def test_reuse_plan_prefix_and_shifted_chunks() -> None:
    system, t1, t2, t3 = list(range(100, 110)), list(range(200, 230)), list(range(300, 330)), list(range(400, 420))
    cache = system + t1 + t2
    # The next turn: the whole cache is the prefix; the new turn's tokens are left (and never the last token).
    assert plan_reuse(cache, cache + t3, can_shift=True).n_past == len(cache)
    assert plan_reuse(cache, cache, can_shift=True).n_past == len(cache) - 1
    # The history dropped its oldest turn: the system prompt is the prefix, the later turn moves up into place.
    plan = plan_reuse(cache, system + t2 + t3, can_shift=True)
    assert plan.n_past == len(system) + len(t2)
    assert plan.shifts == ((len(system) + len(t1), len(t2), -len(t1)),)
    # A model whose positions cannot move (can_shift false) reuses only the prefix.
    assert plan_reuse(cache, system + t2 + t3, can_shift=False) == type(plan)(len(system))
    # Chunks shorter than the minimum are not worth moving.
    assert plan_reuse([*system, 1, 2, 3, *t1], system + t1[:5] + t3, can_shift=True).n_past == len(system)


def test_a_slot_costs_the_tokens_it_lacks_and_the_live_conversation_it_throws_away() -> None:
    system, a, b = list(range(100, 110)), list(range(200, 240)), list(range(300, 320))
    first_word = [200]  # B's first word is A's: A's slot holds one token more of B's prompt than an idle slot
    prompt_b = system + first_word + b
    idle, a_slot = system, system + a
    plan_idle, plan_a = plan_reuse(idle, prompt_b, can_shift=True), plan_reuse(a_slot, prompt_b, can_shift=True)
    assert plan_a.n_past == plan_idle.n_past + 1
    # A's slot lacks one token fewer, and would throw away A's 39 others: the idle slot costs less.
    assert slot_cost(plan_idle, len(prompt_b), len(idle), idle_s=1.0) == len(b) + 1
    assert slot_cost(plan_a, len(prompt_b), len(a_slot), idle_s=1.0) == len(b) + len(a) - 1
    # A conversation idle for KEEP_S is over: its cache is worth nothing, only what the prompt lacks counts.
    assert slot_cost(plan_a, len(prompt_b), len(a_slot), idle_s=1e6) == len(b)
    # A's own next turn costs only its new words in its own slot.
    assert slot_cost(plan_reuse(a_slot, a_slot + b, can_shift=True), len(a_slot + b), len(a_slot), 1.0) == len(b)


def test_clause_ends() -> None:
    assert clause_end("Sure, I can help. Then") == len("Sure, I can help.")
    assert clause_end("No marks here") == 0
    assert clause_end('He said "go." And') == len('He said "go."')
    assert clause_end("好的，我来") == len("好的，")
    assert ends_clause("Done.") and ends_clause("Done!\" ") and not ends_clause("not done")
    assert clauses_length("Sure, I can help. Then") == len("Sure, I can help.")
    assert clauses_length("I'm sorry, ") == len("I'm sorry,") and clauses_length("No marks") == 0


def test_clause_limit_holds_the_unfinished_clause_near_the_limit() -> None:
    limit = ClauseLimit(max_tokens=30)  # text is held from token 6 on
    said = limit.feed("Hello there.", 3) + limit.feed(" First part,", 7) + limit.feed(" and then", 9)
    assert said == "Hello there. First part,"
    assert limit.finish(cut=True) == "" and limit.dropped == " and then"
    done = ClauseLimit(max_tokens=30)
    assert done.feed("One", 1) == "One"
    assert done.feed(" two", 29) == ""  # held, then the model ended by itself: said
    assert done.finish(cut=False) == " two"
    tiny = ClauseLimit(max_tokens=3)  # nothing else would be said: the words are kept
    assert tiny.feed("Hi", 1) == "" and tiny.finish(cut=True) == "Hi"


def test_template_without_a_system_role_gets_it_in_the_first_user_turn() -> None:
    gemma_like = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                  "supported') }}{% endif %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    prompt = ChatPrompt(gemma_like, "<bos>", "<eos>")
    text = prompt.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


# --- bad model files ---------------------------------------------------------------------------------------------
def test_missing_and_corrupt_model_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileError, match=str(missing)):
        create_responder(RespondConfig(engine="llama", model_path=str(missing)))
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ModelFileError, match=f"not a GGUF model file.*{text}"):
        create_responder(RespondConfig(engine="llama", model_path=str(text)))
    truncated = tmp_path / "truncated.gguf"  # a real model's first 64 KiB: GGUF magic, then nothing
    with default_model_path().open("rb") as f:
        truncated.write_bytes(f.read(65536))
    with pytest.raises(ModelFileError, match=f"could not load.*{truncated}"):
        create_responder(RespondConfig(engine="llama", model_path=str(truncated)))


def test_default_model_comes_from_the_installed_package() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


# --- the real model ----------------------------------------------------------------------------------------------
async def test_unset_prompt_and_sampling_are_the_small_models_own() -> None:
    """Left unset in [respond], the system prompt, the temperature and the token cap are the persona the embedded
    model was tuned with, here, where it answers (not every engine's: tests/test_realtime_tools.py); set, they win."""
    default = LlamaResponder(RespondConfig(engine="llama", slots=1, context_tokens=256, threads=1))
    mine = LlamaResponder(RespondConfig(engine="llama", slots=1, context_tokens=256, threads=1,
                                        system_prompt="Be a cat.", temperature=0.7, max_tokens=99))
    try:
        assert (default.prompts.system_prompt, default.temperature, default.max_tokens) == (
            persona.SYSTEM_PROMPT, persona.TEMPERATURE, persona.MAX_TOKENS) == (persona.SYSTEM_PROMPT, 0.0, 48)
        assert "cannot set timers" in default.prompts.render(default.messages("Hi.", [], ReplyOptions()))[0]
        assert (mine.prompts.system_prompt, mine.temperature, mine.max_tokens) == ("Be a cat.", 0.7, 99)
    finally:
        await default.aclose()
        await mine.aclose()


@LOOP
async def test_answers_with_its_own_words_and_exact_usage(llama: LlamaResponder) -> None:
    options = ReplyOptions()
    text = await reply(llama, "What should I cook tonight?", options=options)
    assert text.strip() and "what should i cook tonight" not in text.lower()
    assert isinstance(options.usage, Usage) and options.usage.exact
    request = llama.last_request
    assert request is not None
    assert options.usage.input_tokens == len(request.prompt) and options.usage.output_tokens == request.generated
    assert 0 < options.usage.output_tokens <= persona.MAX_TOKENS
    # The prompt is the GGUF's template (ChatML here) over the system prompt and the turn.
    assert llama.last_prompt_text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")
    assert llama.last_prompt_text.endswith("<|im_start|>user\nWhat should I cook tonight?<|im_end|>\n"
                                           "<|im_start|>assistant\n")
    # Warm-up put the system prompt in every slot: this turn evaluated only its own tokens.
    assert request.reused >= len(llama.engine.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))


@LOOP
async def test_next_turn_holds_the_last_and_reuses_its_cache(llama: LlamaResponder) -> None:
    first = await reply(llama, "My name is Ada. What is a good name for a cat?")
    turn1 = llama.last_request
    history = [Message("user", "My name is Ada. What is a good name for a cat?"), Message("assistant", first)]
    # The user speaks: meanwhile the slot evaluates the next prompt's start.
    await until(lambda: llama.engine.settled, "the next prompt's start to be evaluated", 30)
    await reply(llama, "And for a dog?", history)
    turn2 = llama.last_request
    assert turn1 is not None and turn2 is not None
    assert "My name is Ada. What is a good name for a cat?" in llama.last_prompt_text
    assert first.strip() in llama.last_prompt_text
    # Everything of turn 1 (its prompt, the reply as the history holds it, the next user turn's opening) was in
    # the slot: only turn 2's own words (and the assistant's opening after them) were evaluated.
    assert turn2.slot == turn1.slot
    own = llama.engine.tokenize("And for a dog?<|im_end|>\n<|im_start|>assistant\n")
    assert len(turn2.prompt) - turn2.reused <= len(own) + 1, (len(turn2.prompt), turn2.reused, len(own))
    # The oldest turn dropped from the history: the later turns move up in the cache instead of being evaluated.
    history2 = [*history, Message("user", "And for a dog?"), Message("assistant", "Rex is a classic dog name.")]
    await reply(llama, "Thanks!", history2)
    await reply(llama, "Which one is shorter?", history2[2:])
    turn4 = llama.last_request
    assert turn4 is not None
    system_len = len(llama.engine.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))
    assert turn4.reused > system_len + 10, (turn4.reused, system_len)


@pytest.mark.asyncio
async def test_a_new_conversation_leaves_a_live_one_its_slot() -> None:
    """Two conversations whose first words are the same ("Can …"): the second takes the idle slot, not the one
    holding the first's history (one token more of its prompt), so the first's next turn evaluates only its own
    words. Before, four sessions on four slots threw each other's histories away turn after turn."""
    r = LlamaResponder(RespondConfig(engine="llama", slots=2, context_tokens=512, threads=1, max_waiting=1,
                                     system_prompt=SYSTEM, temperature=0.0, examples=False, max_tokens=12))
    try:
        await r.warmup()
        ask_a, ask_b = "Can you name a red fruit?", "Can you name a green vegetable?"
        said_a = await reply(r, ask_a)
        a1 = r.last_request
        await until(lambda: r.engine.settled, "the next prompt's start to be evaluated", 30)
        await reply(r, ask_b)
        b1 = r.last_request
        assert a1 is not None and b1 is not None
        assert b1.slot != a1.slot
        await until(lambda: r.engine.settled, "the next prompt's start to be evaluated", 30)
        await reply(r, "And a yellow one?", [Message("user", ask_a), Message("assistant", said_a)])
        a2 = r.last_request
        assert a2 is not None and a2.slot == a1.slot
        own = r.engine.tokenize("And a yellow one?<|im_end|>\n<|im_start|>assistant\n")
        assert len(a2.prompt) - a2.reused <= len(own) + 1, (len(a2.prompt), a2.reused, len(own))
    finally:
        await r.aclose()


@LOOP
async def test_a_full_history_is_shifted_while_the_user_speaks_not_when_they_wait(llama: LlamaResponder) -> None:
    """Once the history holds ``respond.history_turns`` pairs, each turn drops the oldest: the slot's cache is
    moved into place after the reply (while the user speaks), so the next turn starts with nothing to shift and
    only its own words to evaluate."""
    llama.cfg.history_turns, cap = 2, llama.cfg.history_turns
    history = ConversationHistory(2)
    try:
        for k, ask in enumerate(["Name a fruit.", "Name a colour.", "Name a city.", "Name a river.", "Name a tree."]):
            said = await reply(llama, ask, history.messages, ReplyOptions(max_tokens=10))
            request = llama.last_request
            assert request is not None
            if k >= 3:  # the history was full the turn before: its oldest pair left then, not now
                own = llama.engine.tokenize(f"{ask}<|im_end|>\n<|im_start|>assistant\n")
                assert request.shifted == 0, (k, request.shifted)
                assert len(request.prompt) - request.reused <= len(own) + 1, (k, len(request.prompt), request.reused)
            history.add_turn(ask, said)
            await until(lambda: llama.engine.settled, "the next prompt's start to be evaluated", 30)
    finally:
        llama.cfg.history_turns = cap


@LOOP
async def test_a_reply_the_conversation_drops_leaves_the_slot_to_the_history_it_has(llama: LlamaResponder) -> None:
    """The next prompt is got ready from what the conversation kept (``ReplyOptions.kept``), never from a turn it
    dropped. A speculative reply the user talked over, prepared at once, had put its own history in the slot and,
    the history being full, shifted the oldest turn out: the real turn, whose history still has it, evaluated the
    whole history again (2.1 s in a 40-turn run)."""
    llama.cfg.history_turns, cap = 2, llama.cfg.history_turns
    history = ConversationHistory(2)
    loop = asyncio.get_running_loop()
    try:
        for ask in ["Name a fruit.", "Name a colour."]:
            kept: asyncio.Future[str] = loop.create_future()
            prepared = llama.engine.stats["prepared"]
            said = await reply(llama, ask, history.messages, ReplyOptions(max_tokens=10, kept=kept))
            await asyncio.sleep(0.05)
            assert llama.engine.stats["prepared"] == prepared  # nothing prepared before it is kept
            history.add_turn(ask, said)
            kept.set_result(said)
            await until(lambda n=prepared + 1: llama.engine.stats["prepared"] == n and llama.engine.settled,
                        "the prepared start", 30)
        # The history is full. A speculation at a pause ("Name a city") is answered, then dropped: the user went on.
        spoken: asyncio.Future[str] = loop.create_future()
        prepared = llama.engine.stats["prepared"]
        await reply(llama, "Name a city", history.messages, ReplyOptions(max_tokens=10, kept=spoken))
        spec = llama.last_request
        spoken.cancel()
        await until(lambda: llama.engine.settled, "the engine settled", 30)
        assert llama.engine.stats["prepared"] == prepared  # nothing got ready from the dropped reply
        ask = "Name a city in Spain."
        await reply(llama, ask, history.messages, ReplyOptions(max_tokens=10))
        real = llama.last_request
        assert spec is not None and real is not None and real.slot == spec.slot
        own = llama.engine.tokenize(f"{ask}<|im_end|>\n<|im_start|>assistant\n")
        assert real.shifted == 0 and len(real.prompt) - real.reused <= len(own) + 1, (len(real.prompt), real.reused)
    finally:
        llama.cfg.history_turns = cap


@LOOP
async def test_the_engine_never_reads_settled_while_a_preparation_is_being_applied(
        llama: LlamaResponder, monkeypatch: pytest.MonkeyPatch) -> None:
    """``settled`` holds only once a queued preparation is in its slot and counted. Read without the engine's lock,
    a queue just taken but not yet applied read as settled: on a busy machine the count came after a test had
    moved on (CI, stop 72). Here applying one is held 0.2 s, as a busy scheduler may hold the engine thread."""
    real = engine_module.plan_reuse

    def held(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)
        return real(*args, **kwargs)

    await until(lambda: llama.engine.settled, "the engine settled", 30)
    prepared = llama.engine.stats["prepared"]
    monkeypatch.setattr(engine_module, "plan_reuse", held)
    await reply(llama, "Name a fruit.", [], ReplyOptions(max_tokens=5))  # its preparation is queued on return
    await until(lambda: llama.engine.settled, "the engine settled", 30)
    assert llama.engine.stats["prepared"] == prepared + 1


@pytest.mark.asyncio
async def test_a_doubted_reply_gets_the_next_prompt_ready_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A factual answer the model is unsure of is replaced by "I'm not sure" (honest doubt); the history keeps that,
    and the slot gets ready for it like after any reply, so the next turn evaluates only its own words. The English
    threshold is raised to 0 here so that any answer is doubted: whether the small model's greedy answer falls below
    the shipped one depends on the CPU's kernels (on an AMD EPYC "Name a fruit." was doubted; on a Xeon with AVX-512
    it answered "The most iconic example of a fruit is the Banana." at -1.89, above -2.8)."""
    from assistant.respond.llama import doubt

    monkeypatch.setitem(doubt.THRESHOLDS, "en", 0.0)
    r = LlamaResponder(RespondConfig(engine="llama", slots=1, context_tokens=1024, threads=1, max_waiting=1,
                                     system_prompt="Answer briefly.", temperature=0.0, examples=False, doubt="on"))
    try:
        await r.warmup()
        ask = "Name a fruit."
        kept: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        said = await reply(r, ask, [], ReplyOptions(kept=kept))
        assert r.last_doubt is not None and r.last_doubt.doubted, said
        prepared = r.engine.stats["prepared"]
        kept.set_result(said)
        await until(lambda: r.engine.stats["prepared"] == prepared + 1 and r.engine.settled, "the prepared start", 30)
        ask2 = "Thanks."
        await reply(r, ask2, [Message("user", ask), Message("assistant", said)])
        request = r.last_request
        assert request is not None
        own = r.engine.tokenize(f"{ask2}<|im_end|>\n<|im_start|>assistant\n")
        assert len(request.prompt) - request.reused <= len(own) + 1, (len(request.prompt), request.reused, len(own))
    finally:
        await r.aclose()


@pytest.mark.asyncio
async def test_a_prompt_takes_the_free_cores_and_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """respond.prompt_threads: a step of one conversation's prompt runs on two threads when two cores are free as it
    starts, on respond.threads when not (a thread that shares its core stalls llama.cpp's step); the reply's own
    tokens stay on one. The words do not change with the threads."""
    from assistant.respond.llama import engine as engine_module

    r = LlamaResponder(RespondConfig(engine="llama", slots=1, context_tokens=512, threads=1, prompt_threads=2,
                                     max_waiting=1, system_prompt=SYSTEM, temperature=0.0, examples=False))
    try:
        assert r.engine.prompt_threads == 2
        ask = "Name three colours."
        monkeypatch.setattr(engine_module, "free_cpus", lambda usable: 1)  # another thread has the second core
        await r.warmup()
        busy = await reply(r, ask, options=ReplyOptions(max_tokens=12))
        assert r.engine.stats["wide_steps"] == 0
        await wait_idle(r)
        monkeypatch.setattr(engine_module, "free_cpus", lambda usable: 2)  # nothing else runs
        free = await reply(r, "Hello.", options=ReplyOptions(max_tokens=12))  # another prompt: the slot starts over
        free = await reply(r, ask, options=ReplyOptions(max_tokens=12))
        wide = r.engine.stats["wide_steps"]
        assert wide >= 2, r.engine.stats  # each prompt's step (a reply's single tokens never widen)
        assert r.engine.stats["steps"] > wide
        assert free == busy
        # A step other conversations' tokens share stays on one thread (a taken core would stall them all), and so
        # does a single token; one conversation's prompt takes what is free, up to prompt_threads.
        engine = r.engine
        for tokens, slots, free_now, threads in [(20, 2, 2, 1), (1, 1, 2, 1), (20, 1, 2, 2), (20, 1, 1, 1)]:
            monkeypatch.setattr(engine_module, "free_cpus", lambda usable, n=free_now: n)
            engine._wide_threads(tokens, slots)
            assert engine._batch_threads == threads, (tokens, slots, free_now)
    finally:
        await r.aclose()


@LOOP
async def test_after_a_turn_in_another_language_the_next_evaluates_only_its_own_words(llama: LlamaResponder) -> None:
    """The note asking for the turn's language goes on that turn's prompt only; the start prepared for the next
    turn holds the history as the next prompt will (no note), so nothing but the new turn is evaluated."""
    ask = "Bonjour, comment ça va ?"
    said = await reply(llama, ask, options=ReplyOptions(language="fr", max_tokens=8))
    await until(lambda: llama.engine.settled, "the next prompt's start to be evaluated", 30)
    await reply(llama, "Hello!", [Message("user", ask), Message("assistant", said)], ReplyOptions(max_tokens=8))
    request = llama.last_request
    assert request is not None
    own = llama.engine.tokenize("Hello!<|im_end|>\n<|im_start|>assistant\n")
    assert len(request.prompt) - request.reused <= len(own) + 1, (len(request.prompt), request.reused, len(own))


@LOOP
async def test_the_turns_language_reaches_the_prompt(llama: LlamaResponder) -> None:
    await reply(llama, "Bonjour, comment ça va ?", options=ReplyOptions(language="fr", max_tokens=8))
    assert "(Answer in French.)" in llama.last_prompt_text
    await reply(llama, "Hello!", options=ReplyOptions(language="en", max_tokens=8))
    assert "Answer in" not in llama.last_prompt_text  # the configured language: no note


@LOOP
async def test_max_tokens_stops_at_a_clause(llama: LlamaResponder) -> None:
    options = ReplyOptions(max_tokens=40, temperature=0.0)
    text = await reply(llama, "Tell me a long story about a dragon and a knight.", options=options)
    assert options.usage is not None and options.usage.output_tokens <= 40
    assert text.strip() and ends_clause(text), text


@LOOP
async def test_context_full_drops_oldest_turns_never_the_system_prompt(llama: LlamaResponder) -> None:
    history: list[Message] = []
    for i in range(40):  # ~40 × 25 tokens: more than the 1024-token slot holds beside the reply's room
        history += [Message("user", f"Question number {i}: what is {i} plus {i}?"),
                    Message("assistant", f"{i} plus {i} is {2 * i}. Anything else?")]
    options = ReplyOptions(max_tokens=16)
    text = await reply(llama, "What was my last question?", history, options)
    assert text.strip()
    prompt = llama.last_prompt_text
    assert prompt.startswith(f"<|im_start|>system\n{SYSTEM}")
    assert "Question number 39" in prompt and "Question number 0:" not in prompt
    assert options.usage is not None and options.usage.input_tokens <= llama.engine.n_ctx_seq - 16
    # One turn longer than the whole context: its end is kept.
    long_turn = " ".join(f"word{i}" for i in range(3000)) + " What is the last word?"
    text = await reply(llama, long_turn, options=ReplyOptions(max_tokens=8))
    assert "What is the last word?" in llama.last_prompt_text and "word0 " not in llama.last_prompt_text


@LOOP
async def test_cancel_stops_within_a_token_and_frees_the_slot(llama: LlamaResponder) -> None:
    await wait_idle(llama)
    before = llama.engine.stats["tokens_after_cancel"]
    options = ReplyOptions(max_tokens=200)
    stream = llama.respond(LONG_ASK, [], options)
    got = [await anext(stream), await anext(stream)]
    assert "".join(got).strip()
    request = llama.last_request
    assert request is not None
    await stream.aclose()  # what the turn runner's cancel does to the iterator
    await wait_idle(llama)
    assert request.cancelled and request.done
    made_after = request.after_cancel
    assert made_after <= 2 and llama.engine.stats["tokens_after_cancel"] - before == made_after
    assert request.generated < 20, request.generated  # it did not run on to max_tokens
    assert options.usage is not None and options.usage.output_tokens == request.generated
    assert (await reply(llama, "Say hi.", options=ReplyOptions(max_tokens=8))).strip()  # the slot works again


@LOOP
async def test_a_long_reply_does_not_starve_another_sessions_first_token(
        llama: LlamaResponder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both replies advance in the same steps: the second's first token comes while the first keeps going. (The
    long reply may also sit out steps for the other's first clause, up to YIELD_BUDGET_S: the next test. Here that
    budget is 0, or on a fast CPU the short reply is written whole within it and the long one rightly made nothing
    meanwhile: CI on an AMD EPYC, 15 tokens before and after.)"""
    monkeypatch.setattr(engine_module, "YIELD_BUDGET_S", 0.0)
    async with long_reply_being_read(llama) as long_request:
        await until(lambda: long_request.generated >= 10, "the long reply to be under way", 30)
        short = llama.respond("What is two plus two?", [], ReplyOptions(max_tokens=64))
        first = await anext(short)
        at_first = long_request.generated
        assert first.strip()
        assert not long_request.done, "the second session waited for the long reply to end"
        rest = "".join([d async for d in short])
        assert (first + rest).strip()
        assert long_request.generated > at_first, "the long reply stopped while the other was answered"


@LOOP
async def test_a_reply_with_speech_ahead_sits_out_steps_for_another_reply_before_its_first_clause(
        llama: LlamaResponder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the long reply's caller has ~1.5 s of whole clauses ahead (voiced), it leaves the steps to a new reply
    that is still before its first clause (budget unbounded here: it makes no token until the other's first text
    is out); once its budget is spent it goes on in the same steps as the next new reply."""
    async with long_reply_being_read(llama) as long_request:
        await until(lambda: long_request.voiced, "the long reply to have speech ahead", 30)
        monkeypatch.setattr(engine_module, "YIELD_BUDGET_S", 3600.0)
        yields = llama.engine.stats["yields"]
        short = llama.respond("What is two plus two?", [], ReplyOptions(max_tokens=64))
        at_ask = long_request.generated
        first_text = asyncio.ensure_future(anext(short))  # the generator asks the engine at its first step
        await until(lambda: llama.last_request is not long_request, "the second reply to be asked", 10)
        short_request = llama.last_request
        assert short_request is not None
        first = await first_text
        assert first.strip()
        # At most the step running as it was asked, and one before it had its slot (its prompt is rendered off the loop)
        assert long_request.generated <= at_ask + 3, "the long reply went on before the other's first words"
        assert llama.engine.stats["yields"] > yields and long_request.yielded_s > 0
        await drain(short)
        spent = long_request.yielded_s
        monkeypatch.setattr(engine_module, "YIELD_BUDGET_S", spent)  # its budget spent: the next reply shares the steps
        at_ask = long_request.generated
        assert (await reply(llama, "What is three plus three?", options=ReplyOptions(max_tokens=64))).strip()
        assert long_request.yielded_s == spent and long_request.generated > at_ask, "it sat out past its budget"


@LOOP
async def test_conversations_keep_their_own_slots_even_when_their_histories_are_nearly_alike(
        llama: LlamaResponder) -> None:
    """The bench's four sessions play the same clips, so their histories are nearly alike: another conversation's
    slot then held all but a few tokens of a new prompt, and sessions took each other's slots turn after turn, each
    evaluating ~200-300 tokens of history again (2 s before the first word). A request names its conversation: it
    never takes a slot that holds another live one while a slot holding none is free, and a conversation's stale
    copy (it has run in another slot since) is no one's."""
    engine = engine_module.LlamaEngine(llama.weights, slots=2, context_tokens=512, threads=1)
    try:
        ended: list[engine_module._Request] = []

        def run(prompt: list[int], key: str, max_tokens: int = 1, read: bool = True) -> engine_module._Request:
            holder: list[engine_module._Request] = []

            def deliver(item: object) -> None:
                if isinstance(item, engine_module._Token) and holder and read:
                    engine.consumed(holder[0], item.n_tokens)
                elif isinstance(item, engine_module._End) and holder:
                    ended.append(holder[0])
            holder.append(engine.submit(prompt, max_tokens, 0.0, deliver, key=key))
            return holder[0]

        turn = "<|im_start|>user\nA small latte, please.<|im_end|>\n<|im_start|>assistant\nHere it is.<|im_end|>\n"
        history = engine.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" + turn * 3)
        ask_a = engine.tokenize("<|im_start|>user\nAnd a tea?<|im_end|>\n<|im_start|>assistant\n")
        ask_b = engine.tokenize("<|im_start|>user\nAnd a cake?<|im_end|>\n<|im_start|>assistant\n")
        a1 = run(history + ask_a, "a")
        await until(lambda: a1 in ended, "a's first reply", 30)
        # b's prompt shares all of a's history: a's slot lacks only b's last words, the idle slot all of it.
        b1 = run(history + ask_b, "b")
        await until(lambda: b1 in ended, "b's first reply", 30)
        assert b1.slot != a1.slot and b1.reused < len(history)
        a2 = run(history + ask_a + ask_b, "a")
        await until(lambda: a2 in ended, "a's second reply", 30)
        assert a2.slot == a1.slot and a2.reused >= len(history + ask_a)
        # b's next request comes while b's last is still running (unread: it waits in its slot): it takes the
        # other slot, a's; b's first slot now holds a stale copy of b, and a's conversation is b's slot's now.
        essay = engine.tokenize(f"<|im_start|>user\n{LONG_ASK}<|im_end|>\n<|im_start|>assistant\n")
        b2 = run(history + ask_b + essay, "b", max_tokens=200, read=False)
        await until(lambda: b2.stalled, "b's long reply to wait for its reader", 30)
        b3 = run(history + ask_b + essay + ask_b, "b")
        await until(lambda: b3 in ended, "b's next reply", 30)
        assert b3.slot == a1.slot
        engine.cancel(b2)
        await until(lambda: b2 in ended, "b's long reply to stop", 30)
        # a comes back: b's stale slot holds no live conversation; b's latest slot does. a takes the stale one.
        a3 = run(history + ask_a + ask_b + ask_a, "a")
        await until(lambda: a3 in ended, "a's third reply", 30)
        assert a3.slot == b1.slot
    finally:
        await asyncio.to_thread(engine.close)


@LOOP
async def test_preparation_goes_on_while_a_reply_is_before_its_first_clause(llama: LlamaResponder) -> None:
    """An idle slot's next prompt is evaluated while another reply is still before its first clause (a few tokens
    a step): left out of such steps, it never finished at four sessions and the next turn evaluated ~300 tokens of
    history while its caller waited. Its own engine, two empty slots: the reply cannot take the prepared one."""
    engine = engine_module.LlamaEngine(llama.weights, slots=2, context_tokens=1024, threads=1)
    try:
        ended: list[engine_module._Request] = []

        def deliver_to(holder: list[engine_module._Request]) -> Callable[[object], None]:
            def deliver(item: object) -> None:
                if isinstance(item, engine_module._Token) and holder:
                    engine.consumed(holder[0], item.n_tokens)  # read at once: it never waits for its reader
                elif isinstance(item, engine_module._End) and holder:
                    ended.append(holder[0])
            return deliver

        first: list[engine_module._Request] = []
        first.append(engine.submit(engine.tokenize("Hello there, my friend."), 1, 0.0, deliver_to(first)))
        await until(lambda: first[0] in ended, "the first conversation's reply", 30)
        other: list[engine_module._Request] = []
        _, _, essay = llama.prompts.fit(llama.prompts.messages(LONG_ASK, [], ReplyOptions()), 300)
        other.append(engine.submit(essay, 300, 0.0, deliver_to(other)))  # never voiced
        await until(lambda: other[0].generated > 2, "the other reply to be under way", 30)
        assert other[0].slot != first[0].slot and not other[0].voiced
        history = engine.tokenize("Hello there, my friend. " + "We spoke about the sea and its fish. " * 20)
        prepared = engine.stats["prepared"]
        engine.prepare(first[0], history)
        await until(lambda: engine.stats["prepared"] > prepared and engine.settled, "the preparation to finish", 60)
        assert not other[0].done, "the preparation waited for the other reply to end"
        engine.cancel(other[0])
        await until(lambda: other[0] in ended, "the other reply to stop", 30)
    finally:
        await asyncio.to_thread(engine.close)


@LOOP
async def test_a_reply_waits_for_its_reader(llama: LlamaResponder) -> None:
    """Nobody reads (a slow voice): the engine stops AHEAD_TOKENS ahead instead of making the whole reply."""
    await wait_idle(llama)
    stream = llama.respond(LONG_ASK, [], ReplyOptions(max_tokens=300))
    await anext(stream)
    request = llama.last_request
    assert request is not None
    await until(lambda: request.stalled, "the unread reply to wait for its reader", 30)
    assert request.generated - request.consumed == AHEAD_TOKENS and not request.done
    text = await drain(stream)  # reading again lets it go on
    assert request.done and request.generated > AHEAD_TOKENS + 1 and text.strip()


@LOOP
async def test_past_the_slots_and_the_waiting_room_a_turn_is_busy(llama: LlamaResponder) -> None:
    await wait_idle(llama)
    streams = [llama.respond(f"Count slowly from one to fifty, number {i}.", [], ReplyOptions(max_tokens=300))
               for i in range(3)]
    try:
        for s in streams[:2]:  # both slots busy
            await anext(s)
        waiting = asyncio.ensure_future(anext(streams[2]))  # the one place in the waiting room
        await until(lambda: llama.engine.waiting == 1, "the third reply to wait for a slot", 30, 0.005)
        with pytest.raises(ResponderError, match="busy"):
            await anext(llama.respond("Hello?", [], ReplyOptions(max_tokens=4)))
        await streams[0].aclose()  # a slot frees: the waiting reply starts
        assert await waiting  # its first words
    finally:
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()
    await wait_idle(llama)
    assert llama.engine.stats["busy"] >= 1


@LOOP
async def test_the_realtime_sessions_sampling_reaches_the_model(llama: LlamaResponder) -> None:
    from assistant.server.realtime.responder import RealtimeResponder, ReplyContext

    ctx = ReplyContext(instructions="Answer in one word.", temperature=0.0, max_tokens=5)
    wrapped = RealtimeResponder(llama, ctx)
    options = ReplyOptions()
    text = "".join([d async for d in wrapped.respond("What colour is the sky?", [], options)])
    assert text.strip()
    assert llama.last_prompt_text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")
    assert options.max_tokens == 5 and options.temperature == 0.0
    assert options.usage is not None and options.usage.output_tokens <= 5
