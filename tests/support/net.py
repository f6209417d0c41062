"""A free loopback port, for a proxy, a fake cluster or a fake engine to listen on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; it may be taken again before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
