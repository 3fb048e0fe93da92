"""The page in headless Chromium over the paths a public deployment uses: HTTPS with a self-signed certificate
and a bearer token (trickle ICE, hang-up by DELETE), and a call only a TURN relay (real coturn) can carry."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from assistant.server.app import SESSIONS
from assistant.server.services import Services
from tests.browser import chromium, collect_errors
from tests.conftest import self_signed_cert, serve, test_config
from tests.turnserver import TurnServer

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.browser,
    pytest.mark.slow,
]

TOKEN = "browser-test-token"
SELECTED_PAIR = """async () => {
  const stats = await window.assistantState.pc.getStats();
  let pair = null;
  stats.forEach((r) => { if (r.type === 'candidate-pair' && r.nominated && r.state === 'succeeded') pair = r; });
  return pair && `${stats.get(pair.localCandidateId).candidateType}/${stats.get(pair.remoteCandidateId).candidateType}`;
}"""


async def _one_turn(page) -> None:  # type: ignore[no-untyped-def]
    """Connect, then wait for the transcript, the echoed reply and an audible reply (the page's v2v figure)."""
    await page.click("#connect")
    try:
        await page.locator(".msg.user", has_text="weather").first.wait_for(timeout=60_000)
        await page.locator(".msg.bot", has_text="weather").first.wait_for(timeout=30_000)
        await page.wait_for_function(
            "() => /ms$/.test(document.querySelector('#turns tbody tr .v2v')?.textContent || '')", timeout=30_000
        )
    except Exception:
        state = await page.evaluate(
            "() => [document.querySelector('#status').textContent, document.querySelector('#error').textContent,"
            " document.querySelector('#transcript').textContent, window.assistantState.pc?.connectionState]"
        )
        raise AssertionError(f"no turn: status, error, transcript, peer = {state}") from None
    assert not await page.locator("#error").is_visible(), await page.locator("#error").text_content()


async def test_page_over_https_with_token_trickles_and_hangs_up(
    services: Services, mic_wav: Path, tmp_path: Path
) -> None:
    cert, key = self_signed_cert(tmp_path)
    cfg = test_config(server={"auth_token": TOKEN, "tls_cert": str(cert), "tls_key": str(key)})
    async with serve(cfg, services) as (url, app), chromium(mic_wav, "--ignore-certificate-errors") as browser:
        page = await browser.new_page()
        calls: list[tuple[str, str, int]] = []
        page.on(
            "response",
            lambda r: calls.append((r.request.method, urlsplit(r.url).path, r.status))
            if "/api/" in r.url
            else None,
        )
        errors = collect_errors(page)
        await page.goto(f"{url}/?token={TOKEN}")
        assert url.startswith("https://")
        await _one_turn(page)
        session_id = await page.evaluate("window.assistantState.sessionId")
        session = app[SESSIONS][session_id]
        connect_ms = await page.evaluate("window.assistantState.connectMs")
        assert connect_ms is not None and connect_ms > 0
        await page.click("#hangup")
        await page.wait_for_function("() => window.assistantState.hangupStatus !== undefined", timeout=10_000)
        assert await page.evaluate("window.assistantState.hangupStatus") == 200
        # The DELETE ended the session, not the browser closing its peer.
        assert session.closed and session.close_reason == "hangup"
        resource = f"/api/sessions/{session_id}"
        assert ("DELETE", resource, 200) in calls, calls
        assert ("PATCH", resource, 204) in calls, calls  # candidates trickled after the offer
        assert ("GET", "/api/ice", 200) in calls and ("POST", "/api/offer", 200) in calls
        assert ("GET", "/api/voices", 200) in calls  # the TTS panel sends the token too
        assert not [c for c in calls if c[2] == 401], calls
        assert not errors, errors


async def test_page_through_turn_relay_and_a_clear_error_for_a_wrong_credential(
    services: Services, mic_wav: Path, turn_server: TurnServer
) -> None:
    relay = {"turn_urls": [turn_server.url], "turn_secret": turn_server.secret, "transport_policy": "relay"}
    async with chromium(mic_wav) as browser:
        async with serve(test_config(ice=relay), services) as (url, app):
            page = await browser.new_page()
            await page.goto(url + "/")
            await _one_turn(page)
            assert await page.evaluate(SELECTED_PAIR) == "relay/relay"
            await page.click("#hangup")
            await page.close()
        wrong = {**relay, "turn_secret": "not-coturns-secret"}
        async with serve(test_config(ice=wrong), services) as (url, app):
            page = await browser.new_page()
            await page.goto(url + "/")
            await page.click("#connect")
            error = page.locator("#error")
            await error.wait_for(state="visible", timeout=30_000)
            text = await error.text_content() or ""
            print(f"page error: {text}")
            assert "TURN" in text and ("401" in text or "credential" in text), text
            await page.wait_for_function("() => !document.querySelector('#connect').disabled", timeout=10_000)
            for _ in range(50):  # the page hung up: nothing is left waiting for a peer that cannot come
                if not app[SESSIONS]:
                    break
                await page.wait_for_timeout(100)
            assert not app[SESSIONS]
