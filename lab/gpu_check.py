"""The prepared CosyVoice2 check for a CUDA machine without network (``scripts/gpu_check.sh`` runs it).

It needs only torch, numpy, transformers and pyyaml (no aiortc, av, soxr, soundfile, wetext, matplotlib), runs
from the working tree, and writes every stage's result to the output folder the moment the stage ends
(``<stage>.json``, and ``gpu_check.json`` + ``gpu_check.md`` with every stage so far; the first-packet stages
also ``gpu_first_packet.json`` + ``.md``, for docs/figures/), so a run cut short keeps what it had. Its fixtures
and texts are found in ``$ASSISTANT_SHARED``, else ``shared/`` in the tree, else ``../shared`` (`shared_data.py`);
the env stage fails loudly when none holds them. Stages, in order (the headline figures first, the slower
correctness stages after them):

``env``        Python, torch, CUDA device, versions, which optional modules are missing, where the data is.
``parity``     the tiny fixture model in float32 on the device against the reference's goldens: LLM
               log-probs, greedy and end-to-end tokens, flow mels (whole and first streaming chunk), the
               vocoder with the recorded draws, and the official schedule's three streamed chunks.
``graphs``     the graphed and batched paths against their eager twins on the device (`gpu_first_packet.py`).
``first_packet_graphs_on`` / ``first_packet_graphs_off``
               the first packet at 1, 16 and 64 streams, full-size shapes, random weights, bf16, with the CUDA
               graphs on and off (`gpu_first_packet.py`); on the CPU the tiny model at 1 and 2 streams.
``bf16``       the tiny model in bfloat16 against the goldens: log-prob, token agreement, mel error relative
               to the mel's spread, end-to-end audio.
``bf16_full_size`` (CUDA) full-size shapes, random weights: flow mel and LLM log-probs, bf16 against fp32.
``frontend``   the text front end on the reference's ten texts (texts with digits need wetext: skipped
               without it, and the stage says so).

``python -m lab.gpu_check --out DIR [--device auto|cpu|cuda] [--budget-s 300]``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from assistant.bench.figures import cell_text, markdown_table, provenance
from assistant.bench.shared_data import ENV as SHARED_ENV
from assistant.bench.shared_data import shared_candidates, shared_dir
from lab.gpu_first_packet import FirstPacketSummary, fixture, stage_first_packet, stage_graphs, tiny

if TYPE_CHECKING:  # torch and the model come with the cosyvoice extra; each stage imports them when it runs
    import numpy as np
    import torch

    from assistant.tts.cosyvoice.cosyvoice2 import CosyVoice2
    from assistant.tts.cosyvoice.voice import CosyVoicePrompt

log = logging.getLogger(__name__)

TINY = "fixtures/cosyvoice2/tiny"                   # inside the shared folder (`shared_data.py`)
TOKENIZER = "fixtures/cosyvoice2/tiny_tokenizer"
OPTIONAL_MODULES = ("wetext", "soxr", "soundfile", "av", "aiortc", "faster_whisper", "piper", "matplotlib",
                    "onnxruntime", "scipy", "aiohttp")
# float32 parity: the README's 1-vs-2-thread noise is 2e-6 (log-probs), 3e-6 (mels), 2e-5 (audio). On CUDA
# (TF32 off) summation order differs more; a real bug is orders of magnitude larger.
TOLERANCE = {"cpu": {"logp": 1e-4, "mel": 1e-4, "audio": 1e-4}, "cuda": {"logp": 2e-3, "mel": 2e-3, "audio": 5e-3}}
BF16_MEL_MEAN_REL = 0.08   # as tests/cosyvoice/test_guards.py
BF16_MEL_MAX_REL = 0.6
FULL_SIZE_INPUT = {"prompt_tokens": 250, "new_tokens": 100, "text_tokens": 50}  # a 10 s voice, 4 s of speech
LATER_STAGES_S = {"cuda": 40.0, "cpu": 30.0}   # kept for bf16, bf16_full_size and frontend after the first packets


# --- results -------------------------------------------------------------------------------------------


@dataclass
class Stage:
    """One stage's outcome: rows of a table, facts, notes; ``status`` pass / fail / error / skipped."""

    name: str
    status: str = "pass"
    rows: list[dict[str, object]] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def check(self, row: Mapping[str, object], ok: bool | None) -> None:
        """Add a row; ``ok`` False fails the stage (None: informational)."""
        row = {**row, "ok": "-" if ok is None else ("yes" if ok else "NO")}
        self.rows.append(row)
        if ok is False and self.status == "pass":
            self.status = "fail"

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 2), "facts": self.facts,
                "rows": self.rows, "notes": self.notes}


class Report:
    """Writes each finished stage at once: ``<stage>.json``, ``gpu_check.json`` and ``gpu_check.md``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.stages: list[Stage] = []
        self.origin = provenance(["scripts/gpu_check.sh", *sys.argv[1:]])  # command, commit, machine

    def run(self, name: str, fn: Callable[[Stage], None]) -> Stage:
        stage = Stage(name)
        t0 = time.perf_counter()
        log.info("gpu_check.stage_start stage=%s", name)
        try:
            fn(stage)
        except Exception as exc:  # one broken stage must not cost the others their results
            stage.status = "error"
            stage.notes.append(f"{type(exc).__name__}: {exc}")
            stage.facts["traceback"] = traceback.format_exc()
            log.exception("gpu_check.stage_error stage=%s", name)
        stage.seconds = time.perf_counter() - t0
        self.stages.append(stage)
        self.write()
        log.info("gpu_check.stage_done stage=%s status=%s seconds=%.1f", name, stage.status, stage.seconds)
        return stage

    def write(self) -> None:
        for s in self.stages:
            (self.out / f"{s.name}.json").write_text(json.dumps(s.as_dict(), indent=2, default=str), "utf-8")
        doc = {"stages": [s.as_dict() for s in self.stages]}
        (self.out / "gpu_check.json").write_text(json.dumps(doc, indent=2, default=str), "utf-8")
        (self.out / "gpu_check.md").write_text(self.markdown(), "utf-8")

    def markdown(self) -> str:
        parts = ["# CosyVoice2 GPU check", "", self.origin, "", markdown_table(
            [{"stage": s.name, "status": s.status, "seconds": round(s.seconds, 1)} for s in self.stages])]
        for s in self.stages:
            parts += ["", f"## {s.name}: {s.status}", ""]
            facts = {k: v for k, v in s.facts.items() if k != "traceback" and not isinstance(v, (dict, list))}
            parts += [f"- {k}: {cell_text(v)}" for k, v in facts.items()]
            parts += [f"- note: {n}" for n in s.notes]
            if s.rows:
                parts += ["", markdown_table(s.rows)]
        return "\n".join(parts) + "\n"


# --- stages ----------------------------------------------------------------------------------------------


def stage_env(stage: Stage, device: str) -> None:
    import numpy as np
    import torch

    f = stage.facts
    f.update(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__,
             cuda_build=torch.version.cuda, device=device, host=platform.node())
    for mod in ("transformers", "yaml", "onnxruntime", "scipy"):
        try:
            f[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except ImportError:
            f[mod] = None
    missing = []
    for mod in OPTIONAL_MODULES:
        try:
            present = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            present = False
        if not present:
            missing.append(mod)
    f["missing_modules"] = ", ".join(missing) or "none"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        f.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                 capability=f"{props.major}.{props.minor}")
    found = shared_dir(f"{TINY}/golden.pt")
    f["shared"] = _where(found) if found else None
    if found is None:
        stage.status = "fail"
        looked = ", ".join(str(p) for p in shared_candidates())
        stage.notes.append(f"SHARED DATA NOT FOUND: no {TINY}/golden.pt in {looked}. Set {SHARED_ENV} to the "
                           "folder holding fixtures/, texts/ and audio/ (or copy it to shared/ in this tree); "
                           "parity, bf16, frontend and the bench's texts need it")
        log.error("gpu_check.shared_missing looked=%s", looked)


def _where(folder: Path) -> str:
    """Where the shared data was found, without the machine's absolute path (reports go into the docs)."""
    from assistant.bench.shared_data import TREE

    folder = folder.resolve()
    if folder.is_relative_to(TREE):
        return str(folder.relative_to(TREE))
    if folder == (TREE.parent / folder.name).resolve():
        return f"../{folder.name}"
    return f"{folder.name} (${SHARED_ENV})"


_fixture, _tiny = fixture, tiny   # where the fixtures are and the tiny model (shared with the first-packet stages)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float().cpu() - want.float()).abs().max())


def _mismatches(got: list[int], want: list[int]) -> int:
    return sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))


def _flow_mel(model: CosyVoice2, voice: CosyVoicePrompt, tokens: torch.Tensor, streaming: bool,
              finalize: bool) -> torch.Tensor:
    import torch

    dev, dt = model.device, next(model.flow.parameters()).dtype
    tok = tokens.to(dev)
    with torch.inference_mode():
        mel = model.flow.inference(
            tok, torch.tensor([tok.size(1)], device=dev), voice.speech_tokens,
            torch.tensor([voice.speech_tokens.size(1)], device=dev), voice.speech_feat.to(dt),
            torch.tensor([voice.speech_feat.size(1)], device=dev), voice.embedding.to(dt),
            streaming=streaming, finalize=finalize,
        )
    return (mel[0] if isinstance(mel, tuple) else mel).float()


@contextlib.contextmanager
def _recorded_draws(g: dict[str, torch.Tensor], device: torch.device) -> Iterator[None]:
    """The official schedule's vocoder calls take the reference's recorded random draws, in order."""
    import assistant.tts.cosyvoice.vocoding as vocoding
    from assistant.tts.cosyvoice.hift_source import SourceNoise

    draws = iter([SourceNoise(g[f"e2e.hift_call{i}_rand_ini"].to(device), g[f"e2e.hift_call{i}_sine_noise"].to(device))
                  for i in range(3)])
    orig = vocoding.draw_noise
    vocoding.draw_noise = lambda *a, **k: next(draws)
    try:
        yield
    finally:
        vocoding.draw_noise = orig


def _official_e2e(model: CosyVoice2, voice: CosyVoicePrompt, g: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """The official schedule over the reference's 100 e2e tokens with its recorded draws → 3 audio chunks."""
    from assistant.tts.cosyvoice.schedule import StreamSchedule
    from assistant.tts.cosyvoice.streaming import run_stream

    with _recorded_draws(g, model.device):
        chunks = run_stream(model.flow, model.hift, voice, g["e2e.speech_tokens"].tolist(), StreamSchedule.official())
    return [c.audio for c in chunks]


def stage_parity(stage: Stage, device: str) -> None:
    import numpy as np
    import torch

    from assistant.tts.cosyvoice.hift_source import SourceNoise
    from assistant.tts.cosyvoice.llm import GreedySampler

    tol = TOLERANCE["cuda" if device == "cuda" else "cpu"]
    if device == "cuda":  # parity is about the math, not TF32's 10-bit mantissa
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    stage.facts.update(device=device, dtype="float32", **{f"tol_{k}": v for k, v in tol.items()})
    model, voice, g = _tiny(device, "float32")
    lm = model.llm
    inputs = (g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    with torch.inference_mode():
        logp = lm.forward_logp(lm.build_lm_input(*inputs))
        e = _err(logp, g["llm.tf_logp"])
        stage.check({"what": "LLM teacher-forced log-probs", "max_abs": e, "tol": tol["logp"]}, e < tol["logp"])
        greedy = list(lm.generate(*inputs, sampler=GreedySampler(), max_len=40))
        want = g["llm.greedy_tokens"].tolist()
        stage.check({"what": "LLM greedy tokens (40)", "mismatches": _mismatches(greedy, want)}, greedy == want)
        e2e = lm.tokens(g["in.e2e_text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"], greedy=True)
        want = g["e2e.speech_tokens"].tolist()
        stage.check({"what": "LLM end-to-end tokens (100)", "mismatches": _mismatches(e2e, want)}, e2e == want)
    for name, n, streaming, finalize in (("flow_nonstream", 40, False, True), ("flow_stream_chunk1", 28, True, False)):
        mel = _flow_mel(model, voice, g["in.flow_token"][:, :n], streaming, finalize)
        e = _err(mel, g[f"{name}.mel"])
        stage.check({"what": f"{name}.mel", "max_abs": e, "tol": tol["mel"]}, e < tol["mel"])
    dev = model.device
    noise = SourceNoise(g["hift_full.rand_ini"].to(dev), g["hift_full.sine_noise"].to(dev))
    with torch.inference_mode():
        speech, _ = model.hift.inference(g["hift_full.mel_in"].to(dev), noise=noise)
    e = _err(speech, g["hift_full.speech"])
    stage.check({"what": "hift_full.speech (recorded draws)", "max_abs": e, "tol": tol["audio"]}, e < tol["audio"])
    chunks = _official_e2e(model, voice, g)
    sizes = [c.size for c in chunks]
    stage.check({"what": "official schedule chunk sizes", "got": str(sizes),
                 "want": str(g["e2e.chunk_lengths"].tolist())}, sizes == g["e2e.chunk_lengths"].tolist())
    for i, c in enumerate(chunks):
        e = _err(torch.from_numpy(np.asarray(c)), g[f"e2e.chunk{i}"][0])
        stage.check({"what": f"e2e.chunk{i} (official schedule)", "max_abs": e, "tol": tol["audio"]}, e < tol["audio"])


def stage_bf16(stage: Stage, device: str, e2e: bool) -> None:
    import numpy as np
    import torch

    model, voice, g = _tiny(device, "bfloat16")
    lm = model.llm
    stage.facts.update(device=device, dtype="bfloat16 (LLM, flow; vocoder float32)")
    inputs = (g["in.text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"])
    with torch.inference_mode():
        logp = lm.forward_logp(lm.build_lm_input(*inputs)).float().cpu()
    d = (logp - g["llm.tf_logp"]).abs()
    finite = bool(torch.isfinite(logp).all())
    stage.check({"what": "LLM teacher-forced log-probs", "max_abs": float(d.max()), "mean_abs": float(d.mean())},
                finite)
    for name, n, streaming, finalize in (("flow_nonstream", 40, False, True), ("flow_stream_chunk1", 28, True, False)):
        mel = _flow_mel(model, voice, g["in.flow_token"][:, :n], streaming, finalize).cpu()
        ref = g[f"{name}.mel"]
        d = (mel - ref).abs()
        spread = float(ref.std())
        mean_rel, max_rel = float(d.mean()) / spread, float(d.max()) / spread
        stage.check({"what": f"{name}.mel", "mean_abs": float(d.mean()), "max_abs": float(d.max()), "mel_std": spread,
                     "mean/std": mean_rel, "max/std": max_rel},
                    bool(torch.isfinite(mel).all()) and mean_rel < BF16_MEL_MEAN_REL and max_rel < BF16_MEL_MAX_REL)
    if not e2e:  # bf16 matmuls are slow on most CPUs; the code path is parity's
        stage.notes.append("end-to-end tokens and audio in bf16: CUDA only")
        return
    with torch.inference_mode():
        tokens = lm.tokens(g["in.e2e_text_token"], g["in.prompt_text_token"], g["in.prompt_speech_token"],
                           greedy=True)
    want = g["e2e.speech_tokens"].tolist()
    same = next((i for i, (a, b) in enumerate(zip(tokens, want, strict=False)) if a != b), min(len(tokens), len(want)))
    stage.check({"what": "greedy e2e tokens equal to fp32 (prefix)", "value": f"{same}/{len(want)}"}, None)
    chunks = _official_e2e(model, voice, g)
    audio = torch.from_numpy(np.concatenate([np.asarray(c) for c in chunks]))
    ref = g["e2e.audio_concat"][0]
    if audio.shape != ref.shape:
        stage.check({"what": "e2e audio (fp32 tokens, official schedule)", "value": f"shape {tuple(audio.shape)}"},
                    False)
    else:
        noise = float(((audio - ref) ** 2).mean())
        snr = 10 * np.log10(float((ref**2).mean()) / max(noise, 1e-20))
        stage.check({"what": "e2e audio (fp32 tokens, official schedule)",
                     "max_abs": float((audio - ref).abs().max()), "snr_db": float(snr)},
                    bool(torch.isfinite(audio).all()))


def full_size_bf16(stage: Stage, device: str) -> None:
    """Full-size shapes, random weights: the flow's mel and the LLM's log-probs in bf16 against fp32 on the
    same inputs (wide layers and 24 LLM blocks accumulate more rounding than the tiny model shows)."""
    import torch

    from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig
    from assistant.tts.cosyvoice.llm import QWEN2_05B_CONFIG, SpeechLM, SpeechLMConfig, qwen_config_from_dict

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    n_prompt, n_new, n_text = (FULL_SIZE_INPUT[k] for k in ("prompt_tokens", "new_tokens", "text_tokens"))
    prompt_tokens = torch.randint(0, 6561, (1, n_prompt), generator=gen, dtype=torch.int32).to(dev)
    prompt_feat = torch.randn(1, 2 * n_prompt, 80, generator=gen).to(dev)
    embedding = torch.randn(1, 192, generator=gen).to(dev)
    new_tokens = torch.randint(0, 6561, (1, n_new), generator=gen, dtype=torch.int32).to(dev)
    text = torch.randint(0, 150000, (1, n_text), generator=gen)
    torch.manual_seed(0)
    with dev:
        flow = CausalFlow(FlowConfig()).eval()
    mels = []
    for dt in (torch.float32, torch.bfloat16):
        flow = flow.to(dt)
        with torch.inference_mode():
            mel = flow.inference(new_tokens, torch.tensor([n_new], device=dev), prompt_tokens,
                                 torch.tensor([n_prompt], device=dev), prompt_feat.to(dt),
                                 torch.tensor([2 * n_prompt], device=dev), embedding.to(dt),
                                 streaming=False, finalize=True)
        mels.append((mel[0] if isinstance(mel, tuple) else mel).float())
    del flow
    d, spread = (mels[1] - mels[0]).abs(), float(mels[0].std())
    stage.check({"what": "full-size flow mel (random weights)", "mean_abs": float(d.mean()), "max_abs": float(d.max()),
                 "mel_std": spread, "mean/std": float(d.mean()) / spread, "max/std": float(d.max()) / spread},
                bool(torch.isfinite(mels[1]).all()))
    with dev:
        lm = SpeechLM(SpeechLMConfig(), qwen_config_from_dict(QWEN2_05B_CONFIG)).eval()
    lm.llm.rebuild_rotary(dev)
    logps = []
    for dt in (torch.float32, torch.bfloat16):
        lm = lm.to(dt)
        lm.llm.rebuild_rotary(dev)
        with torch.inference_mode():
            logps.append(lm.forward_logp(lm.build_lm_input(text, None, prompt_tokens)).float())
    del lm
    d = (logps[1] - logps[0]).abs()
    top1 = float((logps[1].argmax(-1) == logps[0].argmax(-1)).float().mean())
    stage.check({"what": "full-size LLM log-probs (random weights)", "mean_abs": float(d.mean()),
                 "max_abs": float(d.max()), "top1_agree": top1}, bool(torch.isfinite(logps[1]).all()))


def stage_frontend(stage: Stage) -> None:
    from assistant.tts.cosyvoice.frontend import TextFrontend

    tokenizer = _fixture(TOKENIZER)
    golden_file = tokenizer / "frontend_golden.json"
    cases = json.loads(golden_file.read_text("utf-8"))["cases"]
    fe = TextFrontend(tokenizer)
    wetext = fe.normalizes
    stage.facts["wetext"] = "yes" if wetext else "no (normalisation skipped; texts with digits not compared)"
    for i, c in enumerate(cases):
        if not wetext and any(ch.isdigit() for ch in c["text"]):
            stage.check({"case": i, "text": c["text"][:30], "segments": "skipped", "ids": "skipped"}, None)
            continue
        segs = fe.sentences(c["text"])
        ids_ok = segs == c["segments"] and [fe.encode(s) for s in segs] == c["token_ids"]
        stage.check({"case": i, "text": c["text"][:30], "segments": segs == c["segments"], "ids": ids_ok}, ids_ok)


# --- entry -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    p = argparse.ArgumentParser(prog="python -m lab.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out", help="output folder ($OUT)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="time for all stages (the first-packet runs get what the others leave)")
    p.add_argument("--skip-first-packet", action="store_true", help="correctness stages only")
    p.add_argument("--full-size-bf16", action="store_true",
                   help="on CPU too: bf16 end to end and at full size (minutes on a CPU; always on CUDA)")
    args = p.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    full = device == "cuda" or args.full_size_bf16
    out = Path(args.out)
    report = Report(out)
    report.run("env", lambda s: stage_env(s, device))
    report.run("parity", lambda s: stage_parity(s, device))
    report.run("graphs", lambda s: stage_graphs(s, device, full))
    if not args.skip_first_packet:
        summary = FirstPacketSummary(out, device, report.origin)
        for graphs, share in ((True, 0.5), (False, 1.0)):   # graphs on first, with half of what is left
            seconds = (deadline - time.monotonic() - LATER_STAGES_S[device]) * share
            label = "on" if graphs else "off"
            report.run(f"first_packet_graphs_{label}", functools.partial(
                stage_first_packet, device=device, graphs=graphs, seconds=seconds, summary=summary))
    report.run("bf16", lambda s: stage_bf16(s, device, full))
    if full:
        report.run("bf16_full_size", lambda s: full_size_bf16(s, device))
    report.run("frontend", stage_frontend)
    print(report.markdown())
    print(f"gpu_check: wrote {out}/gpu_check.md and .json in {time.monotonic() - t_start:.0f} s")
    return 0 if all(s.status in ("pass", "skipped") for s in report.stages) else 1


if __name__ == "__main__":
    sys.exit(main())
