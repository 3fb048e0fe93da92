"""Headless Chromium for the browser tests, set up one way: the project's flags (Debian's chromium, no sandbox, no
background networking, a fake microphone that plays a file), that file, and a browser closed on every exit path."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from assistant.audio import read_audio, resample
from tests import needs
from tests.needs import CHROMIUM

MIC_RATE = 48_000  # what Chromium's fake microphone plays: 48 kHz, 16-bit, mono


def chromium_args(mic: Path | None = None) -> list[str]:
    """The flags every browser test launches with; with ``mic``, the fake microphone plays that file (looping)."""
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
    ]
    if mic is not None:
        args.append(f"--use-file-for-fake-audio-capture={mic}")
    return args


def mic_file(path: Path, *parts: Path | float | tuple[np.ndarray, int]) -> Path:
    """Write the fake microphone's file at ``path``: speech files (a ``Path``), audio (samples and their rate) and
    silences (seconds), in order."""
    pieces = []
    for part in parts:
        if isinstance(part, Path):
            x, sr = read_audio(part)
            pieces.append(resample(x, sr, MIC_RATE))
        elif isinstance(part, tuple):
            pieces.append(resample(part[0], part[1], MIC_RATE))
        else:
            pieces.append(np.zeros(round(part * MIC_RATE), dtype=np.float32))
    sf.write(path, np.concatenate(pieces), MIC_RATE, subtype="PCM_16")
    return path


@contextlib.asynccontextmanager
async def chromium(mic: Path | None = None, *extra_args: str) -> AsyncIterator[Any]:
    """A headless Chromium (playwright's ``Browser``) with :func:`chromium_args` and ``extra_args``, closed on
    exit, however the test ends."""
    playwright = needs.module("playwright.async_api")
    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=[*chromium_args(mic), *extra_args])
        try:
            yield browser
        finally:
            await browser.close()


def collect_errors(page: Any) -> list[str]:
    """The page's uncaught script errors, as they happen (a test asserts the list is empty at its end)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors
