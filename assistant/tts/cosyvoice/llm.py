"""The CosyVoice2 speech language model: text tokens in, speech tokens (25 Hz, 6561 codes) out.

A Qwen2 decoder reads one embedding sequence

    [sos] [text embeddings of prompt_text + text] [task_id] [speech embeddings of the prompt's speech tokens]

and then continues it one speech token at a time: each new token's ``speech_embedding`` row is fed back as the
next input. ``llm_decoder`` maps the last hidden state to ``speech_token_size + 3`` logits; the three extra rows
are end-of-speech (``speech_token_size``) and two ids the model never emits usefully; all three stop decoding.

State-dict names follow the official ``llm.pt`` exactly (``llm.model.model.*``, ``llm.model.lm_head.weight``,
``llm_decoder.*``, ``speech_embedding.weight``, ``llm_embedding.weight``) so it loads with ``strict=True``.
The backbone is HF ``Qwen2ForCausalLM`` built from a config (never downloaded); its ``lm_head`` is tied to the
text embedding and never used here (we call the inner ``Qwen2Model`` and skip the 151936-way projection).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:  # transformers comes with the cosyvoice extra; imported where the model is built
    from transformers import DynamicCache, Qwen2Config

log = logging.getLogger(__name__)

SOS_INDEX = 0      # row of llm_embedding that starts the sequence
TASK_ID_INDEX = 1  # row of llm_embedding between the text and the speech part

# Qwen2-0.5B, the backbone of CosyVoice2-0.5B (what CosyVoice-BlankEN/config.json holds).
QWEN2_05B_CONFIG: dict[str, object] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


@dataclass(frozen=True)
class SpeechLMConfig:
    """Hyper-parameters of the speech LM (the yaml's ``llm`` section) and its decoding limits."""

    input_size: int = 896
    output_size: int = 896
    speech_token_size: int = 6561
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1
    # The official model emits at least 2 and at most 20 speech tokens per text token (of the text to speak,
    # not counting the prompt text).
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    @classmethod
    def from_yaml(cls, section: dict[str, Any]) -> SpeechLMConfig:
        """Build from ``read_model_yaml(...)["llm"]``."""
        sampling = section.get("sampling") or {}
        return cls(
            input_size=int(section["llm_input_size"]),
            output_size=int(section["llm_output_size"]),
            speech_token_size=int(section["speech_token_size"]),
            top_p=float(sampling.get("top_p", cls.top_p)),
            top_k=int(sampling.get("top_k", cls.top_k)),
            win_size=int(sampling.get("win_size", cls.win_size)),
            tau_r=float(sampling.get("tau_r", cls.tau_r)),
        )

    @property
    def eos_id(self) -> int:
        return self.speech_token_size

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.speech_token_size, self.speech_token_size + 1, self.speech_token_size + 2)


def load_qwen_config(model_dir_or_file: str | Path) -> Qwen2Config:
    """A ``Qwen2Config`` from ``CosyVoice-BlankEN/config.json`` (a dir or the file itself); no network."""

    path = Path(model_dir_or_file)
    if path.is_dir():
        path = path / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return qwen_config_from_dict(data)


def qwen_config_from_dict(data: dict[str, Any]) -> Qwen2Config:
    """A ``Qwen2Config`` from a ``config.json``'s JSON (untyped: each key is a keyword of Qwen2Config)."""
    from transformers import Qwen2Config

    data = {k: v for k, v in data.items() if k not in ("transformers_version", "torch_dtype", "dtype")}
    cfg = Qwen2Config(**data)
    # sdpa matches the reference (its goldens were made with sdpa) and is the fast path on GPU too.
    cfg._attn_implementation = "sdpa"
    return cfg


class QwenBackbone(nn.Module):
    """Holds ``Qwen2ForCausalLM`` as ``.model`` so the state-dict keys read ``llm.model.model.*``."""

    def __init__(self, qwen_config: Qwen2Config) -> None:
        super().__init__()
        from transformers import Qwen2ForCausalLM

        self.model = Qwen2ForCausalLM(qwen_config)
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept both generations of the API.
        params = inspect.signature(type(self.model.model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(self, inputs_embeds: torch.Tensor,
                cache: DynamicCache | None = None) -> tuple[torch.Tensor, DynamicCache | None]:
        """inputs_embeds [B,T,D] → (last hidden state after the final RMSNorm [B,T,D], the cache).

        A given cache (HF ``DynamicCache``) is extended in place; RoPE positions continue from its length.
        """
        kw = {self._cache_kw: cache} if cache is not None else {}
        out = self.model.model(inputs_embeds=inputs_embeds, use_cache=cache is not None, **kw)
        return out.last_hidden_state, cache

    def rebuild_rotary(self, device: torch.device | str) -> None:
        """Recompute RoPE's non-persistent ``inv_freq`` in float32 (lost on the meta device, and a cast of the
        model to bf16/fp16 would round it)."""
        rotary = self.model.model.rotary_emb
        with torch.device(device):
            self.model.model.rotary_emb = type(rotary)(config=self.model.config)


# --- sampling ------------------------------------------------------------------------------------------------


class GreedySampler:
    """Argmax: deterministic, used by the parity tests."""

    def __call__(self, logp: torch.Tensor, decoded: list[int]) -> int:
        return int(torch.argmax(logp).item())


class RasSampler:
    """Repetition-aware sampling, as CosyVoice2 decodes.

    Nucleus sampling over the ``top_k`` most likely tokens whose preceding probability mass is below
    ``top_p``; if the drawn token already fills ``win_size * tau_r`` of the last ``win_size`` tokens, it is
    banned and a token is drawn from the whole distribution instead (breaks loops of one code).
    """

    def __init__(
        self,
        top_p: float = 0.8,
        top_k: int = 25,
        win_size: int = 10,
        tau_r: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        self.top_p, self.top_k, self.win_size, self.tau_r = top_p, top_k, win_size, tau_r
        self.generator = generator

    def _draw(self, probs: torch.Tensor) -> int:
        gen = self.generator
        if gen is not None and gen.device != probs.device:
            probs = probs.to(gen.device)
        return int(torch.multinomial(probs, 1, replacement=True, generator=gen).item())

    def nucleus(self, logp: torch.Tensor) -> int:
        probs, order = logp.float().softmax(dim=0).sort(descending=True, stable=True)
        head = probs[: self.top_k]
        mass_before = torch.cumsum(head, dim=0) - head  # probability mass above each candidate
        keep = int((mass_before < self.top_p).sum().item())
        keep = max(keep, 1)
        return int(order[self._draw(head[:keep])].item())

    def __call__(self, logp: torch.Tensor, decoded: list[int]) -> int:
        token = self.nucleus(logp)
        recent = decoded[-self.win_size :]
        if recent.count(token) >= self.win_size * self.tau_r:
            logp = logp.float().clone()
            logp[token] = -float("inf")
            token = self._draw(logp.softmax(dim=0))
        return token


# --- the model -----------------------------------------------------------------------------------------------


class SpeechLM(nn.Module):
    """Qwen2-based text-to-speech-token model (official class: ``Qwen2LM``)."""

    def __init__(self, cfg: SpeechLMConfig, qwen_config: Qwen2Config) -> None:
        super().__init__()
        self.cfg = cfg
        n_speech = cfg.speech_token_size + 3  # codes + eos + 2 unused special rows
        self.llm_embedding = nn.Embedding(2, cfg.input_size)  # sos, task_id
        self.llm = QwenBackbone(qwen_config)
        self.llm_decoder = nn.Linear(cfg.output_size, n_speech)
        self.speech_embedding = nn.Embedding(n_speech, cfg.input_size)

    # The text embedding is Qwen's own token table.
    def embed_text(self, text: torch.Tensor) -> torch.Tensor:
        """text ids [B,T] → [B,T,D]."""
        return self.llm.model.model.embed_tokens(text)

    def build_lm_input(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[sos, embed(prompt_text + text), task_id, speech_embedding(prompt_speech)] → [1, L, D].

        All id tensors are [1,T] (T may be 0). The speaker embedding is not an input of this model.
        """
        return torch.cat(self.build_lm_input_parts(text, prompt_text, prompt_speech), dim=1)

    def build_lm_input_parts(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`build_lm_input` in two parts: the start that depends on the prompt text only ([sos, embed(prompt_text)],
        cacheable per voice) and the rest ([embed(text), task_id, speech_embedding(prompt_speech)])."""
        dev = self.llm_embedding.weight.device
        sos = self.llm_embedding.weight[SOS_INDEX].reshape(1, 1, -1)
        task = self.llm_embedding.weight[TASK_ID_INDEX].reshape(1, 1, -1)
        head = [sos]
        if prompt_text is not None and prompt_text.numel() > 0:
            head.append(self.embed_text(prompt_text.reshape(1, -1).to(dev, torch.long)))
        rest = []
        if text is not None and text.numel() > 0:
            rest.append(self.embed_text(text.reshape(1, -1).to(dev, torch.long)))
        rest.append(task)
        if prompt_speech is not None and prompt_speech.numel() > 0:
            rest.append(self.speech_embedding(prompt_speech.reshape(1, -1).to(dev, torch.long)))
        return torch.cat(head, dim=1), torch.cat(rest, dim=1)

    def logp_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] → log-probabilities over speech ids [..., speech_token_size+3] (float32)."""
        return self.llm_decoder(hidden).float().log_softmax(dim=-1)

    @torch.inference_mode()
    def forward_hidden(self, lm_input: torch.Tensor) -> torch.Tensor:
        """Teacher-forced pass, no cache: lm_input [1,L,D] → hidden [1,L,D] (after the final RMSNorm)."""
        hidden, _ = self.llm(lm_input)
        return hidden

    @torch.inference_mode()
    def forward_logp(self, lm_input: torch.Tensor) -> torch.Tensor:
        """Teacher-forced log-probs at every position: [1,L,D] → [1,L,speech_token_size+3]."""
        return self.logp_from_hidden(self.forward_hidden(lm_input))

    def length_limits(self, text_len: int) -> tuple[int, int]:
        """(min, max) speech tokens for ``text_len`` text tokens to speak (prompt text not counted)."""
        return (
            int(text_len * self.cfg.min_token_text_ratio),
            int(text_len * self.cfg.max_token_text_ratio),
        )

    def make_sampler(self, seed: int | None = None, greedy: bool = False) -> GreedySampler | RasSampler:
        """The official sampling (RAS, top-p 0.8 / top-k 25) seeded per request, or argmax."""
        if greedy:
            return GreedySampler()
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
        c = self.cfg
        return RasSampler(c.top_p, c.top_k, c.win_size, c.tau_r, generator=gen)

    @torch.inference_mode()
    def generate(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
        *,
        sampler: GreedySampler | RasSampler | None = None,
        min_len: int | None = None,
        max_len: int | None = None,
        on_logp: Callable[[int, torch.Tensor], None] | None = None,
    ) -> Iterator[int]:
        """Yield speech token ids one at a time until a stop id or ``max_len``.

        The cache and all state live in this generator, so each request owns its own; closing the generator
        frees them. ``on_logp(step, logp)`` (optional) sees each step's log-probs before eos masking.
        """
        from transformers import DynamicCache

        text_len = int(text.numel())
        lo, hi = self.length_limits(text_len)
        min_len = lo if min_len is None else min_len
        max_len = hi if max_len is None else max_len
        sampler = sampler or self.make_sampler()
        stop_ids = set(self.cfg.stop_ids)

        x = self.build_lm_input(text, prompt_text, prompt_speech)          # [1, L, D] prefill
        cache = DynamicCache(config=self.llm.model.config)
        decoded: list[int] = []
        for step in range(max_len):
            hidden, cache = self.llm(x, cache)                              # [1, L or 1, D]
            logp = self.logp_from_hidden(hidden[0, -1])                     # [V]
            if on_logp is not None:
                on_logp(step, logp)
            if step < min_len:
                logp[self.cfg.eos_id] = -float("inf")  # only the eos row; as the reference does
            token = sampler(logp, decoded)
            if token in stop_ids:
                return
            yield token
            decoded.append(token)
            x = self.speech_embedding.weight[token].reshape(1, 1, -1)      # [1, 1, D]

    def tokens(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor | None = None,
        prompt_speech: torch.Tensor | None = None,
        *,
        seed: int | None = None,
        greedy: bool = False,
    ) -> list[int]:
        """All speech tokens at once (whole-utterance synthesis)."""
        sampler = self.make_sampler(seed=seed, greedy=greedy)
        return list(self.generate(text, prompt_text, prompt_speech, sampler=sampler))


def build_speech_lm(cfg: SpeechLMConfig, qwen_config: Qwen2Config, device: str | torch.device = "meta") -> SpeechLM:
    """Construct without initialising weights (on ``meta``): the checkpoint supplies them all."""
    with torch.device(device):
        return SpeechLM(cfg, qwen_config)


def finish_meta_load(model: SpeechLM, device: str | torch.device) -> None:
    """After ``load_state_dict(..., assign=True)`` into a meta-built model (and any dtype cast): rebuild RoPE
    in float32 and re-tie lm_head to the text embedding (the file holds both as separate tensors)."""
    model.llm.rebuild_rotary(device)
    qwen = model.llm.model
    if getattr(qwen.config, "tie_word_embeddings", False):
        qwen.lm_head.weight = qwen.model.embed_tokens.weight


def logp_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max abs, max abs / max |b|) between two log-prob tensors, ignoring -inf entries."""
    a, b = a.float(), b.float()
    ok = torch.isfinite(a) & torch.isfinite(b)
    diff = (a - b).abs()[ok]
    mx = float(diff.max().item()) if diff.numel() else 0.0
    scale = float(b[ok].abs().max().item()) if diff.numel() else 1.0
    return mx, mx / max(scale, 1e-12)


__all__ = [
    "QWEN2_05B_CONFIG",
    "GreedySampler",
    "RasSampler",
    "SpeechLM",
    "SpeechLMConfig",
    "build_speech_lm",
    "finish_meta_load",
    "load_qwen_config",
    "logp_difference",
    "qwen_config_from_dict",
]
