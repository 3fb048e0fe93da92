"""Where the shared CosyVoice2 fixtures live (``shared/fixtures/cosyvoice2``: a missing folder is a failure under
CI, a skip elsewhere; see ``tests/needs.py``), and the reference paths the model tests compare against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from assistant.bench.shared_data import shared_path
from tests import needs

FIXTURES_DIR = "fixtures/cosyvoice2"

FIXTURES = shared_path(FIXTURES_DIR)
TINY = FIXTURES / "tiny"
FULL_KEYS = FIXTURES / "full_size_keys"


def need_fixture(relative: str) -> Path:
    """A file or folder inside the fixtures (the test fails under CI, skips elsewhere, when it is absent)."""
    return needs.shared(f"{FIXTURES_DIR}/{relative}")


def need_fixtures() -> Path:
    """The tiny model directory."""
    need_fixture("tiny/llm.pt")
    return need_fixture("tiny")


def report(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    """Print and return the max abs error of ``got`` against ``want`` (with the error relative to |want|)."""
    err = (got.float() - want.float()).abs().max().item()
    rel = err / max(want.abs().max().item(), 1e-12)
    print(f"{name:40s} max abs {err:.3e}  max rel {rel:.3e}")
    return err


def tiny_model_and_voice() -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """The tiny CosyVoice2 on CPU (fp32, one thread), the golden prompt as a voice, and golden.pt."""
    torch.set_num_threads(1)
    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    model = CosyVoice2.from_dir(need_fixtures(), "cpu", "float32")
    g = torch.load(need_fixtures() / "golden.pt", weights_only=True)
    voice = CosyVoicePrompt("p", "", g["in.prompt_speech_token"], g["in.prompt_feat"], g["in.embedding"])
    return model, voice, g


@torch.inference_mode()
def tokens_to_audio(model: Any, tokens: list[int], voice: Any, speed: float = 1.0) -> Any:
    """Whole-utterance reference path: speech tokens → one non-streaming flow call → one HiFT call (float32)."""
    import numpy as np
    import torch.nn.functional as F

    token = torch.as_tensor(tokens, dtype=torch.int32).reshape(1, -1)
    if token.shape[1] == 0:
        return np.zeros(0, dtype=np.float32)
    dtype = next(model.flow.parameters()).dtype
    mel = model.flow.inference(
        token=token, token_len=None, prompt_token=voice.speech_tokens.to(torch.int32), prompt_token_len=None,
        prompt_feat=voice.speech_feat.to(dtype), prompt_feat_len=None, embedding=voice.embedding.to(dtype),
        streaming=False, finalize=True,
    ).float()
    if speed != 1.0:
        mel = F.interpolate(mel, size=max(1, int(mel.shape[2] / speed)), mode="linear")
    speech, _ = model.hift.inference(speech_feat=mel)
    return speech[0].float().numpy()


def synthesize_ids(
    model: Any, text_ids: torch.Tensor, voice: Any, prompt_text_ids: torch.Tensor | None = None,
    seed: int | None = None, greedy: bool = False,
) -> tuple[list[int], Any]:
    """Whole-utterance synthesis with the reference sampler (`llm.generate`, CPU generator): tokens, audio."""
    prompt_speech = voice.speech_tokens if prompt_text_ids is not None else None
    sampler = model.llm.make_sampler(seed=seed, greedy=greedy)
    tokens = list(model.llm.generate(text_ids, prompt_text_ids, prompt_speech, sampler=sampler))
    return tokens, tokens_to_audio(model, tokens, voice)


def random_voice(gen: torch.Generator, n: int) -> Any:
    """A voice with an ``n``-token prompt of random tokens, mel and embedding (prompts not a multiple of 25)."""
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    return CosyVoicePrompt(f"v{n}", "", torch.randint(0, 6561, (1, n), generator=gen, dtype=torch.int32),
                           torch.randn(1, 2 * n, 80, generator=gen), torch.randn(1, 192, generator=gen))
