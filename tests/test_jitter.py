"""The server's receive buffer: in order with no prefetch, brief waits for holes, no lasting lag after a
loss (aiortc's own buffer stays 280 ms behind after one), and a turn that works through reordering and loss."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import aiohttp
import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtp import RtpPacket

from assistant.bench.audio_source import load_utterance
from assistant.bench.v2v import BenchSession, TurnSettings
from assistant.rtc.jitter import (
    FLOOD_CLOSE_PACKETS,
    GARBAGE_CLOSE_PACKETS,
    MAX_JUMPS,
    PACKET_BURST,
    AdaptiveReceiveBuffer,
    AudioReceiveBuffer,
    is_valid_opus,
)
from assistant.server.app import SESSIONS
from tests.conftest import serve, test_config


def _packet(seq: int) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=seq % 65536, timestamp=seq * 960 % 2**32)
    p._data = bytes([seq % 256])  # type: ignore[attr-defined]
    return p


def _play(buffer: object, order: list[int]) -> list[tuple[int, int]]:
    """Feed packets in ``order``; returns (seq of the packet that released it, released seq) pairs."""
    out: list[tuple[int, int]] = []
    extra: list[int] = []
    if isinstance(buffer, AudioReceiveBuffer):
        buffer._emit_extra = lambda frame, _packet: extra.append(frame.timestamp // 960)
    for s in order:
        frame = buffer.add(_packet(s))[1]  # type: ignore[attr-defined]
        released = ([frame.timestamp // 960] if frame is not None else []) + extra
        extra.clear()
        out += [(s, r) for r in released]
    return out


def test_in_order_packets_are_released_at_once() -> None:
    assert _play(AudioReceiveBuffer(1), list(range(6))) == [(s, s) for s in range(6)]


def test_reordered_packets_come_out_in_order_and_none_is_lost() -> None:
    buf = AudioReceiveBuffer(1)
    got = [r for _, r in _play(buf, [0, 1, 3, 2, 4, 6, 5, 7, 8])]
    assert got == list(range(9)) and buf.lost == 0


def test_a_lost_packet_costs_a_hole_not_a_lasting_delay() -> None:
    order = [s for s in range(200) if s != 50]
    ours = _play(AudioReceiveBuffer(1), order)
    assert [r for _, r in ours] == [s for s in range(200) if s != 50]
    lag = [arrived - released for arrived, released in ours]
    assert max(lag) <= 2 and all(x == 0 for x in lag[60:])  # caught up right after the hole
    # aiortc's own buffer (prefetch 1) stays 14 packets = 280 ms behind after that single loss.
    stock = _play(JitterBuffer(capacity=16, prefetch=1), order)
    assert [a - r for a, r in stock][-1] == 14


def test_sequence_numbers_wrap() -> None:
    got = [r for _, r in _play(AudioReceiveBuffer(1), list(range(65530, 65542)))]
    assert got == list(range(65530, 65542))


def _receiver(jitter_ts: int = 0) -> SimpleNamespace:
    r = SimpleNamespace()
    r._RTCRtpReceiver__jitter_buffer = None
    r._RTCRtpReceiver__decoder_queue = None
    r._RTCRtpReceiver__codecs = {}
    r._RTCRtpReceiver__remote_streams = {1: SimpleNamespace(jitter=jitter_ts)}
    return r


# --- hostile peers ---------------------------------------------------------------------------------------------
def test_a_sequence_jump_is_given_up_in_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = AudioReceiveBuffer(1)
    checks = []
    original = AudioReceiveBuffer._hole_expired
    monkeypatch.setattr(AudioReceiveBuffer, "_hole_expired", lambda self: checks.append(1) or original(self))
    got = [r for _, r in _play(buf, [*range(10), *range(32_777, 32_780)])]
    assert got == [*range(10), *range(32_777, 32_780)]
    assert buf.lost == 32_767 and len(checks) == 1  # one check for the whole jump, not one per missing packet
    assert buf.abuse() == ""  # one jump is not yet a pattern


def test_a_long_call_with_a_burst_now_and_then_is_not_a_flood() -> None:
    """Every minute of an hour's call, a burst past the packet budget (packets a network stall held, arriving at
    once): some are dropped each time, more than a flood's worth in all; no flood, while the same count at once is."""
    now = [0.0]
    buf = AudioReceiveBuffer(1, clock=lambda: now[0])
    seq = 0
    for _ in range(60):
        for _ in range(PACKET_BURST + 20):  # the burst: 20 past the budget are dropped
            buf.add(_packet(seq))
            seq += 1
        now[0] += 60.0
    assert buf.flooded == 60 * 20 > FLOOD_CLOSE_PACKETS and buf.abuse() == ""


def test_repeated_jumps_a_flood_and_garbage_each_name_the_peer() -> None:
    jumper = AudioReceiveBuffer(1)
    _play(jumper, [(k * 20_000) % 65_536 for k in range(MAX_JUMPS + 1)])
    assert jumper.abuse() == "rtp_jumps"
    flood = AudioReceiveBuffer(1)
    released = _play(flood, list(range(PACKET_BURST + FLOOD_CLOSE_PACKETS + 10)))
    assert flood.flooded >= FLOOD_CLOSE_PACKETS and flood.abuse() == "rtp_flood"
    assert len(released) <= PACKET_BURST + 10  # the rest was dropped before any decoding
    garbage = AudioReceiveBuffer(1, is_opus=lambda payload_type: payload_type == 111)
    for seq in range(GARBAGE_CLOSE_PACKETS):
        p = _packet(seq)
        p._data = bytes([0x03])  # type: ignore[attr-defined]  # code 3 without its frame-count byte (R5)
        assert garbage.add(p) == (False, None)
    assert garbage.abuse() == "rtp_garbage"


def test_opus_framing_rules() -> None:
    import av
    import numpy as np

    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate, enc.layout, enc.format, enc.bit_rate = 48_000, "stereo", "s16", 96_000
    packets = []
    for i in range(10):
        frame = av.AudioFrame.from_ndarray((np.random.randn(1, 1920) * 3000).astype(np.int16), format="s16",
                                           layout="stereo")
        frame.sample_rate, frame.pts = 48_000, i * 960
        packets += [bytes(p) for p in enc.encode(frame)]
    assert packets and all(is_valid_opus(p) for p in packets)
    assert not is_valid_opus(b"")                       # R1
    assert not is_valid_opus(bytes([0x01, 1, 2, 3]))    # R3: code 1 with an odd frame split
    assert not is_valid_opus(bytes([0x02, 250, 1]))     # R4: first frame longer than the packet
    assert not is_valid_opus(bytes([0xFB, 0x07]))       # R5: 7 x 20 ms > 120 ms
    assert is_valid_opus(bytes([0xFB, 0x03, 1, 2, 3]))  # CBR 3 x 1 byte


def test_hole_wait_grows_with_jitter_and_shrinks_slowly() -> None:
    receiver = _receiver(jitter_ts=0)
    rb = AdaptiveReceiveBuffer(receiver, initial_packets=1, max_packets=6, adaptive=True)
    assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, AudioReceiveBuffer)
    assert rb.adapt() == 1
    streams = receiver._RTCRtpReceiver__remote_streams
    streams[1].jitter = 48 * 30  # 30 ms of jitter → 2 × 30 / 20 = 3 packets
    assert rb.adapt() == 3 and rb.buffer.hole_packets == 3  # type: ignore[union-attr]
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
    async with serve(test_config()) as (url, app), aiohttp.ClientSession() as http:
        client = BenchSession(index=0, url=url, http=http)
        await client.connect()
        session = next(iter(app[SESSIONS].values()))
        buffer = session.receive_buffer.buffer
        try:
            result = await client.run_turn(
                load_utterance(shared_audio / "en_weather.wav"), 0, TurnSettings(timeout_s=40.0)
            )
        finally:
            await client.close()
            await asyncio.sleep(0)
    assert result.status == "ok", result.reason
    assert "weather" in result.transcript.lower()
    assert buffer.lost > 0  # holes were given up, and the frames behind them went to the decoder at once
    # ... in order: frames released together reach the decoder in sequence, so the sample clock never jumps.
    assert session.inbound.discontinuities == 0 and session.close_reason != "timestamp_jumps"
