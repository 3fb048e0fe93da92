"""assistant.bench v2v: statistics and tables, the microphone track, the reply listener, and the bench
run end to end against the real app on loopback (default CPU stack), including a deliberately slowed stage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import pytest_asyncio

from assistant.audio import FRAME_SAMPLES
from assistant.audio import WEBRTC_RATE as SAMPLE_RATE
from assistant.bench.audio_source import Utterance, UtteranceSource, load_utterance
from assistant.bench.plots import plot_result
from assistant.bench.processes import CpuSnapshot, cpu_snapshot, cpu_use
from assistant.bench.report import (
    COLUMNS,
    SPEECH_END_RESOLUTION_MS,
    STAGE_COLUMNS,
    BenchResult,
    LevelResult,
    TurnResult,
    format_summary,
    format_turns,
    percentile,
    read_result,
    stage_sum,
    summarize,
    summarize_level,
    write_json,
)
from assistant.bench.shared_data import shared_speech_files
from assistant.bench.v2v import (
    ReplyListener,
    bench_v2v,
    frame_to_mono,
    is_same_host,
)
from assistant.bench.v2v_cli import add_v2v_arguments
from assistant.server.services import Services
from tests.conftest import serve, test_config

# --- statistics and report -------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    rng = np.random.default_rng(1)
    xs = list(rng.normal(500, 80, size=37))
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edges() -> None:
    assert percentile([7.0], 90) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_skips_missing_values() -> None:
    s = summarize([100.0, None, 300.0, float("nan"), 200.0])
    assert s == {"n": 3, "p50": 200.0, "p90": 280.0, "max": 300.0, "mean": 200.0}
    assert summarize([None]) == {"n": 0, "p50": None, "p90": None, "max": None, "mean": None}


def _turn(session: int, index: int, v2v: float | None, status: str = "ok", **stages: float) -> TurnResult:
    cols: dict[str, float | None] = {}
    if v2v is not None:
        cols = {"v2v_ms": v2v, "server_v2v_ms": v2v - 150, **stages}
        cols["unaccounted_ms"] = v2v - stage_sum(cols)
    return TurnResult(session=session, index=index, file=f"f{index}.wav", status=status, columns=cols,
                      client_marks_ms={"speech_end": 1000.0 * (index + 1)})


def _synthetic_result() -> BenchResult:
    stages = {"endpoint_ms": 530.0, "asr_ms": 500.0, "llm_first_text_ms": 1.0, "chunker_ms": 1.0,
              "tts_first_audio_ms": 300.0, "playout_ms": 50.0, "downlink_ms": 90.0, "onset_ms": 20.0}
    one = LevelResult(sessions=1, turns=[_turn(0, i, 1700.0 + 10 * i, **stages) for i in range(3)], wall_s=30)
    four = LevelResult(
        sessions=4,
        turns=[_turn(s, i, 2500.0 + 100 * s, **stages) for s in range(4) for i in range(2)]
        + [_turn(3, 2, None, "dropped")],
        wall_s=40,
    )
    return BenchResult(url="http://127.0.0.1:8080", same_host=True, threshold_dbfs=-40.0, window_ms=10,
                       levels=[one, four])


def test_stage_sum_and_unaccounted() -> None:
    t = _turn(0, 0, 1700.0, endpoint_ms=500.0, asr_ms=400.0, downlink_ms=100.0)
    assert stage_sum(t.columns) == 1000.0
    assert t.columns["unaccounted_ms"] == 700.0
    assert set(STAGE_COLUMNS) < set(COLUMNS)


def test_summarize_level_counts_and_stats() -> None:
    four = _synthetic_result().levels[1]
    s = summarize_level(four)
    assert (s["turns"], s["ok"], s["dropped"], s["error"]) == (9, 8, 1, 0)
    v2v = s["columns"]["v2v_ms"]
    assert v2v["n"] == 8 and v2v["max"] == 2800.0 and v2v["p50"] == 2650.0
    assert set(s["columns"]) == set(COLUMNS)


def test_tables_json_and_plot(tmp_path: Path) -> None:
    result = _synthetic_result()
    table = format_summary(result)
    for name in COLUMNS:
        assert name in table
    assert "sessions=4" in table and "dropped=1" in table and "-40 dBFS" in table
    assert "dropped" in format_turns(result.levels[1])
    path = write_json(result, tmp_path / "out" / "v2v.json")
    data = json.loads(path.read_text())
    assert data["audible_threshold"] == {
        "level_dbfs": -40.0, "window_ms": 10,
        "measure": "peak (largest absolute sample) in the window; the onset is located to the sample"}
    assert [lv["sessions"] for lv in data["levels"]] == [1, 4]
    assert data["levels"][1]["summary"]["dropped"] == 1
    png = plot_result(result, tmp_path / "out" / "v2v.png")
    from PIL import Image

    with Image.open(png) as im:
        assert im.size[0] > 500 and im.size[1] > 500  # two rows: bars and the concurrency curve


def test_cpu_use_counts_this_process_and_the_host() -> None:
    """The client's own cores and the host's busy ones, from the counters: a stretch of this process's CPU shows in
    both (the host's counter has 10 ms ticks, so a little slack)."""
    start = cpu_snapshot()
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    own, host = cpu_use(start)
    wall = time.monotonic() - start.at
    assert own is not None and 0.3 / wall * 0.9 <= own <= 1.1 * os.cpu_count()  # type: ignore[operator]
    if Path("/proc/stat").exists():
        assert host is not None and host >= own - 0.05 / wall and host <= os.cpu_count()  # type: ignore[operator]


@pytest.mark.parametrize("period_ms", [4.0, 10.0])
def test_the_host_counts_work_that_wakes_and_sleeps_between_clock_ticks(period_ms: float) -> None:
    """Work that wakes just after each clock tick and sleeps before the next (as a client pacing audio frames may)
    is in the host's figure: /proc/stat's busy fields, sampled at each tick, read almost none of it on a 250 Hz
    kernel (0.007 cores of 0.61 here), and a CI run once read the host less busy than the bench client alone."""
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat")
    period = period_ms / 1000
    start = cpu_snapshot()
    while time.monotonic() < start.at + 1.0:
        tick = (int(time.monotonic() / period) + 1) * period + 0.0002
        time.sleep(max(0.0, tick - time.monotonic()))
        busy_until = time.monotonic() + period * 0.6
        while time.monotonic() < busy_until:
            pass
    own, host = cpu_use(start)
    assert own is not None and own > 0.3, own
    assert host is not None and host >= own - 0.05, (own, host)


def test_a_host_reading_below_this_process_alone_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """A host figure that cannot be true (less busy than the one process inside it) is not reported."""
    since = CpuSnapshot(at=100.0, own_s=10.0, host_idle_s={"cpu0": 50.0, "cpu1": 50.0}, host_cores=2)
    now = CpuSnapshot(at=110.0, own_s=14.0, host_idle_s={"cpu0": 58.0, "cpu1": 59.0}, host_cores=2)  # 3 s busy
    with caplog.at_level("WARNING"):
        assert cpu_use(since, now) == (0.4, None)
    assert "left out" in caplog.text
    coherent = CpuSnapshot(at=110.0, own_s=14.0, host_idle_s={"cpu0": 55.0, "cpu1": 59.0, "cpu2": 1.0}, host_cores=3)
    assert cpu_use(since, coherent) == (0.4, 0.6)  # cpu2 came online: only CPUs seen at both moments count


def test_level_cpu_in_the_summary_and_back_from_json(tmp_path: Path) -> None:
    result = _synthetic_result()
    four = result.levels[1]
    four.client_cores, four.host_busy_cores, four.host_cores = 0.42, 1.57, 2
    table = format_summary(result)
    assert "cpu: this client 0.42 cores, the host 1.57 of 2 busy" in table and "the server and the rest 1.15" in table
    assert table.count("cpu: ") == 1  # the level that measured nothing says nothing
    back = read_result(write_json(result, tmp_path / "v2v.json"))
    assert (back.levels[1].client_cores, back.levels[1].host_busy_cores, back.levels[1].host_cores) == (0.42, 1.57, 2)
    assert back.levels[0].client_cores is None


def test_cli_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_v2v_arguments(parser)
    args = parser.parse_args(["--sessions", "1,4", "--turns", "3", "--out", "x"])
    assert args.sessions == [1, 4] and args.turns == 3 and args.out == Path("x")
    assert args.threshold_dbfs == -40.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--sessions", "0"])


def test_same_host() -> None:
    assert is_same_host("http://127.0.0.1:8080")
    assert is_same_host("http://localhost:8080")
    assert not is_same_host("http://192.0.2.200:8080")  # TEST-NET, not ours


# --- audio in and out ------------------------------------------------------------------------------------


def test_default_files_and_manifest_speech_end(shared_audio: Path) -> None:
    files = shared_speech_files()
    names = [f.name for f in files]
    assert "en_weather.wav" in names and "en_reference_voice.wav" not in names
    assert all(n.startswith("en_") for n in names)
    utt = load_utterance(shared_audio / "en_weather.wav")
    assert utt.pcm.dtype == np.int16
    assert utt.speech_end_sample == round(2.54 * SAMPLE_RATE)
    assert utt.seconds == pytest.approx(4.276, abs=0.01)


async def test_source_paces_frames_and_stamps_speech_end() -> None:
    pcm = np.full(int(0.1 * SAMPLE_RATE), 1000, dtype=np.int16)  # 100 ms: 5 frames
    utt = Utterance(name="t", text="", pcm=pcm, speech_end_sample=2 * FRAME_SAMPLES + 10)  # in frame 2
    src = UtteranceSource()
    before = time.monotonic()  # the pacer's clock starts at the first frame, not before this
    frames = [await src.recv()]  # silence before anything is queued
    stamps: list[float] = []
    pb = src.play(utt, on_speech_end=stamps.append)
    handed: list[float] = [before]  # when each frame came out
    for _ in range(7):
        frames.append(await src.recv())
        handed.append(time.monotonic())
    assert [f.pts for f in frames] == [k * FRAME_SAMPLES for k in range(8)]  # continuous
    assert all(f.samples == FRAME_SAMPLES and f.sample_rate == SAMPLE_RATE for f in frames)
    levels = [int(np.abs(f.to_ndarray()).max()) for f in frames]
    assert levels == [0, 1000, 1000, 1000, 1000, 1000, 0, 0]
    # Real time, not as fast as possible: no frame is handed out before its place in the stream is due
    # (late is allowed: a loaded machine).
    frame_s = FRAME_SAMPLES / SAMPLE_RATE
    assert all(handed[k] >= handed[0] + k * frame_s - 0.001 for k in range(1, 8)), handed
    assert pb.speech_end_at.done() and stamps == [pb.speech_end_at.result()]
    assert pb.finished_at.result() > pb.speech_end_at.result()
    src.stop()


def _frame(samples: np.ndarray, stereo: bool = True) -> av.AudioFrame:
    s = samples.astype(np.int16)
    data = np.repeat(s, 2)[None, :] if stereo else s[None, :]
    frame = av.AudioFrame.from_ndarray(data, format="s16", layout="stereo" if stereo else "mono")
    frame.sample_rate = SAMPLE_RATE
    frame.time_base = Fraction(1, SAMPLE_RATE)
    return frame


def test_frame_to_mono_scales_and_mixes() -> None:
    x = frame_to_mono(_frame(np.full(FRAME_SAMPLES, 16384)))
    assert x.shape == (FRAME_SAMPLES,) and np.allclose(x, 0.5)


def test_listener_onset_to_the_sample_and_server_frame_rule() -> None:
    listener = ReplyListener(threshold_dbfs=-40.0)
    quiet = np.zeros(FRAME_SAMPLES)
    listener.on_frame(_frame(quiet), 10.0)
    listener.on_frame(_frame(np.full(FRAME_SAMPLES, 5000)), 10.02)  # loud, but before arming: ignored
    listener.arm(10.03)
    listener.on_frame(_frame(quiet), 10.04)
    faint = np.zeros(FRAME_SAMPLES)
    faint[100:] = 100  # −50 dBFS: above the server's −60 dBFS frame rule, below the −40 dBFS threshold
    listener.on_frame(_frame(faint), 10.06)
    assert listener.first_frame_at == 10.06 and listener.heard_at is None
    loud = np.zeros(FRAME_SAMPLES)
    loud[300:] = 400  # −38 dBFS from sample 300
    listener.on_frame(_frame(loud), 10.08)
    assert listener.heard_frame_at == 10.08
    assert listener.heard_at == pytest.approx(10.08 + 300 / SAMPLE_RATE)
    assert listener.last_audible_at == pytest.approx(10.08 + FRAME_SAMPLES / SAMPLE_RATE)


def test_listener_counts_reply_audio_heard_before_the_speech_end_as_a_false_start() -> None:
    """A reply that starts while the user still has words to say (a pause taken for the end) is heard: the audible
    10 ms windows from the playback's start to its speech end are kept with their arrival, and what came after the
    server's decision is the false start (what came before it is the previous reply running on)."""
    listener = ReplyListener(threshold_dbfs=-40.0)
    loud = np.full(FRAME_SAMPLES, 3000)
    listener.on_frame(_frame(loud), 0.5)  # the previous turn's tail, before this playback began: not counted
    listener.watch_early(1.0)
    listener.on_frame(_frame(loud), 1.01)  # the previous reply still running on when the playback began
    listener.on_frame(_frame(np.zeros(FRAME_SAMPLES)), 1.02)
    half = np.zeros(FRAME_SAMPLES)
    half[FRAME_SAMPLES // 2:] = 3000  # the second 10 ms window of a 20 ms frame
    listener.on_frame(_frame(half), 1.04)
    listener.on_frame(_frame(loud), 1.06)
    assert listener.early_audible_s == pytest.approx(0.050)
    assert listener.early_since(1.03) == pytest.approx(0.030)  # after a decision at 1.03: the false start
    listener.arm(1.08)  # the speech end: the reply from here is the turn's own, not a false start
    listener.on_frame(_frame(loud), 1.10)
    assert listener.early_audible_s == pytest.approx(0.050) and listener.heard_at is not None
    listener.watch_early(2.0)  # the next turn starts from zero
    assert listener.early_audible_s == 0.0


def test_listener_keeps_the_longest_silence_inside_the_reply() -> None:
    """A piece the voice was late with is heard as a silence inside the reply: from the last audible sample before
    it to the first after it, as played out; a new turn starts from zero."""
    listener = ReplyListener(threshold_dbfs=-40.0)
    loud, quiet = np.full(FRAME_SAMPLES, 3000), np.zeros(FRAME_SAMPLES)
    listener.arm(1.0)
    listener.on_frame(_frame(quiet), 1.0)  # before the onset: not inside the reply
    listener.on_frame(_frame(loud), 1.02)
    for i in range(3):
        listener.on_frame(_frame(quiet), 1.04 + 0.02 * i)
    late = np.zeros(FRAME_SAMPLES)
    late[100:] = 3000
    listener.on_frame(_frame(late), 1.10)
    listener.on_frame(_frame(quiet), 1.12)
    listener.on_frame(_frame(loud), 1.14)
    assert listener.longest_gap_s == pytest.approx(0.06 + 100 / SAMPLE_RATE)
    listener.arm(2.0)
    assert listener.longest_gap_s == 0.0


def test_listener_playout_queue_delays_a_burst() -> None:
    """Frames delivered back to back are played one after another, not at once."""
    listener = ReplyListener()
    listener.arm(0.0)
    listener.on_frame(_frame(np.zeros(FRAME_SAMPLES)), 1.0)
    listener.on_frame(_frame(np.full(FRAME_SAMPLES, 3000)), 1.001)  # arrived 19 ms early
    assert listener.heard_at == pytest.approx(1.0 + FRAME_SAMPLES / SAMPLE_RATE)


# --- end to end against the real app ---------------------------------------------------------------------

E2E_FILES = ("en_weather.wav", "en_timer.wav")  # the two shortest questions: keeps the run short
E2E_TURNS = 2
SLOW_MS = 300.0  # tests/slow_responder.py's delay before the first word


async def _run_bench(
    services: Services, out: Path, engine: str | None, shared_audio: Path, **settings: dict[str, object]
) -> BenchResult:
    cfg = test_config(**({"respond": {"engine": engine}} if engine else {}), **settings)
    # Share the loaded models; the responder comes from this config (a plug-in for the slow run).
    svc = Services(cfg, vad_model=services.vad_model, asr=services.asr, tts=services.tts)  # type: ignore[arg-type]

    async def close_responder_only() -> None:  # the shared engines outlive this app
        aclose = getattr(svc.responder, "aclose", None)
        if aclose is not None:
            await aclose()

    svc.close = close_responder_only  # type: ignore[method-assign]
    async with serve(cfg, svc) as (url, _app):
        return await bench_v2v(url, [shared_audio / f for f in E2E_FILES], turns=E2E_TURNS, sessions=1,
                               out_dir=out, timeout_s=40.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def baseline(services: Services, shared_audio: Path, tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return await _run_bench(services, tmp_path_factory.mktemp("v2v-base"), None, shared_audio)


# The slow responder runs with speculation off: a speculative turn starts its responder during the pause, so part
# of a slow first word can hide in the wait for the end of the turn (and then rightly shows less in
# llm_first_text_ms). Without it the responder starts once the turn is decided and transcribed.
NO_SPECULATION = {"turn": {"speculative": False}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slowed(services: Services, shared_audio: Path, tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return await _run_bench(services, tmp_path_factory.mktemp("v2v-slow"), "tests.slow_responder:SlowEcho",
                            shared_audio, **NO_SPECULATION)


# Sub-millisecond with the echo responder (first text, first chunk): present, and ≥ 0 rather than > 0.
# ASR after the endpoint too: the end of turn waits for the speculative transcript (its evidence), so
# the turn's ASR is often done when the turn ends.
MAY_BE_ZERO = {"llm_first_text_ms", "chunker_ms", "llm_first_clause_ms", "asr_ms"}
# The wait's other parts are each 0 unless that piece of evidence was the last one waited for.
MAY_BE_ZERO |= {"worker_wait_ms", "end_of_turn_ms", "decide_ms"}
# The falling end-of-turn policy decides after ~700 ms of a finished sentence's silence: the speculative reply's
# first audio is made by then, so no TTS time is left after the decision.
MAY_BE_ZERO |= {"tts_first_audio_ms"}
# The hold is 0 when the end was sure (or the reply came after turn.confirm_ms anyway): which, the machine decides.
MAY_BE_ZERO |= {"confirm_wait_ms"}
# A reply whose audible samples run on across every frame has no silence inside it.
MAY_BE_ZERO |= {"reply_gap_ms"}


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_e2e_json_columns_and_png(baseline: BenchResult) -> None:
    data = json.loads(baseline.json_path.read_text())  # type: ignore[union-attr]
    (level,) = data["levels"]
    assert level["summary"]["ok"] == E2E_TURNS, [(t["status"], t["reason"]) for t in level["turns"]]
    for turn in level["turns"]:
        cols = turn["columns"]
        assert set(cols) == set(COLUMNS), set(COLUMNS) ^ set(cols)
        for name, value in cols.items():
            assert value is not None and math.isfinite(value), name
            if name == "unaccounted_ms":  # the uplink, plus where the VAD put the end against the manifest
                assert value > -SPEECH_END_RESOLUTION_MS, (name, value)
            else:
                assert value >= 0 if name in MAY_BE_ZERO else value > 0, (name, value)
        contained = sum(cols[c] for c in STAGE_COLUMNS)
        # Nothing hidden: what is left is the uplink, give or take the VAD's placing of the speech end.
        assert cols["v2v_ms"] > contained - SPEECH_END_RESOLUTION_MS, cols
        assert cols["v2v_ms"] >= cols["server_v2v_ms"] + cols["downlink_ms"]
        assert "weather" in turn["transcript"].lower() or "timer" in turn["transcript"].lower()
    # What the client took from the machine it shares with the server: some, never more than the host was busy.
    assert 0 < level["client_cores"] <= level["host_busy_cores"] + 0.05, level
    assert level["host_busy_cores"] <= (os.cpu_count() or 1), level
    from PIL import Image

    with Image.open(baseline.png_path) as im:  # type: ignore[arg-type]
        im.verify()


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_e2e_slow_responder_shows_in_its_stage_and_v2v(slowed: BenchResult) -> None:
    """A responder that sleeps before its first word: its delay lands in llm_first_text_ms (after the turn was
    decided and transcribed, by at least the sleep) and so in v2v. Lower bounds only, which load cannot break
    (it only adds time); the stages are disjoint intervals that add up to server_v2v_ms, so the sleep counted
    in llm_first_text_ms is in no other stage. How much v2v grows against a baseline is the bench's to print
    (``assistant bench v2v --responder tests.slow_responder:SlowEcho`` beside a default run)."""
    slow = slowed.levels[0].turns
    assert all(t.status == "ok" for t in slow), [(t.status, t.reason) for t in slow]

    def col(t: TurnResult, name: str) -> float:
        value = t.columns.get(name)
        assert value is not None, (name, t.columns)
        return value

    for t in slow:  # the first word came after the sleep, counted from the end of the wait
        m = t.server_marks_ms
        assert m["first_text"] >= max(m["vad_end"], m["asr_done"]) + SLOW_MS - 1, m
        assert col(t, "llm_first_text_ms") >= SLOW_MS - 1, t.columns
        assert col(t, "server_v2v_ms") >= col(t, "llm_first_text_ms") and col(t, "v2v_ms") >= SLOW_MS - 1, t.columns


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_compare_puts_two_real_runs_side_by_side(baseline: BenchResult, slowed: BenchResult, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``--compare A.json B.json``: the two runs' tables side by side, each column's p50 of B over A's, one PNG and
    the Markdown; nothing is run."""
    from assistant.bench.v2v_cli import run_v2v
    from assistant.cli import build_parser

    a, b = baseline.json_path, slowed.json_path
    args = build_parser("v2v").parse_args(["bench", "v2v", "--compare", str(a), str(b), "--out", str(tmp_path),
                                           "--markdown", str(tmp_path / "compare.md")])
    assert await run_v2v(args) == 0
    out = capsys.readouterr().out
    assert f"A = page {baseline.url} [assistant] 1 session: 2/2 heard ({a})" in out
    assert f"B = page {slowed.url} [assistant] 1 session: 2/2 heard ({b})" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert rows["sessions=1"] == ["A", "p50", "A", "p90", "B", "p50", "B", "p90", "B/A"]
    for name in ("v2v_ms", "server_v2v_ms", "llm_first_text_ms", "downlink_ms"):
        assert len(rows[name]) == 5, rows[name]
    v2v = [float(x) for x in rows["v2v_ms"]]
    assert v2v[4] == pytest.approx(v2v[2] / v2v[0], abs=0.01)  # the ratio is of the p50s printed
    from PIL import Image

    with Image.open(tmp_path / "compare.png") as im:
        im.verify()
    markdown = (tmp_path / "compare.md").read_text()
    assert "_Measured with `" in markdown and "| `v2v_ms` |" in markdown and "| B p90 | B/A |" in markdown


async def test_compare_refuses_a_file_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from assistant.bench.v2v_cli import run_v2v
    from assistant.cli import build_parser

    (tmp_path / "x.json").write_text('{"bench": "tts"}')
    args = build_parser("v2v").parse_args(["bench", "v2v", "--compare", str(tmp_path / "x.json")])
    assert await run_v2v(args) == 2
    assert "not a v2v bench result" in capsys.readouterr().err
