"""Speech tokens to audio, chunk by chunk, for one request: the official recompute and our cached way.

``RecomputeVocoding`` (the official schedule, the bench's baseline)
    every chunk re-runs the flow over *all* tokens so far (``finalize=False``) and keeps the new frames; the
    vocoder sees the last 8 mel frames of the previous chunk again, its source there is overwritten by the
    previous source, and the overlapping audio is Hamming cross-faded. The last chunk re-runs the flow with
    full attention (``streaming=False, finalize=True``).

``CachedVocoding`` (the fast schedule)
    the flow carries its encoder and estimator caches (`StreamingFlow`), so each chunk costs only its new
    tokens. A warm voice forks the voice's sealed `FlowPrefix`; a cold one (no prefix built yet) pushes the
    voice's whole prompt through its own state in its first chunk — about the official first chunk's work,
    never a separate wait — while the scheduler builds the prefix for later requests. Caches are exact only
    up to the encoder's 25-token chunk boundaries, so frames past the last boundary are computed
    *provisionally* on throw-away copies of the caches (optionally with fewer Euler steps) and recomputed
    exactly later: the exact frames then replace the provisional ones the vocoder still holds (its held-back
    edge and context), so only audio already returned keeps provisional frames. The vocoder
    (`StreamingHiFT`) carries F0, source phase and convolution context across chunks, holding back
    ``vocoder_lookahead`` frames of right context.

A chunk is computed by a generator (`chunk_steps`) that yields its flow solves and vocoder windows, so the
chunk scheduler can batch them with other streams' (`batch_work.py`). A warm stream's first chunk can instead
take the voice's static first-chunk solver and the vocoder's static first push (`first_chunk.py`: one CUDA
graph replay each for all the streams batched); the eager path above stays their reference. Random draws of
the vocoder come from a per-request generator, so concurrent requests never disturb each other's audio and a
seeded request is reproducible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from assistant.tts.cosyvoice.batch_work import WorkSteps
from assistant.tts.cosyvoice.device_time import StageClock, upload
from assistant.tts.cosyvoice.flow import CausalFlow, FlowSolve, StreamingFlow
from assistant.tts.cosyvoice.flow_graphs import FirstChunkFlow, FirstChunkSolve
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.hift import HiFTVocoder, StreamingHiFT, crossfade_window, fade_in_out
from assistant.tts.cosyvoice.hift_graphs import FirstPush, FirstPushWork
from assistant.tts.cosyvoice.hift_source import SourceNoise
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

# The reference's vocoder overlap: 8 mel frames (160 ms, 3840 samples at 24 kHz) are vocoded twice and the
# audio of the overlap is cross-faded; long enough to hide the seam, short enough to cost little.
MEL_CACHE_FRAMES = 8


def stretch_mel(mel: torch.Tensor, speed: float) -> torch.Tensor:
    """mel [1, 80, T] → [1, 80, T/speed] by linear interpolation (tempo change, pitch kept)."""
    if speed == 1.0 or mel.size(2) == 0:
        return mel
    return F.interpolate(mel, size=max(1, round(mel.size(2) / speed)), mode="linear")


def draw_noise(gen: torch.Generator, n_samples: int, n_harmonics: int, device: torch.device) -> SourceNoise:
    """One vocoder call's random draws from a per-request generator (not the global one)."""
    rand_ini = torch.rand(1, n_harmonics, generator=gen, device=gen.device).to(device)
    sine_noise = torch.randn(1, n_samples, n_harmonics, generator=gen, device=gen.device).to(device)
    return SourceNoise(rand_ini, sine_noise)


class NoiseTape:
    """A request's vocoder randomness as a function of absolute sample position.

    One harmonic start phase for the whole utterance and one noise sample per (sample, harmonic), drawn
    from the request's generator as the utterance grows: a chunked vocoder then sees exactly the draws a
    whole-utterance call would, so streaming does not change the excitation.
    """

    def __init__(self, gen: torch.Generator, n_harmonics: int, device: torch.device) -> None:
        self.gen, self.device = gen, device
        self.rand_ini = torch.rand(1, n_harmonics, generator=gen, device=gen.device).to(device)   # [1, H]
        self.noise = torch.zeros(1, 0, n_harmonics, device=device)                                # [1, N, H]

    def span(self, start: int, end: int) -> SourceNoise:
        """Draws for samples [start, end)."""
        have = self.noise.size(1)
        if end > have:
            more = torch.randn(1, end - have, self.noise.size(2), generator=self.gen, device=self.gen.device)
            self.noise = torch.cat([self.noise, more.to(self.device)], dim=1)
        return SourceNoise(self.rand_ini, self.noise[:, start:end])


def stream_sync(device: torch.device) -> None:
    """Wait for this thread's current CUDA stream only, never the whole device: the decode thread's stream runs
    on, and a graph capture elsewhere is not disturbed (voice preparation; the chunk path never waits)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _stage_ms(clock: StageClock) -> dict[str, float]:
    """A chunk's ``flow_ms`` (start → mel ready, batch-mates' work in the same batches included) and
    ``vocoder_ms`` (mel → audio), 0 for a stage it did not reach."""
    return {"flow_ms": 0.0, "vocoder_ms": 0.0, **clock.ms()}


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    gen = torch.Generator(device=device if device.type == "cuda" else "cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


# --- the official way: recompute the flow over all tokens every chunk -------------------------------------


class RecomputeVocoding:
    """token2wav as the reference streams it (baseline): flow over every token so far, vocoder with caches."""

    def __init__(
        self, flow: CausalFlow, hift: HiFTVocoder, voice: CosyVoicePrompt, gen: torch.Generator, speed: float = 1.0
    ) -> None:
        self.flow, self.hift, self.voice, self.gen, self.speed = flow, hift, voice, gen, speed
        self.device = next(flow.parameters()).device
        self.dtype = next(flow.parameters()).dtype
        self.prompt_tokens = voice.speech_tokens.size(1)
        self.overlap = MEL_CACHE_FRAMES * hift.cfg.samples_per_frame
        self.window = crossfade_window(self.overlap)
        self.mel_tail: torch.Tensor | None = None     # [1, 80, 8]
        self.source_tail: torch.Tensor | None = None  # [1, 1, 3840]
        self.speech_tail: torch.Tensor | None = None  # [1, 3840]
        self.clock = StageClock(self.device)
        self.spoken: list[torch.Tensor] | None = None  # with `record_mel`: each chunk's new mel frames

    def record_mel(self) -> None:
        self.spoken = []

    def chunk_steps(self, tokens: list[int], offset: int, upto: int | None) -> WorkSteps[torch.Tensor]:
        """Audio [N] of new tokens [offset, upto) (``upto`` None: the last chunk, everything left). The
        baseline runs as the reference does, unbatched: nothing is yielded."""
        yield from ()
        return self.chunk(tokens, offset, upto)

    def timings(self) -> dict[str, float]:
        """The last chunk's stage times (read once its audio is on the host)."""
        return _stage_ms(self.clock)

    @torch.inference_mode()
    def chunk(self, tokens: list[int], offset: int, upto: int | None) -> torch.Tensor:
        final = upto is None
        self.clock = clock = StageClock(self.device)
        clock.mark("start")
        lookahead = self.flow.cfg.pre_lookahead_len
        used = tokens if upto is None else tokens[: upto + lookahead]
        dev, v = self.device, self.voice
        token = upload([used], torch.int32, dev)
        prompt = v.speech_tokens.to(dev, torch.int32)
        mel = self.flow.inference(
            token=token,
            token_len=None,   # lengths are for the reference's interface only: batch size 1
            prompt_token=prompt,
            prompt_token_len=None,
            prompt_feat=v.speech_feat.to(dev, self.dtype),
            prompt_feat_len=None,
            embedding=v.embedding.to(dev, self.dtype),
            streaming=not final,
            finalize=final,
        )
        mel = stretch_mel(mel[:, :, offset * self.flow.cfg.token_mel_ratio :].float(), self.speed)
        if self.spoken is not None:
            self.spoken.append(mel)
        clock.mark("flow_ms")
        if self.mel_tail is not None:
            mel = torch.cat([self.mel_tail, mel], dim=2)
        n = mel.size(2) * self.hift.cfg.samples_per_frame
        noise = draw_noise(self.gen, n, self.hift.m_source.n_harmonics, dev)
        speech, source = self.hift.inference(mel, cache_source=self.source_tail, noise=noise)
        if self.speech_tail is not None:
            speech = fade_in_out(speech, self.speech_tail, self.window)
        clock.mark("vocoder_ms")
        if final:
            return speech[0]
        self.mel_tail = mel[:, :, -MEL_CACHE_FRAMES:]
        self.source_tail = source[:, :, -self.overlap :]
        self.speech_tail = speech[:, -self.overlap :]
        return speech[0, : -self.overlap]


# --- ours: cached flow, provisional frames past the last exact boundary ----------------------------------


class CachedVocoding:
    """Our token2wav: each chunk costs its new tokens only (see the module doc).

    ``prefix``: the voice's built `FlowPrefix` (warm: forked), or None (cold: the voice's whole prompt goes
    through this request's own flow state in its first chunk).
    """

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFTVocoder,
        voice: CosyVoicePrompt,
        prefix: FlowPrefix | None,
        gen: torch.Generator,
        speed: float = 1.0,
        first_chunk_steps: int | None = None,
        vocoder_lookahead: int | None = None,
        capacity_tokens: int = 0,
        first_flow: FirstChunkFlow | None = None,
        first_push: FirstPush | None = None,
    ) -> None:
        self.flow, self.hift, self.prefix, self.gen, self.speed = flow, hift, prefix, gen, speed
        self.device = next(flow.parameters()).device
        ratio = flow.cfg.token_mel_ratio
        if prefix is not None:
            self.state = prefix.fork(ratio * capacity_tokens)
            self.prompt_tokens = prefix.prompt_tokens
        else:
            dtype = next(flow.parameters()).dtype
            frames = voice.speech_feat.size(1) + ratio * capacity_tokens
            dev = self.device
            self.state = StreamingFlow(flow, voice.speech_tokens.to(dev), voice.speech_feat.to(dev, dtype),
                                       voice.embedding.to(dev, dtype), capacity=frames)
            self.prompt_tokens = voice.speech_tokens.size(1)
        self.vocoder = StreamingHiFT(hift, lookahead_frames=vocoder_lookahead)
        # the first chunk as static graphs (`first_chunk.py`): the voice's flow solver, the vocoder's first push
        self.first_flow = first_flow if prefix is not None and speed == 1.0 else None
        self.first_push = first_push
        self.n_prompt_frames = self.state.prompt_feat.size(1)
        self.given = 0              # new tokens handed to the flow state
        self.emitted = 0            # new-token mel frames already vocoded
        self.exact: torch.Tensor | None = None  # exact frames computed, not yet vocoded [1, 80, k]
        self.exact_start = 0        # new-frame index of self.exact's first frame
        n_steps = flow.cfg.n_timesteps
        reduced = first_chunk_steps and first_chunk_steps != n_steps and prefix is not None
        self.first_steps = first_chunk_steps if reduced else None
        self.provisional_frames = 0  # frames emitted from provisional mel (stats)
        self.revised_frames = 0      # provisional frames the vocoder still held, replaced by exact ones (stats)
        self.tape = NoiseTape(gen, hift.m_source.n_harmonics, self.device)
        self.vocoded = 0            # mel frames handed to the vocoder (after any speed stretch)
        self.clock = StageClock(self.device)

    @property
    def cold(self) -> bool:
        return self.prefix is None

    def timings(self) -> dict[str, float]:
        """The last chunk's stage times (read once its audio is on the host)."""
        return _stage_ms(self.clock)

    def record_mel(self) -> None:
        self.vocoder.spoken = []

    @property
    def spoken(self) -> list[torch.Tensor] | None:
        return self.vocoder.spoken

    def _commit_steps(self, tokens: list[int], avail: int, final: bool) -> WorkSteps[None]:
        """Hand tokens [given, avail) to the flow state; keep the exact frames it returns."""
        st = self.state
        before = max(st.frames - self.n_prompt_frames, 0)
        new = upload([tokens[self.given : avail]], torch.long, self.device)
        mel = yield from st.push_steps(new, finalize=final)                 # [1, 80, 2k]
        self.given = avail
        if mel.size(2) == 0:
            return
        if self.exact is None:
            self.exact, self.exact_start = mel, before
        else:
            self.exact = torch.cat([self.exact, mel], dim=2)

    def _provisional_steps(self, tokens: list[int], upto: int, n_steps: int | None) -> WorkSteps[torch.Tensor]:
        """Mel of new-token frames [exact end, 2*upto) on throw-away cache copies: [1, 80, k]."""
        flow, st = self.flow, self.state
        look = flow.cfg.pre_lookahead_len
        extra = upload([tokens[self.given : upto + look]], torch.long, self.device)
        seq = torch.cat([st.pending, extra], dim=1)                         # tokens from st.encoded on
        n = self.prompt_tokens + upto - st.encoded                          # tokens to encode
        if n <= 0:
            return self.state.prompt_feat.new_zeros(1, flow.cfg.output_size, 0).float()
        emb = flow.input_embedding(seq[:, : n + look].clamp(min=0))
        h = flow.encoder(emb[:, :n], emb[:, n:], streaming=True, cache=dict(st.encoder_cache))
        mu = flow.encoder_proj(h).transpose(1, 2)                           # [1, 80, 2n]
        start, end = st.frames, st.frames + mu.size(2)
        cond = torch.zeros_like(mu)
        if start < self.n_prompt_frames:
            cond[:, :, : self.n_prompt_frames - start] = st.prompt_feat[:, start:end].transpose(1, 2)
        z = st.noise(start, end)
        if n_steps is None or self.prefix is None:  # written past the committed frames, left uncommitted
            steps, caches = flow.cfg.n_timesteps, [{**c, "provisional": True} for c in st.step_caches]
        else:
            steps, caches = n_steps, self.prefix.reduced_step_caches(n_steps)
        solve = FlowSolve(flow, z, mu, st.spks, cond, caches, steps)
        yield solve
        return solve.result[:, :, max(self.n_prompt_frames - start, 0) :].float()

    def _revise(self) -> None:
        """Exact frames of frames already handed over provisionally: the vocoder still holds some of them
        (its held-back edge and decoder context); replace those (speed 1 only: frames map one to one)."""
        if self.exact is None or self.exact_start >= self.emitted or self.speed != 1.0:
            return
        n = min(self.emitted, self.exact_start + self.exact.size(2)) - self.exact_start
        self.revised_frames += self.vocoder.revise(self.exact[:, :, :n], self.exact_start)

    def chunk_steps(self, tokens: list[int], offset: int, upto: int | None) -> WorkSteps[torch.Tensor]:
        """Audio [N] of new tokens [offset, upto) (``upto`` None: the last chunk)."""
        final = upto is None
        self.clock = clock = StageClock(self.device)
        clock.mark("start")
        first = self.first_flow
        if upto is not None and first is not None and self.emitted == 0 and self.given == 0 and upto == first.hop:
            mel = yield from self._static_first_steps(first, tokens, upto)
        else:
            mel = yield from self._mel_steps(tokens, upto)
        clock.mark("flow_ms")
        if mel.size(2) == 0 and self.vocoder.held_frames == 0 and not final:
            return torch.zeros(0, device=self.device)
        spf = self.hift.cfg.samples_per_frame
        noise = self.tape.span(self.vocoded * spf, (self.vocoded + mel.size(2)) * spf)   # the new frames' draws
        self.vocoded += mel.size(2)
        push = self.first_push
        if push is not None and self.vocoder.received == 0 and not final and mel.size(2) == push.frames:
            work = FirstPushWork(push, mel, noise)
            yield work
            audio = self.vocoder.adopt_first_push(mel, noise, work.f0, work.source, work.result)
        else:
            audio = yield from self.vocoder.push_steps(mel, final, noise)
        clock.mark("vocoder_ms")
        return audio

    def _static_first_steps(self, first: FirstChunkFlow, tokens: list[int], upto: int) -> WorkSteps[torch.Tensor]:
        """The first chunk's mel from the voice's static solver, provisional (its tokens are committed with the
        second chunk): [1, 80, 2 * upto]."""
        work = FirstChunkSolve(first, tokens[: upto + first.look])
        yield work
        self.emitted = self.flow.cfg.token_mel_ratio * upto
        self.provisional_frames += work.result.size(2)
        return work.result

    def _mel_steps(self, tokens: list[int], upto: int | None) -> WorkSteps[torch.Tensor]:
        """The mel of new-token frames [emitted, 2 * upto) (all that is left when ``upto`` is None): exact frames
        committed so far, then provisional ones past the last exact boundary; stretched to the speed."""
        final = upto is None
        ratio = self.flow.cfg.token_mel_ratio
        first_reduced = self.first_steps is not None and self.emitted == 0 and not final
        if not first_reduced:  # only what this chunk needs: the work and the audio do not depend on timing
            look = self.flow.cfg.pre_lookahead_len
            yield from self._commit_steps(tokens, len(tokens) if upto is None else min(len(tokens), upto + look), final)
        self._revise()
        exact_end = max(self.state.frames - self.n_prompt_frames, 0)  # new-token frames known exactly
        target = exact_end if upto is None else ratio * upto
        parts = []
        if self.exact is not None:
            lo = max(self.emitted - self.exact_start, 0)
            hi = min(target, exact_end) - self.exact_start
            if hi > lo:
                parts.append(self.exact[:, :, lo:hi])
        if upto is not None and target > max(exact_end, self.emitted):
            prov = yield from self._provisional_steps(tokens, upto, self.first_steps if first_reduced else None)
            skip = max(self.emitted - exact_end, 0)                 # prov starts at frame exact_end
            parts.append(prov[:, :, skip : target - exact_end])
            self.provisional_frames += parts[-1].size(2)
        mel = torch.cat(parts, dim=2) if parts else torch.zeros(1, self.flow.cfg.output_size, 0, device=self.device)
        self.emitted = max(self.emitted, target)
        if self.exact is not None and self.exact_start < self.emitted:
            cut = min(self.emitted - self.exact_start, self.exact.size(2))
            self.exact, self.exact_start = self.exact[:, :, cut:], self.exact_start + cut
            if self.exact.size(2) == 0:
                self.exact = None
        return stretch_mel(mel, self.speed)


__all__ = [
    "MEL_CACHE_FRAMES",
    "CachedVocoding",
    "NoiseTape",
    "RecomputeVocoding",
    "draw_noise",
    "make_generator",
    "stream_sync",
    "stretch_mel",
]
