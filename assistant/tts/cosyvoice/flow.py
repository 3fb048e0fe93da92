"""CosyVoice2 flow: speech tokens + speaker + prompt mel -> mel spectrogram (conditional flow matching).

    tokens (25 Hz) ──embed──▶ UpsampleConformerEncoder ──proj──▶ mu [80, T] (50 Hz)
    speaker x-vector ──normalize, Linear──▶ spks [80]
    noise z (fixed) ──10 Euler steps of v = estimator(x, mu, t, spks, prompt mel)──▶ mel

Classifier-free guidance runs the conditional and an unconditional row (mu, spks and prompt zeroed)
as one batch of 2 and mixes v = (1 + rate) * v_cond - rate * v_uncond. The starting noise is not
drawn per call: it is a fixed table (seed 0), sliced to the utterance length, so the same tokens
always give the same mel, also chunk after chunk in streaming.

`CausalFlow.state_dict()` has exactly the keys of the official `flow.pt`.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from assistant.tts.cosyvoice.batch_work import Work, WorkSteps, bucket, run_alone
from assistant.tts.cosyvoice.flow_cache import KVCache, RowCaches, Rows
from assistant.tts.cosyvoice.flow_decoder import CausalUNetEstimator
from assistant.tts.cosyvoice.flow_encoder import Cache, UpsampleConformerEncoder

log = logging.getLogger(__name__)

NOISE_SEED = 0
NOISE_FRAMES = 15000  # 300 s of mel frames at 50 Hz: the longest utterance the fixed noise covers


@dataclass
class FlowConfig:
    """Sizes of the flow (defaults: CosyVoice2-0.5B)."""

    input_size: int = 512  # token embedding width
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    token_mel_ratio: int = 2  # mel frames per token
    pre_lookahead_len: int = 3  # future tokens the encoder looks at
    # encoder
    encoder_output_size: int = 512
    encoder_heads: int = 8
    encoder_linear_units: int = 2048
    encoder_blocks: int = 6
    encoder_up_blocks: int = 4
    encoder_chunk_size: int = 25  # tokens per attention chunk in streaming mode
    # estimator
    estimator_in_channels: int = 320  # x, mu, spks, cond: 4 x 80
    estimator_channels: list[int] = field(default_factory=lambda: [256])
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    estimator_chunk_size: int = 50  # frames per attention chunk in streaming mode
    # sampler
    n_timesteps: int = 10
    inference_cfg_rate: float = 0.7
    t_scheduler: str = "cosine"

    @classmethod
    def from_yaml(cls, section: dict[str, Any]) -> FlowConfig:
        """Build from the `flow` entry of the official yaml as plain dicts (see the yaml reader)."""
        enc = section.get("encoder", {})
        dec = section.get("decoder", {})
        est = dec.get("estimator", {})
        cfm = dec.get("cfm_params", {})
        cfm = cfm.get("content", cfm)  # an unwrapped omegaconf.DictConfig
        d = cls()
        channels = list(est.get("channels", d.estimator_channels))
        if len(channels) != 1:
            raise ValueError(f"only a one-level estimator is supported (CosyVoice2), got channels={channels}")
        return cls(
            input_size=section.get("input_size", d.input_size),
            output_size=section.get("output_size", d.output_size),
            spk_embed_dim=section.get("spk_embed_dim", d.spk_embed_dim),
            vocab_size=section.get("vocab_size", d.vocab_size),
            token_mel_ratio=section.get("token_mel_ratio", d.token_mel_ratio),
            pre_lookahead_len=section.get("pre_lookahead_len", d.pre_lookahead_len),
            encoder_output_size=enc.get("output_size", d.encoder_output_size),
            encoder_heads=enc.get("attention_heads", d.encoder_heads),
            encoder_linear_units=enc.get("linear_units", d.encoder_linear_units),
            encoder_blocks=enc.get("num_blocks", d.encoder_blocks),
            encoder_chunk_size=enc.get("static_chunk_size", d.encoder_chunk_size),
            estimator_in_channels=est.get("in_channels", d.estimator_in_channels),
            estimator_channels=channels,
            attention_head_dim=est.get("attention_head_dim", d.attention_head_dim),
            n_blocks=est.get("n_blocks", d.n_blocks),
            num_mid_blocks=est.get("num_mid_blocks", d.num_mid_blocks),
            num_heads=est.get("num_heads", d.num_heads),
            estimator_chunk_size=int(est.get("static_chunk_size", d.estimator_chunk_size)),
            inference_cfg_rate=cfm.get("inference_cfg_rate", d.inference_cfg_rate),
            t_scheduler=cfm.get("t_scheduler", d.t_scheduler),
        )


def fixed_noise(
    frames: int = NOISE_FRAMES, mel_bins: int = 80, device: torch.device | str | None = None
) -> torch.Tensor:
    """The reference's starting noise: seed 0, randn [1, 80, frames] drawn on the CPU generator (so every
    device starts from the same values; global RNG state kept), then moved to ``device``."""
    gen = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
    noise = torch.randn([1, mel_bins, frames], generator=gen, device="cpu")
    return noise if device is None else noise.to(device)


def time_schedule(n_steps: int, scheduler: str, device=None, dtype=torch.float32) -> torch.Tensor:
    """t_0 = 0 ... t_n = 1 [n+1]; 'cosine' spends more steps near t=0 (the noisy end)."""
    t = torch.linspace(0, 1, n_steps + 1, device=device, dtype=dtype)
    if scheduler == "cosine":
        t = 1 - torch.cos(t * 0.5 * torch.pi)
    return t


def guided_euler(
    estimator: CausalUNetEstimator,
    z: torch.Tensor,
    mu: torch.Tensor,
    spks: torch.Tensor,
    cond: torch.Tensor,
    *,
    n_steps: int,
    rate: float,
    scheduler: str,
    streaming: bool = False,
    mask: torch.Tensor | None = None,
    caches: Sequence[list[Cache]] | None = None,
    lengths: list[int] | None = None,
    step_rows: Sequence[Rows] | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The flow's classifier-free-guided Euler solve for N streams at once → mel [N, 80, T] (float32).

    z, mu, cond [N, 80, T]; spks [N, 80]; mask [N, 1, T] (default: ones, or each stream's ``lengths`` real
    frames). Every stream runs as a conditional row and an unconditional one (mu, spks and cond zeroed), in
    pairs, and moves by v = (1 + rate) * v_cond - rate * v_uncond. The state x and the time stay float32
    whatever the weights' dtype (as the reference under autocast: bf16 would round both). ``caches[i][step]``:
    stream i's estimator cache at each step (streaming), so its T frames continue its earlier calls'; or
    ``step_rows[step]``: each step's streaming state already wrapped (`PrefixRows`), with its ``bias``
    [2N, T, T]. The attention bias is made once for all steps.
    """
    n, _, frames = z.shape
    dtype = mu.dtype
    t_span = time_schedule(n_steps, scheduler, mu.device, torch.float32)

    def pair(a: torch.Tensor) -> torch.Tensor:  # [N, ...] → [2N, ...]: each row, then its unconditional twin
        return torch.stack([a, torch.zeros_like(a)], dim=1).flatten(0, 1)

    mu_in, spks_in, cond_in = pair(mu), pair(spks), pair(cond)
    if mask is None:
        mask = torch.ones(n, 1, frames, device=mu.device, dtype=dtype)
        for i, length in enumerate(lengths or []):
            mask[i, :, length:] = 0
    mask_in = mask.repeat_interleave(2, dim=0)
    if bias is None and caches is not None:
        bias = estimator.streams_bias(mask_in, [int(c[0].get("frames", 0)) for c in caches], dtype)
    elif bias is None and step_rows is None:
        bias = estimator.attention_bias(mask_in, streaming, dtype)
    x = z.float()
    t, dt = t_span[0], t_span[1] - t_span[0]
    solve: dict[str, object] = {}       # what the steps share (where the streams sit in the flow arena)
    for step in range(1, n_steps + 1):
        rows: Rows | None = None
        if step_rows is not None:
            rows = step_rows[step - 1]
        elif caches is not None:
            rows = RowCaches([c[step - 1] for c in caches], 2 * n, frames, lengths, solve)
        v = estimator(x.to(dtype).repeat_interleave(2, dim=0), mask_in, mu_in, t.expand(2 * n), spks_in, cond_in,
                      streaming, rows=rows, bias=bias)
        v = v.float().view(n, 2, *v.shape[1:])
        x = x + dt * ((1.0 + rate) * v[:, 0] - rate * v[:, 1])
        # Accumulate t and take dt from the schedule, in the reference's order of float operations.
        t = t + dt
        if step < n_steps:
            dt = t_span[step + 1] - t
    return x


class FlowMatchingDecoder(nn.Module):
    """Euler solver with classifier-free guidance around the velocity estimator (checkpoint: `decoder.`)."""

    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.estimator = CausalUNetEstimator(
            in_channels=cfg.estimator_in_channels,
            out_channels=cfg.output_size,
            channels=cfg.estimator_channels[0],
            attention_head_dim=cfg.attention_head_dim,
            n_blocks=cfg.n_blocks,
            num_mid_blocks=cfg.num_mid_blocks,
            num_heads=cfg.num_heads,
            static_chunk_size=cfg.estimator_chunk_size,
        )

    def forward(
        self,
        z: torch.Tensor,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
        caches: list[Cache] | None = None,
    ) -> torch.Tensor:
        """z, mu, cond [1, 80, T]; mask [1, 1, T]; spks [1, 80] -> mel [1, 80, T] (float32).

        `caches` (streaming): one estimator cache per Euler step, so T frames continue earlier calls'.
        """
        return guided_euler(
            self.estimator, z, mu, spks, cond, n_steps=self.cfg.n_timesteps, rate=self.cfg.inference_cfg_rate,
            scheduler=self.cfg.t_scheduler, streaming=streaming, mask=mask,
            caches=None if caches is None else [caches],
        )


class CausalFlow(nn.Module):
    """Token-to-mel flow of CosyVoice2 (the official `CausalMaskedDiffWithXvec`, inference only)."""

    noise: torch.Tensor  # the fixed starting noise, a buffer (registered below)

    def __init__(self, cfg: FlowConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or FlowConfig()
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(
            input_size=cfg.input_size,
            output_size=cfg.encoder_output_size,
            attention_heads=cfg.encoder_heads,
            linear_units=cfg.encoder_linear_units,
            num_blocks=cfg.encoder_blocks,
            num_up_blocks=cfg.encoder_up_blocks,
            lookahead=cfg.pre_lookahead_len,
            static_chunk_size=cfg.encoder_chunk_size,
            upsample=cfg.token_mel_ratio,
        )
        self.encoder_proj = nn.Linear(cfg.encoder_output_size, cfg.output_size)
        self.decoder = FlowMatchingDecoder(cfg)
        # Drawn on the CPU generator so every device starts from the same noise, then placed on the device the
        # module is built on (``with torch.device(...)``) and moved with it by ``.to()``; not a checkpoint key.
        build = torch.empty(0).device
        if build.type == "meta":  # key/shape checks only: nothing is drawn
            noise = torch.empty(1, cfg.output_size, NOISE_FRAMES, device=build)
        else:
            noise = fixed_noise(mel_bins=cfg.output_size, device=build)
        self.register_buffer("noise", noise, persistent=False)

    @torch.inference_mode()
    def inference(
        self,
        token: torch.Tensor,
        token_len: torch.Tensor | None,
        prompt_token: torch.Tensor,
        prompt_token_len: torch.Tensor | None,
        prompt_feat: torch.Tensor,
        prompt_feat_len: torch.Tensor | None,
        embedding: torch.Tensor,
        streaming: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """Mel of the new tokens [1, 80, 2*(T_new - lookahead if not finalize)]; prompt frames removed.

        token [1, T_new], prompt_token [1, P] (int); prompt_feat [1, 2P, 80]; embedding [1, 192].
        finalize=False: the last `pre_lookahead_len` tokens are only look-ahead context (their frames
        come with the next call). streaming=True: chunked attention, so the result is a prefix of
        what a longer call would give. Lengths are accepted for interface parity; batch size is 1.
        """
        assert token.size(0) == 1, "batch size 1 only"
        del token_len, prompt_token_len, prompt_feat_len
        dtype = self.spk_embed_affine_layer.weight.dtype
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(dtype), dim=1))  # [1, 80]

        tokens = torch.cat([prompt_token, token], dim=1).long().clamp(min=0)
        emb = self.input_embedding(tokens)  # [1, P+T, D]
        context = None
        if not finalize:
            n = self.cfg.pre_lookahead_len
            emb, context = emb[:, :-n], emb[:, -n:]
        h = self.encoder(emb, context, streaming=streaming)  # [1, frames, D]
        n_prompt = prompt_feat.size(1)
        n_frames = h.size(1)
        mu = self.encoder_proj(h)  # [1, frames, 80]

        cond = torch.zeros(1, n_frames, self.cfg.output_size, device=mu.device, dtype=mu.dtype)
        cond[:, :n_prompt] = prompt_feat.to(mu.dtype)
        mask = torch.ones(1, 1, n_frames, device=mu.device, dtype=mu.dtype)
        if n_frames > self.noise.size(2):
            raise ValueError(f"utterance too long for the fixed noise: {n_frames} > {self.noise.size(2)} frames")
        z = self.noise[:, :, :n_frames].to(mu.dtype)
        mel = self.decoder(z, mu.transpose(1, 2), mask, spks, cond.transpose(1, 2), streaming)
        return mel[:, :, n_prompt:].float()


class FlowSolve(Work):
    """One stream's guided Euler solve of T new frames (`guided_euler`), batchable with other streams'.

    z, mu, cond [1, 80, T]; spks [1, 80]; ``caches``: the stream's estimator cache per step (None: a solve
    without streaming state). ``result``: mel [1, 80, T] float32.
    """

    def __init__(
        self,
        flow: CausalFlow,
        z: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        caches: list[Cache] | None,
        n_steps: int | None = None,
    ) -> None:
        self.flow, self.z, self.mu, self.spks, self.cond, self.caches = flow, z, mu, spks, cond, caches
        self.n_steps = n_steps or flow.cfg.n_timesteps

    @property
    def frames(self) -> int:
        return self.z.size(2)

    def batch_key(self, buckets: Sequence[int] = ()) -> Hashable:
        return id(self.flow), self.n_steps, self.caches is None, bucket(self.frames, buckets), self.mu.dtype

    @classmethod
    def run_batch(cls, items: list[FlowSolve]) -> None:
        flow = items[0].flow
        items = sorted(items, key=_voice_of)     # streams of one voice side by side: one prefix run each
        lengths = [it.frames for it in items]
        frames = max(lengths)

        def stack(name: str) -> torch.Tensor:
            parts = [getattr(it, name) for it in items]
            if name != "spks":
                parts = [F.pad(x, (0, frames - x.size(2))) for x in parts]
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        cfg = flow.cfg
        mel = guided_euler(
            flow.decoder.estimator, stack("z"), stack("mu"), stack("spks"), stack("cond"),
            n_steps=items[0].n_steps, rate=cfg.inference_cfg_rate, scheduler=cfg.t_scheduler, streaming=True,
            caches=None if items[0].caches is None else [it.caches for it in items if it.caches is not None],
            lengths=lengths if min(lengths) < frames else None,
        )
        for i, it in enumerate(items):
            it.result = mel[i : i + 1, :, : lengths[i]]


def _voice_of(solve: FlowSolve) -> int:
    """The identity of the voice prefix a solve's stream continues (0: none)."""
    for value in (solve.caches or [{}])[0].values():
        if isinstance(value, KVCache) and value.prefix is not None:
            return id(value.prefix[0])
    return 0


class StreamingFlow:
    """Per-utterance streaming state of a `CausalFlow`: each call computes only the new tokens' frames.

    The encoder keeps its attention keys/values and conv tails, the estimator one cache per Euler step
    (a `KVCache` per transformer block, tails of every causal conv). Tokens are encoded only up to a chunk
    boundary (`encoder_chunk_size` tokens, counted from the first prompt token) that still has
    `pre_lookahead_len` known tokens after it; the rest waits for the next call. That makes the
    concatenated output equal to one `inference(..., streaming=True, finalize=True)` over the whole
    utterance (up to float summation order), while each call costs only its new frames.

    `seal` encodes every pending token as a finished sequence (no look-ahead) without closing the stream:
    a voice prompt is pushed once (`flow_prefix.FlowPrefix`) and continued by every request of that voice.

    Memory grows with the utterance: for every frame, K and V of every attention layer, per Euler step,
    for the 2 CFG rows (written in place into per-layer buffers). Never share one between requests.
    """

    def __init__(
        self,
        flow: CausalFlow,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        capacity: int = 0,
        noise_offset: int = 0,
    ):
        """prompt_token [1, P]; prompt_feat [1, 2P, 80] (prompt mel); embedding [1, 192] speaker x-vector;
        capacity: frames to reserve in each estimator buffer up front (0: grow as needed); noise_offset: where
        frame 0 sits in the fixed noise (a prompt cut at its start keeps the frames' noise of the whole one)."""
        self.flow = flow
        self.noise_offset = noise_offset
        cfg = flow.cfg
        dtype = flow.spk_embed_affine_layer.weight.dtype
        dev = flow.spk_embed_affine_layer.weight.device
        with torch.inference_mode():
            self.spks = flow.spk_embed_affine_layer(F.normalize(embedding.to(dev, dtype), dim=1))  # [1, 80]
        self.prompt_feat = prompt_feat.to(dev, dtype)  # [1, 2P, 80]
        self.pending = prompt_token.to(dev).long().clamp(min=0)  # tokens received, not yet encoded [1, n]
        self.encoded = 0  # tokens encoded so far (prompt included)
        self.frames = 0  # mel frames computed so far (prompt included)
        self.encoder_cache: Cache = {}
        self.step_caches: list[Cache] = [{"capacity": capacity} for _ in range(cfg.n_timesteps)]
        self.finished = False

    def noise(self, start: int, end: int) -> torch.Tensor:
        """The fixed starting noise of this stream's frames [start, end): [1, 80, end - start]."""
        table = self.flow.noise
        lo, hi = self.noise_offset + start, self.noise_offset + end
        if hi > table.size(2):
            raise ValueError(f"utterance too long for the fixed noise: {hi} > {table.size(2)} frames")
        return table[:, :, lo:hi].to(self.prompt_feat.dtype)

    def ready_tokens(self, finalize: bool) -> int:
        """How many pending tokens the next call would encode."""
        if finalize:
            return self.pending.size(1)
        cfg = self.flow.cfg
        known = self.encoded + self.pending.size(1) - cfg.pre_lookahead_len
        boundary = known // cfg.encoder_chunk_size * cfg.encoder_chunk_size
        return max(boundary - self.encoded, 0)

    @torch.inference_mode()
    def push(self, token: torch.Tensor, finalize: bool = False) -> torch.Tensor:
        """Append speech tokens [1, n]; return the mel frames that became final [1, 80, 2k] (k >= 0).

        finalize=True encodes every remaining token (the end of the utterance has zeros as look-ahead).
        Prompt frames are never returned.
        """
        return run_alone(self.push_steps(token, finalize))

    def push_steps(self, token: torch.Tensor, finalize: bool = False) -> WorkSteps[torch.Tensor]:
        """`push` as work steps (its solve can be batched with other streams')."""
        if self.finished:
            raise RuntimeError("this StreamingFlow was finalized")
        self.pending = torch.cat([self.pending, token.long().clamp(min=0).to(self.pending.device)], dim=1)
        mel = yield from self.encode_steps(self.ready_tokens(finalize), look_ahead=not finalize)
        self.finished = finalize
        return mel

    @torch.inference_mode()
    def seal(self) -> torch.Tensor:
        """Encode every pending token as if the sequence ended there (zeros look-ahead); the stream stays open."""
        return run_alone(self.encode_steps(self.pending.size(1), look_ahead=False))

    def encode_steps(self, n: int, look_ahead: bool) -> WorkSteps[torch.Tensor]:
        """Encode the next n pending tokens (with the following ones as look-ahead, or zeros) and solve their
        frames; yields the solve, returns the new frames' mel (prompt frames left out)."""
        flow, cfg = self.flow, self.flow.cfg
        if n == 0:
            return self.prompt_feat.new_zeros(1, cfg.output_size, 0).float()
        new, context = self.pending[:, :n], None
        if look_ahead:
            context = flow.input_embedding(self.pending[:, n : n + cfg.pre_lookahead_len])
        h = flow.encoder(flow.input_embedding(new), context, streaming=True, cache=self.encoder_cache)
        mu = flow.encoder_proj(h).transpose(1, 2)  # [1, 80, 2n]
        start, n_frames = self.frames, mu.size(2)
        end = start + n_frames
        z = self.noise(start, end)

        cond = torch.zeros_like(mu)
        n_prompt = self.prompt_feat.size(1)
        if start < n_prompt:
            cond[:, :, : n_prompt - start] = self.prompt_feat[:, start:end].transpose(1, 2)
        solve = FlowSolve(flow, z, mu, self.spks, cond, self.step_caches)
        yield solve
        mel = solve.result

        self.pending = self.pending[:, n:]
        self.encoded += n
        self.frames = end
        return mel[:, :, max(n_prompt - start, 0) :].float()
