"""HTTPS and WSS served directly: the SSL context from ``server.tls_cert`` / ``server.tls_key``.

Browsers give the microphone only to ``https://`` pages (or localhost), so a server reached by name needs TLS,
either here or in a proxy in front (see the README).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from assistant.config import ConfigError, ServerConfig


def ssl_context(server: ServerConfig) -> ssl.SSLContext | None:
    """The server-side context, or None when TLS is off; a clear ConfigError for a half or broken setup."""
    cert, key = server.tls_cert, server.tls_key
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both server.tls_cert and server.tls_key")
    for name, path in (("server.tls_cert", cert), ("server.tls_key", key)):
        if not Path(path).is_file():
            raise ConfigError(f"{name}: no such file: {path}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"cannot load server.tls_cert/tls_key: {exc}") from None
    return ctx
