"""CosyVoice2 whole-utterance synthesis: text → speech tokens (LLM) → mel (flow) → 24 kHz audio (HiFT).

Modes, chosen by what the request carries (as the reference's ``inference_*`` functions do):

| request                              | LLM prompt text          | LLM prompt speech | flow prompt   |
|--------------------------------------|--------------------------|-------------------|---------------|
| voice with transcript (zero-shot)    | transcript               | voice tokens      | voice         |
| voice without transcript (x-lingual) | —                        | —                 | voice         |
| instruct / emotion tag (instruct2)   | ``instruct<|endofprompt|>`` | —              | voice         |
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from assistant.tts.base import SPEED_RANGE
from assistant.tts.cosyvoice.frontend import TextFrontend, language_tag, prepare_text, split_emotion_tag
from assistant.tts.cosyvoice.llm import GreedySampler, RasSampler
from assistant.tts.cosyvoice.loader import LoadedModel, load_model_dir
from assistant.tts.cosyvoice.voice import CosyVoicePrompt, VoiceEncoder, VoiceStore

log = logging.getLogger(__name__)

SPEAKER_DIM = 192


class SynthesisCancelled(Exception):
    """The caller's cancel event was set while tokens were being generated."""


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
        self.voices = VoiceStore(voices_dir)

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

    def _prompt_text_ids(self, voice: CosyVoicePrompt) -> torch.Tensor | None:
        if voice.prompt_text_tokens is not None:
            return voice.prompt_text_tokens
        if voice.prompt_text and self.frontend.has_tokenizer:
            voice.prompt_text_tokens = torch.tensor([self.frontend.encode(voice.prompt_text)], dtype=torch.long)
            return voice.prompt_text_tokens
        return None

    # --- token level --------------------------------------------------------------------------------------

    def speech_tokens(
        self,
        text_ids: torch.Tensor,
        voice: CosyVoicePrompt,
        instruct_ids: torch.Tensor | None = None,
        sampler: GreedySampler | RasSampler | None = None,
        cancel: threading.Event | None = None,
    ) -> list[int]:
        """Text ids [1,T] → speech tokens, in the mode the inputs select (see the module docstring)."""
        if instruct_ids is not None:
            prompt_text, prompt_speech = instruct_ids, None
        else:
            prompt_text = self._prompt_text_ids(voice)
            prompt_speech = voice.speech_tokens if prompt_text is not None else None
        out: list[int] = []
        for token in self.llm.generate(text_ids, prompt_text, prompt_speech, sampler=sampler):
            if cancel is not None and cancel.is_set():
                raise SynthesisCancelled()
            out.append(token)
        return out

    @torch.inference_mode()
    def tokens_to_audio(
        self, tokens: list[int] | torch.Tensor, voice: CosyVoicePrompt, speed: float = 1.0
    ) -> np.ndarray:
        """Speech tokens → 24 kHz float32 audio: flow (non-streaming, finalised) then HiFT.

        ``speed`` stretches the mel in time by linear interpolation before the vocoder (the reference's way;
        pitch is unchanged).
        """
        dev = self.device
        token = torch.as_tensor(tokens, dtype=torch.int32).reshape(1, -1).to(dev)
        if token.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        prompt_token = voice.speech_tokens.to(dev, torch.int32)
        prompt_feat = voice.speech_feat.to(dev)
        flow_dtype = next(self.flow.parameters()).dtype
        mel = self.flow.inference(
            token=token,
            token_len=torch.tensor([token.shape[1]], dtype=torch.int32, device=dev),
            prompt_token=prompt_token,
            prompt_token_len=torch.tensor([prompt_token.shape[1]], dtype=torch.int32, device=dev),
            prompt_feat=prompt_feat.to(flow_dtype),
            prompt_feat_len=torch.tensor([prompt_feat.shape[1]], dtype=torch.int32, device=dev),
            embedding=voice.embedding.to(dev, flow_dtype),
            streaming=False,
            finalize=True,
        )                                                                   # [1, 80, 2T]
        if isinstance(mel, tuple):  # tolerate a (mel, cache) return
            mel = mel[0]
        mel = mel.float()
        if speed != 1.0:
            lo, hi = SPEED_RANGE
            if not lo <= speed <= hi:
                raise ValueError(f"speed {speed} outside {lo}-{hi}")
            mel = F.interpolate(mel, size=max(1, int(mel.shape[2] / speed)), mode="linear")
        speech, _ = self.hift.inference(speech_feat=mel)                   # [1, 480 * frames]
        return speech[0].float().cpu().numpy()

    # --- text level ---------------------------------------------------------------------------------------

    def make_sampler(self, seed: int | None = None, greedy: bool = False) -> GreedySampler | RasSampler:
        return self.llm.make_sampler(seed=seed, greedy=greedy)

    def plan(
        self, text: str, instruct: str | None = None, language: str | None = None
    ) -> tuple[list[str], str | None]:
        """Text → (sentences to speak, each with its language tag; formatted instruction or None)."""
        _, bare = split_emotion_tag(text)
        prepared = prepare_text(text, instruct, None)
        tag = language_tag(language)
        sentences = [tag + s for s in self.frontend.sentences(bare)]
        return sentences, prepared.instruct

    def synthesize_sentence(
        self,
        sentence: str,
        voice: CosyVoicePrompt,
        instruct: str | None,
        speed: float,
        sampler: GreedySampler | RasSampler,
        cancel: threading.Event | None = None,
    ) -> np.ndarray:
        text_ids = torch.tensor([self.frontend.encode(sentence)], dtype=torch.long)
        instruct_ids = torch.tensor([self.frontend.encode(instruct)], dtype=torch.long) if instruct else None
        tokens = self.speech_tokens(text_ids, voice, instruct_ids, sampler, cancel)
        return self.tokens_to_audio(tokens, voice, speed)

    def synthesize(
        self,
        text: str,
        voice: CosyVoicePrompt | str | None = None,
        instruct: str | None = None,
        language: str | None = None,
        speed: float = 1.0,
        seed: int | None = None,
        greedy: bool = False,
    ) -> np.ndarray:
        """Whole utterance, sentence by sentence, concatenated: 24 kHz mono float32."""
        prompt = self.resolve_voice(voice)
        sentences, formatted = self.plan(text, instruct, language)
        sampler = self.make_sampler(seed, greedy)
        parts = [self.synthesize_sentence(s, prompt, formatted, speed, sampler) for s in sentences]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def synthesize_ids(
        self,
        text_ids: torch.Tensor,
        voice: CosyVoicePrompt,
        prompt_text_ids: torch.Tensor | None = None,
        speed: float = 1.0,
        seed: int | None = None,
        greedy: bool = False,
    ) -> tuple[list[int], np.ndarray]:
        """Token-id level synthesis (no tokenizer needed): zero-shot with ``prompt_text_ids``."""
        if prompt_text_ids is not None:
            voice = CosyVoicePrompt(**{**voice.__dict__, "prompt_text_tokens": prompt_text_ids})
        tokens = self.speech_tokens(text_ids, voice, None, self.make_sampler(seed, greedy))
        return tokens, self.tokens_to_audio(tokens, voice, speed)


__all__ = ["CosyVoice2", "SynthesisCancelled", "empty_voice"]
