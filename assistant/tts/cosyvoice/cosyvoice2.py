"""The loaded CosyVoice2: its modules (LLM, flow, HiFT), text front end and voice prompts.

Synthesis itself is streamed by the engine (`engine.py` → `batching.py` → `streaming.py`). Modes, chosen by
what the request carries (as the reference's ``inference_*`` functions do):

| request                              | LLM prompt text          | LLM prompt speech | flow prompt   |
|--------------------------------------|--------------------------|-------------------|---------------|
| voice with transcript (zero-shot)    | transcript               | voice tokens      | voice         |
| voice without transcript (x-lingual) | —                        | —                 | voice         |
| instruct / emotion tag (instruct2)   | ``instruct<|endofprompt|>`` | —              | voice         |
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from assistant.tts.cosyvoice.frontend import TextFrontend, language_tag, prepare_text, split_emotion_tag
from assistant.tts.cosyvoice.loader import LoadedModel, load_model_dir
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, PromptStore, VoiceEncoder

log = logging.getLogger(__name__)

SPEAKER_DIM = 192


def empty_voice(device: torch.device | str = "cpu") -> CosyVoicePrompt:
    """No prompt at all: the model picks a voice by itself (zero speaker vector, no prompt frames)."""
    return CosyVoicePrompt(
        voice_id="",
        prompt_text="",
        speech_tokens=torch.zeros(1, 0, dtype=torch.int32, device=device),
        speech_feat=torch.zeros(1, 0, 80, device=device),
        embedding=torch.zeros(1, SPEAKER_DIM, device=device),
    )


class CosyVoice2:
    """The loaded model plus its text front end and voice prompts."""

    def __init__(self, loaded: LoadedModel, voices_dir: str | Path | None = None) -> None:
        self.loaded = loaded
        self.llm, self.flow, self.hift = loaded.llm, loaded.flow, loaded.hift
        self.device = loaded.device
        self.sample_rate = loaded.sample_rate
        self.frontend = TextFrontend(loaded.tokenizer_dir)
        self.voice_encoder = VoiceEncoder(loaded.campplus_path, loaded.speech_tokenizer_path)
        self.voices = PromptStore(voices_dir)

    @classmethod
    def from_dir(
        cls, model_dir: str | Path, device: str = "cpu", dtype: str = "float32", voices_dir: str | Path | None = None
    ) -> CosyVoice2:
        return cls(load_model_dir(model_dir, device, dtype), voices_dir)

    # --- voices -------------------------------------------------------------------------------------------

    def add_voice(self, voice_id: str, audio: np.ndarray, sample_rate: int, prompt_text: str = "") -> CosyVoicePrompt:
        """Compute and store a voice from a reference clip (needs the two ONNX files)."""
        prompt = self.voice_encoder.encode(voice_id, audio, sample_rate, prompt_text)
        self.voices.put(prompt)
        return prompt

    def resolve_voice(self, voice: CosyVoicePrompt | str | None) -> CosyVoicePrompt:
        if isinstance(voice, CosyVoicePrompt):
            return voice
        if voice is None or voice == "":
            return empty_voice(self.device)
        found = self.voices.get(voice)
        if found is None:
            raise KeyError(f"unknown voice {voice!r}")
        return found

    def prompt_text_ids(self, voice: CosyVoicePrompt) -> torch.Tensor | None:
        """The ids of the voice's transcript (zero-shot mode), or None (cross-lingual)."""
        if voice.prompt_text_tokens is not None:
            return voice.prompt_text_tokens
        if voice.prompt_text and self.frontend.has_tokenizer:
            voice.prompt_text_tokens = torch.tensor([self.frontend.encode(voice.prompt_text)], dtype=torch.long)
            return voice.prompt_text_tokens
        return None

    # --- text level ---------------------------------------------------------------------------------------

    def plan(
        self, text: str, instruct: str | None = None, language: str | None = None
    ) -> tuple[list[str], str | None]:
        """Text → (sentences to speak, each with its language tag; formatted instruction or None)."""
        _, bare = split_emotion_tag(text)
        prepared = prepare_text(text, instruct, None)
        tag = language_tag(language)
        sentences = [tag + s for s in self.frontend.sentences(bare)]
        return sentences, prepared.instruct


__all__ = ["CosyVoice2", "empty_voice"]
