"""aiohttp apps the tests stand up beside the proxy (fake clusters, recorders, fault injectors), each on
an ephemeral port of the running loop: plain aiohttp, as a cluster or a gateway would answer."""

from __future__ import annotations

import ssl
from typing import Any

from aiohttp import web


async def serve_app(
    app: web.Application, ssl_context: ssl.SSLContext | None = None, **server: Any
) -> tuple[web.AppRunner, str]:
    """Serve `app` (request bodies left as sent; `server`: more of aiohttp's server settings); returns
    its runner (`cleanup()` stops it) and URL."""
    runner = web.AppRunner(app, auto_decompress=False, access_log=None, **server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
