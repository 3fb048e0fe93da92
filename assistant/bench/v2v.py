"""``assistant bench v2v``: voice-to-voice latency as the listener hears it.

A WebRTC client of its own (aiortc) connects like the page does: it opens the ``events`` data channel
before the offer, sends a microphone track (:class:`~assistant.bench.audio_source.UtteranceSource`, real
speech files played in real time) and receives the reply track. For every turn it measures, on its own
clock, the end of the user's speech (the manifest's ``speech_ends_s``: when the frame holding that sample
was handed to aiortc) → the first reply sample at or above the audible threshold, and puts the server's
``turn_metrics`` for the same turn next to it, plus the downlink (server's first_frame_sent → frame
received) as a column of its own. Nothing is subtracted: whatever no column explains stays visible in
``unaccounted_ms``.

On a server that is not ours (``bench/targets.py``) no ``turn_metrics`` come: a turn is then measured from the
client's side alone (``v2v_ms``, ``first_audio_ms``, ``onset_ms``), and the result says what was left out.
With no speech files given, the bench plays its own (``bench/speech.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from assistant.audio import SILENCE_PEAK_S16, WEBRTC_RATE
from assistant.bench.audio_source import Utterance, UtteranceSource, load_utterance, now, read_manifest
from assistant.bench.processes import cpu_snapshot
from assistant.bench.report import (
    BenchResult,
    LevelResult,
    TurnResult,
    add_server_columns,
    below_server,
    client_columns,
    write_json,
)
from assistant.bench.speech import bench_speech
from assistant.bench.targets import Target
from assistant.rtc import audio_level
from assistant.rtc.jitter import AdaptiveReceiveBuffer

log = logging.getLogger(__name__)

AUDIBLE_DBFS = -40.0  # a reply sample at or above this peak level is "heard"
WINDOW_MS = 10  # the level is a peak over 10 ms windows; the onset is then located to the sample
# The server's own "first non-silent frame" rule (ReplyTrack), used to find the frame its
# first_frame_sent mark stamped, for downlink_ms.
SERVER_AUDIBLE_PEAK = SILENCE_PEAK_S16 / 32768.0

DEFAULT_TIMEOUT_S = 30.0  # a turn with no reply heard this long after the speech end is dropped
DEFAULT_SILENCE_MS = 1200  # the reply is over after this much silence (when no reply_done event came)
DEFAULT_SETTLE_MS = 300  # quiet wanted before the next utterance starts
DEFAULT_STAGGER_MS = 400  # session i starts i × this later, so K sessions do not speak in lockstep
POLL_S = 0.02  # how often a turn checks its state; measurements never depend on it (stamped on arrival)
CONNECT_TIMEOUT_S = 20.0


def is_same_host(url: str) -> bool:
    """True when ``url`` names this machine, so server epoch marks share the client's clock."""
    host = urlsplit(url).hostname or ""
    try:
        addrs = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    if all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        return True
    try:
        import ifaddr

        local = {ip.ip if isinstance(ip.ip, str) else ip.ip[0] for a in ifaddr.get_adapters() for ip in a.ips}
    except Exception:  # ifaddr comes with aioice; without it, only loopback counts as local
        return False
    return bool(addrs) and addrs <= local


# --- the reply side -------------------------------------------------------------------------------------
def frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """An aiortc audio frame (s16/flt, packed or planar, any channels) → float32 mono −1…1."""
    a = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        x = a.reshape(channels, -1).astype(np.float32).mean(axis=0)
    else:
        x = a.reshape(-1, channels).astype(np.float32).mean(axis=1)
    if np.issubdtype(a.dtype, np.integer):
        x /= float(np.iinfo(a.dtype.name).max + 1)
    return x


class ReplyListener:
    """Reads the reply track and stamps, on the bench clock, when the reply is received and heard.

    Frames are stamped the moment aiortc hands them over (after its jitter buffer and Opus decoder).
    A playout model places each frame at ``max(received, end of the previous frame)``, as a speaker
    that never drops audio would; it restarts at every :meth:`arm` (silence lets a player drain).
    """

    def __init__(self, threshold_dbfs: float = AUDIBLE_DBFS) -> None:
        self.threshold = 10.0 ** (threshold_dbfs / 20.0)
        self.frames = 0
        self.armed_at: float | None = None
        self.first_frame_at: float | None = None  # first frame (since arm) the server calls non-silent
        self.heard_frame_at: float | None = None  # receive time of the frame holding the onset
        self.heard_at: float | None = None  # playout time of the first audible sample
        self.last_audible_at = 0.0  # playout time just after the latest audible sample
        self.longest_gap_s = 0.0  # since the onset: the longest silence between two audible samples, as played
        self.ended = False
        self._play_end: float | None = None
        # Reply audio heard while the user still had words to say (from the start of the playback to its labelled
        # speech end): a reply begun at a pause the speaker had not finished, a false start the caller hears.
        self.early_from: float | None = None
        self.early: list[tuple[float, float]] = []  # (received at, audible seconds) of each such frame

    def watch_early(self, at: float) -> None:
        """Count audible reply audio received from ``at`` (the start of the user's playback) until :meth:`arm`."""
        self.early_from, self.early = at, []

    @property
    def early_audible_s(self) -> float:
        return sum(seconds for _, seconds in self.early)

    def early_since(self, at: float) -> float:
        """Seconds of audible reply audio received before the speech end, from ``at`` on."""
        return sum(seconds for received, seconds in self.early if received >= at)

    def arm(self, at: float) -> None:
        """Start looking for a reply in frames received from ``at`` on (the user's speech end)."""
        self.armed_at = at
        self.early_from = None
        self.first_frame_at = self.heard_frame_at = self.heard_at = None
        self.longest_gap_s = 0.0
        self._play_end = None

    def on_frame(self, frame: av.AudioFrame, received_at: float) -> None:
        self.frames += 1
        x = frame_to_mono(frame)
        if x.size == 0:
            return
        sr = frame.sample_rate or WEBRTC_RATE
        play_at = received_at if self._play_end is None else max(received_at, self._play_end)
        self._play_end = play_at + x.size / sr
        mag = np.abs(x)
        loud = mag >= self.threshold
        at = np.flatnonzero(loud)  # the audible samples
        if at.size:
            if self.heard_at is not None and self.armed_at is not None and received_at >= self.armed_at:
                silent_s = play_at + int(at[0]) / sr - self.last_audible_at  # since the last audible sample
                self.longest_gap_s = max(self.longest_gap_s, silent_s)
            self.last_audible_at = play_at + (int(at[-1]) + 1) / sr
        if self.armed_at is None and self.early_from is not None and received_at >= self.early_from and at.size:
            self.early.append((received_at, _audible_s(loud, sr)))
        if self.armed_at is None or received_at < self.armed_at:
            return
        if self.first_frame_at is None and float(mag.max()) > SERVER_AUDIBLE_PEAK:
            self.first_frame_at = received_at
        if self.heard_at is None and at.size:
            # The first 10 ms window whose peak reaches the threshold starts at or before the first
            # loud sample; locating the onset to that sample is the window rule made precise.
            self.heard_at = play_at + int(at[0]) / sr
            self.heard_frame_at = received_at
            if self.first_frame_at is None:
                self.first_frame_at = received_at

    async def run(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                break
            self.on_frame(frame, now())
        self.ended = True


def _audible_s(loud: np.ndarray, sr: int) -> float:
    """Seconds of a frame in 10 ms windows that hold an audible sample (the window rule, as for the onset)."""
    n = max(1, sr * WINDOW_MS // 1000)
    windows = -(-loud.size // n)
    padded = np.zeros(windows * n, dtype=bool)
    padded[: loud.size] = loud
    return float(padded.reshape(windows, n).any(axis=1).sum()) * n / sr


# --- one session ----------------------------------------------------------------------------------------
@dataclass
class TurnSettings:
    timeout_s: float = DEFAULT_TIMEOUT_S
    silence_ms: float = DEFAULT_SILENCE_MS
    settle_ms: float = DEFAULT_SETTLE_MS


@dataclass
class BenchEvent:
    """One event from the server, stamped on arrival (client clock)."""

    at: float
    body: dict[str, Any]


@dataclass
class BenchSession:
    """One bench peer: connect, play turns one by one, measure each, hang up."""

    index: int
    url: str
    http: aiohttp.ClientSession
    threshold_dbfs: float = AUDIBLE_DBFS
    token: str = ""
    session_id: str = ""
    low_latency_receive: bool = True  # False: aiortc's own 4-packet receive buffer
    rtc_config: RTCConfiguration | None = None  # e.g. the server's GET /api/ice (TURN); None: host candidates
    events: list[BenchEvent] = field(default_factory=list)
    answer: dict[str, Any] = field(default_factory=dict)  # the offer's answer (its session id, who answers, …)
    ours: bool = True  # an assistant server: every turn ends with its turn_metrics (bench/targets.py)
    model: str = ""  # the Realtime API's model name ("" for the server's default)
    endpoint: str = ""  # where the offer goes, when the protocol's client needs it given (WHIP, Realtime calls)

    def __post_init__(self) -> None:
        audio_level.install()  # as the server's peers do: the client's packets cost the two cores as little
        self.pc = RTCPeerConnection(self.rtc_config or RTCConfiguration(iceServers=[]))
        self.source = UtteranceSource()
        self.listener = ReplyListener(self.threshold_dbfs)
        self._tasks: list[asyncio.Task[Any]] = []
        self._open = asyncio.Event()
        self.failed = ""

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    channel_label = "events"  # the data channel the server's events come on

    @staticmethod
    def endpoint_of(target: Target) -> str:
        """Where this client sends its offer for ``target`` ("": :meth:`exchange` builds it from the URL)."""
        return ""

    @property
    def wants_channel(self) -> bool:
        """Whether the offer opens the events channel (the page's always does)."""
        return True

    async def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Offer (data channel first, then audio), send it (:meth:`exchange`), apply the answer, wait until both
        flow (without a data channel: until the peer is connected)."""
        pc = self.pc
        if self.wants_channel:
            channel = self.channel = pc.createDataChannel(self.channel_label)  # the page's asks go on it too

            @channel.on("open")
            def _on_open() -> None:
                self._open.set()

            @channel.on("message")
            def _on_message(message: Any) -> None:
                at = now()
                try:
                    body = json.loads(message)
                except (TypeError, ValueError):
                    log.warning("bench.v2v bad_event session=%d", self.index)
                    return
                if isinstance(body, dict):
                    self.on_event(at, body)

        @pc.on("track")
        def _on_track(track: Any) -> None:
            if track.kind == "audio":
                # Receive like a good client (a browser's NetEq on loopback holds a packet or two), not with
                # aiortc's fixed 4-packet prefetch, which would add 80 ms that no listener hears.
                if self.low_latency_receive:
                    self.receive_buffer = AdaptiveReceiveBuffer.for_track(pc, track, 1, 6, adaptive=False)
                self._tasks.append(asyncio.create_task(self.listener.run(track), name=f"bench-rx-{self.index}"))

        @pc.on("connectionstatechange")
        def _on_state() -> None:
            if pc.connectionState == "connected" and not self.wants_channel:
                self._open.set()
            if pc.connectionState in ("failed", "closed") and not self.failed:
                self.failed = f"peer {pc.connectionState}"

        pc.addTransceiver(self.source, direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())  # gathers host candidates into the SDP
        answer = await self.exchange(pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(self._open.wait(), timeout_s)
        log.info("bench.v2v connected session=%d id=%s", self.index, self.session_id)

    async def exchange(self, offer: str) -> str:
        """Send the offer the page's way (``POST /api/offer``); sets :attr:`session_id`, returns the answer SDP."""
        body = {"sdp": offer, "type": "offer"}
        async with self.http.post(f"{self.url}/api/offer", json=body, headers=self._headers()) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"offer refused: HTTP {resp.status} {data}")
        self.session_id = data.get("session_id", "")
        self.answer = {k: v for k, v in data.items() if k != "sdp"}
        return str(data["sdp"])

    def on_event(self, at: float, body: dict[str, Any]) -> None:
        """One server event, stamped on arrival."""
        self.events.append(BenchEvent(at, body))

    def _events_since(self, start: int, kind: str) -> list[BenchEvent]:
        return [e for e in self.events[start:] if e.body.get("type") == kind]

    async def _settle(self, settings: TurnSettings) -> None:
        """Wait until the reply track has been quiet for ``settle_ms`` (bounded by the turn timeout)."""
        deadline = time.monotonic() + settings.timeout_s
        while now() - self.listener.last_audible_at < settings.settle_ms / 1000 and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)

    async def run_turn(self, utt: Utterance, index: int, settings: TurnSettings) -> TurnResult:
        """Play one utterance and measure its reply; never raises for a missing reply (it is dropped)."""
        result = TurnResult(session=self.index, index=index, file=utt.name)
        if self.failed:
            result.status, result.reason = "error", self.failed
            return result
        await self._settle(settings)
        start = len(self.events)
        listener = self.listener
        listener.watch_early(now())
        pb = self.source.play(utt, on_speech_end=listener.arm)
        try:
            speech_end = await asyncio.wait_for(asyncio.shield(pb.speech_end_at), utt.seconds + 10.0)
        except TimeoutError:
            result.status, result.reason = "error", "the audio track is not being read (peer not sending)"
            return result
        result.client_marks_ms["playback_start"] = round((pb.started_at or speech_end) * 1000, 1)
        result.client_marks_ms["speech_end"] = round(speech_end * 1000, 1)

        deadline = speech_end + settings.timeout_s
        give_up_at: float | None = None  # set when the server said no reply will come
        metrics: dict[str, Any] | None = None
        while True:
            await asyncio.sleep(POLL_S)
            t = now()
            tm = self._events_since(start, "turn_metrics")
            if tm:
                metrics = tm[-1].body
            if listener.heard_at is not None:
                turn = metrics.get("turn") if metrics else None
                done = [e for e in self._events_since(start, "reply_done")
                        if turn is None or e.body.get("turn") == turn]
                if done and (metrics is not None or not self.ours):
                    break
                if t - listener.last_audible_at >= settings.silence_ms / 1000:
                    # Our server says when a reply is done: one that went quiet this long before it did stopped
                    # mid-way (a piece the voice was late with), and the caller hears a reply cut.
                    result.reply_cut = self.ours and not done
                    if result.reply_cut:
                        listener.longest_gap_s = max(listener.longest_gap_s, t - listener.last_audible_at)
                    break
            elif give_up_at is None:
                errors = self._events_since(start, "error")
                empty = [e for e in self._events_since(start, "transcript")
                         if e.body.get("final") and not str(e.body.get("text", "")).strip()]
                if errors or empty:
                    give_up_at = t + 2.0  # a spoken error message may still come
            if t >= deadline or (give_up_at is not None and t >= give_up_at) or self.failed:
                break
        if listener.heard_at is not None and metrics is None and self.ours:
            # turn_metrics travels on SCTP, the audio on RTP: give the data channel a moment.
            for _ in range(50):
                await asyncio.sleep(POLL_S)
                if tm := self._events_since(start, "turn_metrics"):
                    metrics = tm[-1].body
                    break
        self._fill(result, start, speech_end, metrics)
        listener.armed_at = None
        return result

    def _fill(self, result: TurnResult, start: int, speech_end: float, metrics: dict[str, Any] | None) -> None:
        listener = self.listener
        result.speech_ends = len(self._events_since(start, "speech_end"))
        # A false start is reply audio after a turn end the server decided while this file still had words to say:
        # audio before any such decision is the previous reply running on (a slow one, on a busy server).
        decided = [e.at for e in self._events_since(start, "speech_end") if e.at < speech_end]
        result.false_start_ms = round(listener.early_since(min(decided)) * 1000, 1) if decided else 0.0
        went_on = [e for e in self._events_since(start, "interrupted") if e.body.get("reason") == "went_on"]
        result.rejoined = len(went_on)
        finals = [e.body for e in self._events_since(start, "transcript") if e.body.get("final")]
        if finals:
            result.transcript = str(finals[-1].get("text", ""))
        texts = self._events_since(start, "reply_text")
        if texts:
            result.reply_text = str(texts[-1].body.get("text", ""))
        errors = self._events_since(start, "error")
        if listener.heard_at is None:
            result.status = "dropped"
            if errors:
                result.reason = f"error: {errors[-1].body.get('stage')}: {errors[-1].body.get('message')}"
            elif finals and not result.transcript.strip():
                result.reason = "empty transcript"
            else:
                result.reason = self.failed or "no reply heard before the timeout"
            return
        heard = listener.heard_at
        first_rx = listener.first_frame_at or listener.heard_frame_at or heard
        result.client_marks_ms.update(
            first_frame_received=round(first_rx * 1000, 1),
            heard=round(heard * 1000, 1),
            reply_end=round(listener.last_audible_at * 1000, 1),
        )
        cols = client_columns(speech_end, first_rx, heard)
        cols["reply_gap_ms"] = round(listener.longest_gap_s * 1000, 1)
        if errors:
            result.status = "error"
            result.reason = f"error: {errors[-1].body.get('stage')}: {errors[-1].body.get('message')}"
        if metrics is None:
            if self.ours:
                result.status, result.reason = "error", result.reason or "no turn_metrics event"
            result.columns = cols
            return
        result.server_turn = metrics.get("turn")
        result.server_marks_ms = {k: float(v) for k, v in (metrics.get("timestamps_ms", {}) or {}).items()}
        result.gaps_ms = {k: float(v) for k, v in (metrics.get("gaps_ms", {}) or {}).items()}
        add_server_columns(cols, metrics, first_rx)
        result.columns = cols
        if below_server(cols):
            log.warning("bench.v2v client_below_server file=%s v2v_ms=%s server_v2v_ms=%s unaccounted_ms=%s",
                        result.file, cols["v2v_ms"], cols.get("server_v2v_ms"), cols["unaccounted_ms"])

    async def close(self) -> None:
        if self.session_id and not self.failed:
            with contextlib.suppress(Exception):
                async with self.http.delete(f"{self.url}/api/sessions/{self.session_id}",
                                            headers=self._headers()) as resp:
                    await resp.read()
        self.source.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# --- levels and the whole bench -------------------------------------------------------------------------
async def wait_server_ready(http: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
    """Poll ``/readyz`` until the server's models are loaded (raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with http.get(f"{url}/readyz") as resp:
                if resp.status == 200:
                    return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{url}/readyz not ready after {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


async def run_level(
    url: str,
    utterances: Sequence[Utterance],
    turns: int,
    sessions: int,
    *,
    settings: TurnSettings,
    threshold_dbfs: float = AUDIBLE_DBFS,
    token: str = "",
    stagger_ms: float = DEFAULT_STAGGER_MS,
    client: type[BenchSession] = BenchSession,
    target: Target | None = None,
    on_turn: Callable[[TurnResult], None] | None = None,
) -> LevelResult:
    """Run ``sessions`` peers at once, each playing ``turns`` utterances in its own order; ``on_turn`` hears of each
    turn as it is measured."""
    level = LevelResult(sessions=sessions)
    start = cpu_snapshot()
    ours, model = (True, "") if target is None else (target.ours, target.model)
    endpoint = "" if target is None else client.endpoint_of(target)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S + 10)) as http:
        clients = [client(i, url, http, threshold_dbfs, token, ours=ours, model=model, endpoint=endpoint)
                   for i in range(sessions)]
        connected = await asyncio.gather(*(c.connect() for c in clients), return_exceptions=True)

        async def play(client: BenchSession, ok: BaseException | None) -> list[TurnResult]:
            n = len(utterances)
            order = [utterances[(client.index + k) % n] for k in range(n)]  # each session its own order
            if isinstance(ok, BaseException):
                level.connect_failures += 1
                level.errors.append(f"session {client.index}: {type(ok).__name__}: {ok}")
                return [TurnResult(client.index, k, order[k % n].name, "error", "could not connect")
                        for k in range(turns)]
            await asyncio.sleep(client.index * stagger_ms / 1000)
            out = []
            for k in range(turns):
                out.append(await client.run_turn(order[k % n], k, settings))
                log.info("bench.v2v turn session=%d turn=%d status=%s v2v_ms=%s", client.index, k,
                         out[-1].status, out[-1].columns.get("v2v_ms"))
                if on_turn is not None:
                    on_turn(out[-1])
            return out

        try:
            per_session = await asyncio.gather(*(play(c, r) for c, r in zip(clients, connected, strict=True)))
        finally:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    level.turns = [t for ts in per_session for t in ts]
    level.timed(start)
    return level


async def bench_v2v(
    url: str,
    audio_files: Sequence[Path] | None = None,
    turns: int | None = None,
    sessions: int | Sequence[int] = 1,
    out_dir: Path | str | None = "bench-out",
    *,
    threshold_dbfs: float = AUDIBLE_DBFS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    silence_ms: float = DEFAULT_SILENCE_MS,
    settle_ms: float = DEFAULT_SETTLE_MS,
    stagger_ms: float = DEFAULT_STAGGER_MS,
    token: str = "",
    ready_timeout_s: float = 120.0,
    plot: bool = True,
    client: type[BenchSession] = BenchSession,  # the Realtime API's: bench/realtime_client.py; WHIP's: whip_client.py
    target: Target | None = None,  # the server and protocol (None: our server, the page's protocol)
    on_turn: Callable[[TurnResult], None] | None = None,
) -> BenchResult:
    """Run the bench at each concurrency level in turn; write ``v2v.json`` (and ``v2v.png``) to ``out_dir``.

    ``turns`` is per session (default: one per audio file); ``sessions`` an int or a list of levels. With no
    ``audio_files`` the bench plays its own English speech (``bench/speech.py``).
    """
    url = url.rstrip("/")
    target = target or Target("page", url)
    files = [Path(f) for f in audio_files] if audio_files else await bench_speech(["en"])
    utterances = load_utterances(files)
    turns = len(utterances) if turns is None else int(turns)
    levels = [sessions] if isinstance(sessions, int) else list(sessions)
    settings = TurnSettings(timeout_s=timeout_s, silence_ms=silence_ms, settle_ms=settle_ms)
    result = BenchResult(
        url=url,
        same_host=is_same_host(url),
        threshold_dbfs=threshold_dbfs,
        window_ms=WINDOW_MS,
        protocol=target.protocol,
        server=target.server,
        left_out=target.left_out,
        settings={
            "files": [u.name for u in utterances],
            "turns_per_session": turns,
            "sessions": levels,
            "timeout_s": timeout_s,
            "silence_ms": silence_ms,
            "settle_ms": settle_ms,
            "stagger_ms": stagger_ms,
        },
    )
    if target.ours:
        async with aiohttp.ClientSession() as http:
            await wait_server_ready(http, url, ready_timeout_s)
    for k in levels:
        log.info("bench.v2v level sessions=%d turns=%d", k, turns)
        level = await run_level(url, utterances, turns, k, settings=settings, threshold_dbfs=threshold_dbfs,
                                token=token or target.key, stagger_ms=stagger_ms, client=client, target=target,
                                on_turn=on_turn)
        result.levels.append(level)
    if out_dir is not None:
        write_outputs(result, Path(out_dir), plot)
    return result


def load_utterances(files: Sequence[Path]) -> list[Utterance]:
    """Each file read and resampled, its speech end from the manifest beside it (one read per folder)."""
    if not files:
        raise ValueError("no speech files to play")
    manifests: dict[Path, dict[str, dict]] = {}
    return [load_utterance(f, manifests.setdefault(f.parent, read_manifest(f.parent))) for f in files]


def write_outputs(result: BenchResult, out: Path, plot: bool = True) -> None:
    """``out/v2v.json``, and ``out/v2v.png`` when asked and matplotlib (the ``plot`` extra) is there."""
    result.json_path = write_json(result, out / "v2v.json")
    if plot:
        try:
            from assistant.bench.plots import plot_result
        except ImportError:  # matplotlib is the `plot` extra: the tables and the JSON need none of it
            log.warning("bench.v2v no_plot reason=matplotlib_missing hint=pip install 'assistant[plot]'")
        else:
            result.png_path = plot_result(result, out / "v2v.png")


def session_levels(text: str) -> list[int]:
    """``--sessions 1,4`` → [1, 4] (an argparse type)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not levels or any(k < 1 for k in levels):
        raise argparse.ArgumentTypeError("session counts must be ≥ 1")
    return levels
