"""A free loopback port, for a proxy, a fake cluster or a fake engine to listen on."""

from __future__ import annotations

from bmx_rerank.testing.process import free_ports


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; it may be taken again before use)."""
    return free_ports(1)[0]
