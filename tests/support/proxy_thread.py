"""The proxy in a thread: an event loop in a daemon thread, and the proxy app served by one, so that
synchronous tests and the official (synchronous) clients can talk to it on an ephemeral port."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from bmx_rerank.proxy import ProxyConfig, make_app, start_server


class LoopThread:
    """An event loop in a daemon thread, to serve aiohttp apps next to the synchronous tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel whatever still runs (stalled handlers, pipes) while the loop lives, then stop it."""

        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(drain(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class ProxyThread(LoopThread):
    """A proxy app served by an event loop in a background thread; `url` is where it listens."""

    def __init__(self, upstream: str, stats: Any, **config: Any) -> None:
        """`stats`: a statistics source, or a (session, base_url) -> source factory."""
        super().__init__()
        factory = stats if callable(stats) else (lambda session, base: stats)
        self.app = make_app(ProxyConfig(upstream=upstream, **config), factory)
        self.runner, self.url = self.run(start_server(self.app))

    def close(self) -> None:
        self.run(self.runner.cleanup())
        super().close()
