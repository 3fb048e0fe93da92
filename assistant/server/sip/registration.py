"""Registration with the trunk (RFC 3261 10): ``REGISTER`` for ``sip.user`` at the trunk's domain, our Contact, for
``sip.register_expires_s``; answered challenges with the trunk credentials; refreshed before it lapses; taken
back (``Expires: 0``) at shutdown. A trunk that refuses is asked again with a backoff, and the log says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from assistant.server.sip.dialog import USER_AGENT
from assistant.server.sip.message import Headers, SipRequest, new_branch, new_call_id, new_tag
from assistant.server.sip.transport import Flow
from assistant.server.sip.uri import SipURI
from assistant.server.sip.useragent import UserAgent

log = logging.getLogger(__name__)

RETRY_S = (30.0, 600.0)  # first wait after a failure, and the longest
UNREGISTER_TIMEOUT_S = 2.0


class Registration:
    def __init__(self, agent: UserAgent, trunk: SipURI, address: tuple[str, int]) -> None:
        self.agent, self.trunk, self.address = agent, trunk, address
        self.call_id = new_call_id(trunk.host)
        self.tag = new_tag()
        self.cseq = secrets.randbelow(2**16) + 1
        self.expires = agent.cfg.sip.register_expires_s
        self.state = "unregistered"
        self._flow: Flow | None = None

    def _register(self, flow: Flow, expires: int) -> SipRequest:
        agent, sip = self.agent, self.agent.cfg.sip
        aor = f"<sip:{sip.user}@{self.trunk.hostport}>"
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{flow.transport.upper()} {agent.via_host(flow)};branch={new_branch()};rport")
        headers.add("Max-Forwards", "70")
        headers.add("From", f"{aor};tag={self.tag}")
        headers.add("To", aor)
        headers.add("Call-ID", self.call_id)
        headers.add("CSeq", f"{self.cseq} REGISTER")
        headers.add("Contact", agent.contact(flow))
        headers.add("Expires", str(expires))
        headers.add("User-Agent", USER_AGENT)
        self.cseq += 2  # the answer to a challenge takes the next one
        uri = SipURI(self.trunk.scheme, "", self.trunk.host, self.trunk.port, dict(self.trunk.params))
        return SipRequest("REGISTER", uri, headers)

    async def run(self) -> None:
        agent, sip = self.agent, self.agent.cfg.sip
        wait = RETRY_S[0]
        while True:
            try:
                if self._flow is None or (self._flow.connection is not None and self._flow.connection.closed):
                    self._flow = await agent.transport.connect(self.trunk.transport, self.address, self.trunk.host)
                outcome = await agent.request(self._register(self._flow, self.expires), self._flow,
                                              credentials=(sip.trunk_username, sip.trunk_password))
            except OSError as exc:
                outcome = None
                log.warning("sip_register_failed trunk=%s error=%r", self.trunk.hostport, exc)
            answer = outcome.response if outcome is not None else None
            if answer is not None and 200 <= answer.status < 300:
                granted = self._granted(answer.headers.get("Expires"), answer.headers.get_all("Contact"))
                if self.state != "registered":
                    log.info("sip_registered trunk=%s expires=%d", self.trunk.hostport, granted)
                self.state, wait = "registered", RETRY_S[0]
                await asyncio.sleep(max(5.0, granted - min(granted / 2, 30.0)))
                continue
            least = (answer.headers.get("Min-Expires") or "").strip() if answer is not None else ""
            if answer is not None and answer.status == 423 and least.isdigit() and int(least) > self.expires:
                self.expires = int(least)
                continue
            self.state = "failed"
            log.warning("sip_register_refused trunk=%s status=%s reason=%s retry_s=%.0f", self.trunk.hostport,
                        answer.status if answer else None, answer.reason if answer else
                        (outcome.error if outcome else "unreachable"), wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_S[1])

    def _granted(self, expires: str | None, contacts: list[str]) -> int:
        """The lifetime the trunk granted: our Contact's ``expires``, else the Expires header, else what we asked."""
        for contact in contacts:
            for part in contact.split(";")[1:]:
                name, _, value = part.partition("=")
                if name.strip().lower() == "expires" and value.strip().isdigit():
                    return int(value.strip())
        if expires is not None and expires.strip().isdigit():
            return int(expires.strip())
        return self.expires

    async def unregister(self) -> None:
        """Take the registration back (best effort, briefly) when the server stops."""
        if self.state != "registered" or self._flow is None:
            return
        sip = self.agent.cfg.sip
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.agent.request(self._register(self._flow, 0), self._flow,
                                                      credentials=(sip.trunk_username, sip.trunk_password)),
                                   UNREGISTER_TIMEOUT_S)
        self.state = "unregistered"
