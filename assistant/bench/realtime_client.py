"""The bench's Realtime API clients: the same voice-to-voice turns as ``bench/v2v.py``, through OpenAI's Realtime API,
to our server or any other that speaks it (``bench/targets.py``: the URL, the model, the key).

- :class:`RealtimeBenchSession` is the v2v client (same microphone track, same listener, same measurements)
  speaking the Realtime protocol over WebRTC, as OpenAI's WebRTC guide does it: a data channel named
  ``oai-events`` before the offer, the offer posted as a form (its ``sdp`` part, and a ``session`` part naming the
  model) to ``…/realtime/calls``, the call hung up at ``…/realtime/calls/{id}/hangup``. Its events are read back
  into the page protocol's shapes, so :meth:`BenchSession.run_turn` measures it exactly as it measures our page
  protocol.
- :func:`ws_turn` is one turn over the WebSocket (``…/realtime``), the way a server-side client streams a
  microphone: 20 ms of PCM16 per ``input_audio_buffer.append``, in real time. It measures from the append that
  carried the end of the speech (the server's VAD ends the turn), or from the last append (the client commits),
  to the first ``response.output_audio.delta`` and to the first audible sample in the deltas as a player would
  play them; :func:`bench_ws` runs such turns into a :class:`~assistant.bench.report.BenchResult`.

Event names are read in both of the API's spellings (the GA's ``response.output_audio.delta``, the beta's
``response.audio.delta``), since servers that copy the API follow one or the other.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import aiohttp
import numpy as np

from assistant.audio import float_to_s16, resample, s16_to_float
from assistant.bench.audio_source import Utterance, now
from assistant.bench.processes import cpu_snapshot
from assistant.bench.report import (
    BenchResult,
    LevelResult,
    TurnResult,
    add_server_columns,
    client_columns,
)
from assistant.bench.targets import Target
from assistant.bench.v2v import AUDIBLE_DBFS, WINDOW_MS, BenchEvent, BenchSession, is_same_host

log = logging.getLogger(__name__)

WS_RATE = 24_000  # PCM16 as the Realtime API takes and gives it by default
WS_FRAME_S = 0.02  # one microphone frame per append
WS_TAIL_S = 2.5  # silence streamed after the speech (the VAD needs its hangover)
AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")
TEXT_DELTAS = ("response.output_audio_transcript.delta", "response.audio_transcript.delta")
METRICS_GRACE_S = 2.0  # our server: how long after response.done its turn_metrics may still come


# --- WebRTC ------------------------------------------------------------------------------------------------
class RealtimeBenchSession(BenchSession):
    """A v2v bench peer that talks to ``/v1/realtime/calls`` (see the module docstring)."""

    call_path: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.realtime_events: list[tuple[float, dict[str, Any]]] = []
        self._reply_text: dict[str, str] = {}
        self._turn_of: dict[str, int] = {}

    channel_label = "oai-events"

    @staticmethod
    def endpoint_of(target: Target) -> str:
        return target.calls_url()

    async def exchange(self, offer: str) -> str:
        """The Realtime API's way: a form with the offer (``sdp``) and the session (``session``: its model) to
        ``…/realtime/calls``; the call's path comes back in ``Location``."""
        url = self.endpoint or Target("realtime", self.url, ours=self.ours).calls_url()
        session: dict[str, Any] = {"type": "realtime", **({"model": self.model} if self.model else {})}
        form = aiohttp.FormData()
        form.add_field("sdp", offer, content_type="application/sdp")
        form.add_field("session", json.dumps(session), content_type="application/json")
        async with self.http.post(url, data=form, headers=self._headers()) as resp:
            answer = await resp.text()
            if resp.status not in (200, 201):
                raise RuntimeError(f"call refused: HTTP {resp.status} {answer[:300]}")
            location = resp.headers.get("Location", "")
        self.call_path = urljoin(url, location) if location else ""
        self.session_id = location.rstrip("/").rsplit("/", 1)[-1]
        return answer

    def on_event(self, at: float, body: dict[str, Any]) -> None:
        self.realtime_events.append((at, body))
        for event in self.as_page_events(body):
            self.events.append(BenchEvent(at, event))

    def as_page_events(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """A Realtime server event in our page protocol's shape (what ``run_turn`` reads), if it has one."""
        kind = event.get("type")
        rid = event.get("response_id") or (event.get("response") or {}).get("id", "")
        if kind == "input_audio_buffer.speech_stopped":
            return [{"type": "speech_end"}]
        if kind == "conversation.item.input_audio_transcription.completed":
            return [{"type": "transcript", "final": True, "text": event.get("transcript", "")}]
        if kind in TEXT_DELTAS:
            self._reply_text[rid] = self._reply_text.get(rid, "") + str(event.get("delta", ""))
            return [{"type": "reply_text", "text": self._reply_text[rid]}]
        if kind == "assistant.turn_metrics":
            self._turn_of[rid] = int(event.get("turn", 0))
            return [{**event, "type": "turn_metrics"}]
        if kind == "response.done":
            return [{"type": "reply_done", "turn": self._turn_of.get(rid)}]
        if kind == "error":
            err = event.get("error") or {}
            if err.get("type") == "server_error":
                return [{"type": "error", "stage": err.get("code"), "message": err.get("message")}]
        return []

    async def close(self) -> None:
        if self.call_path and not self.failed:
            try:
                async with self.http.post(f"{self.call_path.split('?')[0]}/hangup", headers=self._headers()) as resp:
                    await resp.read()
            except (aiohttp.ClientError, OSError) as exc:
                log.info("bench.realtime hangup_failed error=%s", exc)
        self.session_id = ""  # hung up here: the page protocol's DELETE is not needed
        await super().close()


# --- WebSocket ---------------------------------------------------------------------------------------------
@dataclass
class WSTurn:
    """One WebSocket turn: what was measured, in ms, and what was said."""

    file: str
    mode: str  # "server_vad": the server ends the turn; "commit": the client does
    first_delta_ms: float | None = None  # the append holding the speech end (or the last append) → first delta
    v2v_ms: float | None = None  # the same append → the first audible sample, as a player plays the deltas
    transcript: str = ""
    reply: str = ""
    error: str = ""
    server: dict[str, Any] = field(default_factory=dict)  # our turn_metrics' durations (ours only)
    metrics: dict[str, Any] = field(default_factory=dict)  # our whole turn_metrics event (ours only)
    speech_end_at: float | None = None  # bench clock (audio_source.now), seconds
    first_delta_at: float | None = None
    heard_at: float | None = None


def pcm16_frames(utt: Utterance, tail_s: float) -> tuple[list[bytes], int]:
    """The utterance as 24 kHz PCM16 appends of ``WS_FRAME_S``, ``tail_s`` of silence after it; and the index of
    the frame that holds the last speech sample."""
    x = resample(s16_to_float(utt.pcm), 48_000, WS_RATE)
    x = np.concatenate([x, np.zeros(int(tail_s * WS_RATE), dtype=np.float32)])
    pcm = float_to_s16(x).astype("<i2").tobytes()
    step = int(WS_FRAME_S * WS_RATE) * 2
    frames = [pcm[i : i + step] for i in range(0, len(pcm), step)]
    return frames, int(utt.speech_end_s / WS_FRAME_S)


class DeltaPlayer:
    """Plays the audio deltas as a speaker that never drops audio would: each from ``max(arrival, the end of the
    one before)``; finds the first sample at or above the audible threshold."""

    def __init__(self, threshold_dbfs: float = AUDIBLE_DBFS) -> None:
        self.threshold = 10.0 ** (threshold_dbfs / 20.0)
        self.first_at: float | None = None
        self.heard_at: float | None = None
        self._play_end = 0.0

    def on_delta(self, b64: str, at: float) -> None:
        pcm = s16_to_float(np.frombuffer(base64.b64decode(b64), dtype="<i2"))
        if self.first_at is None:
            self.first_at = at
        play_at = max(at, self._play_end)
        self._play_end = play_at + len(pcm) / WS_RATE
        if self.heard_at is None:
            loud = np.flatnonzero(np.abs(pcm) >= self.threshold)
            if loud.size:
                self.heard_at = play_at + int(loud[0]) / WS_RATE


async def ws_turn(http: aiohttp.ClientSession, url: str, utt: Utterance, *, mode: str = "server_vad",
                  token: str = "", timeout_s: float = 30.0, target: Target | None = None,
                  threshold_dbfs: float = AUDIBLE_DBFS) -> WSTurn:
    """One turn over the Realtime WebSocket (see the module docstring); never raises for a turn that fails.
    ``target`` names the server, model and key (default: our server at ``url``, ``token`` as its key)."""
    target = target or Target("realtime-ws", url.rstrip("/"), key=token)
    result = WSTurn(utt.name, mode)
    player = DeltaPlayer(threshold_dbfs)
    mark: float | None = None
    async with http.ws_connect(target.realtime_ws_url(), headers=target.headers(), max_msg_size=0) as ws:

        async def send(event: dict[str, object]) -> None:
            await ws.send_str(json.dumps(event))

        if mode == "commit":
            await send({"type": "session.update",
                        "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
            frames, end = pcm16_frames(utt, 0.0)
            frames = frames[: end + 1]
        else:
            frames, end = pcm16_frames(utt, WS_TAIL_S)

        async def stream() -> None:
            nonlocal mark
            t0 = now()
            for k, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, t0 + k * WS_FRAME_S - now()))
                await send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()})
                if k == end or (mode == "commit" and k == len(frames) - 1):
                    mark = now()
            if mode == "commit":
                await send({"type": "input_audio_buffer.commit"})
                await send({"type": "response.create"})

        sender = asyncio.create_task(stream())
        deadline = now() + utt.seconds + WS_TAIL_S + timeout_s
        done = False
        try:
            while not done or (target.ours and not result.metrics):
                left = deadline - now()
                if left <= 0:
                    break
                try:
                    msg = await asyncio.wait_for(ws.receive(), left)
                except TimeoutError:
                    break
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    break
                at = now()
                event = json.loads(msg.data)
                kind = event.get("type")
                if kind in AUDIO_DELTAS and mark is not None:
                    player.on_delta(str(event.get("delta", "")), at)
                elif kind == "conversation.item.input_audio_transcription.completed":
                    result.transcript = event.get("transcript", "")
                elif kind == "assistant.turn_metrics":
                    result.metrics = event
                    result.server = event.get("durations_ms", {})
                elif kind == "error":
                    result.error = str((event.get("error") or {}).get("message", ""))
                elif kind == "response.done" and mark is not None:  # not a reply to part of the speech
                    result.reply = reply_transcript(event)
                    done = True
                    deadline = min(deadline, at + METRICS_GRACE_S)  # ours: its turn_metrics may follow
        finally:
            sender.cancel()
    if not done:
        result.error = result.error or "no response.done in time"
    result.speech_end_at = mark
    result.first_delta_at, result.heard_at = player.first_at, player.heard_at
    if mark is not None and player.first_at is not None:
        result.first_delta_ms = round((player.first_at - mark) * 1000, 1)
    if mark is not None and player.heard_at is not None:
        result.v2v_ms = round((player.heard_at - mark) * 1000, 1)
    return result


def reply_transcript(done: dict[str, Any]) -> str:
    """The spoken reply's transcript in a ``response.done`` (its first output's content), "" if it has none."""
    response = done.get("response")
    outputs = response.get("output") if isinstance(response, dict) else None
    for item in outputs if isinstance(outputs, list) else []:
        for part in (item.get("content") or []) if isinstance(item, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("transcript"), str):
                return str(part["transcript"])
    return ""


def ws_turn_result(turn: WSTurn, index: int, ours: bool) -> TurnResult:
    """A WebSocket turn as a row of the bench's result: the client's columns, and our server's stages."""
    result = TurnResult(session=0, index=index, file=turn.file, transcript=turn.transcript, reply_text=turn.reply)
    if turn.speech_end_at is None or turn.first_delta_at is None or turn.heard_at is None:
        result.status, result.reason = "dropped", turn.error or "no audible reply"
        return result
    result.client_marks_ms = {"speech_end": round(turn.speech_end_at * 1000, 1),
                              "first_frame_received": round(turn.first_delta_at * 1000, 1),
                              "heard": round(turn.heard_at * 1000, 1)}
    result.columns = client_columns(turn.speech_end_at, turn.first_delta_at, turn.heard_at)
    if turn.error:
        result.status, result.reason = "error", f"error: {turn.error}"
    if ours:
        if not turn.metrics:
            result.status, result.reason = "error", result.reason or "no assistant.turn_metrics event"
            return result
        result.server_turn = turn.metrics.get("turn")
        result.server_marks_ms = {k: float(v) for k, v in (turn.metrics.get("timestamps_ms") or {}).items()}
        result.gaps_ms = {k: float(v) for k, v in (turn.metrics.get("gaps_ms") or {}).items()}
        add_server_columns(result.columns, turn.metrics, turn.first_delta_at)
    return result


async def bench_ws(target: Target, utterances: Sequence[Utterance], turns: int, *, mode: str = "server_vad",
                   timeout_s: float = 30.0, threshold_dbfs: float = AUDIBLE_DBFS,
                   on_turn: Callable[[TurnResult], None] | None = None) -> BenchResult:
    """``turns`` WebSocket turns, one connection each, the utterances in turn; one level of one session."""
    result = BenchResult(url=target.url, same_host=is_same_host(target.url), threshold_dbfs=threshold_dbfs,
                         window_ms=WINDOW_MS, protocol=target.protocol, server=target.server,
                         left_out=target.left_out,
                         settings={"files": [u.name for u in utterances], "turns_per_session": turns, "sessions": [1],
                                   "timeout_s": timeout_s, "mode": mode, "model": target.model})
    level = LevelResult(sessions=1)
    start = cpu_snapshot()
    async with aiohttp.ClientSession() as http:
        for k in range(turns):
            utt = utterances[k % len(utterances)]
            try:
                turn = await ws_turn(http, target.url, utt, mode=mode, timeout_s=timeout_s, target=target,
                                     threshold_dbfs=threshold_dbfs)
            except (aiohttp.ClientError, OSError) as exc:
                level.errors.append(f"turn {k}: {type(exc).__name__}: {exc}")
                turn = WSTurn(utt.name, mode, error=f"could not connect: {exc}")
            row = ws_turn_result(turn, k, target.ours)
            level.turns.append(row)
            log.info("bench.realtime ws mode=%s file=%s status=%s v2v_ms=%s first_delta_ms=%s", mode, utt.name,
                     row.status, turn.v2v_ms, turn.first_delta_ms)
            if on_turn is not None:
                on_turn(row)
    level.timed(start)
    result.levels.append(level)
    return result
