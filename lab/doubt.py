"""``python -m lab doubt``: where should the small model say "I'm not sure"? Simple factual questions through the
bundled model, each reply's first sentence scored as the honest-doubt gate scores it (respond/llama/doubt.py: its
least likely word), right or wrong by the request's answer words; the thresholds that lose no right answer, per
language group, and the wrong answers each would have caught.

Tuning requests only: the factual requests of the tuning half of ``lab replies`` and ``lab/data/facts_tuning.json``
(90 more, none of them a held-out question or fact). ``--half heldout`` scores the held-out factual requests with the
thresholds as they are, for the report: it chooses nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assistant.config import RespondConfig
from assistant.respond.base import ReplyOptions
from lab.replies import DATA, Request, load_requests, right

FACTS = DATA / "facts_tuning.json"


@dataclass
class Scored:
    request: Request
    reply: str  # the first sentence and what followed, as the model wrote it (no gate)
    score: float  # the gate's: the first sentence's least likely word
    right: bool


def tuning_requests() -> list[Request]:
    """The tuning half's factual requests and the facts tuning set (each text once)."""
    doc = json.loads(FACTS.read_text(encoding="utf-8"))
    facts = [Request(r["id"], r["category"], r["language"], r["text"], tuple(r["answer"])) for r in doc["requests"]]
    seen: set[str] = set()
    out = []
    for r in [*(q for q in load_requests("tuning") if q.category == "factual"), *facts]:
        if r.text not in seen:
            seen.add(r.text)
            out.append(r)
    return out


def group(language: str) -> str:
    """The threshold's language group: English (the persona's language) or any other."""
    return "en" if language.split("-")[0] == "en" else "*"


def choose(rows: list[Scored]) -> dict[str, dict[str, Any]]:
    """Per language group: the highest threshold (a tenth below the lowest right answer's score) that loses no right
    answer, and the wrong answers it catches; with no right answer in a group, just above its highest wrong."""
    out: dict[str, dict[str, Any]] = {}
    for g in sorted({group(r.request.language) for r in rows}):
        mine = [r for r in rows if group(r.request.language) == g]
        rights = sorted(r.score for r in mine if r.right)
        wrongs = [r.score for r in mine if not r.right]
        if rights:
            limit = math.floor(rights[0] * 10) / 10
            if limit >= rights[0]:
                limit -= 0.1
        else:
            limit = math.ceil(max(wrongs, default=0.0) * 10) / 10 + 0.1
        out[g] = {"threshold": round(limit, 1), "right": len(rights), "wrong": len(wrongs),
                  "lowest_right": round(rights[0], 2) if rights else None,
                  "caught": sum(1 for w in wrongs if w < limit), "lost": sum(1 for s in rights if s < limit)}
    return out


async def score_all(requests: list[Request], cfg: RespondConfig) -> list[Scored]:
    """Each request through the bundled model with every token's log-probability (greedy, as the calls run it)."""
    from assistant.respond.llama import LlamaResponder
    from assistant.respond.llama.doubt import DoubtGate
    from assistant.respond.llama.engine import _End, _Token
    from assistant.respond.persona import MAX_TOKENS, TEMPERATURE, embedded

    cfg = embedded(cfg)  # the embedded model's own prompt, sampling and cap where cfg leaves them unset
    max_tokens = MAX_TOKENS if cfg.max_tokens is None else cfg.max_tokens
    temperature = TEMPERATURE if cfg.temperature is None else cfg.temperature
    responder = LlamaResponder(cfg)
    await responder.warmup()
    rows = []
    try:
        loop = asyncio.get_running_loop()
        for q in requests:
            _, _, prompt = responder.prompts.fit(
                responder.prompts.messages(q.text, [], ReplyOptions(language=q.language)), max_tokens)
            queue: asyncio.Queue[_Token | _End] = asyncio.Queue()
            request = responder.engine.submit(prompt, max_tokens, temperature,
                                              functools.partial(_hand_over, loop, queue), logprobs=True)
            gate = DoubtGate(q.language)
            gate.limit = -math.inf  # score only: never doubt here
            reply = ""
            while not isinstance(item := await queue.get(), _End):
                piece = item.text if reply else item.text.lstrip()
                reply += piece
                gate.feed(piece, item.logprob)
                responder.engine.consumed(request, item.n_tokens)
            gate.decide()
            rows.append(Scored(q, reply, gate.score, bool(right(q, reply))))
    finally:
        await responder.aclose()
    return rows


def _hand_over(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], item: Any) -> None:
    """An engine token (on its thread) into the study's queue (on the loop)."""
    loop.call_soon_threadsafe(queue.put_nowait, item)


def format_rows(rows: list[Scored], thresholds: dict[str, float]) -> str:
    lines = []
    for r in sorted(rows, key=lambda r: r.score):
        limit = thresholds.get(group(r.request.language), thresholds.get("*", -math.inf))
        mark = "right" if r.right else "wrong"
        said = "doubt" if r.score < limit else "says "
        lines.append(f"{r.score:7.2f}  {mark}  {said}  {r.request.language}  {r.request.text[:44]:44}  "
                     f"{' '.join(r.reply.split())[:60]}")
    return "\n".join(lines)


def add_doubt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--half", choices=("tuning", "heldout"), default="tuning",
                        help="tuning: choose the thresholds; heldout: score the held-out facts with the thresholds "
                        "as they are (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests (0: all)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for doubt.json")


def run_doubt(args: argparse.Namespace) -> int:
    from assistant.respond.llama.doubt import THRESHOLDS

    cfg = RespondConfig(engine="llama", model_path="")
    requests = (tuning_requests() if args.half == "tuning"
                else [r for r in load_requests("heldout") if r.category == "factual"])[: args.limit or None]
    rows = asyncio.run(score_all(requests, cfg))
    print(format_rows(rows, THRESHOLDS))
    chosen = choose(rows) if args.half == "tuning" else {}
    for g, c in chosen.items():
        print(f"\n{g}: {c['right']} right (lowest {c['lowest_right']}), {c['wrong']} wrong; threshold "
              f"{c['threshold']} catches {c['caught']} wrong, loses {c['lost']} right (in use: {THRESHOLDS.get(g)})")
    if args.half == "heldout":
        said = [(r, r.score < THRESHOLDS.get(group(r.request.language), THRESHOLDS["*"])) for r in rows]
        print(f"\nheld-out with the thresholds in use: {sum(r.right and not d for r, d in said)} right, "
              f"{sum(d for _, d in said)} not sure, {sum(not r.right and not d for r, d in said)} wrong "
              f"of {len(rows)}")
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "doubt.json").write_text(json.dumps({
        "half": args.half, "chosen": chosen, "in_use": THRESHOLDS,
        "rows": [{"id": r.request.id, "language": r.request.language, "request": r.request.text, "reply": r.reply,
                  "score": round(r.score, 3), "right": r.right} for r in rows]}, ensure_ascii=False, indent=1),
        encoding="utf-8")
    return 0


__all__ = ["Scored", "add_doubt_arguments", "choose", "group", "run_doubt", "score_all", "tuning_requests"]
