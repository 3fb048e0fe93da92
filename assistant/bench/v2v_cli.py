"""``assistant bench v2v`` on the command line: its flags, the run of one protocol or several side by side, and
``--compare`` of runs already made.

The clients it drives sit below it: our page protocol's (``bench/v2v.py``), WHIP's (``bench/whip_client.py``),
the Realtime API's over WebRTC and WebSocket (``bench/realtime_client.py``), a phone carrier's
(``bench/telephony_client.py``: a call through Twilio Media Streams) and a SIP phone's (``bench/sip_client.py``: a
call straight to the server's SIP listener, PCMU or Opus; ``--sessions 1,2,4`` holds that many calls at once per
level, and the report says how many a machine holds before a call's v2v p90 doubles; ``--protocol page,sip
--interleave`` takes a page session's and a SIP call's turns in turn, so a changing load weighs on both alike).
Each protocol's run is a :class:`~assistant.bench.report.BenchResult` written as ``v2v.json``; several (``--protocol
page,realtime-ws``) or files (``--compare A.json B.json``) are put side by side by ``bench/compare.py``. Any server
that speaks one of these protocols can be measured (``bench/targets.py``); the stage columns come only from ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import aiohttp

from assistant.bench.compare import compare_markdown, compare_text, letters
from assistant.bench.figures import provenance, write_markdown
from assistant.bench.processes import cpu_snapshot
from assistant.bench.progress import Progress
from assistant.bench.realtime_client import RealtimeBenchSession, bench_ws
from assistant.bench.report import (
    CLIENT_TABLE_COLUMNS,
    BenchResult,
    LevelResult,
    format_markdown,
    format_summary,
    format_turns,
    percentile,
    read_result,
)
from assistant.bench.sip_client import CODECS, SipPhone, bench_sip, phone_turn
from assistant.bench.speech import LANGUAGES, bench_speech, speech_languages
from assistant.bench.targets import PROTOCOLS, Target, check_protocols, make_target
from assistant.bench.telephony_client import PhoneTurn, bench_phone, phone_turn_result
from assistant.bench.v2v import (
    AUDIBLE_DBFS,
    DEFAULT_SETTLE_MS,
    DEFAULT_SILENCE_MS,
    DEFAULT_STAGGER_MS,
    DEFAULT_TIMEOUT_S,
    WINDOW_MS,
    BenchSession,
    TurnSettings,
    bench_v2v,
    is_same_host,
    load_utterances,
    session_levels,
    wait_server_ready,
    write_outputs,
)
from assistant.bench.whip_client import WhipBenchSession
from assistant.rtc.loopback_ice import allow_loopback_ice

log = logging.getLogger(__name__)

TWILIO_TOKEN_ENV = "ASSISTANT_TELEPHONY__TWILIO_AUTH_TOKEN"  # the server's own setting, read the same way
CLIENTS: dict[str, type[BenchSession]] = {"page": BenchSession, "whip": WhipBenchSession,
                                          "realtime": RealtimeBenchSession}
MAX_TURN_ROWS = 40  # a level with more turns prints its summary only
SIP_PASSWORD_ENV = "ASSISTANT_SIP__PASSWORD"
DOUBLED = 2.0  # the SIP capacity is the last level whose v2v p90 stays within this many times one call's


# --- CLI ------------------------------------------------------------------------------------------------
def add_v2v_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``assistant bench v2v`` flags."""
    parser.add_argument("--url", default="http://127.0.0.1:8080",
                        help="the server's base URL; a protocol adds its standard path unless the URL names one (a "
                        "WHIP endpoint, a phone bot's webhook, https://api.openai.com/v1) (default: %(default)s)")
    parser.add_argument("--protocol", type=lambda t: t.split(","), default=["page"],
                        help="page (our /api/offer), whip (a WHIP endpoint), realtime (OpenAI's Realtime API over "
                        "WebRTC), realtime-ws (over WebSocket), twilio (a phone call: a signed webhook, then Media "
                        "Streams, μ-law at 8 kHz in real time); a list runs each and compares them (default: page)")
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="FILE",
                        help="speech files to play, with a manifest.json (or the human set's labels.json) beside them "
                        "giving each one's speech end (default: the bench's own speech, see --language)")
    parser.add_argument("--language", type=speech_languages, default=["en"],
                        help=f"the bench's own speech when no --audio is given: {', '.join(LANGUAGES)} or a list (en: "
                        "five recorded people, shipped; ja: three requests made once with the Kokoro voice and "
                        "cached) (default: en)")
    parser.add_argument("--turns", type=int, default=None,
                        help="turns per session (default: one per audio file)")
    parser.add_argument("--sessions", type=session_levels, default=[1],
                        help="concurrent sessions, or a list run one level after another, e.g. 1,4 (WebRTC "
                        "protocols; default: 1)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for v2v.json and v2v.png (a sub-folder per protocol when several run; "
                        "compare.png there too) (default: %(default)s)")
    parser.add_argument("--threshold-dbfs", type=float, default=AUDIBLE_DBFS,
                        help=f"reply audible at this peak level over {WINDOW_MS} ms (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds after the speech end before a turn with no reply is dropped "
                        "(default: %(default)s)")
    parser.add_argument("--silence-ms", type=float, default=DEFAULT_SILENCE_MS,
                        help="reply over after this much silence if no reply_done came (default: %(default)s)")
    parser.add_argument("--stagger-ms", type=float, default=DEFAULT_STAGGER_MS,
                        help="session i starts i × this later (default: %(default)s)")
    parser.add_argument("--token", default="", help="bearer token, if our server requires one")
    parser.add_argument("--key-env", default="", metavar="VAR",
                        help="the environment variable holding the API key another server wants (e.g. "
                        "OPENAI_API_KEY): sent as Authorization: Bearer, never printed or written")
    parser.add_argument("--model", default="",
                        help="the Realtime API's model, as the server names it (e.g. gpt-realtime; our server: a "
                        "responder's name, or nothing for its default)")
    parser.add_argument("--commit", action="store_true",
                        help="realtime-ws: the bench ends each turn itself (turn detection off; commit and "
                        "response.create at the speech end) instead of the server's VAD")
    parser.add_argument("--ready-timeout", type=float, default=120.0,
                        help="seconds to wait for our server's /readyz (default: %(default)s)")
    parser.add_argument("--loopback-ice", action="store_true",
                        help="offer 127.0.0.1 as an ICE candidate (machines with only loopback; the server "
                        "must do the same)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables as Markdown to FILE, under a line naming this command, the git "
                        "commit and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    parser.add_argument("--twilio-auth-token", default=os.environ.get(TWILIO_TOKEN_ENV, ""),
                        help="the phone bot's Twilio auth token, to sign the webhook (ours: "
                        f"telephony.twilio_auth_token; default: ${TWILIO_TOKEN_ENV})")
    parser.add_argument("--sip", default="127.0.0.1:5060", metavar="HOST:PORT",
                        help="the server's SIP listener, for --protocol sip (default: %(default)s)")
    parser.add_argument("--sip-codec", choices=CODECS, default="PCMU",
                        help="the codec the SIP phone offers: PCMU (8 kHz) or opus (48 kHz) (default: %(default)s)")
    parser.add_argument("--sip-user", default="", help="digest user, if the server challenges (sip.username)")
    parser.add_argument("--sip-password", default=os.environ.get(SIP_PASSWORD_ENV, ""),
                        help=f"digest password (default: ${SIP_PASSWORD_ENV})")
    parser.add_argument("--interleave", action="store_true",
                        help="with --protocol page,sip: one page session and one SIP call open together, their turns "
                        "taken in turn on the same files (page, sip, page, sip...), so a machine whose load changes "
                        "during the run weighs on both alike")
    parser.add_argument("--compare", nargs="+", type=Path, default=None, metavar="JSON",
                        help="run nothing: put these v2v.json files side by side (the same table, ratios to the "
                        "first, one plot in --out)")


def _fail(message: str) -> int:
    print(f"bench v2v: {message}", file=sys.stderr)
    return 2


async def run_v2v(args: argparse.Namespace) -> int:
    """CLI entry: run the bench (or compare runs), print the tables; 0 if every turn was heard, 1 if some were not,
    2 when it could not run."""
    origin = provenance()  # the machine's load as the bench starts
    if args.compare:
        return compare_runs(args, origin)
    if error := check_protocols(args.protocol):
        return _fail(error)
    if args.interleave and sorted(args.protocol) != ["page", "sip"]:
        return _fail("--interleave takes --protocol page,sip")
    key = args.token
    if args.key_env:
        key = os.environ.get(args.key_env, "")
        if not key:
            return _fail(f"--key-env {args.key_env}: that environment variable is not set")
    if args.loopback_ice:
        allow_loopback_ice()
    progress = Progress(0)
    try:
        if args.audio:
            files = [Path(f) for f in args.audio]
        else:
            if "ja" in args.language:
                progress.say("the Japanese speech: made with Kokoro the first time, then cached")
            files = await bench_speech(args.language)
        utterances = load_utterances(files)
    except (OSError, ValueError, RuntimeError) as exc:
        return _fail(f"speech: {exc}")
    turns = args.turns or len(utterances)
    if args.interleave:
        return await run_interleaved(args, origin, utterances, turns)
    webrtc_turns = turns * sum(args.sessions)
    progress.total = sum(webrtc_turns if p in CLIENTS or p == "sip" else turns for p in args.protocol)
    async with aiohttp.ClientSession() as http:
        targets = [await make_target(http, p, args.url, key=key, model=args.model, wait_s=args.ready_timeout)
                   for p in args.protocol]
    if any(t.protocol == "page" and not t.ours for t in targets):
        return _fail(f"{args.url} did not answer GET /api/stages as an assistant server does (ours with a token needs "
                     "--token), and only ours speaks the page's protocol: measure another with --protocol whip, "
                     "realtime, realtime-ws or twilio")
    results: list[BenchResult] = []
    for target in targets:
        progress.run(target.protocol)
        try:
            result = await run_protocol(target, args, files, turns, progress)
        except (TimeoutError, OSError, ValueError, RuntimeError, aiohttp.ClientError) as exc:
            progress.close()
            return _fail(f"{target.protocol}: {exc}")
        write_outputs(result, args.out if len(targets) == 1 else args.out / target.protocol, not args.no_plot)
        results.append(result)
    progress.close()
    print_results(results)
    if len(results) > 1:
        print("\n" + compare_text(results))
        _plot_compare(results, args.out, not args.no_plot)
    notes = sip_notes(results)
    for line in notes:
        print(line)
    if args.markdown is not None:
        body = format_markdown(results[0]) if len(results) == 1 else compare_markdown(results)
        _write_markdown(args.markdown, "\n\n".join([body, *notes]), origin)
    bad = sum(1 for r in results for lv in r.levels for t in lv.turns if t.status != "ok")
    return 0 if bad == 0 else 1


async def run_protocol(target: Target, args: argparse.Namespace, files: list[Path], turns: int,
                       progress: Progress) -> BenchResult:
    """One protocol's run against its target."""
    if target.protocol in CLIENTS:
        return await bench_v2v(
            target.url, files, turns, args.sessions, None, threshold_dbfs=args.threshold_dbfs,
            timeout_s=args.timeout, silence_ms=args.silence_ms, stagger_ms=args.stagger_ms, token=target.key,
            ready_timeout_s=args.ready_timeout, client=CLIENTS[target.protocol], target=target,
            on_turn=progress.turn)
    utterances = load_utterances(files)
    if target.protocol == "sip":
        return await run_sip(target, args, utterances, turns, progress)
    if target.protocol == "realtime-ws":
        return await bench_ws(target, utterances, turns, mode="commit" if args.commit else "server_vad",
                              timeout_s=args.timeout, threshold_dbfs=args.threshold_dbfs, on_turn=progress.turn)
    # twilio
    result = BenchResult(url=target.url, same_host=is_same_host(target.url), threshold_dbfs=args.threshold_dbfs,
                         window_ms=WINDOW_MS, protocol=target.protocol, server=target.server, left_out=target.left_out,
                         settings={"files": [u.name for u in utterances], "turns_per_session": turns, "sessions": [1],
                                   "timeout_s": args.timeout, "webhook": target.webhook_url()})
    start = cpu_snapshot()
    phone = await bench_phone(target.url, utterances, turns, auth_token=args.twilio_auth_token,
                              timeout_s=args.timeout, ready_timeout_s=args.ready_timeout,
                              webhook=target.webhook_url(), wait_ready=target.ours, on_turn=progress.turn)
    level = LevelResult(sessions=1, turns=[phone_turn_result(t, k) for k, t in enumerate(phone)])
    level.timed(start)
    result.levels.append(level)
    return result


async def run_sip(target: Target, args: argparse.Namespace, utterances: list, turns: int,
                  progress: Progress) -> BenchResult:
    """``--protocol sip``: calls to the server's SIP listener (``--sip``), one level per ``--sessions`` entry (that
    many calls at once), each call saying ``turns`` files; the caller's side only (RTP carries no events)."""
    host, _, port = args.sip.rpartition(":")
    result = BenchResult(url=f"sip:{args.sip}", same_host=is_same_host(target.url), threshold_dbfs=args.threshold_dbfs,
                         window_ms=WINDOW_MS, protocol="sip", server=target.server, left_out=target.left_out,
                         settings={"files": [u.name for u in utterances], "turns_per_session": turns,
                                   "sessions": list(args.sessions), "timeout_s": args.timeout, "sip": args.sip,
                                   "codec": args.sip_codec})
    for level in args.sessions:
        start = cpu_snapshot()
        phone = await bench_sip((host or "127.0.0.1", int(port)), utterances, turns, calls=level,
                                codec=args.sip_codec, user=args.sip_user, password=args.sip_password,
                                timeout_s=args.timeout)
        rows = [phone_turn_result(t, k) for k, t in enumerate(phone)]
        for row in rows:
            progress.turn(row)
        result.levels.append(lv := LevelResult(sessions=level, turns=rows))
        lv.timed(start)
    return result


def sip_capacity(levels: dict[int, list[float]]) -> str:
    """The most calls at once, counting up the levels (``{calls: every turn's v2v_ms}``), before the first level whose
    v2v p90 is over ``DOUBLED`` × the fewest calls' p90, as a sentence."""
    p90 = {k: percentile(v, 90) for k, v in sorted(levels.items()) if v}
    if not p90:
        return "no turn was heard"
    base = min(p90)
    held = base
    for k in sorted(p90):
        if p90[k] > DOUBLED * p90[base]:
            return (f"{held} (p90 {p90[held]:.0f} ms against {p90[base]:.0f} ms with {base}; at {k} calls it was "
                    f"{p90[k] / p90[base]:.2f}x)")
        held = k
    return f"{held} or more (p90 {p90[held]:.0f} ms against {p90[base]:.0f} ms with {base}; no level tried doubled it)"


def _v2v(level: LevelResult) -> list[float]:
    return [float(v) for t in level.turns if t.status == "ok" and (v := t.columns.get("v2v_ms")) is not None]


def sip_notes(results: list[BenchResult]) -> list[str]:
    """What the SIP runs add to the tables: the calls one machine holds (several levels), and SIP minus the page at the
    medians (a page run beside it)."""
    notes = []
    page = next((r for r in results if r.protocol == "page" and r.levels), None)
    for r in results:
        if r.protocol != "sip" or not r.levels:
            continue
        codec = r.settings.get("codec", "")
        if len(r.levels) > 1:
            notes.append(f"SIP calls held at once before a call's v2v p90 doubles ({codec}): "
                         f"{sip_capacity({lv.sessions: _v2v(lv) for lv in r.levels})}.")
        if page is not None and (sip_v := _v2v(r.levels[0])) and (page_v := _v2v(page.levels[0])):
            notes.append(f"SIP ({codec}) minus page, medians: {percentile(sip_v, 50) - percentile(page_v, 50):+.0f} "
                         "ms (one after the other; --interleave takes their turns in turn).")
    return notes


async def run_interleaved(args: argparse.Namespace, origin: str, utts: list, turns: int) -> int:
    """``--protocol page,sip --interleave``: a page session and a SIP call open together, turn k of each on the same
    file one after the other, and their medians."""
    url = args.url.rstrip("/")
    host, _, port = args.sip.rpartition(":")
    settings = TurnSettings(timeout_s=args.timeout, silence_ms=args.silence_ms, settle_ms=DEFAULT_SETTLE_MS)
    page_v2v: list[float] = []
    sip_turns: list[PhoneTurn] = []
    async with aiohttp.ClientSession() as http:
        await wait_server_ready(http, url, args.ready_timeout)
        page = BenchSession(index=0, url=url, http=http, threshold_dbfs=args.threshold_dbfs, token=args.token)
        phone = SipPhone((host or "127.0.0.1", int(port)), codec=args.sip_codec, user=args.sip_user,
                         password=args.sip_password, threshold_dbfs=args.threshold_dbfs)
        try:
            await page.connect()
            await phone.dial()
            for k in range(turns):
                utt = utts[k % len(utts)]
                result = await page.run_turn(utt, k, settings)
                value = result.columns.get("v2v_ms")
                if result.status == "ok" and value is not None:
                    page_v2v.append(float(value))
                sip_turns.append(await phone_turn(phone, utt, timeout_s=args.timeout))
                print(f"turn {k} {utt.name:26s} page {value!s:>8} ms   sip {sip_turns[-1].v2v_ms!s:>8} ms"
                      f"{'  ' + sip_turns[-1].error if sip_turns[-1].error else ''}")
        finally:
            await page.close()
            await phone.hang_up()
    sip_v2v = [t.v2v_ms for t in sip_turns if t.v2v_ms is not None]
    lines = ["| voice-to-voice (client clock), turns taken in turn | turns heard | median | p90 |",
             "|---|---:|---:|---:|"]
    for name, values, n in (("page", page_v2v, len(sip_turns)), (f"sip ({args.sip_codec})", sip_v2v, len(sip_turns))):
        cells = [f"{percentile(values, q):.0f} ms" if values else "—" for q in (50, 90)]
        lines.append(f"| {name} | {len(values)}/{n} | {cells[0]} | {cells[1]} |")
    if page_v2v and sip_v2v:
        sip_median, page_median = percentile(sip_v2v, 50), percentile(page_v2v, 50)
        lines += ["", f"SIP minus page (medians): {sip_median - page_median:+.0f} ms; ratio "
                  f"{sip_median / page_median:.3f}."]
    print("\n".join(lines))
    out = Path(args.out) / "interleaved"
    out.mkdir(parents=True, exist_ok=True)
    (out / "interleaved.json").write_text(json.dumps({"page_v2v_ms": page_v2v, "sip": [t.__dict__ for t in sip_turns]},
                                                     indent=1))
    if args.markdown is not None:
        _write_markdown(args.markdown, "\n".join(lines), origin)
    return 0 if len(page_v2v) == len(sip_v2v) == len(sip_turns) else 1


def print_results(results: list[BenchResult]) -> None:
    """Each run's per-turn table (short levels) and its summary."""
    for result in results:
        if len(results) > 1:
            print(f"== protocol {result.protocol} ({result.url}, {result.server})")
        columns = CLIENT_TABLE_COLUMNS if result.left_out else None
        for level in result.levels:
            if len(level.turns) <= MAX_TURN_ROWS:
                print(format_turns(level, columns) if columns else format_turns(level))
                print()
        print(format_summary(result))
        written = [str(p) for p in (result.json_path, result.png_path) if p is not None]
        if written:
            print(f"\nwrote {' and '.join(written)}")


def compare_runs(args: argparse.Namespace, origin: str) -> int:
    """``--compare A.json B.json …``: the runs' tables side by side, one plot, Markdown if asked."""
    try:
        results = [read_result(path) for path in args.compare]
    except ValueError as exc:
        return _fail(f"--compare: {exc}")
    print(compare_text(results))
    _plot_compare(results, args.out, not args.no_plot)
    if args.markdown is not None:
        _write_markdown(args.markdown, compare_markdown(results), origin)
    return 0


def _plot_compare(results: list[BenchResult], out: Path, plot: bool) -> None:
    if not plot:
        return
    try:
        from assistant.bench.plots import plot_compare
    except ImportError:  # matplotlib is the `plot` extra
        log.warning("bench.v2v no_plot reason=matplotlib_missing hint=pip install 'assistant[plot]'")
        return
    print(f"wrote {plot_compare(results, letters(results), out / 'compare.png')}")


def _write_markdown(path: Path, body: str, origin: str) -> None:
    docs = write_markdown(path, body, origin)
    print(f"wrote {path}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))


__all__ = ["PROTOCOLS", "add_v2v_arguments", "compare_runs", "run_protocol", "run_v2v", "sip_capacity", "sip_notes"]
