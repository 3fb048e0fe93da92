"""The voice chat page in headless Chromium with a fake microphone playing a speech file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from assistant.audio import read_audio, resample
from assistant.pipeline.trace import STAGE_STYLE
from tests.conftest import serve, test_config

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Debian chromium is not installed (scripts/test.sh installs it)"
    ),
]


def chromium_args(mic_wav: Path) -> list[str]:
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic_wav}",
    ]


@pytest.fixture
def mic_wav(tmp_path: Path, shared_audio: Path) -> Path:
    """en_weather.wav as Chromium's fake mic wants it (48 kHz 16-bit mono), with 4 s of silence after."""
    x, sr = read_audio(shared_audio / "en_weather.wav")
    y = np.concatenate([resample(x, sr, 48_000), np.zeros(4 * 48_000, dtype=np.float32)])
    path = tmp_path / "mic.wav"
    sf.write(path, y, 48_000, subtype="PCM_16")
    return path


async def test_page_connects_shows_transcript_and_latency(mic_wav: Path) -> None:
    playwright = pytest.importorskip("playwright.async_api")
    async with serve(test_config()) as (url, _app), playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=chromium_args(mic_wav))
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(url + "/")
            await page.click("#connect")
            await page.wait_for_selector("#status.live", timeout=20_000)
            user = page.locator(".msg.user", has_text="weather")
            await user.first.wait_for(timeout=60_000)
            bot = page.locator(".msg.bot", has_text="weather")
            await bot.first.wait_for(timeout=30_000)
            # The turn's row gets the server's stage bars and the page's own voice-to-voice figure.
            await page.wait_for_function(
                "() => { const r = document.querySelector('#turns tbody tr');"
                " return r && /ms$/.test(r.querySelector('.v2v').textContent)"
                " && /ms$/.test(r.querySelector('.server').textContent); }",
                timeout=30_000,
            )
            v2v = await page.locator("#turns tbody tr .v2v").first.text_content()
            server = await page.locator("#turns tbody tr .server").first.text_content()
            bars = await page.locator("#turns tbody tr .bar span").count()
            print(f"page: voice-to-voice {v2v}, server {server}")
            assert float(v2v.split()[0]) > 0 and float(server.split()[0]) > 0
            assert bars >= 4
            # The legend comes from the server's one list of stages (GET /api/stages), not a copy in the page.
            assert await page.locator("#legend span").count() == len(STAGE_STYLE)
            assert not await page.locator("#error").is_visible()
            await page.click("#hangup")
            assert not errors, errors
        finally:
            await browser.close()
