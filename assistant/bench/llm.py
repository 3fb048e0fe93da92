"""``assistant bench llm``: the embedded model's time to the first token, turn by turn, against the same GGUF behind
llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``) through our ``openai`` responder.

One run, the same conversations for both, engines taking turns (conversation 1 embedded, then the server, then
conversation 2 …), on one machine:

- **embedded**: :class:`~assistant.respond.llama.LlamaResponder` in this process (its slots, the conversation's
  prefix kept in its slot's KV cache);
- **server**: ``python -m llama_cpp.server`` as a child process (installed with llama-cpp-python's ``[server]``
  extra, not a dependency of ours), with the same model file, context and threads, asked by
  :class:`~assistant.respond.openai.OpenAIResponder`: the way a user runs a local model today.

Each conversation is ``--turns`` questions with the history kept as the voice chat keeps it
(``respond.history_turns`` pairs), ``--gap-s`` apart (the user speaking); the last question repeats the first,
so turn 1 and the last turn evaluate the same new words and differ only in the history before them.
``--conversations N`` runs N conversations at once (sessions talking at the same time). Time to the first token
is from the call to the first text delta.

With ``--v2v-sessions 1,4`` it then measures voice-to-voice (``assistant bench v2v``'s client, the shared clips)
against ``assistant serve`` with each: the embedded default, and ``--respond.engine openai`` at the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from assistant.bench.processes import free_port, start_assistant, stop, wait_ready
from assistant.bench.report import BenchResult, percentile, summarize_level
from assistant.bench.v2v import bench_v2v, session_levels
from assistant.config import REQUANTIZE, RespondConfig, load_config
from assistant.respond import persona
from assistant.respond.base import ReplyOptions, Responder, reply_stream
from assistant.respond.history import ConversationHistory

log = logging.getLogger(__name__)

ENGINES = ("embedded", "server")
# llama-cpp-python's server, started through the module that keeps llama.cpp's extra buffer types off (AMX Xeons)
SERVER_MODULE = "assistant.respond.llama.native"
# A voice-assistant conversation; the last question repeats the first (see the module docstring).
QUESTIONS = (
    "What should I cook tonight?",
    "How long does that take to make?",
    "Can you set a timer for ten minutes, please?",
    "What is the weather like today?",
    "Tell me a short story about a cat who learns to play the piano.",
    "What is the capital of France?",
    "How far away is the moon?",
    "Give me a tip for sleeping better.",
    "What time is it in Tokyo when it is noon in London?",
)
V2V_COLUMNS = ("v2v_ms", "server_v2v_ms", "asr_ms", "llm_first_text_ms", "chunker_ms", "llm_first_clause_ms",
               "tts_first_audio_ms")


@dataclass
class Turn:
    engine: str
    level: int  # conversations at once
    conversation: int
    turn: int  # from 1
    ttft_ms: float | None
    total_ms: float
    chars: int
    prompt_tokens: int | None = None  # the embedded model's count (the server's stream does not say)


@dataclass
class Results:
    settings: dict[str, Any]
    turns: list[Turn] = field(default_factory=list)
    v2v: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ttft(self, engine: str, turn: int | None = None, level: int | None = None) -> list[float]:
        return [t.ttft_ms for t in self.turns if t.engine == engine and t.ttft_ms is not None
                and (turn is None or t.turn == turn) and (level is None or t.level == level)]


def add_llm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="config file ([respond]: model, slots, …)")
    parser.add_argument("--model", default="", help="GGUF file (default: respond.model_path, or the packaged SmolLM2)")
    parser.add_argument("--turns", type=int, default=10, help="questions per conversation (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="conversations per engine, one after the other (default: %(default)s; 0: only the "
                        "voice-to-voice part)")
    parser.add_argument("--conversations", type=session_levels, default=[1],
                        help="conversations at once, or a list run one after the other, e.g. 1,4 (default: 1)")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="longest reply (default: respond.max_tokens)")
    parser.add_argument("--threads", type=int, default=0, help="threads for both engines (default: respond.threads)")
    parser.add_argument("--requantize", choices=REQUANTIZE, default=None,
                        help="the weights both engines load (default: respond.requantize; off: the file as it is)")
    parser.add_argument("--gap-s", type=float, default=1.0,
                        help="pause between a reply's end and the next question: the user speaking "
                        "(default: %(default)s)")
    parser.add_argument("--v2v-sessions", type=session_levels, default=[],
                        help="then voice-to-voice at these session levels against a server with each engine "
                        "(e.g. 1,4; default: skip)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for llm.json")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables as Markdown under a line naming the command, commit and "
                        "machine (docs include FILE)")


def _respond_config(args: argparse.Namespace) -> RespondConfig:
    cfg = load_config(args.config, environ={}).respond
    if args.requantize is not None:
        cfg = dataclasses.replace(cfg, requantize=args.requantize)
    from assistant.respond.auto import resolve_auto
    from assistant.respond.llama import default_threads, resolve_model_path
    from assistant.respond.llama.weights import weights_path

    if not args.model and cfg.model_path.strip() == "auto":  # the machine's model if pulled, else the bundled one
        cfg, _ = resolve_auto(cfg)
    # The file the voice chat would load (the packaged model rewritten for the CPU), the same for both engines.
    model = weights_path(Path(args.model) if args.model else resolve_model_path(cfg), cfg)
    threads = args.threads or cfg.threads or default_threads()
    # The embedded model's own prompt and sampling, set explicitly: the server behind openai is asked the same.
    return persona.embedded(dataclasses.replace(cfg, engine="llama", model_path=str(model), threads=threads,
                                                max_tokens=args.max_tokens or cfg.max_tokens))


@contextlib.contextmanager
def llama_server(cfg: RespondConfig, folder: Path) -> Iterator[str]:
    """llama-cpp-python's server with the model, context and threads of ``cfg``; its ``/v1`` base URL. It answers
    one request at a time (one context, no batching across requests). Started through ``native.py``, so its model
    loads with plain CPU buffers as ours does."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = folder / "llama_cpp_server.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--model", cfg.model_path, "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", str(cfg.context_tokens), "--n_threads", str(cfg.threads),
             "--n_threads_batch", str(cfg.threads), "--verbose", "false",
             # By default it cuts a streaming answer short when another request arrives; several conversations
             # at once must each get their whole answer (it then serves them one at a time).
             "--interrupt_requests", "false"],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                if resp.status == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"llama-cpp-python's server exited ({proc.returncode}); install it with "
                                   f"pip install 'llama-cpp-python[server]'. Log:\n{log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("llama-cpp-python's server did not answer in 120 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def converse(responder: Responder, engine: str, level: int, index: int, questions: Sequence[str],
                   max_tokens: int, history_turns: int, gap_s: float) -> list[Turn]:
    """One conversation, turn by turn, as the voice chat holds it (history of what was said)."""
    history = ConversationHistory(history_turns)
    out: list[Turn] = []
    for k, question in enumerate(questions, 1):
        if k > 1:
            await asyncio.sleep(gap_s)  # the user speaks
        t0 = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        options = ReplyOptions(max_tokens=max_tokens)
        async for delta in reply_stream(responder, question, history.messages, options):
            if first is None and delta:
                first = time.perf_counter() - t0
            parts.append(delta)
        total = time.perf_counter() - t0
        reply = "".join(parts)
        history.add_turn(question, reply)
        ttft = None if first is None else round(first * 1000, 1)
        out.append(Turn(engine, level, index, k, ttft, round(total * 1000, 1), len(reply),
                        options.usage.input_tokens if options.usage is not None else None))
    return out


def questions_for(turns: int) -> list[str]:
    """``turns`` questions, the last one the first again."""
    body = [QUESTIONS[k % len(QUESTIONS)] for k in range(max(1, turns - 1))]
    return [*body, QUESTIONS[0]] if turns > 1 else body


async def run_conversations(args: argparse.Namespace, cfg: RespondConfig, results: Results, folder: Path) -> None:
    from assistant.respond.llama import LlamaResponder
    from assistant.respond.openai import OpenAIResponder

    questions = questions_for(args.turns)
    embedded = LlamaResponder(dataclasses.replace(cfg, slots=max(cfg.slots, *args.conversations)))
    await embedded.warmup()
    try:
        with llama_server(cfg, folder) as url:
            server = OpenAIResponder(dataclasses.replace(cfg, engine="openai", base_url=url, model="local",
                                                         total_timeout_s=600.0, first_token_timeout_s=300.0))
            try:
                number = 0
                for level in args.conversations:
                    for _ in range(args.repeats):
                        for engine, responder in (("embedded", embedded), ("server", server)):
                            runs = [converse(responder, engine, level, number + i, questions,
                                             cfg.max_tokens or persona.MAX_TOKENS, cfg.history_turns, args.gap_s)
                                    for i in range(level)]
                            for turns in await asyncio.gather(*runs):
                                results.turns.extend(turns)
                            log.info("bench.llm engine=%s level=%d done", engine, level)
                        number += level
            finally:
                await server.aclose()
    finally:
        await embedded.aclose()


def run_v2v_pair(args: argparse.Namespace, cfg: RespondConfig, results: Results, folder: Path) -> None:
    """Voice-to-voice against ``assistant serve`` with the embedded model, then with the server behind ``openai``."""
    from assistant.rtc.loopback_ice import allow_loopback_ice

    allow_loopback_ice()  # the servers are children on this machine (they offer 127.0.0.1 too)
    common = ["--respond.model_path", cfg.model_path, "--respond.threads", str(cfg.threads),
              "--respond.max_tokens", str(cfg.max_tokens), "--respond.temperature", str(cfg.temperature),
              "--respond.system_prompt", cfg.system_prompt or ""]
    with llama_server(cfg, folder / "server") as url:
        for engine, flags in (("embedded", ["--respond.engine", "llama"]),
                              ("server", ["--respond.engine", "openai", "--respond.base_url", url,
                                          "--respond.model", "local"])):
            child = start_assistant(f"serve-{engine}", "serve", [*common, *flags], folder)
            try:
                wait_ready([child])
                result: BenchResult = asyncio.run(bench_v2v(
                    child.url, None, None, args.v2v_sessions, folder / f"v2v-{engine}", plot=False))
            finally:
                stop([child])
            results.v2v[engine] = {str(lv.sessions): summarize_level(lv) for lv in result.levels}


def _p(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q):.0f}" if values else "—"


def format_results(results: Results, turns: int, levels: Sequence[int]) -> str:
    lines: list[str] = []
    for level in levels:
        lines.append(f"== time to the first token (ms) with {level} conversation(s) at once, per turn: p50")
        lines.append(f"  {'turn':>4} " + "".join(f"{e:>12}" for e in ENGINES) + f"{'emb/server':>12}")
        for k in range(1, turns + 1):
            cells = [results.ttft(e, k, level) for e in ENGINES]
            ratio = (f"{percentile(cells[0], 50) / percentile(cells[1], 50):.2f}" if all(cells) else "—")
            lines.append(f"  {k:>4} " + "".join(f"{_p(c, 50):>12}" for c in cells) + f"{ratio:>12}")
        for e in ENGINES:
            every, first, last = results.ttft(e, None, level), results.ttft(e, 1, level), results.ttft(e, turns, level)
            growth = (f"{percentile(last, 50) / percentile(first, 50):.2f}" if first and last else "—")
            lines.append(f"  {e:>9}: all turns p50 {_p(every, 50)} p90 {_p(every, 90)} ms (n={len(every)}); "
                         f"turn {turns} / turn 1 (p50) = {growth}")
        emb, srv = results.ttft("embedded", None, level), results.ttft("server", None, level)
        if emb and srv:
            lines.append(f"  first token, embedded / server (p50 of all turns): "
                         f"{percentile(emb, 50) / percentile(srv, 50):.3f}")
        lines.append("")
    for engine, by_level in results.v2v.items():
        lines.append(f"== voice-to-voice, {engine} (ms: p50/p90)")
        for sessions, summary in by_level.items():
            columns = summary["columns"]
            row = "  ".join(f"{c} {_fmt_pair(columns.get(c))}" for c in V2V_COLUMNS)
            lines.append(f"  sessions={sessions} ok={summary['ok']}/{summary['turns']}  {row}")
    return "\n".join(lines)


def _fmt_pair(st: dict[str, Any] | None) -> str:
    if not st or st.get("p50") is None:
        return "—"
    return f"{st['p50']:.0f}/{st['p90']:.0f}"


def run_llm_bench(args: argparse.Namespace) -> int:
    from assistant.bench.figures import provenance, write_markdown

    origin = provenance()  # the command and commit as it started
    cfg = _respond_config(args)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    results = Results(settings={"model": cfg.model_path, "threads": cfg.threads, "context_tokens": cfg.context_tokens,
                                "max_tokens": cfg.max_tokens, "history_turns": cfg.history_turns,
                                "turns": args.turns, "repeats": args.repeats, "conversations": args.conversations,
                                "gap_s": args.gap_s,
                                "temperature": cfg.temperature})
    try:
        if args.repeats > 0:
            asyncio.run(run_conversations(args, cfg, results, folder))
        if args.v2v_sessions:
            run_v2v_pair(args, cfg, results, folder)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"bench llm: {exc}")
        return 2
    text = format_results(results, args.turns, args.conversations)
    print(text)
    if args.markdown is not None:
        body = (f"Model `{Path(cfg.model_path).name}`, {cfg.threads} thread(s), max_tokens {cfg.max_tokens}, "
                f"{args.turns} turns per conversation, {args.repeats} conversation(s) per engine.\n\n"
                f"```text\n{text}\n```")
        docs = write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}" + (f"; refreshed {', '.join(map(str, docs))}" if docs else ""))
    path = folder / "llm.json"
    path.write_text(json.dumps({"bench": "llm", "settings": results.settings,
                                "turns": [dataclasses.asdict(t) for t in results.turns], "v2v": results.v2v},
                               indent=1))
    print(f"\nwrote {path}")
    return 0
