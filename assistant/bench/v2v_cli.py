"""``assistant bench v2v`` on the command line: its flags, and the run of one protocol or several side by side.

The clients it drives sit below it: our page protocol's (``bench/v2v.py``), the Realtime API's
(``bench/realtime_client.py``), a phone carrier's (``bench/telephony_client.py``: a call through Twilio Media
Streams) and a SIP phone's (``bench/sip_client.py``: a call straight to the server's SIP listener, PCMU or Opus).
With ``--protocol page,realtime[,realtime-ws][,twilio][,sip]`` each protocol runs in turn on the same files, and the
ratio of their medians is printed; ``--protocol sip --sessions 1,2,4`` holds that many SIP calls at once per level.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from assistant.bench.audio_source import load_utterance, read_manifest
from assistant.bench.figures import provenance, write_markdown
from assistant.bench.realtime_client import RealtimeBenchSession, WSTurn, ws_turn
from assistant.bench.report import BenchResult, format_markdown, format_summary, format_turns, percentile
from assistant.bench.sip_client import CODECS, SipPhone, bench_sip, phone_turn
from assistant.bench.telephony_client import PhoneTurn, bench_phone
from assistant.bench.v2v import (
    AUDIBLE_DBFS,
    DEFAULT_SETTLE_MS,
    DEFAULT_SILENCE_MS,
    DEFAULT_STAGGER_MS,
    DEFAULT_TIMEOUT_S,
    SHARED_AUDIO,
    WINDOW_MS,
    BenchSession,
    TurnSettings,
    bench_v2v,
    default_audio_files,
    session_levels,
    wait_server_ready,
)
from assistant.rtc.loopback_ice import allow_loopback_ice

log = logging.getLogger(__name__)

PROTOCOLS = ("page", "realtime", "realtime-ws", "twilio", "sip")
TWILIO_TOKEN_ENV = "ASSISTANT_TELEPHONY__TWILIO_AUTH_TOKEN"  # the server's own setting, read the same way
SIP_PASSWORD_ENV = "ASSISTANT_SIP__PASSWORD"
DOUBLED = 2.0  # the SIP capacity is the last level whose v2v p90 stays within this many times one call's


# --- CLI ------------------------------------------------------------------------------------------------
def add_v2v_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``assistant bench v2v`` flags."""
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (default: %(default)s)")
    parser.add_argument("--audio", nargs="+", type=Path, default=None, metavar="WAV",
                        help=f"speech files to play (default: {SHARED_AUDIO}/en_*.wav without the cloning clip); "
                        "speech ends come from manifest.json next to them")
    parser.add_argument("--turns", type=int, default=None,
                        help="turns per session (default: one per audio file)")
    parser.add_argument("--sessions", type=session_levels, default=[1],
                        help="concurrent sessions, or a list run one level after another, e.g. 1,4 (default: 1)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for v2v.json and v2v.png (default: %(default)s)")
    parser.add_argument("--threshold-dbfs", type=float, default=AUDIBLE_DBFS,
                        help=f"reply audible at this peak level over {WINDOW_MS} ms (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds after the speech end before a turn with no reply is dropped "
                        "(default: %(default)s)")
    parser.add_argument("--silence-ms", type=float, default=DEFAULT_SILENCE_MS,
                        help="reply over after this much silence if no reply_done came (default: %(default)s)")
    parser.add_argument("--stagger-ms", type=float, default=DEFAULT_STAGGER_MS,
                        help="session i starts i × this later (default: %(default)s)")
    parser.add_argument("--token", default="", help="bearer token, if the server requires one")
    parser.add_argument("--ready-timeout", type=float, default=120.0,
                        help="seconds to wait for /readyz (default: %(default)s)")
    parser.add_argument("--loopback-ice", action="store_true",
                        help="offer 127.0.0.1 as an ICE candidate (machines with only loopback; the server "
                        "must do the same)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the tables as Markdown to FILE, under a line naming this command, the git "
                        "commit and the machine; docs that include FILE are refreshed (assistant/bench/figures.py)")
    parser.add_argument("--protocol", type=lambda t: t.split(","), default=["page"],
                        help="page (our /api/offer), realtime (OpenAI Realtime over WebRTC), realtime-ws (over "
                        "WebSocket), twilio (a phone call: a signed webhook, then Media Streams, μ-law at 8 kHz in "
                        "real time); a list runs each and compares them (default: page)")
    parser.add_argument("--twilio-auth-token", default=os.environ.get(TWILIO_TOKEN_ENV, ""),
                        help="the server's telephony.twilio_auth_token, to sign the webhook (default: "
                        f"${TWILIO_TOKEN_ENV})")
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


async def run_v2v(args: argparse.Namespace) -> int:
    """CLI entry: run the bench, print the tables, return 0 if every turn was heard, 1 otherwise."""
    origin = provenance()  # the machine's load as the bench starts
    if args.loopback_ice:
        allow_loopback_ice()
    if args.protocol != ["page"]:
        return await run_protocols(args, origin)
    try:
        result = await bench_v2v(
            args.url,
            args.audio,
            args.turns,
            args.sessions,
            args.out,
            threshold_dbfs=args.threshold_dbfs,
            timeout_s=args.timeout,
            silence_ms=args.silence_ms,
            stagger_ms=args.stagger_ms,
            token=args.token,
            ready_timeout_s=args.ready_timeout,
            plot=not args.no_plot,
        )
    except (TimeoutError, OSError, ValueError, aiohttp.ClientError) as exc:
        print(f"bench v2v: {exc}")
        return 2
    for level in result.levels:
        if len(level.turns) <= 40:
            print(format_turns(level))
            print()
    print(format_summary(result))
    print(f"\nwrote {result.json_path}" + (f" and {result.png_path}" if result.png_path else ""))
    if args.markdown is not None:
        _write_markdown(args.markdown, format_markdown(result), origin)
    bad = sum(1 for lv in result.levels for t in lv.turns if t.status != "ok")
    return 0 if bad == 0 else 1


def _write_markdown(path: Path, body: str, origin: str) -> None:
    docs = write_markdown(path, body, origin)
    print(f"wrote {path}" + (f"; refreshed {', '.join(str(d) for d in docs)}" if docs else ""))


# --- the comparison ------------------------------------------------------------------------------------------
def v2v_values(result: BenchResult) -> list[float]:
    return [float(v) for lv in result.levels for t in lv.turns
            if t.status == "ok" and (v := t.columns.get("v2v_ms")) is not None]


def describe(values: Sequence[float]) -> str:
    if not values:
        return "n=0"
    return (f"n={len(values)} median={percentile(values, 50):.0f} p90={percentile(values, 90):.0f} "
            f"min={min(values):.0f} max={max(values):.0f} ms")


async def run_protocols(args: argparse.Namespace, origin: str) -> int:
    """``assistant bench v2v --protocol …``: each protocol on the same files, then their medians side by side."""
    protocols = args.protocol
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        print(f"bench v2v: unknown protocol {unknown[0]!r}; choose from {', '.join(PROTOCOLS)}")
        return 2
    url = args.url.rstrip("/")
    if args.interleave:
        if sorted(protocols) != ["page", "sip"]:
            print("bench v2v: --interleave takes --protocol page,sip")
            return 2
        return await run_interleaved(args, origin)
    results: dict[str, BenchResult] = {}
    ws: list[WSTurn] = []
    phone: list[PhoneTurn] = []
    sip: dict[int, list[PhoneTurn]] = {}
    for protocol in protocols:
        if protocol == "sip":
            files = [Path(f) for f in (args.audio or default_audio_files())]
            known_sip: dict[Path, dict[str, dict]] = {}
            utts = [load_utterance(f, known_sip.setdefault(f.parent, read_manifest(f.parent))) for f in files]
            host, _, port = args.sip.rpartition(":")
            for level in args.sessions:
                sip[level] = await bench_sip((host or "127.0.0.1", int(port)), utts, args.turns or len(utts),
                                             calls=level, codec=args.sip_codec, user=args.sip_user,
                                             password=args.sip_password, timeout_s=args.timeout)
            continue
        if protocol == "twilio":
            files = [Path(f) for f in (args.audio or default_audio_files())]
            known: dict[Path, dict[str, dict]] = {}
            utts = [load_utterance(f, known.setdefault(f.parent, read_manifest(f.parent))) for f in files]
            try:
                phone = await bench_phone(url, utts, args.turns or len(utts), auth_token=args.twilio_auth_token,
                                          timeout_s=args.timeout, ready_timeout_s=args.ready_timeout)
            except (RuntimeError, OSError, aiohttp.ClientError) as exc:
                print(f"bench v2v: twilio: {exc}")
                return 2
            continue
        if protocol == "realtime-ws":
            files = [Path(f) for f in (args.audio or default_audio_files())]
            manifests: dict[Path, dict[str, dict]] = {}
            utts = [load_utterance(f, manifests.setdefault(f.parent, read_manifest(f.parent))) for f in files]
            turns = args.turns or len(utts)
            async with aiohttp.ClientSession() as http:
                for k in range(turns):
                    for mode in ("server_vad", "commit"):
                        ws.append(await ws_turn(http, url, utts[k % len(utts)], mode=mode, token=args.token))
                        log.info("bench.realtime ws mode=%s file=%s first_delta_ms=%s", mode, ws[-1].file,
                                 ws[-1].first_delta_ms)
            continue
        client = RealtimeBenchSession if protocol == "realtime" else BenchSession
        results[protocol] = await bench_v2v(
            url, args.audio, args.turns, args.sessions, Path(args.out) / protocol,
            threshold_dbfs=args.threshold_dbfs, timeout_s=args.timeout, silence_ms=args.silence_ms,
            stagger_ms=args.stagger_ms, token=args.token, ready_timeout_s=args.ready_timeout,
            plot=not args.no_plot, client=client,
        )
    bad = 0
    for protocol, result in results.items():
        print(f"== protocol {protocol}")
        for level in result.levels:
            if len(level.turns) <= 40:
                print(format_turns(level))
        print(format_summary(result))
        bad += sum(1 for lv in result.levels for t in lv.turns if t.status != "ok")
    print("\n== voice-to-voice (client clock), per protocol")
    medians = {}
    for protocol, result in results.items():
        values = v2v_values(result)
        print(f"{protocol:10s} {describe(values)}")
        if values:
            medians[protocol] = percentile(values, 50)
    if phone:
        values = [t.v2v_ms for t in phone if t.v2v_ms is not None]
        print(f"{'twilio':10s} {describe(values)}")
        if values:
            medians["twilio"] = percentile(values, 50)
    for level, turns in sip.items():
        values = [t.v2v_ms for t in turns if t.v2v_ms is not None]
        print(f"{'sip x' + str(level):10s} {describe(values)}")
        if values and level == min(sip):
            medians["sip"] = percentile(values, 50)
    if "page" in medians and "sip" in medians:
        print(f"ratio sip/page (median v2v): {medians['sip'] / medians['page']:.3f}; sip - page: "
              f"{medians['sip'] - medians['page']:+.0f} ms")
    if len(sip) > 1:
        print(f"SIP calls held before a call's v2v p90 doubles ({args.sip_codec}): {sip_capacity(sip)}")
    bad += sum(1 for turns in sip.values() for t in turns if t.v2v_ms is None)
    if sip:
        out = Path(args.out) / "sip"
        out.mkdir(parents=True, exist_ok=True)
        (out / "sip.json").write_text(json.dumps({str(k): [t.__dict__ for t in v] for k, v in sip.items()},
                                                 indent=1))
    if "page" in medians and "realtime" in medians:
        print(f"ratio realtime/page (median v2v): {medians['realtime'] / medians['page']:.3f}")
    if "page" in medians and "twilio" in medians:
        print(f"ratio twilio/page (median v2v): {medians['twilio'] / medians['page']:.3f}")
    if phone:
        print("\n== a phone call (Twilio Media Streams, μ-law 8 kHz): the media frame holding the speech end sent "
              "→ first audible reply sample as the carrier plays it (first reply media received)")
        for t in phone:
            print(f"  {t.file:24s} {t.v2v_ms!s:>8} ms  (first media {t.first_media_ms!s:>8} ms, reply {t.reply_s} s)"
                  f"{'  ' + t.error if t.error else ''}")
        bad += sum(1 for t in phone if t.v2v_ms is None)
        out = Path(args.out) / "twilio"
        out.mkdir(parents=True, exist_ok=True)
        (out / "phone.json").write_text(json.dumps([t.__dict__ for t in phone], indent=1))
    if ws:
        print("\n== Realtime over WebSocket: append holding the speech end (server_vad) or last append (commit) "
              "→ first response.output_audio.delta")
        for mode in ("server_vad", "commit"):
            turns = [t for t in ws if t.mode == mode]
            values = [t.first_delta_ms for t in turns if t.first_delta_ms is not None]
            print(f"{mode:10s} {describe(values)}")
            for t in turns:
                print(f"  {t.file:24s} {t.first_delta_ms!s:>8} ms  server_v2v={t.server.get('server_v2v_ms')} "
                      f"{t.error or t.transcript!r}")
        bad += sum(1 for t in ws if t.first_delta_ms is None)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "realtime_ws.json").write_text(json.dumps([t.__dict__ for t in ws], indent=1))
    if args.markdown is not None:
        _write_markdown(args.markdown, protocols_markdown(results, ws, phone, sip, args.sip_codec), origin)
    return 0 if bad == 0 else 1


def sip_capacity(levels: dict[int, list[PhoneTurn]]) -> str:
    """The most calls at once, counting up the levels, before the first level whose v2v p90 is over ``DOUBLED`` ×
    the fewest calls' p90 (each level's every turn counted), as a sentence."""
    p90 = {k: percentile(v, 90) for k, turns in sorted(levels.items())
           if (v := [t.v2v_ms for t in turns if t.v2v_ms is not None])}
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


def protocols_markdown(results: dict[str, BenchResult], ws: Sequence[WSTurn],
                       phone: Sequence[PhoneTurn] = (), sip: dict[int, list[PhoneTurn]] | None = None,
                       sip_codec: str = "PCMU") -> str:
    """The comparison as Markdown: voice-to-voice per protocol (and their ratios to the page's), then the
    WebSocket's time to the first audio delta per mode, then each phone turn."""
    lines = ["| voice-to-voice (client clock) | turns heard | median | p90 |", "|---|---:|---:|---:|"]
    medians = {}
    rows: list[tuple[str, list[float], int]] = [(p, v2v_values(r), sum(len(lv.turns) for lv in r.levels))
                                                for p, r in results.items()]
    if phone:
        rows.append(("twilio", [t.v2v_ms for t in phone if t.v2v_ms is not None], len(phone)))
    for level, turns_at in sorted((sip or {}).items()):
        name = f"sip ({sip_codec})" + (f", {level} call{'s' if level > 1 else ''} at once"
                                       if len(sip or {}) > 1 or level > 1 else "")
        rows.append((name, [t.v2v_ms for t in turns_at if t.v2v_ms is not None], len(turns_at)))
        if level == min(sip or {0: []}) and rows[-1][1]:
            medians["sip"] = percentile(rows[-1][1], 50)
    for protocol, values, turns in rows:
        if values and not protocol.startswith("sip"):
            medians[protocol] = percentile(values, 50)
        cells = [f"{percentile(values, q):.0f} ms" if values else "—" for q in (50, 90)]
        lines.append(f"| {protocol} | {len(values)}/{turns} | {cells[0]} | {cells[1]} |")
    for other in ("realtime", "twilio", "sip"):
        if "page" in medians and other in medians:
            lines += ["", f"Ratio {other} / page (medians): {medians[other] / medians['page']:.3f}."]
    if "page" in medians and "sip" in medians:
        lines.append(f"SIP minus page (medians): {medians['sip'] - medians['page']:+.0f} ms.")
    if sip and len(sip) > 1:
        lines += ["", f"SIP calls held at once before a call's v2v p90 doubles: {sip_capacity(sip)}."]
    if ws:
        lines += ["", "| Realtime over WebSocket, to the first `response.output_audio.delta` | turns | median | p90 |",
                  "|---|---:|---:|---:|"]
        for mode, what in (("server_vad", "from the append holding the speech end (server VAD)"),
                           ("commit", "from the last append (turn detection null, then commit)")):
            values = [t.first_delta_ms for t in ws if t.mode == mode and t.first_delta_ms is not None]
            cells = [f"{percentile(values, q):.0f} ms" if values else "—" for q in (50, 90)]
            lines.append(f"| {what} | {len(values)} | {cells[0]} | {cells[1]} |")
    if phone:
        lines += ["", "| phone turn (Twilio Media Streams) | speech end → first audible reply | → first reply media "
                  "| reply heard |", "|---|---:|---:|---:|"]
        for t in phone:
            heard = f"{t.v2v_ms:.0f} ms" if t.v2v_ms is not None else (t.error or "—")
            media = f"{t.first_media_ms:.0f} ms" if t.first_media_ms is not None else "—"
            lines.append(f"| {t.file} | {heard} | {media} | {t.reply_s:.2f} s |")
    return "\n".join(lines)


async def run_interleaved(args: argparse.Namespace, origin: str) -> int:
    """``--protocol page,sip --interleave``: a page session and a SIP call open together, turn k of each on the same
    file one after the other, and their medians."""
    url = args.url.rstrip("/")
    files = [Path(f) for f in (args.audio or default_audio_files())]
    known: dict[Path, dict[str, dict]] = {}
    utts = [load_utterance(f, known.setdefault(f.parent, read_manifest(f.parent))) for f in files]
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
            for k in range(args.turns or len(utts)):
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
    print(f"\n{'page':10s} {describe(page_v2v)}\n{'sip':10s} {describe(sip_v2v)}")
    lines = ["| voice-to-voice (client clock), turns taken in turn | turns heard | median | p90 |",
             "|---|---:|---:|---:|"]
    for name, values, n in (("page", page_v2v, len(sip_turns)), (f"sip ({args.sip_codec})", sip_v2v, len(sip_turns))):
        cells = [f"{percentile(values, q):.0f} ms" if values else "—" for q in (50, 90)]
        lines.append(f"| {name} | {len(values)}/{n} | {cells[0]} | {cells[1]} |")
    if page_v2v and sip_v2v:
        sip_median, page_median = percentile(sip_v2v, 50), percentile(page_v2v, 50)
        lines += ["", f"SIP minus page (medians): {sip_median - page_median:+.0f} ms; ratio "
                  f"{sip_median / page_median:.3f}."]
        print(lines[-1])
    out = Path(args.out) / "interleaved"
    out.mkdir(parents=True, exist_ok=True)
    (out / "interleaved.json").write_text(json.dumps({"page_v2v_ms": page_v2v, "sip": [t.__dict__ for t in sip_turns]},
                                                     indent=1))
    if args.markdown is not None:
        _write_markdown(args.markdown, "\n".join(lines), origin)
    return 0 if len(page_v2v) == len(sip_v2v) == len(sip_turns) else 1
