"""Load a CosyVoice2 model directory in the official layout into our modules.

    model_dir/
      cosyvoice2.yaml            hyper-parameters (read as data, nothing executed)
      llm.pt  flow.pt  hift.pt   state dicts; loaded with strict=True
      CosyVoice-BlankEN/         Qwen2 config.json (+ tokenizer files in the real release)
      campplus.onnx              speaker embedding (optional: without it no voice cloning)
      speech_tokenizer_v2.onnx   speech tokens of a reference clip (optional, same)

Every problem with a directory is reported as one ``ModelDirError`` naming the file and what was expected.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from assistant.tts.cosyvoice import SAMPLE_RATE
from assistant.tts.cosyvoice.llm import (
    SpeechLM,
    SpeechLMConfig,
    build_speech_lm,
    finish_meta_load,
    load_qwen_config,
)
from assistant.tts.cosyvoice.yaml_config import YamlConfigError, read_model_yaml

if TYPE_CHECKING:  # imported where built (loading the config needs neither)
    from transformers import Qwen2Config

    from assistant.tts.cosyvoice.flow import CausalFlow, FlowConfig
    from assistant.tts.cosyvoice.hift import HiFTConfig, HiFTVocoder

log = logging.getLogger(__name__)

YAML_FILE = "cosyvoice2.yaml"
QWEN_DIR = "CosyVoice-BlankEN"
CHECKPOINTS = ("llm.pt", "flow.pt", "hift.pt")
REQUIRED_FILES = (YAML_FILE, *CHECKPOINTS, f"{QWEN_DIR}/config.json")
CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
ONNX_FILES = (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE)
MAX_LISTED = 5  # keys named in an error message before "... and N more"

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class ModelDirError(RuntimeError):
    """A model directory is missing a file or holds one that does not fit our modules."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use float32, float16 or bfloat16") from None


# --- files -------------------------------------------------------------------------------------------------


def check_files(model_dir: Path) -> None:
    """Raise ModelDirError if the directory or a required file is missing."""
    if not model_dir.is_dir():
        raise ModelDirError(
            f"{model_dir}: model directory not found (expected the CosyVoice2-0.5B layout: "
            f"{', '.join(REQUIRED_FILES)}; get it with `assistant models pull cosyvoice2`)"
        )
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelDirError(f"{model_dir}: missing {', '.join(missing)} (expected the official CosyVoice2 layout)")


def read_yaml(model_dir: Path) -> dict[str, Any]:
    path = model_dir / YAML_FILE
    try:
        raw = read_model_yaml(path)
    except YamlConfigError as exc:
        raise ModelDirError(str(exc)) from exc
    for section in ("llm", "flow", "hift"):
        if not isinstance(raw.get(section), dict):
            raise ModelDirError(f"{path}: no '{section}' section (expected the official cosyvoice2.yaml)")
    return raw


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """torch.load(weights_only=True) on the CPU, turning any failure into a ModelDirError."""
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):  # legacy (non-zip) files cannot be memory-mapped
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelDirError(
            f"{path}: cannot be read as a torch state dict (truncated or corrupt download?): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelDirError(f"{path}: expected a state dict (name -> tensor), got {type(sd).__name__}")
    return sd


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return shown + (f" ... and {more} more" if more > 0 else "")


def check_state_dict(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], path: Path) -> None:
    """Compare key sets and shapes; raise one ModelDirError that lists a few of each problem."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = [
        f"{k}: file {list(found[k].shape)}, model {list(expected[k].shape)}"
        for k in expected
        if k in found and tuple(found[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys ({_listed(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys ({_listed(unexpected)})")
    if wrong:
        problems.append(f"{len(wrong)} wrong shapes ({_listed(wrong)})")
    if problems:
        raise ModelDirError(
            f"{path}: does not match the model described by {YAML_FILE}: " + "; ".join(problems)
        )


# --- module construction -----------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    """Hyper-parameters of all three networks, read from a model directory."""

    raw: dict[str, Any]   # the yaml, as plain data
    llm: SpeechLMConfig
    qwen: Qwen2Config
    flow: FlowConfig
    hift: HiFTConfig
    sample_rate: int = SAMPLE_RATE


def read_spec(model_dir: Path) -> ModelSpec:
    from assistant.tts.cosyvoice.flow import FlowConfig
    from assistant.tts.cosyvoice.hift import HiFTConfig

    raw = read_yaml(model_dir)
    try:
        llm_cfg = SpeechLMConfig.from_yaml(raw["llm"])
        flow_cfg = FlowConfig.from_yaml(raw["flow"])
        hift_cfg = HiFTConfig.from_yaml(raw["hift"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelDirError(f"{model_dir / YAML_FILE}: unexpected content: {exc!r}") from exc
    try:
        qwen = load_qwen_config(model_dir / QWEN_DIR)
    except Exception as exc:
        raise ModelDirError(f"{model_dir / QWEN_DIR / 'config.json'}: not a Qwen2 config: {exc}") from exc
    return ModelSpec(raw, llm_cfg, qwen, flow_cfg, hift_cfg, int(raw.get("sample_rate", SAMPLE_RATE)))


def build_flow(spec: ModelSpec, device: str | torch.device = "cpu") -> CausalFlow:
    from assistant.tts.cosyvoice.flow import CausalFlow

    with torch.device(device):
        return CausalFlow(spec.flow)


def build_hift(spec: ModelSpec, device: str | torch.device = "cpu") -> HiFTVocoder:
    from assistant.tts.cosyvoice.hift import HiFTVocoder

    with torch.device(device):
        return HiFTVocoder(spec.hift)


def _expected_keys(module: nn.Module) -> dict[str, torch.Tensor]:
    return module.state_dict()


def verify_model_dir(model_dir: str | Path) -> ModelSpec:
    """Check a directory without loading weights into memory-heavy modules: every required file exists, the
    yaml reads, and each checkpoint's keys and shapes match our modules built on the meta device."""
    model_dir = Path(model_dir)
    check_files(model_dir)
    spec = read_spec(model_dir)
    expected = {
        "llm.pt": _expected_keys(build_speech_lm(spec.llm, spec.qwen, "meta")),
        "flow.pt": _expected_keys(build_flow(spec, "meta")),
        "hift.pt": _expected_keys(build_hift(spec, "meta")),
    }
    for name, keys in expected.items():
        check_state_dict(keys, read_state_dict(model_dir / name), model_dir / name)
    return spec


def _place_llm(llm: SpeechLM, device: torch.device, dtype: torch.dtype) -> None:
    """Move a meta-built, assign-loaded LLM to device/dtype; RoPE tables are rebuilt (in float32) around it."""
    llm.llm.rebuild_rotary("cpu")  # meta buffers cannot be moved
    llm.to(device=device, dtype=dtype)
    finish_meta_load(llm, device)


def load_speech_lm(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> SpeechLM:
    """Only the speech LLM (yaml ``llm`` section, Qwen2 config, ``llm.pt``), built on meta and loaded strict."""
    model_dir = Path(model_dir)
    check_files(model_dir)
    raw = read_yaml(model_dir)
    try:
        cfg = SpeechLMConfig.from_yaml(raw["llm"])
        qwen = load_qwen_config(model_dir / QWEN_DIR)
    except Exception as exc:
        raise ModelDirError(f"{model_dir}: cannot read the LLM configuration: {exc!r}") from exc
    dev = torch.device(device)
    llm = build_speech_lm(cfg, qwen, "meta")
    _load_into(llm, model_dir / "llm.pt", assign=True)
    _place_llm(llm, dev, parse_dtype(dtype))
    return llm.eval()


@dataclass
class LoadedModel:
    """The three networks on their device, plus what the front end needs from the directory."""

    model_dir: Path
    spec: ModelSpec
    llm: SpeechLM
    flow: CausalFlow
    hift: HiFTVocoder
    device: torch.device
    dtype: torch.dtype
    campplus_path: Path | None = None
    speech_tokenizer_path: Path | None = None
    tokenizer_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def sample_rate(self) -> int:
        return self.spec.sample_rate

    @property
    def can_clone(self) -> bool:
        return self.campplus_path is not None and self.speech_tokenizer_path is not None


def _load_into(module: nn.Module, path: Path, *, assign: bool = False) -> None:
    sd = read_state_dict(path)
    check_state_dict(module.state_dict(), sd, path)
    try:
        module.load_state_dict(sd, strict=True, assign=assign)
    except RuntimeError as exc:  # dtype/shape oddities the pre-check did not see
        raise ModelDirError(f"{path}: load_state_dict failed: {exc}") from exc


def load_model_dir(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> LoadedModel:
    """Load llm/flow/hift strictly, on ``device`` in ``dtype``.

    The vocoder stays float32 whatever ``dtype`` says (as the reference runs it): it is small, and its
    sine source and iSTFT lose audible precision in half types.
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    dev = torch.device(device)
    dt = parse_dtype(dtype)
    check_files(model_dir)
    spec = read_spec(model_dir)

    # The LLM is built on meta and takes the file's tensors as they are (no 0.5B random init).
    llm = build_speech_lm(spec.llm, spec.qwen, "meta")
    _load_into(llm, model_dir / "llm.pt", assign=True)
    _place_llm(llm, dev, dt)
    llm.eval()

    flow = build_flow(spec, "cpu")
    _load_into(flow, model_dir / "flow.pt")
    flow = flow.to(device=dev, dtype=dt).eval()

    hift = build_hift(spec, "cpu")
    _load_into(hift, model_dir / "hift.pt")
    hift = hift.to(dev).eval().remove_weight_norm()  # checked against the checkpoint's keys: fold g * v / |v| once

    loaded = LoadedModel(model_dir, spec, llm, flow, hift, dev, dt)
    for name in ONNX_FILES:
        if not (model_dir / name).is_file():
            loaded.notes.append(f"{name} not found: voice cloning from a reference clip is unavailable")
    if not loaded.notes:
        loaded.campplus_path = model_dir / CAMPPLUS_FILE
        loaded.speech_tokenizer_path = model_dir / SPEECH_TOKENIZER_FILE
    qwen_dir = model_dir / QWEN_DIR
    if any((qwen_dir / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json")):
        loaded.tokenizer_dir = qwen_dir
    else:
        loaded.notes.append(f"{QWEN_DIR} has no tokenizer files: text must be given as token ids")
    for note in loaded.notes:
        log.warning("cosyvoice2 %s: %s", model_dir, note)
    log.info("cosyvoice2 loaded from %s on %s/%s in %.1f s", model_dir, dev, dt, time.perf_counter() - t0)
    return loaded


__all__ = [
    "CHECKPOINTS",
    "ONNX_FILES",
    "REQUIRED_FILES",
    "LoadedModel",
    "ModelDirError",
    "ModelSpec",
    "check_state_dict",
    "load_model_dir",
    "load_speech_lm",
    "parse_dtype",
    "read_spec",
    "read_state_dict",
    "verify_model_dir",
]
