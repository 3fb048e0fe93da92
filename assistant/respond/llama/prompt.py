"""The prompt: the GGUF's own chat template over the system prompt, the session's history and the turn, trimmed
to the slot's context by dropping the oldest turns (never the system prompt, never the newest words).

Rendering and tokenizing cost milliseconds per message on a long history, so :meth:`PromptBuilder.fit` finds how
many old turns to drop by bisection (a few renders, not one per dropped message) and the responder runs it off
the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from assistant import languages
from assistant.respond.base import Message, ReplyOptions, ResponderError
from assistant.respond.llama.engine import MSG_TOO_LONG

log = logging.getLogger(__name__)

NEXT_TURN = "\u2063next-user-turn\u2063"  # stands for the user's next words when the template is rendered ahead
MAX_MESSAGE_CHARS = 32_000  # one message's text before it is rendered (a turn keeps its end, others their start)

Chat = list[dict[str, str]]


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class ChatPrompt:
    """The GGUF's chat template (Jinja, as Hugging Face renders it); ChatML when the file has none. A template
    that refuses a system role gets the system prompt at the start of the first user message instead."""

    def __init__(self, template: str, bos: str, eos: str) -> None:
        from assistant.respond.llama.native import llama_cpp

        self.template = template or CHATML
        self.formatter: Any = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template=self.template, eos_token=eos, bos_token=bos)
        self.system_role = True

    def render(self, messages: list[dict[str, str]]) -> str:
        if self.system_role:
            try:
                return str(self.formatter(messages=messages).prompt)
            except Exception as exc:
                if not messages or messages[0]["role"] != "system":
                    raise
                log.info("llm.template_without_system_role reason=%s", exc)
                self.system_role = False
        return str(self.formatter(messages=_fold_system(messages)).prompt)


def _fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    else:
        rest.insert(0, {"role": "user", "content": system})
    return rest



def alternating(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Consecutive messages of one role joined (a turn with no answer kept, an answer cut to nothing gone), so
    templates that insist on user/assistant alternation accept the conversation."""
    out: list[dict[str, str]] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"] and m["role"] != "system":
            out[-1] = {"role": m["role"], "content": f"{out[-1]['content']}\n{m['content']}"}
        else:
            out.append(dict(m))
    return out


class PromptBuilder:
    """The messages of a reply and their tokens, fitted to ``n_ctx`` tokens less the reply's room."""

    def __init__(self, prompt: ChatPrompt, tokenize: Callable[[str], list[int]], n_ctx: int,
                 system_prompt: str, language: str, examples: Sequence[dict[str, str]] = ()) -> None:
        self.prompt = prompt
        self.examples = list(examples)  # the persona's example turns (respond/persona.py), after the system prompt
        self.tokenize = tokenize
        self.n_ctx = n_ctx
        self.system_prompt = system_prompt
        self.language = language.strip().lower()

    def messages(self, text: str, history: Sequence[Message], options: ReplyOptions) -> Chat:
        """System prompt (the history's own system message first, if it brings one), history, the turn. Each
        message is capped at ``MAX_MESSAGE_CHARS``: the turn keeps its end (what was said last), others their
        start."""
        turns = list(history)
        system = self.system_prompt
        if turns and turns[0].role == "system":
            system, turns = turns[0].content, turns[1:]
        out = [{"role": "system", "content": system[:MAX_MESSAGE_CHARS]}] if system else []
        if len(turns) == len(history):  # the persona's examples, unless the history brings its own prompt
            out += self.examples
        for m in turns:
            if m.role in ("user", "assistant") and (m.content or m.role == "user"):
                out.append({"role": m.role, "content": m.content[:MAX_MESSAGE_CHARS]})
        user = text[-MAX_MESSAGE_CHARS:]
        language = (options.language or "").strip()
        if language and language.split("-")[0].lower() != self.language:
            user = f"{user}\n\n(Answer in {languages.name(language.split('-')[0].lower())}.)"
        out.append({"role": "user", "content": user})
        return alternating(out)

    def render(self, messages: Chat) -> tuple[str, list[int]]:
        text = self.prompt.render(messages)
        return text, self.tokenize(text)

    def fit(self, messages: Chat, reserve: int) -> tuple[Chat, str, list[int]]:
        """The messages kept, the rendered prompt and its tokens: the fewest oldest turns dropped (never the system
        prompt) for the prompt to leave ``reserve`` tokens for the reply; a lone turn too long even then keeps its
        end. Blocking (renders and tokenizes): run it off the event loop."""
        budget = self.n_ctx - reserve
        first = 1 if messages and messages[0]["role"] == "system" else 0
        text, tokens = self.render(messages)
        if len(tokens) <= budget:
            return list(messages), text, tokens
        # Cut points: the oldest turns go whole (a user message and its answer), the newest turn always stays.
        starts = [i for i in range(first + 1, len(messages)) if messages[i]["role"] == "user"]
        lo, hi = 0, len(starts)  # starts[:lo] do not fit; starts[hi - 1] (or the turn alone) is the last resort
        best: tuple[Chat, str, list[int]] | None = None
        while lo < hi:  # the token count falls as more is dropped: bisect for the first cut that fits
            mid = (lo + hi) // 2
            kept = [*messages[:first], *messages[starts[mid]:]]
            text, tokens = self.render(kept)
            if len(tokens) <= budget:
                best, hi = (kept, text, tokens), mid
            else:
                lo = mid + 1
        if best is not None:
            return best
        return self._turn_alone([*messages[:first], messages[-1]], budget)

    def _turn_alone(self, msgs: Chat, budget: int) -> tuple[Chat, str, list[int]]:
        """Only the system prompt and the turn are left and still too long: keep the turn's end, as much as fits."""
        while True:
            text, tokens = self.render(msgs)
            if len(tokens) <= budget:
                return msgs, text, tokens
            user = msgs[-1]["content"]
            keep = int(len(user) * max(0.1, min(0.9, budget / len(tokens))))  # shrinks by 10 % at least
            if keep < 8:  # the system prompt alone leaves no room
                raise ResponderError(MSG_TOO_LONG)
            msgs = [*msgs[:-1], {"role": "user", "content": user[-keep:]}]

    def next_prompt_start(self, messages: Chat) -> list[int]:
        """The tokens every next prompt of this conversation starts with (``messages``, then the template's opening
        of a user turn), less the last (it may tokenize differently once the user's words follow it)."""
        text = self.prompt.render([*messages, {"role": "user", "content": NEXT_TURN}])
        cut = text.rfind(NEXT_TURN)
        return self.tokenize(text[:cut])[:-1] if cut > 0 else []
