"""How far the fast schedule's audio is from the official schedule's, by region, on the same inputs.

Two comparisons (`compare`), each split into the regions where the fast schedule approximates differently:

``mel`` (flow): the mel each frame's audio was made from on the fast schedule (`StreamingHiFT` records it,
    after exact frames replaced provisional ones it still held) against the official schedule's mel for that
    frame. Sources of difference: the first chunk's provisional frames (never replaced where audio was
    already returned); a warm voice's sealed, cut prompt (`flow_prefix.py`); the last chunk, chunk-masked
    where the official code recomputes everything with full attention.
``audio`` (vocoder): that mel vocoded chunk by chunk as the stream did (same chunk sizes, a
    ``vocoder_lookahead``-frame right edge instead of the ~21 frames exactness needs) against one vocoder pass
    over it, with the same random draws: what the streaming vocoder costs, which sits at the seams. Compared as
    log-magnitude spectra (dB, one column per mel frame), not samples: the harmonic phase runs on from F0
    summed over every earlier frame, so an F0 made from a provisional edge shifts the phase of everything after
    it, which is inaudible but would swamp a sample-wise difference. (The stream itself also replaced held
    provisional frames by exact ones, which shows in the mel comparison; re-vocoding its final mel keeps that
    out of this one.)

Regions (in mel frames of the fast stream's chunks): ``first`` (the first chunk), ``seams`` (the frames
before each later chunk boundary whose audio was made without the vocoder's full right context: the
vocoder's exact look-ahead, ~21 frames), ``last`` (the last chunk, seams excluded), ``middle`` (the rest).
Errors are mean and max absolute differences; the mel's also relative to the official mel's standard deviation.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from assistant.tts.cosyvoice.flow import CausalFlow
from assistant.tts.cosyvoice.flow_prefix import FlowPrefix
from assistant.tts.cosyvoice.hift import HiFTVocoder, StreamingHiFT
from assistant.tts.cosyvoice.schedule import StreamSchedule
from assistant.tts.cosyvoice.streaming import StreamingSynthesis
from assistant.tts.cosyvoice.vocoding import CachedVocoding, NoiseTape, make_generator
from assistant.tts.cosyvoice.voice import CosyVoicePrompt

REGIONS = ("first", "seams", "middle", "last")


@dataclass
class Streamed:
    """One schedule's run over known tokens: its audio, the mel behind each frame, its chunks' frame edges."""

    audio: np.ndarray
    mel: torch.Tensor            # [1, 80, frames]
    edges: list[int]             # frame index where each chunk after the first starts
    stream: StreamingSynthesis


def stream_tokens(
    flow: CausalFlow, hift: HiFTVocoder, voice: CosyVoicePrompt, tokens: list[int], schedule: StreamSchedule,
    prefix: FlowPrefix | None = None, seed: int = 0,
) -> Streamed:
    """Stream known tokens as the LLM would hand them over, recording the mel behind every frame."""
    s = StreamingSynthesis(flow, hift, voice, schedule, prefix=prefix, seed=seed)
    s.backend.record_mel()
    chunks = s.run_through(tokens)
    ratio = flow.cfg.token_mel_ratio
    assert s.backend.spoken is not None
    mel = torch.cat(s.backend.spoken, dim=2).float()
    edges = [ratio * c.covers[0] for c in chunks[1:]]
    return Streamed(np.concatenate([c.audio for c in chunks]), mel, edges, s)


def region_masks(frames: int, first_end: int, edges: list[int], last_start: int, seam: int) -> dict[str, np.ndarray]:
    """Boolean frame masks of the four regions (see the module doc; ``seam`` frames before each edge); every
    frame is in exactly one."""
    idx = np.arange(frames)
    seams = np.zeros(frames, dtype=bool)
    for e in edges:
        seams |= (idx >= e - seam) & (idx < e)
    first = idx < first_end
    seams &= ~first
    last = (idx >= last_start) & ~seams & ~first
    return {"first": first, "seams": seams, "middle": ~(first | seams | last), "last": last}


def _errors(diff: np.ndarray, masks: dict[str, np.ndarray], scale: float) -> dict[str, dict]:
    """diff [frames, k] (absolute differences of each frame's k values) → per region mean/max/relative."""
    out = {}
    for name in REGIONS:
        d = diff[masks[name]]
        out[name] = {"frames": int(masks[name].sum()), "mean_abs": float(d.mean()) if d.size else 0.0,
                     "max_abs": float(d.max()) if d.size else 0.0,
                     "mean_rel": float(d.mean()) / scale if d.size else 0.0}
    return out


def spectrum_db(audio: np.ndarray, spf: int, frames: int) -> np.ndarray:
    """Log-magnitude spectrum [frames, bins] in dB, one column per mel frame (window 4 frames), floored 60 dB
    under the loudest bin so silent bins do not dominate."""
    x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    n_fft = 4 * spf
    mag = torch.stft(x, n_fft, spf, window=torch.hann_window(n_fft), return_complex=True).abs()[:, :frames]
    db = 20 * torch.log10(mag.clamp(min=float(mag.max()) * 1e-3 + 1e-12))
    return db.T.numpy()


@torch.inference_mode()
def compare(
    flow: CausalFlow, hift: HiFTVocoder, voice: CosyVoicePrompt, tokens: list[int], *, warm: bool,
    schedule: StreamSchedule | None = None, seed: int = 0, official: Streamed | None = None,
) -> dict[str, object]:
    """The fast schedule (warm: the voice's prefix; cold: its own state) against the official one (``official``:
    its run over the same tokens, when already made)."""
    schedule = schedule or StreamSchedule.fast()
    prefix = FlowPrefix(flow, voice) if warm else None
    fast = stream_tokens(flow, hift, voice, tokens, schedule, prefix, seed)
    official = official or stream_tokens(flow, hift, voice, tokens, StreamSchedule.official(), seed=seed)
    frames = fast.mel.size(2)
    if official.mel.size(2) != frames:
        raise ValueError(f"the schedules made {official.mel.size(2)} and {frames} frames")
    first_end = fast.edges[0] if fast.edges else frames
    seam = StreamingHiFT(hift).exact_lookahead
    masks = region_masks(frames, first_end, fast.edges, fast.edges[-1] if fast.edges else frames, seam)
    mel_diff = (fast.mel - official.mel).abs()[0].T.numpy()                       # [frames, 80]
    mel = _errors(mel_diff, masks, float(official.mel.std()))
    # the vocoder alone: the same mel and draws, chunk by chunk as the stream pushed it, and in one pass
    backend = fast.stream.backend
    assert isinstance(backend, CachedVocoding)
    dev = next(flow.parameters()).device
    spf = hift.cfg.samples_per_frame
    tape = NoiseTape(make_generator(dev, seed), hift.m_source.n_harmonics, dev)
    whole, _ = hift.inference(fast.mel, noise=tape.span(0, frames * spf))
    whole_audio = whole[0].float().cpu().numpy()
    streamed = StreamingHiFT(hift, lookahead_frames=schedule.vocoder_lookahead)
    bounds = [0, *fast.edges, frames]
    parts = [streamed.push(fast.mel[:, :, a:b], i == len(bounds) - 2, tape.span(a * spf, b * spf))
             for i, (a, b) in enumerate(itertools.pairwise(bounds))]
    chunked = torch.cat(parts).float().cpu().numpy()
    audio_diff = np.abs(spectrum_db(chunked, spf, frames) - spectrum_db(whole_audio, spf, frames))
    audio = _errors(audio_diff, masks, 1.0)
    return {"warm": warm, "prompt_tokens": int(voice.speech_tokens.size(1)), "tokens": len(tokens),
            "frames": frames, "chunk_edges": fast.edges, "mel_std": float(official.mel.std()),
            "revised_frames": backend.revised_frames, "provisional_frames": backend.provisional_frames,
            "mel": mel, "audio": audio}


def table(rows: list[dict[str, object]]) -> str:
    """Markdown: one line per comparison and region (mel error, also relative to the mel's std; vocoder error
    as the log-spectral difference in dB)."""
    lines = ["| voice | prompt tokens | region | frames | mel mean abs | mel max abs | mel mean / std | "
             "vocoder mean dB | vocoder max dB |", "|" + "---|" * 9]
    for r in rows:
        mel, audio = r["mel"], r["audio"]
        assert isinstance(mel, dict) and isinstance(audio, dict)
        for name in REGIONS:
            m, a = mel[name], audio[name]
            lines.append(f"| {'warm' if r['warm'] else 'cold'} | {r['prompt_tokens']} | {name} | {m['frames']} | "
                         f"{m['mean_abs']:.4f} | {m['max_abs']:.3f} | {m['mean_rel']:.4f} | {a['mean_abs']:.3f} | "
                         f"{a['max_abs']:.2f} |")
    return "\n".join(lines)


__all__ = ["REGIONS", "compare", "region_masks", "stream_tokens", "table"]
