"""The server's receive buffer: one packet by default, grown to the measured jitter, and a turn that still
works when the network reorders and loses packets."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import aiohttp
import pytest
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtp import RtpPacket

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.rtc.jitter import AdaptiveReceiveBuffer
from tests.conftest import serve, test_config


def _packet(seq: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * 960)
    p._data = bytes([seq % 256])  # type: ignore[attr-defined]
    return p


def _receiver(jitter_ts: int = 0) -> SimpleNamespace:
    r = SimpleNamespace()
    r._RTCRtpReceiver__jitter_buffer = None
    r._RTCRtpReceiver__remote_streams = {1: SimpleNamespace(jitter=jitter_ts)}
    return r


def test_one_packet_prefetch_releases_each_packet_on_the_next() -> None:
    buf = AdaptiveReceiveBuffer(_receiver(), initial_packets=1, max_packets=6, adaptive=True).buffer
    assert buf is not None
    out = [buf.add(_packet(s))[1] for s in range(5)]
    # Packet k is released when k+1 arrives: 20 ms of buffering instead of aiortc's 80.
    assert out[0] is None and [f.timestamp // 960 for f in out[1:]] == [0, 1, 2, 3]


def test_reordered_packets_come_out_in_order() -> None:
    buf = AdaptiveReceiveBuffer(_receiver(), initial_packets=1, max_packets=6, adaptive=True).buffer
    assert buf is not None
    released = []
    for s in [0, 1, 3, 2, 4, 6, 5, 7, 8]:
        frame = buf.add(_packet(s))[1]
        if frame is not None:
            released.append(frame.timestamp // 960)
    assert released == sorted(released) == list(range(len(released)))
    assert released[-1] >= 6


def test_buffer_grows_with_jitter_and_shrinks_slowly() -> None:
    receiver = _receiver(jitter_ts=0)
    rb = AdaptiveReceiveBuffer(receiver, initial_packets=1, max_packets=6, adaptive=True)
    assert rb.adapt() == 1
    streams = receiver._RTCRtpReceiver__remote_streams  # type: ignore[attr-defined]
    streams[1].jitter = 48 * 30  # 30 ms of jitter → 2 × 30 / 20 = 3 packets
    assert rb.adapt() == 3 and rb.buffer._prefetch == 3  # type: ignore[union-attr]
    streams[1].jitter = 48 * 500
    assert rb.adapt() == 6  # capped
    streams[1].jitter = 0
    assert [rb.adapt() for _ in range(3)] == [5, 4, 3]  # one packet at a time
    fixed = AdaptiveReceiveBuffer(receiver, initial_packets=2, max_packets=6, adaptive=False)
    streams[1].jitter = 48 * 500
    assert fixed.adapt() == 2


@pytest.mark.asyncio
@pytest.mark.slow
async def test_turn_survives_reordering_and_loss(shared_audio, monkeypatch: pytest.MonkeyPatch) -> None:
    """5 % of packets swapped with their successor and 2 % lost on the way in: the turn still works."""
    original = RTCRtpReceiver._handle_rtp_packet
    rng = random.Random(7)
    held: dict[int, RtpPacket] = {}

    async def unreliable(self: RTCRtpReceiver, packet: RtpPacket, arrival_time_ms: int) -> None:
        key = id(self)
        if key in held:  # deliver the newer packet first, then the one held back
            older = held.pop(key)
            await original(self, packet, arrival_time_ms)
            await original(self, older, arrival_time_ms)
            return
        roll = rng.random()
        if roll < 0.02:
            return
        if roll < 0.07:
            held[key] = packet
            return
        await original(self, packet, arrival_time_ms)

    monkeypatch.setattr(RTCRtpReceiver, "_handle_rtp_packet", unreliable)
    async with serve(test_config()) as (url, _app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        try:
            result = await client.run_turn(
                load_utterance(shared_audio / "en_weather.wav"), 0, TurnSettings(timeout_s=40.0)
            )
        finally:
            await client.close()
            await asyncio.sleep(0)
    assert result.status == "ok", result.reason
    assert "weather" in result.transcript.lower()
