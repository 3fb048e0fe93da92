"""When a chunk of speech tokens becomes audio: the two streaming schedules and the chunk planner.

The speech LLM produces 25 tokens per second of audio. A chunk of ``hop`` new tokens can be turned into
audio once ``pre_lookahead_len`` (3) further tokens exist (the flow's encoder looks that far ahead).

``official`` (the reference's token2wav, kept as the baseline the bench compares against)
    first hop 25 tokens + the padding that aligns prompt + hop to the encoder's 25-token attention chunk,
    then 50, 100, 100 ...
``fast`` (ours)
    first hop ``first_chunk_tokens`` (10), then chunks that end on the encoder's 25-token boundaries
    (growing up to ``max_hop``), so only the first chunk's frames are computed provisionally.

How a chunk is computed on each schedule is `vocoding.py`'s business.
"""

from __future__ import annotations

from dataclasses import dataclass

OFFICIAL_FIRST_HOP = 25     # the reference's token_hop_len
OFFICIAL_MAX_HOP = 100      # the reference's token_max_hop_len
HOP_GROWTH = 2              # the reference's stream_scale_factor; ours grows the same way
FAST_MAX_HOP = 50           # ours: smaller late chunks keep many sessions' chunks short and interleaved
# Ours: mel frames the streaming vocoder holds back for right context. Exact needs ~21 (HiFT's receptive
# field: `StreamingHiFT.exact_lookahead`), which would swallow a 10-token (20-frame) first chunk whole; with
# 4 frames (80 ms) each seam is vocoded from a provisional right edge (its error is measured by region in
# `fidelity.py`; the seams' sample steps stay within the signal's own, tests/cosyvoice/test_streaming.py).
FAST_VOCODER_LOOKAHEAD = 4


@dataclass(frozen=True)
class StreamSchedule:
    """How many new speech tokens each chunk covers, and how chunks are computed (see the module doc)."""

    name: str = "fast"                      # "official" (recompute, baseline) or "fast" (cached)
    first_hop: int = 10                     # new tokens in the first chunk (look-ahead not counted)
    max_hop: int = FAST_MAX_HOP
    growth: int = HOP_GROWTH
    first_chunk_steps: int | None = None    # Euler steps for the first chunk's flow (None: the model's 10)
    vocoder_lookahead: int | None = None    # fast: mel frames the vocoder holds back (None: exact)
    align_first_to_prompt: bool = False     # official: pad the first hop so prompt + hop fills 25-token chunks
    align_to_chunks: bool = False           # fast: after the first chunk, end every chunk on an encoder chunk

    @classmethod
    def official(cls) -> StreamSchedule:
        return cls("official", OFFICIAL_FIRST_HOP, OFFICIAL_MAX_HOP, HOP_GROWTH, None, None, True)

    @classmethod
    def fast(
        cls,
        first_chunk_tokens: int = 10,
        max_hop: int = FAST_MAX_HOP,
        first_chunk_steps: int | None = None,
        vocoder_lookahead: int | None = FAST_VOCODER_LOOKAHEAD,
    ) -> StreamSchedule:
        if first_chunk_tokens < 1:
            raise ValueError("first_chunk_tokens must be >= 1")
        hop = max(max_hop, first_chunk_tokens)
        return cls("fast", first_chunk_tokens, hop, HOP_GROWTH, first_chunk_steps, vocoder_lookahead, False, True)

    @classmethod
    def named(cls, name: str, first_chunk_tokens: int = 10, first_chunk_steps: int | None = None) -> StreamSchedule:
        if name == "official":
            return cls.official()
        if name == "fast":
            return cls.fast(first_chunk_tokens, first_chunk_steps=first_chunk_steps)
        raise ValueError(f"unknown stream schedule {name!r} (official or fast)")


class ChunkPlanner:
    """Which tokens the next chunk covers: ``offset`` new tokens are done, the next chunk ends at
    ``offset + hop`` and is due once ``lookahead`` more tokens exist (or the LLM has finished).

    With ``align_to_chunks`` every chunk after the first ends on an encoder chunk boundary (counted from the
    first prompt token, so ``prompt_tokens`` says where the grid lies): its frames are then exact when made
    and never solved twice; only the first chunk's frames are provisional.
    """

    def __init__(self, schedule: StreamSchedule, prompt_tokens: int, encoder_chunk: int, lookahead: int) -> None:
        self.schedule = schedule
        self.lookahead = lookahead
        self.prompt_tokens = prompt_tokens
        self.encoder_chunk = encoder_chunk
        self.offset = 0
        self.base_hop = schedule.first_hop
        self.pad = (-prompt_tokens) % encoder_chunk if schedule.align_first_to_prompt else 0
        self.chunks = 0

    @property
    def hop(self) -> int:
        if self.chunks == 0:
            return self.base_hop + self.pad
        if not self.schedule.align_to_chunks:
            return self.base_hop
        c, p = self.encoder_chunk, self.prompt_tokens
        end = (p + self.offset + self.base_hop) // c * c - p       # the last boundary within the wanted hop
        if end <= self.offset:
            end = ((p + self.offset) // c + 1) * c - p             # or the next one
        return end - self.offset

    def due(self, n_tokens: int, llm_done: bool) -> bool:
        return llm_done or n_tokens - self.offset >= self.hop + self.lookahead

    def advance(self) -> None:
        self.offset += self.hop
        self.chunks += 1
        self.base_hop = min(self.schedule.max_hop, self.base_hop * self.schedule.growth)


__all__ = ["FAST_VOCODER_LOOKAHEAD", "ChunkPlanner", "StreamSchedule"]
