"""The bench's Realtime API clients: the same voice-to-voice turns as ``bench/v2v.py``, through the Realtime API.

- :class:`RealtimeBenchSession` is the v2v client (same microphone track, same listener, same measurements)
  speaking the Realtime protocol over WebRTC, as OpenAI's WebRTC guide does it: a data channel named
  ``oai-events`` before the offer, the offer posted as ``application/sdp`` to ``/v1/realtime/calls``, the call
  hung up at ``/v1/realtime/calls/{id}/hangup``. Its events are read back into the page protocol's shapes, so
  :meth:`BenchSession.run_turn` measures it exactly as it measures our page protocol.
- :func:`ws_turn` is one turn over the WebSocket (``/v1/realtime``), the way a server-side client streams a
  microphone: 20 ms of PCM16 per ``input_audio_buffer.append``, in real time. It measures the time from the
  append that carried the end of the speech (server VAD), or from the last append (the client commits), to the
  first ``response.output_audio.delta``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from assistant.audio import float_to_s16, resample, s16_to_float
from assistant.bench.audio_source import Utterance
from assistant.bench.v2v import BenchEvent, BenchSession

log = logging.getLogger(__name__)

WS_RATE = 24_000  # PCM16 as the Realtime API takes it
WS_FRAME_S = 0.02  # one microphone frame per append
WS_TAIL_S = 2.5  # silence streamed after the speech (the VAD needs its hangover)


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

    async def exchange(self, offer: str) -> str:
        """The Realtime API's way: the SDP itself to ``/v1/realtime/calls``; the call's path comes back."""
        headers = {"Content-Type": "application/sdp", **self._headers()}
        async with self.http.post(f"{self.url}/v1/realtime/calls?model=default&extensions=1", data=offer,
                                  headers=headers) as resp:
            answer = await resp.text()
            if resp.status != 201:
                raise RuntimeError(f"call refused: HTTP {resp.status} {answer[:300]}")
            self.call_path = resp.headers.get("Location", "")
        self.session_id = self.call_path.rsplit("/", 1)[-1]
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
        if kind == "response.output_audio_transcript.delta":
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
                async with self.http.post(f"{self.url}{self.call_path}/hangup", headers=self._headers()) as resp:
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
    transcript: str = ""
    reply: str = ""
    error: str = ""
    server: dict[str, Any] = field(default_factory=dict)


def pcm16_frames(utt: Utterance, tail_s: float) -> tuple[list[bytes], int]:
    """The utterance as 24 kHz PCM16 appends of ``WS_FRAME_S``, ``tail_s`` of silence after it; and the index of
    the frame that holds the last speech sample."""
    x = resample(s16_to_float(utt.pcm), 48_000, WS_RATE)
    x = np.concatenate([x, np.zeros(int(tail_s * WS_RATE), dtype=np.float32)])
    pcm = float_to_s16(x).astype("<i2").tobytes()
    step = int(WS_FRAME_S * WS_RATE) * 2
    frames = [pcm[i : i + step] for i in range(0, len(pcm), step)]
    return frames, int(utt.speech_end_s / WS_FRAME_S)


async def ws_turn(http: aiohttp.ClientSession, url: str, utt: Utterance, *, mode: str = "server_vad",
                  token: str = "", timeout_s: float = 30.0) -> WSTurn:
    """One turn over ``/v1/realtime`` (see the module docstring); never raises for a turn that fails."""
    result = WSTurn(utt.name, mode)
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=default&extensions=1"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    mark: float | None = None
    async with http.ws_connect(ws_url, headers=headers, max_msg_size=0) as ws:

        async def send(event: dict[str, Any]) -> None:
            await ws.send_str(json.dumps(event))

        if mode == "commit":
            await send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
            frames, end = pcm16_frames(utt, 0.0)
            frames = frames[: end + 1]
        else:
            frames, end = pcm16_frames(utt, WS_TAIL_S)

        async def stream() -> None:
            nonlocal mark
            t0 = time.perf_counter()
            for k, frame in enumerate(frames):
                await asyncio.sleep(max(0.0, t0 + k * WS_FRAME_S - time.perf_counter()))
                await send({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()})
                if k == end or (mode == "commit" and k == len(frames) - 1):
                    mark = time.perf_counter()
            if mode == "commit":
                await send({"type": "input_audio_buffer.commit"})
                await send({"type": "response.create"})

        sender = asyncio.create_task(stream())
        try:
            async with asyncio.timeout(utt.seconds + WS_TAIL_S + timeout_s):
                async for msg in ws:
                    if msg.type is not aiohttp.WSMsgType.TEXT:
                        break
                    event = json.loads(msg.data)
                    kind = event.get("type")
                    if kind == "response.output_audio.delta" and result.first_delta_ms is None and mark:
                        result.first_delta_ms = round((time.perf_counter() - mark) * 1000, 1)
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        result.transcript = event.get("transcript", "")
                    elif kind == "assistant.turn_metrics":
                        result.server = event.get("durations_ms", {})
                    elif kind == "error":
                        result.error = str((event.get("error") or {}).get("message", ""))
                    elif kind == "response.done":
                        out = (event.get("response") or {}).get("output") or [{}]
                        result.reply = str(((out[0].get("content") or [{}])[0]).get("transcript", ""))
                        break
        except TimeoutError:
            result.error = result.error or "no response.done in time"
        finally:
            sender.cancel()
    return result
