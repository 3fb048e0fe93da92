"""Sessions: one conversation each, with what its transport needs. :class:`Session` is a browser's (or a WHIP or
Realtime WebRTC client's): an aiortc peer, its reply track, its data channels. :class:`ConversationSession` is
the part every transport shares (the Realtime API's WebSocket uses it alone).

Every task a session starts is owned by it and cancelled by :meth:`ConversationSession.close`; nothing a
session does can reach another session's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack
from zoneinfo import ZoneInfo

from aiortc import RTCDataChannel, RTCIceCandidate, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from assistant.audio import AudioChunk
from assistant.body import loads_bounded
from assistant.config import Config
from assistant.config.respond import known_timezones
from assistant.pipeline.conversation import Conversation, TurnDeps
from assistant.pipeline.events import DataChannel, EventChannel
from assistant.pipeline.reply import ReplySink
from assistant.pipeline.turn import Turn
from assistant.respond.base import Responder
from assistant.respond.skills.timers import CallTimers, Timer
from assistant.rtc import audio_level
from assistant.rtc.inbound import InboundAudio, read_track
from assistant.rtc.jitter import AdaptiveReceiveBuffer
from assistant.rtc.outbound import ReplyTrack
from assistant.server.services import Services
from assistant.server.voice.ice import ice_servers, rtc_configuration
from assistant.server.voice.sdpfrag import ice_credentials
from assistant.telemetry import carry, names

if TYPE_CHECKING:
    from assistant.telemetry.spans import CallTrace

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_CLIENT_MESSAGE = 4096  # a message the page sends on the events channel (a setting): bigger ones are dropped


def language_choices(services: Services) -> list[str]:
    """What a session may be heard in: ``auto`` (a multilingual ASR detects each turn's language) and the codes
    the ASR hears (``asr.languages``)."""
    asr = services.asr
    return (["auto"] if getattr(asr, "detects", False) else []) + list(getattr(asr, "languages", ("en",)))


def choose_language(services: Services, language: object) -> str:
    """``language`` if a session may be heard in it (:func:`language_choices`), else ValueError naming them."""
    choices = language_choices(services)
    if not isinstance(language, str) or language not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, got {language!r}")
    return language


def answered_codec(sdp: str) -> str:
    """The audio codec an SDP answer chose: its audio section's first payload type, as its rtpmap names it
    (``opus/48000/2``); empty when the answer has none."""
    payload, codecs = "", {}
    for line in sdp.splitlines():
        if line.startswith("m="):
            if payload:
                break
            fields = line.split()
            if line.startswith("m=audio") and len(fields) > 3:
                payload = fields[3]
        elif payload and line.startswith("a=rtpmap:"):
            pt, _, name = line[len("a=rtpmap:"):].partition(" ")
            codecs[pt] = name.strip()
    return codecs.get(payload, "").lower()


def new_session_id(gateway_id: str = "") -> str:
    """A fresh session id; behind a dispatcher ``GATEWAY.TOKEN``, so the id names the gateway that holds it.

    The token's alphabet (URL-safe base64) has no dot, so the first dot always ends the gateway id.
    """
    token = secrets.token_urlsafe(12)
    return f"{gateway_id}.{token}" if gateway_id else token


class SessionOptions(TypedDict, total=False):
    """What a session is opened with besides its transport, the same for every kind of session."""

    responder: str | Responder | None  # a responder object, or the name of one (None: the configured one)
    voice: str | None                  # the TTS voice (None: the engine's default)
    client: str                        # who opens it: the key of the per-client limits


class ConversationSession:
    """What every session has, whatever its transport: an id, one conversation with its reply sink and events,
    the tasks it owns, and its close.

    The peer (:class:`Session`) is one transport; the Realtime API's WebSocket (``server/realtime/``) is
    another, with a sink of its own and audio fed to :attr:`conversation` as it arrives.
    """

    # What telemetry's call span says of it (assistant/telemetry/): the transport (page, whip, realtime_webrtc,
    # realtime_websocket, phone), the audio codec, and the W3C traceparent the caller sent (signaling.admit).
    transport = ""
    codec = ""
    traceparent = ""

    def __init__(
        self,
        services: Services,
        cfg: Config | None,
        sink: ReplySink,
        on_closed: Callable[[ConversationSession], None] | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        cfg = cfg or services.cfg
        self.cfg = cfg
        self.id = new_session_id(cfg.server.gateway_id)
        self.client = options.get("client", "")  # who opened it (the key of the per-client limits)
        self.owner = ""  # the key that opened it (keys.Principal.id; signaling.admit sets it): who may act on it
        self.cap_group = ""  # whose session cap it counts against (keys.Principal.group; "": the owner's)
        self.connected = True  # a peerless session is connected once admitted; a peer's says when it is
        self.services = services
        self.created = time.monotonic()
        self.created_wall = time.time()
        self.closed = False
        self.close_reason = ""
        self._on_closed = on_closed
        self._tasks: set[asyncio.Task[object]] = set()
        self.sink = sink
        self.events = EventChannel()
        metrics = services.metrics
        # Sessions are admitted only once the engines are loaded (signaling.check_ready).
        assert services.asr is not None and services.tts is not None, "a session before the engines loaded"
        responder = options.get("responder")
        # This call's skills (respond/skills/): its time zone and its timers, which speak on this call when they end
        # and end with it. A responder handed over made (the Realtime API's) brings its own skills, without timers.
        given = responder if responder is not None and not isinstance(responder, str) else None
        self.timers = None if given is not None else CallTimers(
            max_timers=cfg.respond.max_timers, max_seconds=cfg.respond.max_timer_s, on_due=self._timer_due,
            on_change=self._timers_changed)
        self.call = services.call_context(self.timers)
        deps = TurnDeps(
            asr=services.asr,
            tts=services.tts,
            responder=given if given is not None else services.with_skills(
                services.responder_for(responder if isinstance(responder, str) else None), self.call, cfg.respond),
            voice=options.get("voice"),
            on_turn_done=lambda trace: metrics.observe_turn(trace.durations_ms(), trace.gaps_ms()),
            on_error=lambda stage: metrics.errors_total.labels(stage=stage).inc(),
            on_interrupted=metrics.interruptions_total.inc,
            end_of_turn=services.end_of_turn,
            on_turn_end=self._turn_traced if services.telemetry is not None else None,
        )
        self.responder = deps.responder
        # A better model swapped in during the call (respond.model_path = auto): the page hears who answers now.
        shared = given is None and (responder is None or responder == cfg.respond.engine)
        self._unsubscribe_model = services.on_model_change(self._model_changed) if shared else None
        self._call_trace: CallTrace | None = None
        if services.telemetry is not None:  # engines in other processes (Ray) join this call's trace
            carry.register(self.id, self._trace_headers)
        self.conversation = Conversation(
            cfg, services.make_endpointer(cfg.vad), deps, sink, self.events, session_id=self.id
        )

    def _model_changed(self, status: object) -> None:
        if not self.closed:
            self.events.emit("responder", **self.services.describe_responder())

    # --- timers (respond/skills/timers.py) ---------------------------------------------------------------
    def _timer_due(self, timer: Timer, text: str) -> None:
        """A timer of this call rang: the assistant says so at the conversation's next pause."""
        if not self.closed:
            self.conversation.announce(text, timer.language)

    def _timers_changed(self, action: str, timer: Timer, timers: list[Timer]) -> None:
        self.events.emit("timer", action=action, timer=timer.as_event(), timers=[t.as_event() for t in timers])

    def set_timezone(self, name: object) -> str:
        """The user's time zone for this call's clock and alarms (the page sends it); ValueError if it is no IANA
        time zone this machine knows."""
        if not isinstance(name, str) or name not in known_timezones():
            raise ValueError(f"not an IANA time zone: {str(name)[:64]!r}")
        self.call.timezone = ZoneInfo(name)
        return name

    # --- telemetry (off: services.telemetry is None, and none of this runs) ------------------------------
    def call_trace(self) -> CallTrace | None:
        """This session's spans (started with its first turn's end or its close), when telemetry is on."""
        telemetry = self.services.telemetry
        if self._call_trace is None and telemetry is not None:
            self._call_trace = telemetry.call(self.id, self.created_wall, self.traceparent, self.call_attributes)
        return self._call_trace

    def _trace_headers(self) -> dict[str, str]:
        """The call span's W3C context, for an engine request sent to another process (telemetry/carry.py)."""
        trace = self.call_trace()
        return trace.headers() if trace is not None and not self.closed else {}

    def _turn_traced(self, turn: Turn) -> None:
        if (trace := self.call_trace()) is not None:
            trace.turn_ended(turn)

    def call_attributes(self) -> dict[str, Any]:
        """What the call span says of this session (names in assistant/telemetry/names.py)."""
        responder = self.responder
        describe = getattr(responder, "describe", None) or getattr(getattr(responder, "inner", None), "describe", None)
        info = dict(describe()) if describe is not None else {}
        engine = str(info.get("engine") or getattr(getattr(responder, "inner", responder), "name", ""))
        model = str(info.get("model") or (self.cfg.respond.model if engine == "openai" else ""))
        return {names.TRANSPORT: self.transport, names.CODEC: self.codec, names.KEY_ID: self.owner,
                names.LANGUAGE: self.conversation.language or self.cfg.asr.language, names.PROVIDER: engine,
                names.SYSTEM: engine, names.REQUEST_MODEL: model, names.GATEWAY: self.cfg.server.gateway_id,
                names.CARRIER: getattr(self, "carrier", "")}

    # --- lifecycle ---------------------------------------------------------------------------------
    def spawn(self, coro: Coroutine[object, object, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("session_task_failed session=%s task=%s error=%r", self.id, task.get_name(), task.exception())

    @property
    def task_count(self) -> int:
        return sum(1 for t in self._tasks if not t.done())

    async def close(self, reason: str = "closed") -> None:
        """Close in one fixed order: input stops (from the first line on, no audio reaches the conversation, so
        no turn can start after close: see :meth:`feed`), the client is told why, the session's own tasks end
        (inbound reader, watchdog), then the conversation (its turn), what the transport holds (track, peer);
        last, the session table."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        log.info("session_close session=%s reason=%s turns=%d", self.id, reason, self.conversation.turns)
        if self.timers is not None:  # the call's timers end with it: none rings after
            self.timers.close()
        if self._unsubscribe_model is not None:
            self._unsubscribe_model()
        with contextlib.suppress(Exception):
            self.events.emit("close", reason=reason)
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        try:
            await self.conversation.close()
        except Exception as exc:  # the rest must close all the same
            log.warning("session_close_step_failed session=%s step=conversation error=%r", self.id, exc)
        try:
            await self._release()
        except Exception as exc:
            log.warning("session_close_step_failed session=%s step=transport error=%r", self.id, exc)
        try:  # the call's span (a responder's describe() is read into it): a fault there must not keep the slot
            if (trace := self.call_trace()) is not None:
                trace.end(reason)
        except Exception as exc:
            log.warning("session_close_step_failed session=%s step=telemetry error=%r", self.id, exc)
        finally:
            carry.forget(self.id)
            if self._on_closed is not None:
                self._on_closed(self)

    async def _release(self) -> None:
        """What the transport holds besides tasks (a peer, a track): let go of it at close."""

    def feed(self, chunk: AudioChunk) -> None:
        """Inbound audio to the conversation, while the session is open (a frame decoded after close is dropped)."""
        if not self.closed:
            self.conversation.feed(chunk)

    def watch(self) -> None:
        """Start the watchdog: the session closes itself when :meth:`_stale` names a reason."""
        self.spawn(self._watchdog(), "watchdog")

    async def _watchdog(self) -> None:
        while not self.closed:
            await asyncio.sleep(min(1.0, self.cfg.server.idle_timeout_s / 4))
            reason = self._stale()
            if reason:
                await self.close(reason)
                return

    def _stale(self) -> str:
        """Why this session should close now ("" while it is alive): nobody spoke for ``max_silence_s``."""
        if time.time() - self.conversation.last_activity_wall > self.cfg.server.max_silence_s and not (
                self.timers is not None and self.timers.timers):  # a call waiting for its timer is not idle
            return "silence_timeout"
        return ""


class Session(ConversationSession):
    """One browser (or WHIP, or Realtime WebRTC) session: an aiortc peer, its reply track, its conversation.

    Data channels are attached by label (:attr:`channels`): ``events`` carries our page's protocol; the
    Realtime API adds ``oai-events``.
    """

    def __init__(
        self,
        services: Services,
        cfg: Config | None = None,
        on_closed: Callable[[ConversationSession], None] | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        cfg = cfg or services.cfg
        self.track = ReplyTrack(queue_ms=cfg.audio.reply_queue_ms)
        super().__init__(services, cfg, self.track, on_closed, **options)
        # The server's peer gets TURN credentials of its own, minted for this session and expiring with it.
        audio_level.install()  # aiortc's per-packet audio level, from numpy (rtc/audio_level.py)
        self.pc = RTCPeerConnection(rtc_configuration(ice_servers(cfg.ice, self.id), cfg.ice.transport_policy))
        self.etag = f'"{secrets.token_urlsafe(9)}"'  # names this ICE session for trickle PATCHes (If-Match)
        self.remote_ice: tuple[str | None, str | None] = (None, None)  # the offer's ice-ufrag, ice-pwd
        self.remote_candidates = 0
        self.channels: dict[str, Callable[[DataChannel], None]] = {"events": self._attach_events}
        # Where the peer's audio goes: the conversation (the Realtime API may hold it back while turn detection is off).
        self.on_audio: Callable[[AudioChunk], None] = self.feed
        self.last_audio_wall = time.time()  # the latest audio frame from the peer
        self.audio_started = False
        self.connected = False  # the peer reached "connected" at least once
        self.receive_buffer: AdaptiveReceiveBuffer | None = None
        self.inbound = InboundAudio()
        self._wire_peer()

    async def accept(self, sdp: str, type_: str) -> RTCSessionDescription:
        """Apply the browser's offer and return our answer (ICE candidates gathered into it)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=type_))
        self.remote_ice = ice_credentials(sdp)
        # After the remote description, so the reply rides on the offered (sendrecv) audio transceiver.
        self.pc.addTrack(self.track)
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        self.codec = answered_codec(self.pc.localDescription.sdp)
        self.watch()
        return self.pc.localDescription

    async def add_remote_candidates(self, candidates: list[RTCIceCandidate], end: bool) -> None:
        """Trickled candidates of the remote peer (``end``: it has no more); bounded per session."""
        limit = self.cfg.ice.max_remote_candidates
        if self.remote_candidates + len(candidates) > limit:
            raise OverflowError(f"a session takes at most {limit} trickled candidates")
        self.remote_candidates += len(candidates)
        for cand in candidates:
            # aioice pairs UDP host, server-reflexive and relay candidates; others cannot be used.
            if cand.protocol.lower() == "udp" and cand.type != "prflx":
                await self.pc.addIceCandidate(cand)
        if end:
            await self.pc.addIceCandidate(None)
        log.info(
            "trickle session=%s candidates=%d end=%s total=%d", self.id, len(candidates), end, self.remote_candidates
        )

    async def _release(self) -> None:
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()

    def _attach_events(self, channel: DataChannel) -> None:
        self.events.attach(channel)
        channel.add_listener("message", self._on_client_message)
        self._announce()

    def _announce(self) -> None:
        """The ``session`` event: its id, the language it is heard in and the ones it may be set to."""
        self.events.emit("session", session_id=self.id, language=self.conversation.language or self.cfg.asr.language,
                         languages=language_choices(self.services))

    def _on_client_message(self, message: object) -> None:
        """What the page may ask on the events channel: ``{"type": "language", "language": "ja"}`` (or ``auto``),
        checked like the offer's field, and ``{"type": "timezone", "timezone": "Europe/Paris"}`` (the browser's own,
        for the clock and alarms); a bad ask gets an ``error`` event, the call goes on."""
        if not isinstance(message, str) or len(message) > MAX_CLIENT_MESSAGE:
            return
        try:
            body = loads_bounded(message)  # nesting bounded: a deep message is bad JSON, not a RecursionError
        except ValueError:
            return
        if isinstance(body, dict) and body.get("type") == "timezone":
            try:
                log.info("session_timezone session=%s timezone=%s", self.id, self.set_timezone(body.get("timezone")))
            except ValueError as exc:
                self.events.emit("error", stage="timezone", message=f"timezone: {exc}")
            return
        if not isinstance(body, dict) or body.get("type") != "language":
            return
        try:
            language = choose_language(self.services, body.get("language"))
        except ValueError as exc:
            self.events.emit("error", stage="language", message=f"language: {exc}")
            return
        self.conversation.set_language(language)
        log.info("session_language session=%s language=%s", self.id, language)
        self._announce()

    # --- peer events -------------------------------------------------------------------------------
    def _wire_peer(self) -> None:
        pc = self.pc

        @pc.on("datachannel")
        def _on_datachannel(channel: RTCDataChannel) -> None:
            attach = self.channels.get(channel.label)
            if attach is not None:
                attach(channel)

        @pc.on("track")
        def _on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio" and not self.audio_started:
                self.audio_started = True
                audio = self.cfg.audio
                if audio.own_receive_buffer:
                    self.receive_buffer = AdaptiveReceiveBuffer.for_track(
                        pc, track, audio.jitter_buffer_packets, audio.jitter_buffer_max_packets, audio.jitter_adaptive
                    )
                self.spawn(self._read_audio(track), "inbound")

        @pc.on("connectionstatechange")
        async def _on_state() -> None:
            state = pc.connectionState
            log.info("peer_state session=%s state=%s", self.id, state)
            if state == "connected":
                self.connected = True
            if state in ("failed", "closed"):
                self.spawn(self.close(f"peer_{state}"), "close")

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        """Each decoded frame goes straight to the conversation (VAD inline: no queue, no added delay)."""
        buffer = self.receive_buffer.buffer if self.receive_buffer is not None else None
        # Chunks carry their packets' arrival times: the time our receive buffer held them counts.
        await read_track(track, self._on_chunk, self.inbound, arrival=buffer.arrival if buffer is not None else None)
        if not self.closed:
            self.spawn(self.close("audio_ended"), "close")

    def _on_chunk(self, chunk: AudioChunk) -> None:
        if self.closed:  # a frame decoded after close goes nowhere
            return
        self.last_audio_wall = time.time()
        self.on_audio(chunk)

    def media_abuse(self) -> str:
        """What the peer's media did that no real client does (a flood, garbage, jumps), or empty."""
        buffer = self.receive_buffer.buffer if self.receive_buffer is not None else None
        return (buffer.abuse() if buffer is not None else "") or self.inbound.abuse()

    def _stale(self) -> str:
        """Close a peer whose media is hostile (:meth:`media_abuse`), that never connects, that stopped sending
        audio, or in which nobody spoke for long."""
        if self.receive_buffer is not None:
            self.receive_buffer.adapt()
        if reason := self.media_abuse():
            return reason
        # Not audio_started: aiortc announces the remote track as soon as the offer is applied, before
        # any packet or connection exists; only the connection state tells a peer that never came.
        if not self.connected:
            return "connect_timeout" if time.monotonic() - self.created > self.cfg.server.connect_timeout_s else ""
        if time.time() - self.last_audio_wall > self.cfg.server.idle_timeout_s:
            return "idle_timeout"
        return super()._stale()
