"""Loopback ICE for tests and benchmarks that run clients and servers on one machine.

aioice leaves 127.0.0.1 out of its host candidates, so two peers on a machine with no other interface never
meet. :func:`allow_loopback_ice` patches this process only; a server in another process does the same when
started with ``ASSISTANT_LOOPBACK_ICE=1`` (``assistant serve`` reads it: not a setting, never for production).
"""

from __future__ import annotations

from collections.abc import Callable

LOOPBACK_ICE_ENV = "ASSISTANT_LOOPBACK_ICE"


def allow_loopback_ice() -> Callable[[], None]:
    """Offer 127.0.0.1 first among this process's host candidates; returns the undo. Calling it twice is the
    same as once (the undo of the second call does nothing)."""
    import aioice.ice

    original = aioice.ice.get_host_addresses
    if getattr(original, "_with_loopback", False):
        return lambda: None

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        found = [a for a in original(use_ipv4=use_ipv4, use_ipv6=use_ipv6) if a != "127.0.0.1"]
        return (["127.0.0.1"] if use_ipv4 else []) + found

    get_host_addresses._with_loopback = True  # type: ignore[attr-defined]
    aioice.ice.get_host_addresses = get_host_addresses

    def undo() -> None:
        aioice.ice.get_host_addresses = original

    return undo
