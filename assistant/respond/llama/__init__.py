"""The embedded language model: any GGUF chat model run by llama.cpp, shared by every session.

Built on llama-cpp-python's low-level API (the ``llama_batch``/``llama_decode`` loop llama-server runs), not on
its ``Llama`` class, which holds one conversation at a time:

- **One model, one context, several sequences.** The weights are loaded once; the llama.cpp context holds
  ``respond.slots`` sequences of ``respond.context_tokens`` each (its KV cache). A reply runs in a slot.
- **One engine thread decodes every active slot in one batch per step**: each generating slot's next token,
  and a chunk (``respond.prefill_chunk``) of each new prompt beside them. A long reply in one session cannot
  delay another session's first token by more than a step.
- **A conversation's prefix stays in its slot's KV cache across turns.** A new prompt goes to the free slot
  that already holds most of it (the longest common prefix, then chunks further on that can be shifted into
  place, as llama-server's ``--cache-reuse`` does: when the history drops its oldest turn, the rest of the
  conversation moves up instead of being evaluated again); only the new tokens are evaluated, so the time to
  the first token does not grow with the history. At start, every slot evaluates the system prompt once.
- **Bounded.** ``respond.slots`` replies at once, ``respond.max_waiting`` waiting for a slot; past that the
  turn fails with a "busy" :class:`~assistant.respond.base.ResponderError`. Memory: the model file plus, per
  slot, ``n_layer × context_tokens × (K + V width) × 2`` bytes of f16 KV cache (logged at load; SmolLM2-135M:
  45 MiB per 2048-token slot).
- **Cancellation.** Closing the reply's iterator (barge-in, a dropped speculative turn) flags the request; the
  engine drops it before its next step, so at most the step already running makes one more token, and the
  slot is free for the next reply (its KV cache kept for the conversation's next turn).
- **Context full.** The oldest turns are dropped from the prompt (never the system prompt) until the prompt
  and the reply's room fit; a single turn longer than that keeps its end.
- **max_tokens.** A reply stops by ``max_tokens`` at the end of a clause: near the limit, text after the last
  clause mark is held back, and dropped if the limit comes first.

The prompt is the GGUF's own chat template (Jinja, rendered as Hugging Face does) over the system prompt, the
session's history and the turn.

Where it runs is ``respond.backend``: by default in a supervised child process (``respond/hosted.py``; a crash
of llama.cpp ends that process, not the calls), or in this process, or on Ray.

The modules: ``native`` (llama.cpp itself: the one module that imports it and loads models, with the CPU's extra
buffer types off for the whole process), ``model_file`` (finding and checking the GGUF), ``clauses`` (clause ends,
the max_tokens limit), ``kv_reuse`` (the cache plan), ``engine`` (the scheduler thread over llama.cpp), ``prompt``
(template, trimming), ``responder`` (the Responder face). The threads a container's CPU quota allows, and the cores
free now, are ``assistant.cpus``'s (the ASR's default threads follow them too).
"""

from assistant.cpus import default_threads
from assistant.respond.llama.clauses import ClauseLimit, clause_end, ends_clause
from assistant.respond.llama.engine import (
    AHEAD_TOKENS,
    MSG_BUSY,
    MSG_CLOSED,
    MSG_FAILED,
    MSG_TOO_LONG,
    LlamaEngine,
)
from assistant.respond.llama.kv_reuse import ReusePlan, common_prefix, plan_reuse, slot_cost
from assistant.respond.llama.model_file import ModelFileError, check_gguf, default_model_path, resolve_model_path
from assistant.respond.llama.prompt import ChatPrompt, PromptBuilder
from assistant.respond.llama.responder import LlamaResponder, ModelInfo

__all__ = ["AHEAD_TOKENS", "MSG_BUSY", "MSG_CLOSED", "MSG_FAILED", "MSG_TOO_LONG", "ChatPrompt", "ClauseLimit",
           "LlamaEngine", "LlamaResponder", "ModelFileError", "ModelInfo", "PromptBuilder", "ReusePlan",
           "check_gguf", "clause_end", "common_prefix", "default_model_path", "default_threads", "ends_clause",
           "plan_reuse", "resolve_model_path", "slot_cost"]
