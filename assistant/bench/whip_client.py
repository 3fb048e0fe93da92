"""The bench's WHIP client (RFC 9725): the v2v peer of ``bench/v2v.py`` with WHIP's signaling, for our
``/api/whip`` or any WHIP endpoint that answers with audio.

The offer is posted as ``application/sdp`` to the endpoint; ``201 Created`` brings the answer and, in
``Location``, the session's resource, which ``DELETE`` hangs up. On our server the offer also opens the ``events``
channel, whose ``turn_metrics`` give every stage; another endpoint gets an offer with audio alone, and its turns
are measured from the client's side.
"""

from __future__ import annotations

import contextlib
import logging
from urllib.parse import urljoin

import aiohttp

from assistant.bench.targets import Target
from assistant.bench.v2v import BenchSession

log = logging.getLogger(__name__)

SDP = "application/sdp"


class WhipBenchSession(BenchSession):
    """A v2v bench peer signalled by WHIP."""

    location: str = ""

    @staticmethod
    def endpoint_of(target: Target) -> str:
        return target.whip_url()

    @property
    def wants_channel(self) -> bool:
        return self.ours  # our events; a plain WHIP endpoint may refuse a data channel

    async def exchange(self, offer: str) -> str:
        url = self.endpoint or Target("whip", self.url, ours=self.ours).whip_url()
        async with self.http.post(url, data=offer, headers={"Content-Type": SDP, **self._headers()}) as resp:
            answer = await resp.text()
            if resp.status != 201:
                raise RuntimeError(f"WHIP offer refused: HTTP {resp.status} {answer[:300]}")
            location = resp.headers.get("Location", "")
        self.location = urljoin(url, location) if location else ""
        self.session_id = location.rstrip("/").rsplit("/", 1)[-1]
        return answer

    async def close(self) -> None:
        if self.location and not self.failed:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.delete(self.location, headers=self._headers()) as resp:
                    await resp.read()
        self.session_id = ""  # hung up here: the page protocol's DELETE is not needed
        await super().close()
