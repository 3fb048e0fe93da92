"""One utterance to synthesise, as the engine's two worker threads see it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import Chunk, StreamingSynthesis
from assistant.tts.cosyvoice.voice import CosyVoicePrompt


@dataclass(eq=False)
class SpeechJob:
    """One utterance (sentence or clause) to synthesise, and its progress.

    Decode state belongs to the decode thread, the stream to the chunk thread; ``decoded`` and
    ``decode_done`` are how tokens pass from one to the other (append, then set).
    """

    text_ids: torch.Tensor                      # [1, T]
    voice: CosyVoicePrompt
    prompt_text: torch.Tensor | None            # [1, Tp] ids before the text (transcript or instruction)
    prompt_speech: torch.Tensor | None          # [1, P] speech tokens the LLM continues (zero-shot)
    schedule: StreamSchedule
    deliver: Callable[[Chunk | BaseException | None], None]  # thread-safe; None = finished
    greedy: bool = False                        # argmax decoding (tests); else the official sampling
    min_tokens: int | None = None               # None: the model's 2 per text token
    max_tokens: int | None = None               # None: the model's 20 per text token
    ignore_eos: bool = False                    # benchmarks: exactly max_tokens tokens
    speed: float = 1.0
    seed: int | None = None                     # None: a random one (drawn at submit)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # decode thread
    slot: int = -1
    pos: int = 0                                # where the next token goes in the slot (host mirror)
    lo: int = 0
    hi: int = 0
    steps: int = 0                              # tokens sampled (stop ids included)
    decoded: list[int] = field(default_factory=list)
    decode_done: bool = False
    # chunk thread
    stream: StreamingSynthesis | None = None
    fed: int = 0                                # tokens handed to the stream
    t_due: float | None = None                  # when the stream's next chunk became due (queueing)
    # statistics (ms unless named otherwise)
    stats: dict[str, float] = field(default_factory=dict)
    t_submit: float = 0.0
    t_first_audio: float | None = None
    audio_s: float = 0.0

    def cancel(self) -> None:
        self.cancelled.set()

    def deadline(self) -> float:
        """When this job's audio so far has played out (perf_counter seconds): its next chunk is due by then.
        A job that has played nothing yet comes before every job that is playing, oldest first."""
        if self.t_first_audio is None:
            return self.t_submit - 1e6
        return self.t_first_audio + self.audio_s


__all__ = ["SpeechJob"]
