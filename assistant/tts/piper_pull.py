"""``assistant models pull piper:<voice>``: fetch a Piper voice (``zh_CN-huayan-medium`` speaks Mandarin) into
``models/piper/`` so a CPU-only install can speak more languages; then ``--tts.voice zh_CN-huayan-medium``.

Voices come from the rhasspy/piper-voices release on Hugging Face (``<lang>/<lang>_<REGION>/<name>/<quality>/``),
or from a mirror with the same layout (``--url`` or ``ASSISTANT_PIPER_VOICES_URL``). Both files are downloaded
to temporary names, checked (the config is Piper JSON with a sample rate, the model opens in onnxruntime)
and only then renamed into place, so a failed pull leaves nothing half-written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from assistant.tts.piper_engine import PULLED_VOICES_DIR

log = logging.getLogger(__name__)

DEFAULT_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/main"
URL_ENV = "ASSISTANT_PIPER_VOICES_URL"
VOICE_NAME = re.compile(r"^(?P<lang>[a-z]{2,3})_(?P<region>[A-Z]{2})-(?P<speaker>[A-Za-z0-9_]+)-"
                        r"(?P<quality>x_low|low|medium|high)$")
MAX_MODEL_BYTES = 300_000_000     # the largest Piper voices are about 115 MB
MAX_CONFIG_BYTES = 2_000_000
TIMEOUT_S = 30.0
READ_BYTES = 1 << 20
TMP_PREFIX = ".tmp-"


class PiperPullError(RuntimeError):
    """The voice could not be fetched or is not a Piper voice; the message is one line saying what to do."""


def release_path(voice: str) -> str:
    """``zh_CN-huayan-medium`` → ``zh/zh_CN/huayan/medium/zh_CN-huayan-medium`` (without the suffix)."""
    m = VOICE_NAME.fullmatch(voice)
    if m is None:
        raise PiperPullError(f"{voice!r} is not a Piper voice name; they look like zh_CN-huayan-medium or "
                             "en_US-lessac-high (<lang>_<REGION>-<name>-<x_low|low|medium|high>)")
    return f"{m['lang']}/{m['lang']}_{m['region']}/{m['speaker']}/{m['quality']}/{voice}"


def _fetch(url: str, dest: Path, limit: int, timeout: float) -> None:
    """Stream ``url`` into ``dest``, at most ``limit`` bytes; PiperPullError on any failure."""
    host = urlsplit(url).netloc or url
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(dest, "wb") as out:
            size = 0
            while block := resp.read(READ_BYTES):
                size += len(block)
                if size > limit:
                    raise PiperPullError(f"{url} is over {limit} bytes: not a Piper voice file")
                out.write(block)
    except urllib.error.HTTPError as exc:
        hint = " (no such voice in the release?)" if exc.code == 404 else ""
        raise PiperPullError(f"{url} answered HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PiperPullError(f"cannot reach {host} ({reason}); without network, copy the voice's .onnx and "
                             f".onnx.json into {PULLED_VOICES_DIR}/ by hand") from None


def _check(model: Path, config: Path, voice: str) -> int:
    """The voice's sample rate if both files are a usable Piper voice; else PiperPullError."""
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
        rate = int(cfg["audio"]["sample_rate"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PiperPullError(f"{voice}.onnx.json is not a Piper voice config") from None
    try:
        import onnxruntime

        onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for a bad model
        raise PiperPullError(f"{voice}.onnx does not load in onnxruntime ({type(exc).__name__})") from None
    return rate


def pull_piper_voice(voice: str, dest: str | Path = PULLED_VOICES_DIR, url: str | None = None,
                     timeout: float = TIMEOUT_S) -> Path:
    """Download, check and install a voice; returns the path of its ``.onnx``."""
    rel = release_path(voice)
    base = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
    if urlsplit(base).scheme not in ("http", "https"):
        raise PiperPullError(f"voice URL must be http(s), got {base!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model, config = dest / f"{voice}.onnx", dest / f"{voice}.onnx.json"
    tmp_model, tmp_config = dest / f"{TMP_PREFIX}{model.name}", dest / f"{TMP_PREFIX}{config.name}"
    try:
        log.info("piper_pull voice=%s from=%s", voice, urlsplit(base).netloc)
        _fetch(f"{base}/{rel}.onnx.json", tmp_config, MAX_CONFIG_BYTES, timeout)
        _fetch(f"{base}/{rel}.onnx", tmp_model, MAX_MODEL_BYTES, timeout)
        rate = _check(tmp_model, tmp_config, voice)
        os.replace(tmp_config, config)
        os.replace(tmp_model, model)
    finally:
        tmp_model.unlink(missing_ok=True)
        tmp_config.unlink(missing_ok=True)
    log.info("piper_pull_done voice=%s sample_rate=%d path=%s", voice, rate, model)
    return model
