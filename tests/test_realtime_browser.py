"""A browser client written the way OpenAI's WebRTC guide writes one (tests/data/realtime_page, not shipped) holds a
turn in headless Chromium against ``/v1/realtime/calls``: its offer posted as it is, with no candidates trickled."""

from __future__ import annotations

from pathlib import Path

import pytest

from assistant.server.app import SESSIONS
from tests.browser import chromium, collect_errors, mic_file
from tests.conftest import serve, test_config

PAGE_DIR = Path(__file__).parent / "data" / "realtime_page"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
]


@pytest.fixture
def mic_wav(tmp_path: Path, shared_audio: Path) -> Path:
    """1 s of silence, en_weather.wav, then 8 s of silence, as the fake microphone's file."""
    return mic_file(tmp_path / "mic.wav", 1.0, shared_audio / "en_weather.wav", 8.0)


async def test_guide_style_page_holds_a_turn(mic_wav: Path) -> None:
    cfg = test_config(server={"web_dir": str(PAGE_DIR)})
    async with serve(cfg) as (url, app):
        async with chromium(mic_wav) as browser:
            page = await browser.new_page()
            errors = collect_errors(page)
            await page.goto(url + "/")
            await page.wait_for_selector("#status:text('open')", timeout=30_000)
            await page.wait_for_function(
                "() => window.realtimeEvents.some(e => e.type === 'response.done')", timeout=90_000)
            events = await page.evaluate("() => window.realtimeEvents")
            energy = await page.evaluate("() => window.receivedAudioEnergy()")
            await page.evaluate("() => window.hangUp()")
            assert not errors, errors
        assert not app[SESSIONS]  # hung up
    types = [e["type"] for e in events]
    assert types[0] == "session.created" and "session.updated" in types
    said = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert "weather" in said["transcript"].lower()
    done = next(e for e in events if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", done
    assert "weather" in done["response"]["output"][0]["content"][0]["transcript"].lower()
    assert "output_audio_buffer.started" in types and "output_audio_buffer.stopped" in types
    assert energy > 0  # the reply was heard on the track
