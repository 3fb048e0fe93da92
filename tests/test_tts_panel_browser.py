"""The page's TTS panel in headless Chromium: type, speak over /ws/tts, hear it stream, see the timings."""

from __future__ import annotations

import pytest

from assistant.config import Config
from assistant.tts import create_tts
from tests.browser import chromium, collect_errors
from tests.conftest import serve, tts_only_services

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
]


async def test_tts_panel_streams_and_shows_timings(tmp_path):
    cfg = Config()
    cfg.server.data_dir = str(tmp_path / "data")
    engine = create_tts(cfg.tts)
    async with serve(cfg, tts_only_services(cfg, engine)) as (base, _app), chromium() as browser:
        page = await browser.new_page()
        errors = collect_errors(page)
        await page.goto(base + "/")
        await page.wait_for_selector("#tts-speak")
        await page.fill("#tts-text", "Hello from the panel. This is a second sentence.")
        await page.fill("#tts-speed", "1.2")
        await page.click("#tts-speak")
        await page.wait_for_function("window.ttsState && window.ttsState.lastResult", timeout=30_000)
        result = await page.evaluate("window.ttsState.lastResult")
        assert result["error"] is None, result
        assert result["sampleRate"] == 22050
        assert 0 < result["firstPacketMs"] < result["totalMs"]
        assert result["audioSeconds"] > 1.0
        assert (await page.text_content("#tts-first-packet")).endswith("ms")
        assert (await page.text_content("#tts-total")).endswith("ms")
        assert await page.text_content("#tts-status") == "done"

        # A second request on the same socket, then a refused one shows its reason.
        await page.evaluate("window.ttsState.lastResult = null")
        await page.click("#tts-speak")
        await page.wait_for_function("window.ttsState.lastResult", timeout=30_000)
        assert (await page.evaluate("window.ttsState.lastResult"))["error"] is None
        await page.evaluate("window.ttsState.lastResult = null")
        await page.fill("#tts-instruct", "whisper")
        await page.click("#tts-speak")
        await page.wait_for_function("window.ttsState.lastResult", timeout=30_000)
        assert "unsupported" in (await page.evaluate("window.ttsState.lastResult"))["error"]
        assert await page.is_visible("#tts-error")
        assert not errors, errors
