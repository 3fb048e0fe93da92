"""Where the shared CosyVoice2 fixtures live, and pytest skips when they are absent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared/fixtures/cosyvoice2"
TINY = FIXTURES / "tiny"
FULL_KEYS = FIXTURES / "full_size_keys"


def need_fixtures() -> Path:
    """The tiny model directory, or skip the test with the reason."""
    if not (TINY / "llm.pt").is_file():
        pytest.skip(f"CosyVoice2 fixtures not found at {FIXTURES} (shared/fixtures/cosyvoice2 beside the repo)")
    return TINY


def part_b_ready() -> bool:
    """flow.py / hift.py (written in parallel) importable with the agreed names."""
    try:
        from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig  # noqa: F401
        from assistant.tts.cosyvoice.hift import HiFTConfig, HiFTVocoder  # noqa: F401
    except Exception:
        return False
    return True


def need_part_b() -> None:
    if not part_b_ready():
        pytest.skip("flow.py / hift.py (part B) not importable yet")


def report(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    """Print and return the max abs error of ``got`` against ``want`` (with the error relative to |want|)."""
    err = (got.float() - want.float()).abs().max().item()
    rel = err / max(want.abs().max().item(), 1e-12)
    print(f"{name:40s} max abs {err:.3e}  max rel {rel:.3e}")
    return err


def tiny_model_and_voice() -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """The tiny CosyVoice2 on CPU (fp32, one thread), the golden prompt as a voice, and golden.pt."""
    need_part_b()
    torch.set_num_threads(1)
    from assistant.tts.cosyvoice.model import CosyVoice2
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

    model = CosyVoice2.from_dir(need_fixtures(), "cpu", "float32")
    g = torch.load(need_fixtures() / "golden.pt", weights_only=True)
    voice = CosyVoicePrompt("p", "", g["in.prompt_speech_token"], g["in.prompt_feat"], g["in.embedding"])
    return model, voice, g
