"""``python -m lab telemetry-cost``: what OpenTelemetry costs a turn, in one run.

Three servers run side by side as child processes, the same in all but ``[telemetry]``: **off**; **on**, exporting
to a live OTLP/HTTP receiver in this process (it answers every export at once); and **on** towards a **dead**
endpoint (a port where nobody listens: every export fails, every span is dropped and counted). One page session
per server plays the same files, the servers taking turns file by file (the order rotated each round), so drift on
a shared machine falls on all three alike. Printed: each server's client and server voice-to-voice p50 and p90, and
each "on" p50 as a ratio of "off"'s, with the spans each server dropped (from its /metrics).

The responder is ``echo`` unless ``--respond-engine`` says otherwise: telemetry's cost is per turn and fixed, and a
language model's own spread on a small machine would hide a 2 % difference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from assistant.bench.audio_source import Utterance, load_utterance, read_manifest
from assistant.bench.figures import provenance, write_markdown
from assistant.bench.processes import AssistantProcess, free_port, start_assistant, stop, wait_ready
from assistant.bench.report import percentile
from assistant.bench.shared_data import shared_speech_files
from assistant.bench.v2v import DEFAULT_SILENCE_MS, DEFAULT_TIMEOUT_S, BenchSession, TurnSettings
from assistant.rtc.loopback_ice import allow_loopback_ice

log = logging.getLogger(__name__)

SETTINGS = ("off", "live", "dead")
DROPPED = "assistant_telemetry_spans_dropped_total"
DROP_WAIT_S = 7.0  # longer than telemetry.export_timeout_s (5 s) plus one schedule_delay_ms


@dataclass
class Arm:
    """One server of the comparison and what it measured."""

    name: str
    flags: list[str]
    child: AssistantProcess | None = None
    client: BenchSession | None = None
    v2v_ms: list[float] = field(default_factory=list)
    server_v2v_ms: list[float] = field(default_factory=list)
    failed: int = 0
    dropped: float = 0.0


@contextlib.asynccontextmanager
async def live_receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint that takes every export at once (an empty protobuf answer is a valid one); yields its
    URL and the sizes of the bodies it got."""
    got: list[int] = []

    async def take(request: web.Request) -> web.Response:
        got.append(len(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", take)
    app.router.add_post("/v1/metrics", take)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", got
    finally:
        await runner.cleanup()


async def dropped_spans(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(DROPPED + " "))


async def measure(utts: Sequence[Utterance], rounds: int, out: Path, respond_engine: str,
                  settings: TurnSettings) -> tuple[list[Arm], list[int]]:
    """Run the three servers (module docstring) and ``rounds`` rounds of the files; the arms and what the live
    receiver took."""
    async with live_receiver() as (live_url, got), aiohttp.ClientSession() as http:
        dead_url = f"http://127.0.0.1:{free_port()}"  # bound and let go: nobody listens there
        common = ["--respond.engine", respond_engine, "--server.max_silence_s", "3600"]
        arms = [Arm("off", common),
                Arm("live", [*common, "--telemetry.otlp_endpoint", live_url]),
                Arm("dead", [*common, "--telemetry.otlp_endpoint", dead_url])]
        try:
            for arm in arms:
                arm.child = start_assistant(f"telemetry-{arm.name}", "serve",
                                            [*arm.flags, "--server.data_dir", str(out / f"data-{arm.name}")], out)
            await asyncio.to_thread(wait_ready, [a.child for a in arms if a.child is not None])
            for i, arm in enumerate(arms):
                assert arm.child is not None
                arm.client = BenchSession(index=i, url=arm.child.url, http=http)
                await arm.client.connect()
            for r in range(rounds):
                for k, utt in enumerate(utts):
                    turn = r * len(utts) + k
                    for arm in arms[turn % 3:] + arms[:turn % 3]:  # who goes first rotates
                        assert arm.client is not None
                        result = await arm.client.run_turn(utt, turn, settings)
                        v2v, server = result.columns.get("v2v_ms"), result.columns.get("server_v2v_ms")
                        if result.status != "ok" or v2v is None or server is None:
                            arm.failed += 1
                            continue
                        arm.v2v_ms.append(v2v)
                        arm.server_v2v_ms.append(server)
                    log.info("bench.telemetry round=%d file=%s %s", r, utt.name,
                             " ".join(f"{a.name}={a.v2v_ms[-1] if a.v2v_ms else None}" for a in arms))
            await asyncio.sleep(DROP_WAIT_S)  # the dead endpoint's last export gives up (export_timeout_s) and counts
            for arm in arms:
                assert arm.child is not None
                arm.dropped = await dropped_spans(http, arm.child.url)
        finally:
            for arm in arms:
                if arm.client is not None:
                    with contextlib.suppress(Exception):
                        await arm.client.close()
            await asyncio.to_thread(stop, [a.child for a in arms if a.child is not None])
    return arms, got


def table(arms: Sequence[Arm], received: Sequence[int]) -> str:
    off = {a.name: a for a in arms}["off"]
    base, base_server = percentile(off.v2v_ms, 50), percentile(off.server_v2v_ms, 50)
    lines = ["| telemetry | turns heard | v2v p50 ms | v2v p90 ms | ÷ off (p50) | server v2v p50 ms | ÷ off (p50) "
             "| spans dropped |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    label = {"off": "off", "live": "on, live receiver", "dead": "on, dead endpoint"}
    for a in arms:
        if not a.v2v_ms:
            lines.append(f"| {label[a.name]} | 0 | | | | | | {a.dropped:g} |")
            continue
        p50, server = percentile(a.v2v_ms, 50), percentile(a.server_v2v_ms, 50)
        lines.append(f"| {label[a.name]} | {len(a.v2v_ms)} of {len(a.v2v_ms) + a.failed} | {p50:.1f} | "
                     f"{percentile(a.v2v_ms, 90):.1f} | {p50 / base:.3f} | {server:.1f} | {server / base_server:.3f} "
                     f"| {a.dropped:g} |")
    lines.append("")
    lines.append(f"The live receiver took {len(received)} exports ({sum(received) / 1024:.1f} KiB).")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="WAV",
                        help="speech files to play (default: bench v2v's); speech ends from manifest.json beside them")
    parser.add_argument("--turns", type=int, default=None, help="files played per round (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="times each file is played (default: %(default)s)")
    parser.add_argument("--respond-engine", default="echo", help="the servers' responder (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds after the speech end before a turn with no reply is dropped")
    parser.add_argument("--silence-ms", type=float, default=DEFAULT_SILENCE_MS,
                        help="reply over after this much silence if no reply_done came")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for the servers' logs")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the table as Markdown to FILE under its provenance line")


async def run_cli(args: argparse.Namespace) -> int:
    """CLI entry (``python -m lab telemetry-cost``)."""
    return await run(args, provenance())


async def run(args: argparse.Namespace, origin: str) -> int:
    """The study: 0 when every turn of every server was heard."""
    allow_loopback_ice()  # the servers are child processes on this machine (they get the same by environment)
    files = [Path(f) for f in (args.audio or shared_speech_files())]
    manifests: dict[Path, dict[str, dict]] = {}
    utts = [load_utterance(f, manifests.setdefault(f.parent, read_manifest(f.parent))) for f in files]
    if args.turns:
        utts = utts[: args.turns]
    settings = TurnSettings(timeout_s=args.timeout, silence_ms=args.silence_ms)
    out = Path(args.out) / "telemetry"
    arms, received = await measure(utts, args.rounds, out, args.respond_engine, settings)
    body = table(arms, received)
    print(body)
    if args.markdown is not None:
        write_markdown(args.markdown, body, origin)
        print(f"wrote {args.markdown}")
    return 0 if all(a.failed == 0 and a.v2v_ms for a in arms) else 1
