"""``assistant bench v2v`` against servers that are not ours, and our server through WHIP.

The Realtime server here is written with another library (``websockets``), as a reference of the protocol's shapes:
it hears each turn with an energy VAD of its own (or takes the client's commit) and answers with a recording. The
bench must find that it is not ours, leave the stage columns out and say why, send the model and key as OpenAI's
API expects, never show the key, and measure every turn.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from assistant.audio import float_to_s16, read_audio, resample, rms_dbfs, s16_to_float
from assistant.bench.speech import shipped_files
from assistant.bench.targets import Target
from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests import needs
from tests.conftest import serve, test_config
from tests.waiting import until

websockets = needs.module("websockets")
from websockets.asyncio.server import ServerConnection  # noqa: E402
from websockets.asyncio.server import serve as ws_serve  # noqa: E402
from websockets.http11 import Request, Response  # noqa: E402

RATE = 24_000
FRAME = RATE // 50  # 20 ms, as the bench appends
SPEECH_DBFS = -40.0  # a frame at or above this is speech, for the reference server's VAD
END_SILENCE_MS = 500
KEY_ENV = "REFERENCE_REALTIME_KEY"
MODEL = "reference-realtime-1"


def recording() -> bytes:
    """The reply the reference server speaks: a recorded person (the bench's first clip), PCM16 at 24 kHz."""
    x, rate = read_audio(shipped_files()[0])
    return float_to_s16(resample(x, rate, RATE)).astype("<i2").tobytes()


@dataclass
class ReferenceRealtime:
    """A Realtime server that is not ours: what it was asked, and how many turns it answered."""

    key: str
    port: int = 0
    models: list[str] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    answered: int = 0
    reply: bytes = b""

    def check(self, connection: ServerConnection, request: Request) -> Response | None:
        """Every HTTP request before the upgrade: only /v1/realtime, only with the key."""
        path, _, query = request.path.partition("?")
        self.paths.append(path)
        if path != "/v1/realtime":
            return connection.respond(404, "no such route\n")
        self.auth.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return connection.respond(401, "bad key\n")
        self.models += [p.split("=", 1)[1] for p in query.split("&") if p.startswith("model=")]
        return None

    async def handle(self, ws: ServerConnection) -> None:
        ids = iter(range(1, 1_000_000))

        async def send(kind: str, **body: Any) -> None:
            await ws.send(json.dumps({"type": kind, "event_id": f"event_{next(ids)}", **body}))

        await send("session.created", session={"type": "realtime", "object": "realtime.session",
                                                "id": "sess_ref", "model": self.models[-1] if self.models else ""})
        vad = True
        speaking = False
        quiet_ms = 0
        heard_ms = 0
        async for message in ws:
            event = json.loads(message)
            kind = event.get("type")
            if kind == "session.update":
                detection = ((event.get("session") or {}).get("audio") or {}).get("input", {})
                vad = detection.get("turn_detection", {"type": "server_vad"}) is not None
                await send("session.updated", session={"type": "realtime"})
            elif kind == "input_audio_buffer.append":
                pcm = s16_to_float(np.frombuffer(base64.b64decode(event["audio"]), dtype="<i2"))
                heard_ms += len(pcm) * 1000 // RATE
                if not vad:
                    continue
                loud = rms_dbfs(pcm) >= SPEECH_DBFS
                if loud and not speaking:
                    speaking, quiet_ms = True, 0
                    await send("input_audio_buffer.speech_started", audio_start_ms=heard_ms, item_id="item_in")
                elif speaking:
                    quiet_ms = 0 if loud else quiet_ms + len(pcm) * 1000 // RATE
                    if quiet_ms >= END_SILENCE_MS:
                        speaking = False
                        await send("input_audio_buffer.speech_stopped", audio_end_ms=heard_ms - quiet_ms,
                                   item_id="item_in")
                        await send("input_audio_buffer.committed", previous_item_id=None, item_id="item_in")
                        await self.respond(send)
            elif kind == "input_audio_buffer.commit":
                await send("input_audio_buffer.committed", previous_item_id=None, item_id="item_in")
            elif kind == "response.create":
                await self.respond(send)

    async def respond(self, send: Any) -> None:
        """The recording as audio deltas (100 ms each), in the Realtime API's order of events."""
        rid = f"resp_{self.answered}"
        await send("response.created", response={"id": rid, "object": "realtime.response", "status": "in_progress",
                                                  "output": []})
        step = RATE // 10 * 2
        for at in range(0, len(self.reply), step):
            await send("response.output_audio.delta", response_id=rid, item_id="item_out", output_index=0,
                       content_index=0, delta=base64.b64encode(self.reply[at : at + step]).decode())
        await send("response.output_audio.done", response_id=rid, item_id="item_out", output_index=0,
                   content_index=0)
        await send("response.done", response={
            "id": rid, "object": "realtime.response", "status": "completed",
            "output": [{"id": "item_out", "type": "message", "role": "assistant",
                        "content": [{"type": "output_audio", "transcript": "a recorded reply"}]}]})
        self.answered += 1


@pytest_asyncio.fixture
async def reference() -> AsyncIterator[ReferenceRealtime]:
    server = ReferenceRealtime(key="sk-ref-" + secrets.token_hex(16), reply=recording())
    async with ws_serve(server.handle, "127.0.0.1", 0, process_request=server.check, max_size=2**22) as ws_server:
        server.port = next(iter(ws_server.sockets)).getsockname()[1]
        yield server


def _args(*argv: str) -> Any:
    from assistant.cli import build_parser

    return build_parser("v2v").parse_args(["bench", "v2v", *argv])


@pytest.mark.slow
@pytest.mark.parametrize("commit", [False, True], ids=["server-vad", "client-commit"])
async def test_the_bench_measures_a_realtime_server_that_is_not_ours(
        reference: ReferenceRealtime, commit: bool, tmp_path: Path, capsys: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from assistant.bench.v2v_cli import run_v2v

    monkeypatch.setenv(KEY_ENV, reference.key)
    url = f"http://127.0.0.1:{reference.port}/v1"  # the base URL as OpenAI's SDKs write it
    args = _args("--url", url, "--protocol", "realtime-ws", "--model", MODEL, "--key-env", KEY_ENV, "--turns", "2",
                 "--out", str(tmp_path), "--markdown", str(tmp_path / "ref.md"), "--no-plot",
                 *(["--commit"] if commit else []))
    assert await run_v2v(args) == 0
    out, err = capsys.readouterr()

    assert reference.answered == 2
    assert reference.models == [MODEL, MODEL]  # ?model= on each WebSocket, as OpenAI's API takes it
    assert set(reference.auth) == {f"Bearer {reference.key}"}
    assert "/api/stages" in reference.paths  # it was asked whether it is ours, and said no

    data = json.loads((tmp_path / "v2v.json").read_text())
    assert (data["protocol"], data["server"]) == ("realtime-ws", "other")
    assert "is not an assistant server" in data["left_out"]
    assert data["settings"]["mode"] == ("commit" if commit else "server_vad")
    turns = data["levels"][0]["turns"]
    assert [t["status"] for t in turns] == ["ok", "ok"], [(t["status"], t["reason"]) for t in turns]
    for t in turns:
        cols = t["columns"]
        assert set(cols) == {"v2v_ms", "first_audio_ms", "onset_ms"}, cols  # the client's columns only
        assert 0 < cols["first_audio_ms"] <= cols["v2v_ms"], cols
        assert t["reply_text"] == "a recorded reply"
    markdown = (tmp_path / "ref.md").read_text()
    assert "Left out: the stage columns" in markdown and "`server_v2v_ms`" not in markdown
    assert "left out: the stage columns" in out and "server_v2v_ms" not in out
    assert "turn 2/2" in err  # the progress line
    for text in (out, err, markdown, json.dumps(data)):
        assert reference.key not in text


async def test_a_wrong_key_env_fails_before_any_request(capsys: Any, tmp_path: Path) -> None:
    from assistant.bench.v2v_cli import run_v2v

    args = _args("--url", "http://127.0.0.1:9/v1", "--protocol", "realtime-ws", "--key-env", "NO_SUCH_VARIABLE_59",
                 "--out", str(tmp_path))
    assert await run_v2v(args) == 2
    assert "NO_SUCH_VARIABLE_59: that environment variable is not set" in capsys.readouterr().err


def test_where_each_protocol_goes() -> None:
    ours = Target("realtime", "http://127.0.0.1:8080", ours=True)
    assert ours.calls_url() == "http://127.0.0.1:8080/v1/realtime/calls?extensions=1"
    assert ours.realtime_ws_url() == "ws://127.0.0.1:8080/v1/realtime?extensions=1"
    other = Target("realtime-ws", "https://api.example.com/v1", ours=False, key="k", model="m")
    assert other.realtime_ws_url() == "wss://api.example.com/v1/realtime?model=m"
    assert other.calls_url() == "https://api.example.com/v1/realtime/calls"
    assert other.headers() == {"Authorization": "Bearer k"} and "k" not in repr(other)
    assert Target("realtime", "https://h/openai/v1/realtime").realtime_url() == "https://h/openai/v1/realtime"
    assert Target("whip", "http://h:1").whip_url() == "http://h:1/api/whip"
    assert Target("whip", "https://media.example/whip/room7").whip_url() == "https://media.example/whip/room7"
    assert Target("twilio", "http://h:1").webhook_url() == "http://h:1/telephony/twilio/voice"
    assert Target("twilio", "https://bot.example/voice").webhook_url() == "https://bot.example/voice"
    assert Target("page", "http://h", ours=True).left_out == ""
    assert "not an assistant server" in Target("whip", "http://h", ours=False).left_out
    assert "carries no events" in Target("twilio", "http://h", ours=True).left_out


@pytest.mark.slow
async def test_whip_on_our_server_brings_every_stage(services: Services, tmp_path: Path, capsys: Any) -> None:
    """``--protocol whip`` against ours: WHIP's signaling, our events channel, the stage columns."""
    from assistant.bench.v2v_cli import run_v2v

    async with serve(test_config(), services) as (url, _app):
        args = _args("--url", url, "--protocol", "whip", "--turns", "1", "--out", str(tmp_path), "--no-plot",
                     "--audio", str(shipped_files()[0]))
        assert await run_v2v(args) == 0
    data = json.loads((tmp_path / "v2v.json").read_text())
    assert (data["protocol"], data["server"], data["left_out"]) == ("whip", "assistant", "")
    (turn,) = data["levels"][0]["turns"]
    assert turn["status"] == "ok" and turn["columns"]["server_v2v_ms"] > 0 and turn["columns"]["asr_ms"] is not None
    assert turn["transcript"].strip()


@pytest.mark.slow
async def test_the_whip_client_offers_audio_alone_to_an_endpoint_that_is_not_ours(services: Services,
                                                                                    tmp_path: Path) -> None:
    """How the bench speaks to a WHIP endpoint that is not ours: no data channel in the offer (such an endpoint may
    refuse one), connected once the peer is, each turn measured from the client's side. Our /api/whip takes such an
    offer, so it stands in for the other endpoint here."""
    from assistant.bench.v2v import bench_v2v
    from assistant.bench.whip_client import WhipBenchSession

    async with serve(test_config(), services) as (url, app):
        target = Target("whip", f"{url}/api/whip", ours=False)
        result = await bench_v2v(url, shipped_files()[:1], 1, 1, tmp_path, plot=False, client=WhipBenchSession,
                                 target=target)
        await until(lambda: not app[SESSIONS], "the session hung up (DELETE on its Location)")
    (turn,) = result.levels[0].turns
    assert turn.status == "ok", turn.reason
    # What the client hears, the silences inside the reply too (WHIP brings the audio whole).
    assert set(turn.columns) == {"v2v_ms", "first_audio_ms", "onset_ms", "reply_gap_ms"}
    assert turn.columns["v2v_ms"] > 0
    assert result.server == "other" and "not an assistant server" in result.left_out


async def test_a_server_still_starting_is_waited_for_before_it_is_judged() -> None:
    """`assistant serve &` then `assistant bench v2v` at once: the bench's probe meets a port nobody listens on yet;
    it asks again (within --ready-timeout) until the server answers, and only an answer decides whose it is."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from assistant.bench.processes import free_port
    from assistant.bench.targets import is_ours

    port = free_port()

    async def stages(_: web.Request) -> web.Response:
        return web.json_response({"stages": [], "gaps": []})

    app = web.Application()
    app.router.add_get("/api/stages", stages)
    runner = web.AppRunner(app)
    await runner.setup()

    async def start_late() -> None:
        await asyncio.sleep(1.0)  # the server's own start-up; the probe is already asking
        await web.TCPSite(runner, "127.0.0.1", port).start()

    late = asyncio.create_task(start_late())
    try:
        async with aiohttp.ClientSession() as http:
            assert not await is_ours(http, f"http://127.0.0.1:{port}")  # no wait: refused is not ours
            assert await is_ours(http, f"http://127.0.0.1:{port}", wait_s=30.0)
    finally:
        await late
        await runner.cleanup()
