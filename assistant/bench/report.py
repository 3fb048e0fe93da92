"""Voice-to-voice bench results: the data model, percentiles, the terminal tables and the JSON file.

Every column is named and explained once, here (:data:`COLUMNS`); docs/benchmarks.md, the JSON file and
the tables all use these names.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from assistant.audio import SPEECH_RATE
from assistant.bench.processes import CpuSnapshot, cpu_use
from assistant.pipeline.trace import GAPS, PARTS
from assistant.vad.silero import WINDOW_SAMPLES

log = logging.getLogger(__name__)

JSON_VERSION = 3  # 2: the wait at the end of a turn split (worker_wait, asr, end_of_turn, decide); 3: the protocol,
# the kind of server and what could not be measured on it; first_audio_ms

# name -> what it measures. Server columns are the server's own ``turn_metrics`` durations.
COLUMNS: dict[str, str] = {
    "v2v_ms": "client clock: the user's speech end (frame holding the manifest's last speech sample handed "
    "to the client's WebRTC stack) → first reply sample at or above the audible threshold, as played out",
    "first_audio_ms": "client clock: the user's speech end → the first reply audio received (WebRTC: the first frame "
    "above the server's silence level; WebSocket: the first audio delta; a phone call: the first media message)",
    "server_v2v_ms": "server clock: its speech_end mark → first non-silent reply frame handed to its track",
    "endpoint_ms": "server: silence the turn-taking required (speech end → the pause that asked for the "
    "evidence, or the silence the verdict needed); the wait's parts split it along its critical path",
    "worker_wait_ms": "server: the critical ASR pass (or end-of-turn model call) waiting for a free worker",
    "asr_ms": "server: ASR compute on the critical path (a pass that began before the pause counts from it)",
    "end_of_turn_ms": "server: the end-of-turn model's call, when its answer was the last evidence the decision used",
    "decide_ms": "server: the last evidence in → the turn committed (idle time in the decision)",
    "llm_first_text_ms": "server: turn decided and transcribed → first reply text from the responder",
    "chunker_ms": "server: first reply text → first text chunk handed to TTS",
    "tts_first_audio_ms": "server: first TTS text → first PCM chunk out of TTS",
    "confirm_wait_ms": "server: the reply ready, held until more silence confirmed an unsure end (turn.confirm_ms; "
    "0 when the end was sure or the reply was not ready before)",
    "playout_ms": "server: the reply may be heard (its first PCM chunk, or the end confirmed) → first non-silent "
    "frame handed to the outgoing track",
    "downlink_ms": "server's first_frame_sent mark → client received that frame (encode, network, client "
    "jitter buffer, decode); one clock only when client and server share a host",
    "onset_ms": "client received the first reply frame → first sample at or above the audible threshold "
    "(position inside the frame, quiet first frames, client playout queue)",
    "llm_first_clause_ms": "server: turn decided and transcribed → first clause handed to TTS (llm_first_text_ms + "
    "chunker_ms: what the listener waited for the responder's first speakable piece; 0 when a speculative reply "
    "had it ready before the turn was decided)",
    "reply_gap_ms": "client clock: the longest silence inside the reply as played out, between two audible samples "
    "(the pause between sentences, or a piece the voice was late with); when the reply stopped for longer than the "
    "bench waits (--silence-ms) before the server said it was done, that wait, and the turn counts as a reply cut",
    "unaccounted_ms": "v2v_ms minus every stage column it contains (endpoint … onset): the uplink (encode, "
    "network, server jitter buffer, decode) plus where the server's VAD put the speech end against the "
    "manifest; negative when the VAD put the end earlier than the uplink took (by less than one VAD window, "
    "SPEECH_END_RESOLUTION_MS)",
}
# How finely the server's VAD places a speech end (one Silero window): the server's speech_end mark may fall
# this much before the manifest's, so unaccounted_ms (uplink + that offset) may be negative by up to this much.
SPEECH_END_RESOLUTION_MS = WINDOW_SAMPLES * 1000 / SPEECH_RATE
# The server's stage durations, named and ordered as the server's turn trace defines them: they add up to
# server_v2v_ms.
SERVER_STAGES: tuple[str, ...] = PARTS
# Stage columns whose sum, with unaccounted_ms, makes v2v_ms; in the order they happen.
STAGE_COLUMNS: tuple[str, ...] = (*SERVER_STAGES, "downlink_ms", "onset_ms")
SERVER_COLUMNS: tuple[str, ...] = ("server_v2v_ms", *SERVER_STAGES)
TURN_STATUSES = ("ok", "dropped", "error")


@dataclass
class TurnResult:
    """One turn of one bench session."""

    session: int
    index: int  # turn number within the session, from 0
    file: str
    status: str = "ok"  # ok | dropped (no reply heard in time) | error (an error event, or no metrics)
    reason: str = ""
    server_turn: int | None = None
    columns: dict[str, float | None] = field(default_factory=dict)
    client_marks_ms: dict[str, float] = field(default_factory=dict)  # epoch ms on the client's clock
    server_marks_ms: dict[str, float] = field(default_factory=dict)  # epoch ms, from turn_metrics
    transcript: str = ""
    reply_text: str = ""
    speech_ends: int = 0  # speech_end events the server sent while this file played and was answered (1: one turn)
    # Of those ends, the turns dropped because the speaker went on right after the decision (turn.rejoin_ms): heard as
    # one turn with the next, so speech_ends - rejoined is the number of turns the file was heard as.
    rejoined: int = 0
    # Reply audio the caller heard before the file's labelled speech end: a reply begun at a pause the speaker had
    # not finished (then dropped when they went on), however the server mended it afterwards.
    false_start_ms: float = 0.0
    reply_cut: bool = False  # the reply stopped for longer than the bench waits before the server said it was done
    gaps_ms: dict[str, float] = field(default_factory=dict)  # the server's idle gaps (pipeline/trace.GAPS)


@dataclass
class LevelResult:
    """All turns run with ``sessions`` concurrent sessions."""

    sessions: int
    turns: list[TurnResult] = field(default_factory=list)
    wall_s: float = 0.0
    connect_failures: int = 0
    errors: list[str] = field(default_factory=list)  # session-level problems (could not connect, …)
    # Cores in use on average while the level ran: the bench client's own (on a small machine that also runs the
    # server, what the client took from it) and the whole host's busy ones; None where unknown.
    client_cores: float | None = None
    host_busy_cores: float | None = None
    host_cores: int | None = None  # the CPUs /proc/stat counted, on the machine that ran the level

    def summary(self) -> dict[str, Any]:
        return summarize_level(self)

    def timed(self, start: CpuSnapshot) -> None:
        """The level ended: its wall time and the cores the client and the host used since ``start``."""
        self.wall_s = time.monotonic() - start.at
        self.client_cores, self.host_busy_cores = cpu_use(start)
        self.host_cores = start.host_cores

    def cpu_text(self, same_host: bool) -> str:
        """The summary's CPU line ("" when nothing was measured)."""
        if self.client_cores is None:
            return ""
        text = f"cpu: this client {self.client_cores:.2f} cores"
        if self.host_busy_cores is not None:
            text += f", the host {self.host_busy_cores:.2f} of {self.host_cores or '?'} busy"
            if same_host:
                text += (f" (the server and the rest {max(0.0, self.host_busy_cores - self.client_cores):.2f}: "
                         "client and server share these cores)")
        return text


@dataclass
class BenchResult:
    url: str
    same_host: bool
    threshold_dbfs: float
    window_ms: int
    settings: dict[str, Any] = field(default_factory=dict)
    levels: list[LevelResult] = field(default_factory=list)
    json_path: Path | None = None
    png_path: Path | None = None
    protocol: str = "page"  # how the bench spoke to the server (bench/targets.py: PROTOCOLS)
    server: str = "assistant"  # "assistant" (ours: every stage measured) or "other"
    left_out: str = ""  # what could not be measured on this server, and why ("" when nothing)

    @property
    def label(self) -> str:
        """How a comparison names this run: its protocol and server."""
        return f"{self.protocol} {self.url}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bench": "v2v",
            "version": JSON_VERSION,
            "url": self.url,
            "protocol": self.protocol,
            "server": self.server,
            "left_out": self.left_out,
            "same_host": self.same_host,
            "clock": "epoch ms; the client's clock is time.time() at start advanced by perf_counter",
            "audible_threshold": {
                "level_dbfs": self.threshold_dbfs,
                "window_ms": self.window_ms,
                "measure": "peak (largest absolute sample) in the window; the onset is located to the sample",
            },
            "downlink_valid": self.same_host,
            "settings": self.settings,
            "columns": COLUMNS,
            "stage_columns": list(STAGE_COLUMNS),
            "levels": [
                {
                    "sessions": lv.sessions,
                    "wall_s": round(lv.wall_s, 3),
                    "client_cores": None if lv.client_cores is None else round(lv.client_cores, 3),
                    "host_busy_cores": None if lv.host_busy_cores is None else round(lv.host_busy_cores, 3),
                    "host_cores": lv.host_cores,
                    "connect_failures": lv.connect_failures,
                    "errors": lv.errors,
                    "summary": summarize_level(lv),
                    "turns": [asdict(t) for t in lv.turns],
                }
                for lv in self.levels
            ],
        }


    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """A result back from its JSON (``to_dict``; files of version 2 were all our page protocol's)."""
        if data.get("bench") != "v2v" or not isinstance(data.get("levels"), list):
            raise ValueError("not a v2v bench result (no 'bench': 'v2v' with its levels)")
        threshold = data.get("audible_threshold") or {}
        result = cls(url=str(data.get("url", "")), same_host=bool(data.get("same_host")),
                     threshold_dbfs=float(threshold.get("level_dbfs", -40.0)),
                     window_ms=int(threshold.get("window_ms", 10)), settings=dict(data.get("settings") or {}),
                     protocol=str(data.get("protocol", "page")), server=str(data.get("server", "assistant")),
                     left_out=str(data.get("left_out", "")))
        fields = set(TurnResult.__dataclass_fields__)
        for lv in data["levels"]:
            turns = [TurnResult(**{k: v for k, v in t.items() if k in fields}) for t in lv.get("turns", [])]
            result.levels.append(LevelResult(sessions=int(lv["sessions"]), turns=turns,
                                             wall_s=float(lv.get("wall_s", 0)),
                                             client_cores=_float_or_none(lv.get("client_cores")),
                                             host_busy_cores=_float_or_none(lv.get("host_busy_cores")),
                                             host_cores=lv.get("host_cores"),
                                             connect_failures=int(lv.get("connect_failures", 0)),
                                             errors=list(lv.get("errors", []))))
        return result


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def read_result(path: Path) -> BenchResult:
    """A ``v2v.json`` the bench wrote (``ValueError`` for anything else)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a v2v bench result")
    try:
        result = BenchResult.from_dict(data)
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    result.json_path = Path(path)
    return result


# --- the columns of one turn ----------------------------------------------------------------------------------
def client_columns(speech_end: float, first_audio: float, heard: float) -> dict[str, float | None]:
    """What the client alone measures (epoch seconds in): ``v2v_ms``, ``first_audio_ms``, ``onset_ms``."""
    return {"v2v_ms": round((heard - speech_end) * 1000, 1),
            "first_audio_ms": round((first_audio - speech_end) * 1000, 1),
            "onset_ms": round((heard - first_audio) * 1000, 1)}


def add_server_columns(cols: dict[str, float | None], metrics: dict[str, Any], first_audio: float) -> None:
    """Our server's ``turn_metrics`` into ``cols``: its stages, the downlink (its first_frame_sent mark → the first
    reply audio received), the first clause and what no column explains (``unaccounted_ms``)."""
    durations = metrics.get("durations_ms", {}) or {}
    marks = metrics.get("timestamps_ms", {}) or {}
    for name in SERVER_COLUMNS:
        v = durations.get(name)
        cols[name] = float(v) if v is not None else None
    sent = marks.get("first_frame_sent")
    cols["downlink_ms"] = round(first_audio * 1000 - float(sent), 1) if sent is not None else None
    first, chunker = cols.get("llm_first_text_ms"), cols.get("chunker_ms")
    cols["llm_first_clause_ms"] = round(first + chunker, 1) if first is not None and chunker is not None else None
    v2v = cols.get("v2v_ms")
    cols["unaccounted_ms"] = round(v2v - stage_sum(cols), 1) if v2v is not None else None


# --- statistics -----------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """n, p50, p90, max and mean of the values that exist (None for the statistics when none do)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "max": None, "mean": None}
    return {
        "n": len(xs),
        "p50": round(percentile(xs, 50), 1),
        "p90": round(percentile(xs, 90), 1),
        "max": round(max(xs), 1),
        "mean": round(sum(xs) / len(xs), 1),
    }


def below_server(columns: dict[str, float | None]) -> bool:
    """The client's v2v is shorter than the server's own parts allow (``unaccounted_ms`` under minus one VAD
    window): the file's speech-end mark lies after where the server heard the speech end. A defect of the mark
    (or of the clocks, when client and server are on two hosts), never a latency."""
    u = columns.get("unaccounted_ms")
    return u is not None and u < -SPEECH_END_RESOLUTION_MS


def summarize_level(level: LevelResult) -> dict[str, Any]:
    """Turn counts by status and the statistics of every column over the turns that were heard."""
    counts = {s: sum(1 for t in level.turns if t.status == s) for s in TURN_STATUSES}
    heard = [t for t in level.turns if t.columns.get("v2v_ms") is not None]
    return {
        "turns": len(level.turns),
        **counts,
        "below_server": sorted(t.file for t in heard if below_server(t.columns)),
        "false_starts": sorted(t.file for t in level.turns if t.false_start_ms > 0),
        "replies_cut": sorted(t.file for t in level.turns if t.reply_cut),
        "columns": {name: summarize(t.columns.get(name) for t in heard) for name in COLUMNS},
        "gaps": {name: summarize(t.gaps_ms.get(name) for t in heard) for name in GAPS},
    }


def stage_sum(columns: dict[str, float | None]) -> float:
    """Sum of the stage columns a turn has (what v2v_ms contains besides unaccounted_ms)."""
    return sum(v for k in STAGE_COLUMNS if (v := columns.get(k)) is not None)


# --- tables ---------------------------------------------------------------------------------------------
def _fmt(v: float | int | None, width: int = 8) -> str:
    if v is None:
        return "—".rjust(width)
    return f"{v:.0f}".rjust(width) if isinstance(v, float) else str(v).rjust(width)


def format_summary(result: BenchResult) -> str:
    """One block per concurrency level: p50 / p90 / max of every column, then the turn counts."""
    lines: list[str] = []
    for lv in result.levels:
        s = summarize_level(lv)
        lines.append(
            f"sessions={lv.sessions}  turns={s['turns']}  ok={s['ok']}  dropped={s['dropped']}  "
            f"errors={s['error']}  connect_failures={lv.connect_failures}  wall={lv.wall_s:.1f}s"
        )
        if cpu := lv.cpu_text(result.same_host):
            lines.append(f"  {cpu}")
        if s["false_starts"]:
            lines.append(f"  false starts heard: {len(s['false_starts'])} turns had reply audio before their speech "
                         "end: " + ", ".join(s["false_starts"]))
        if s["replies_cut"]:
            lines.append(f"  replies cut: {len(s['replies_cut'])} replies stopped for longer than the bench waits "
                         "before the server said they were done: " + ", ".join(s["replies_cut"]))
        if s["below_server"]:
            lines.append(f"  WARNING: {len(s['below_server'])} turns with v2v_ms below the server's own "
                         f"(unaccounted_ms < -{SPEECH_END_RESOLUTION_MS:g} ms: the speech-end mark is late): "
                         + ", ".join(s["below_server"]))
        lines.append(f"  {'column':<32}{'n':>5}{'p50':>8}{'p90':>8}{'max':>8}{'mean':>8}")
        for name, st in [*s["columns"].items(), *(("gap: " + k, v) for k, v in s["gaps"].items())]:
            if not st["n"] and result.left_out:
                continue
            lines.append(
                f"  {name:<32}{st['n']:>5}{_fmt(st['p50'])}{_fmt(st['p90'])}{_fmt(st['max'])}{_fmt(st['mean'])}"
            )
        lines.append("")
    if result.left_out:
        lines.append(f"left out: {result.left_out}")
        lines.append(f"audible = peak ≥ {result.threshold_dbfs:g} dBFS in a {result.window_ms} ms window")
        return "\n".join(lines)
    lines.append(
        f"audible = peak ≥ {result.threshold_dbfs:g} dBFS in a {result.window_ms} ms window; "
        + (
            "client and server on one host: downlink_ms is on one clock"
            if result.same_host
            else "REMOTE server: downlink_ms / unaccounted_ms mix two clocks"
        )
    )
    return "\n".join(lines)


def _md(v: float | int | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}" if isinstance(v, float) and abs(v) < 10 else f"{v:.0f}"


def format_markdown(result: BenchResult) -> str:
    """The per-level table as Markdown (p50 / p90 / max of every column and gap, per level), with the turn counts:
    what ``--markdown FILE`` writes for the docs."""
    levels = [(lv, summarize_level(lv)) for lv in result.levels]

    def label(n: int) -> str:
        return f"{n} session{'s' if n != 1 else ''}"

    head = ["column"] + [f"{label(lv.sessions)} {stat}" for lv, _ in levels for stat in ("p50", "p90", "max")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    rows = [(f"`{name}`", "columns", name) for name in COLUMNS] + [(f"gap: `{n}`", "gaps", n) for n in GAPS]
    for title, kind, name in rows:
        if result.left_out and not any(s[kind][name]["n"] for _, s in levels):
            continue
        cells = [_md(s[kind][name][stat]) for _, s in levels for stat in ("p50", "p90", "max")]
        lines.append("| " + " | ".join([title, *cells]) + " |")
    counts = "; ".join(f"{label(lv.sessions)}: {s['turns']} turns, {s['ok']} heard, {s['dropped']} dropped, "
                       f"{s['error']} errors, {len(s['false_starts'])} false starts heard, "
                       f"{len(s['replies_cut'])} replies cut" for lv, s in levels)
    files = ", ".join(sorted({t.file for lv in result.levels for t in lv.turns}))
    below = sorted({f for _, s in levels for f in s["below_server"]})
    flagged = [] if not below else [
        "", f"**Not a latency:** {len(below)} turns have `v2v_ms` below the server's own (`unaccounted_ms` < "
        f"-{SPEECH_END_RESOLUTION_MS:g} ms): their speech-end mark lies after where the server heard the speech "
        f"end ({', '.join(below)})."]
    where = ("" if result.same_host or result.left_out else "; REMOTE server: downlink_ms and unaccounted_ms mix two "
             "clocks")
    left = [] if not result.left_out else ["", f"Left out: {result.left_out}."]
    return "\n".join([*lines, "", f"ms. {counts}. Files: {files}. Audible: peak ≥ {result.threshold_dbfs:g} dBFS in "
                      f"{result.window_ms} ms{where}.", *flagged, *left])


TURN_TABLE_COLUMNS: tuple[str, ...] = ("v2v_ms", "server_v2v_ms", *STAGE_COLUMNS, "unaccounted_ms", "reply_gap_ms")
# A server that is not ours: what the client hears (a WHIP or page client hears the reply's audio whole, so its
# silences too; a Realtime API client over WebSocket has no reply_gap_ms).
CLIENT_TABLE_COLUMNS: tuple[str, ...] = ("v2v_ms", "first_audio_ms", "onset_ms", "reply_gap_ms")
_SHORT = {
    "v2v_ms": "v2v",
    "first_audio_ms": "1st_rx",
    "server_v2v_ms": "srv_v2v",
    "endpoint_ms": "endpt",
    "worker_wait_ms": "wait",
    "asr_ms": "asr",
    "end_of_turn_ms": "eot",
    "decide_ms": "decide",
    "llm_first_text_ms": "llm",
    "chunker_ms": "chunk",
    "tts_first_audio_ms": "tts",
    "confirm_wait_ms": "hold",
    "playout_ms": "play",
    "downlink_ms": "down",
    "onset_ms": "onset",
    "unaccounted_ms": "unacc",
    "reply_gap_ms": "gap",
}


def format_turns(level: LevelResult, columns: Sequence[str] = TURN_TABLE_COLUMNS) -> str:
    """One line per turn (ms), in the order the turns ran."""
    head = f"  {'s':>2} {'t':>2} {'file':<26}{'status':<8}" + "".join(f"{_SHORT[c]:>8}" for c in columns)
    lines = [f"sessions={level.sessions}: per turn (ms)", head]
    for t in sorted(level.turns, key=lambda t: (t.client_marks_ms.get("speech_end", math.inf), t.session)):
        row = f"  {t.session:>2} {t.index:>2} {t.file[:25]:<26}{t.status:<8}"
        row += "".join(_fmt(t.columns.get(c)) for c in columns)
        if t.reason:
            row += f"  ({t.reason})"
        lines.append(row)
    return "\n".join(lines)


def write_json(result: BenchResult, path: Path) -> Path:
    """Write the whole result (settings, per-turn rows, per-level statistics) as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    log.info("bench.v2v json=%s", path)
    return path
