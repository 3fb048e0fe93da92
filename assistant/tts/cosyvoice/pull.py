"""``models pull cosyvoice2``: fetch the official CosyVoice2-0.5B release and check that it loads into our modules."""

from __future__ import annotations

import logging
from pathlib import Path

from assistant.tts.cosyvoice.loader import ModelDirError, verify_model_dir

log = logging.getLogger(__name__)

REPOS = {"huggingface": "FunAudioLLM/CosyVoice2-0.5B", "modelscope": "iic/CosyVoice2-0.5B"}


class PullError(RuntimeError):
    """The release could not be fetched (no network, unknown source) or does not verify."""


def _download(repo: str, dest: Path, source: str) -> None:
    """snapshot_download into ``dest``; ModelScope through its own client when installed."""
    if source == "modelscope":
        try:
            from modelscope import snapshot_download as ms_download
        except ImportError:
            ms_download = None
        if ms_download is not None:
            ms_download(repo, local_dir=str(dest))
            return
        raise PullError("source 'modelscope' needs the `modelscope` package (pip install modelscope)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise PullError("downloading needs `huggingface_hub` (pip install 'assistant[cosyvoice]')") from exc
    snapshot_download(repo_id=repo, local_dir=str(dest))


def _is_network_error(exc: BaseException) -> bool:
    names = {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "OfflineModeIsEnabled",
             "LocalEntryNotFoundError", "gaierror", "MaxRetryError", "NewConnectionError"}
    while exc is not None:
        if isinstance(exc, ConnectionError | TimeoutError) or type(exc).__name__ in names:
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def pull_cosyvoice2(dest: str | Path, source: str = "huggingface") -> Path:
    """Download the release into ``dest`` and verify it (files present, checkpoint keys/shapes match).

    Raises PullError with one clear message on no network or a bad download.
    """
    dest = Path(dest)
    if source not in REPOS:
        raise PullError(f"unknown source {source!r}; use one of {', '.join(REPOS)}")
    repo = REPOS[source]
    dest.mkdir(parents=True, exist_ok=True)
    log.info("fetching %s from %s into %s", repo, source, dest)
    try:
        _download(repo, dest, source)
    except PullError:
        raise
    except Exception as exc:
        if _is_network_error(exc):
            raise PullError(
                f"cannot reach {source} to fetch {repo} (no network?): {type(exc).__name__}: {exc}. "
                f"Copy the release into {dest} by other means, then run `assistant models verify`."
            ) from exc
        raise PullError(f"fetching {repo} from {source} failed: {type(exc).__name__}: {exc}") from exc
    try:
        verify_model_dir(dest)
    except ModelDirError as exc:
        raise PullError(f"downloaded {repo} but it does not verify: {exc}") from exc
    log.info("cosyvoice2 ready in %s", dest)
    return dest


__all__ = ["REPOS", "PullError", "pull_cosyvoice2", "verify_model_dir"]
