"""``assistant models pull piper:<voice>``: one clear line without network; a pull from a (loopback) mirror of
the piper-voices layout installs a voice that is then selected by name or by its local ``.onnx`` path."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from aiohttp import web

from assistant.cli import main
from assistant.config import TTSConfig
from assistant.server.local import serve_on_loopback
from assistant.tts.base import TTSRequest
from assistant.tts.piper_engine import PiperEngine, default_voice_path

pytestmark = pytest.mark.timeout(120)
VOICE = "en_US-joe-medium"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pull_without_network_prints_one_clear_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    rc = main(["models", "pull", "piper:zh_CN-huayan-medium", "--url", url, "--dest", str(tmp_path / "piper")])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot reach 127.0.0.1" in lines[0] and "by hand" in lines[0], err
    assert list((tmp_path / "piper").iterdir()) == []  # nothing half-written

    assert main(["models", "pull", "piper:mandarin", "--dest", str(tmp_path)]) == 1
    assert "not a Piper voice name" in capsys.readouterr().err


async def speak(engine: PiperEngine) -> np.ndarray:
    chunks = [c async for c in engine.synthesize(TTSRequest(text="Hello there."))]
    await engine.close()
    return np.concatenate(chunks)


@pytest.mark.slow
async def test_pull_from_a_mirror_then_select_by_name_and_by_path(tmp_path, monkeypatch, capsys):
    source = default_voice_path()
    files = {f"/en/en_US/joe/medium/{VOICE}.onnx": source, f"/en/en_US/joe/medium/{VOICE}.onnx.json":
             source.with_name(source.name + ".json")}

    async def serve_file(request: web.Request) -> web.StreamResponse:
        path = files.get(request.path)
        return web.FileResponse(path) if path else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve_file)
    monkeypatch.chdir(tmp_path)
    async with serve_on_loopback(app) as url:
        rc = await asyncio.to_thread(main, ["models", "pull", f"piper:{VOICE}", "--url", url])
        assert rc == 0, capsys.readouterr().err
        assert "--tts.voice en_US-joe-medium" in capsys.readouterr().out
        rc = await asyncio.to_thread(main, ["models", "pull", "piper:en_US-nobody-low", "--url", url])
        assert rc == 1 and "HTTP 404" in capsys.readouterr().err
    pulled = tmp_path / "models" / "piper" / f"{VOICE}.onnx"
    assert pulled.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in pulled.parent.iterdir()) == [f"{VOICE}.onnx", f"{VOICE}.onnx.json"]

    by_name = PiperEngine(TTSConfig(voice=VOICE))              # a pulled voice, by its name
    assert by_name.voice_name == VOICE and by_name.capabilities.languages == ("en",)
    assert len(await speak(by_name)) > 0.4 * by_name.sample_rate
    local = tmp_path / "elsewhere" / "my-voice.onnx"           # any local .onnx with its .json next to it
    local.parent.mkdir()
    local.write_bytes(pulled.read_bytes())
    local.with_name("my-voice.onnx.json").write_bytes(pulled.with_name(pulled.name + ".json").read_bytes())
    by_path = PiperEngine(TTSConfig(voice=str(local)))
    assert by_path.voice_name == "my-voice"
    assert len(await speak(by_path)) > 0.4 * by_path.sample_rate
    with pytest.raises(FileNotFoundError, match=r"models/piper/zh_CN-huayan-medium\.onnx"):
        PiperEngine(TTSConfig(voice="zh_CN-huayan-medium"))
