"""What SIP holds on one gateway: its settings checked, the listener, the user agent, the RTP ports, the outgoing
calls and the registration; started with the app, stopped after its sessions closed (their BYEs sent)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl

from aiohttp import web

from assistant.config import Config, ConfigError
from assistant.server.http import CONFIG, HTTPJSONError
from assistant.server.services import SERVICES
from assistant.server.sip.dialer import Dialer, resolve
from assistant.server.sip.message import SipRequest, SipResponse
from assistant.server.sip.registration import Registration
from assistant.server.sip.rtpports import RtpPorts
from assistant.server.sip.transport import Door, Flow, Network, SipTransport
from assistant.server.sip.uri import AddressError, SipURI, parse_uri
from assistant.server.sip.useragent import UserAgent
from assistant.server.voice.signaling import VOICE_ID

log = logging.getLogger(__name__)


def check(cfg: Config, allowed_responders: list[str]) -> tuple[list[Network], SipURI | None]:
    """``[sip]`` as a whole (a ConfigError naming the setting): the allowed networks and the trunk's URI."""
    sip = cfg.sip
    networks: list[Network] = []
    for text in sip.allow_from:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"sip.allow_from: {text!r} is not a CIDR") from None
    trunk = None
    if sip.trunk:
        try:
            trunk = parse_uri(sip.trunk)
        except AddressError as exc:
            raise ConfigError(f"sip.trunk must be a SIP URI (sip:pbx.example.com:5060): {exc}") from None
        if not trunk.is_sip or trunk.transport not in sip.transports:
            raise ConfigError(f"sip.trunk must be a sip: URI over one of sip.transports ({sip.trunk!r})")
    if sip.register and trunk is None:
        raise ConfigError("sip.register needs sip.trunk")
    if sip.dial_allow and trunk is None:
        raise ConfigError("sip.dial_allow needs sip.trunk: outgoing calls go through it")
    if sip.password and not sip.username:
        raise ConfigError("sip.password needs sip.username")
    if sip.advertised_address:
        try:
            ipaddress.ip_address(sip.advertised_address)
        except ValueError:
            raise ConfigError(f"sip.advertised_address must be an IP address ({sip.advertised_address!r})") from None
    if sip.responder and sip.responder not in allowed_responders:
        raise ConfigError(f"sip.responder must be one of {allowed_responders} (got {sip.responder!r})")
    if sip.voice and not VOICE_ID.fullmatch(sip.voice):
        raise ConfigError(f"sip.voice must be a voice id (got {sip.voice!r})")
    if "{digits}" not in sip.dtmf_text:
        raise ConfigError("sip.dtmf_text must say where the keys go: {digits}")
    return networks, trunk


def tls_context(cfg: Config) -> ssl.SSLContext | None:
    if "tls" not in cfg.sip.transports:
        return None
    cert = cfg.sip.tls_cert or cfg.server.tls_cert
    key = cfg.sip.tls_key or cfg.server.tls_key
    if not cert or not key:
        raise ConfigError("SIP over TLS needs sip.tls_cert and sip.tls_key (or server.tls_cert and tls_key)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the SIP TLS certificate: {exc}") from None
    return ctx


class SipService:
    """See the module docstring."""

    def __init__(self, app: web.Application) -> None:
        cfg: Config = app[CONFIG]
        self.app = app
        self.cfg = cfg
        self.networks, self.trunk = check(cfg, app[SERVICES].allowed_responders())
        self.tls = tls_context(cfg)
        self.ports = RtpPorts(cfg.sip.host, cfg.sip.rtp_port_min, cfg.sip.rtp_port_max)
        self.transport: SipTransport | None = None
        self.agent: UserAgent | None = None
        self.dialer: Dialer | None = None
        self.registration: Registration | None = None

    async def start(self) -> None:
        cfg = self.cfg
        trunk_address = None
        trusted = list(self.networks)
        if self.trunk is not None:
            trunk_address = await asyncio.get_running_loop().run_in_executor(None, resolve, self.trunk)
            trusted.append(ipaddress.ip_network(trunk_address[0]))
        metrics = self.app[SERVICES].metrics
        door = Door(cfg.sip, trusted)
        self.transport = SipTransport(cfg.sip, door, self._received,
                                      lambda reason: metrics.sip_dropped_total.labels(reason=reason).inc(), self.tls)
        await self.transport.start()
        self.agent = UserAgent(self.app, self.transport, door, self.ports)
        self.dialer = Dialer(self.agent, self.trunk, trunk_address)
        if cfg.sip.register and self.trunk is not None and trunk_address is not None:
            self.registration = Registration(self.agent, self.trunk, trunk_address)
            self.agent.spawn(self.registration.run(), "sip-register")
        log.info("sip_listening host=%s ports=%s rtp=%d-%d trunk=%s allow_from=%s auth=%s", cfg.sip.host,
                 ",".join(f"{t}:{p}" for t, p in self.transport.ports.items()), cfg.sip.rtp_port_min,
                 cfg.sip.rtp_port_max, self.trunk.hostport if self.trunk else "-", len(self.networks),
                 "digest" if cfg.sip.password else "off")

    def _received(self, message: SipRequest | SipResponse, flow: Flow) -> None:
        if self.agent is not None:  # the transport listens a moment before the user agent exists
            self.agent.received(message, flow)

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.unregister()
        if self.agent is not None:
            await self.agent.close()
        if self.transport is not None:
            await self.transport.close()

    def port(self, transport: str = "udp") -> int:
        """Where SIP listens (tests and benches bind port 0 and ask)."""
        assert self.transport is not None
        return self.transport.ports[transport]


SIP: web.AppKey[SipService] = web.AppKey("sip", SipService)


def setup(app: web.Application) -> None:
    """With ``sip.enabled``: the SIP service, started with the app (a ConfigError for bad ``[sip]`` settings)."""
    if not app[CONFIG].sip.enabled:
        return
    service = SipService(app)
    app[SIP] = service

    async def start(app: web.Application) -> None:
        await service.start()

    async def stop(app: web.Application) -> None:
        with contextlib.suppress(Exception):
            await service.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)


def require(app: web.Application) -> SipService:
    """The SIP service, or 404 when SIP is off on this gateway."""
    service = app.get(SIP)
    if service is None or service.dialer is None:
        raise HTTPJSONError(404, "sip_off", "SIP is off on this server (sip.enabled)")
    return service
