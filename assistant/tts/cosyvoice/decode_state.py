"""The decode thread's model side: per-slot decode state on the device, prompts prefilled into slots, and one
batched decode step with its sampling.

Everything a step needs per slot (next input embedding, position, seed, step count, eos limits, recent tokens)
lives in device tensors indexed by slot, so a step never round-trips through the host. On the static path
(the CUDA graph, or the same step traced on the CPU) the sampling runs inside the step too: every slot's row is
sampled and only the rows of the jobs stepped (``_active``) keep what they drew, so a held or free slot's state
is left as it was; the eager path samples the jobs' rows after the step (`sample`), the reference the static
path is tested against. Which jobs hold which slot, when they start and end, and where their tokens go is the
decode thread's business (`decode_worker.py`).
"""

from __future__ import annotations

import logging

import torch

from assistant.tts.cosyvoice.graphs import batch_buckets, memory_pool
from assistant.tts.cosyvoice.jobs import SpeechJob
from assistant.tts.cosyvoice.llm import SpeechLM
from assistant.tts.cosyvoice.prefill_graphs import StaticPrefill
from assistant.tts.cosyvoice.prompt_cache import PromptCache, digest
from assistant.tts.cosyvoice.sampling import sample_tokens
from assistant.tts.cosyvoice.slot_decoder import SlotDecoder, StaticDecodeStep

log = logging.getLogger(__name__)

Prompt = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None, int]  # rest [L, D], cached start, length


class DecodeState:
    """The slots' decode state and the model calls on it: `prompt`, `start` (prefill), `step`.

    ``cuda_graphs``: each step replays the static step's CUDA graph once `capture` ran (CUDA only);
    ``static_step``: that same static step run directly (any device: how the CPU tests trace the graphed path).
    """

    def __init__(self, lm: SpeechLM, slots: int, max_positions: int, *, cuda_graphs: bool, static_step: bool) -> None:
        self.lm = lm
        self.decoder = SlotDecoder(lm, slots, max_positions)
        p = lm.llm_decoder.weight
        self.device = dev = p.device
        self._next = torch.zeros(slots, p.size(1), device=dev, dtype=p.dtype)       # next input embedding
        self._pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self._seeds = torch.zeros(slots, dtype=torch.long, device=dev)
        self._steps = torch.zeros(slots, dtype=torch.long, device=dev)
        self._lo = torch.zeros(slots, dtype=torch.long, device=dev)
        self._ignore_eos = torch.zeros(slots, dtype=torch.bool, device=dev)
        self._greedy = torch.zeros(slots, dtype=torch.bool, device=dev)
        self._recent = torch.full((slots, lm.cfg.win_size), -1, dtype=torch.long, device=dev)
        stop = torch.zeros(lm.cfg.speech_token_size + 3, dtype=torch.bool, device=dev)
        stop[list(lm.cfg.stop_ids)] = True
        self._stop_rows = stop
        self._active = torch.zeros(slots, dtype=torch.bool, device=dev)               # rows the static step keeps
        self._row_index: dict[tuple[int, ...], torch.Tensor] = {}
        self._row_mask: dict[tuple[int, ...], torch.Tensor] = {}
        # the graphed (CUDA) or traced (static step run directly) paths: the decode step with its sampling inside,
        # and the prefill per bucket (the decode thread's graphs: one memory pool); else eager
        static = (cuda_graphs and dev.type == "cuda") or static_step
        pool = memory_pool(dev) if static and cuda_graphs else None
        self.static = StaticDecodeStep(self.decoder, self._next, self._pos, cuda_graphs, then=self._sample_all,
                                       pool=pool) if static else None
        self.prefill_graphs = StaticPrefill(self.decoder, batch_buckets(slots), graph=cuda_graphs, pool=pool) \
            if static else None

    @property
    def path(self) -> dict[str, object]:
        """Which decode step runs: the CUDA graph (with its capture time and replays), the static step, eager;
        and which prefill (``prefill``)."""
        if self.static is not None:
            prefill = self.prefill_graphs.record if self.prefill_graphs is not None else None
            return {**self.static.record, "prefill": prefill}
        return {"path": f"eager ({self.device.type})", "capture_s": None, "error": None, "prefill": None}

    @property
    def cache_bytes(self) -> int:
        return self.decoder.cache_bytes

    def capture(self) -> None:
        """Capture the static step's graph and the prefill's (call from the thread that steps, between two
        steps); the step's warm-up runs keep no row (``_active`` cleared), so no job's sampling state moves, and
        the prefill's write only to the scratch slot (their placeholders: nothing)."""
        if self.static is not None:
            self._active.zero_()
            self.static.capture()
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture()

    def prompt(self, job: SpeechJob, cache: PromptCache) -> Prompt:
        """The job's prompt after its cached start ([L, D]), that start's keys/values, and the whole length;
        the job's token limits set (within the slot's positions)."""
        lm = self.lm
        prefix, rest = lm.build_lm_input_parts(job.text_ids, job.prompt_text, job.prompt_speech)
        lo, hi = lm.length_limits(int(job.text_ids.numel()))
        job.lo = lo if job.min_tokens is None else job.min_tokens
        job.hi = hi if job.max_tokens is None else job.max_tokens
        length = prefix.size(1) + rest.size(1)
        room = self.decoder.max_positions - length
        if room < 1:
            raise ValueError(f"prompt of {length} positions exceeds max_positions {self.decoder.max_positions}")
        if job.hi > room:
            log.warning("speech tokens capped at %d (max_positions %d)", room, self.decoder.max_positions)
            job.hi = room
        key = digest(id(lm), job.prompt_text if job.prompt_text is not None else "none")
        past = cache.get_or_make("llm", key, lambda: self.decoder.prefix_kv(prefix[0]))
        return rest[0], past, length

    def start(self, jobs: list[SpeechJob], prompts: list[Prompt]) -> torch.Tensor:
        """Prefill the jobs' prompts into their slots (``job.slot`` set) in one forward (a bucket's graph, when
        one fits) and sample their first tokens [B] (on the device)."""
        slots, xs, pasts = [j.slot for j in jobs], [p[0] for p in prompts], [p[1] for p in prompts]
        graphs = self.prefill_graphs
        if graphs is not None and graphs.active and graphs.fits(xs, pasts):
            hidden = graphs.run(slots, xs, pasts)
        else:
            hidden = self.decoder.prefill_many(slots, xs, pasts)
        for job, (_, _, length) in zip(jobs, prompts, strict=True):
            job.pos = length
            s = job.slot
            self._pos[s] = length
            self._seeds[s] = int(job.seed or 0) & ((1 << 62) - 1)
            self._steps[s] = 0
            self._lo[s] = job.lo
            self._ignore_eos[s] = job.ignore_eos
            self._greedy[s] = job.greedy
            self._recent[s] = -1
        return self.sample(hidden, jobs)

    def step(self, jobs: list[SpeechJob]) -> torch.Tensor:
        """One decode step for the jobs' slots → their next tokens [B] (on the device; positions advanced)."""
        rows = self.rows(jobs)
        for j in jobs:
            j.pos += 1
        if self.static is not None and self.static.active:
            self._active.copy_(self._mask(jobs))
            return self.static()[rows]                                  # sampled and advanced inside the step
        # eager: rows 0..max slot; idle rows below it carry their last input to their own free slot
        n = max(j.slot for j in jobs) + 1
        kv_len = max(j.pos for j in jobs)
        hidden = self.decoder.decode(self._next[:n], self._pos[:n], kv_len)[rows]       # [B, D]
        self._pos[rows] += 1
        return self.sample(hidden, jobs)

    def rows(self, jobs: list[SpeechJob]) -> torch.Tensor:
        """The jobs' slots as a device index (made once per combination, not copied every step)."""
        key = tuple(j.slot for j in jobs)
        rows = self._row_index.get(key)
        if rows is None:
            rows = self._row_index[key] = torch.tensor(key, dtype=torch.long, device=self.device)
        return rows

    def _mask(self, jobs: list[SpeechJob]) -> torch.Tensor:
        """The jobs' slots as a device mask [slots] (made once per combination)."""
        key = tuple(j.slot for j in jobs)
        mask = self._row_mask.get(key)
        if mask is None:
            mask = torch.zeros_like(self._active)
            mask[list(key)] = True
            self._row_mask[key] = mask
        return mask

    def _draw(self, hidden: torch.Tensor, steps: torch.Tensor, lo: torch.Tensor, ignore: torch.Tensor,
              recent: torch.Tensor, seeds: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
        """hidden [B, D] and those rows' state → their next tokens [B] (the stop ids masked before the minimum
        length, or always when eos is ignored)."""
        logp = self.lm.logp_from_hidden(hidden)                                          # [B, V]
        cfg = self.lm.cfg
        eos_block = torch.zeros_like(self._stop_rows).unsqueeze(0).expand(hidden.size(0), -1).clone()
        eos_block[:, cfg.eos_id] = steps < lo
        eos_block |= ignore.unsqueeze(1) & self._stop_rows.unsqueeze(0)
        logp = logp.masked_fill(eos_block, -float("inf"))
        return sample_tokens(logp, recent, seeds, steps, greedy, cfg)

    def _sample_all(self, hidden: torch.Tensor) -> torch.Tensor:
        """The static step's sampling: every slot's row of hidden [slots, D] drawn as `sample` draws a job's;
        the rows in ``_active`` keep theirs (recent tokens, step count, next input, position), the others are
        left as they were. → tokens [slots] (only the active rows' mean anything)."""
        tokens = self._draw(hidden, self._steps, self._lo, self._ignore_eos, self._recent, self._seeds, self._greedy)
        keep = self._active
        shifted = torch.cat([self._recent[:, 1:], tokens.unsqueeze(1)], dim=1)
        self._recent.copy_(torch.where(keep.unsqueeze(1), shifted, self._recent))
        self._steps.add_(keep.long())
        self._pos.add_(keep.long())
        emb = self.lm.speech_embedding.weight
        self._next.copy_(torch.where(keep.unsqueeze(1), emb[tokens.clamp(max=emb.size(0) - 1)], self._next))
        return tokens

    def sample(self, hidden: torch.Tensor, jobs: list[SpeechJob]) -> torch.Tensor:
        """hidden [B, D] of jobs' rows → their next tokens [B] on the device; device state updated."""
        rows = self.rows(jobs)

        def sel(t: torch.Tensor) -> torch.Tensor:
            return t[rows]

        tokens = self._draw(hidden, sel(self._steps), sel(self._lo), sel(self._ignore_eos), sel(self._recent),
                            sel(self._seeds), sel(self._greedy))
        self._recent[rows] = torch.cat([self._recent[rows][:, 1:], tokens.unsqueeze(1)], dim=1)
        self._steps[rows] += 1
        emb = self.lm.speech_embedding.weight
        self._next[rows] = emb[tokens.clamp(max=emb.size(0) - 1)]
        return tokens


__all__ = ["DecodeState", "Prompt"]
