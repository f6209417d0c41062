"""The client wrapper: BMX reranking inside a Python program, around the official clients.

`BMXClient` wraps a sync `elasticsearch.Elasticsearch` (8.x or 9.x) or `opensearchpy.OpenSearch` (2.x or
3.x), `AsyncBMXClient` their async twins. `search(...)` is the wrapped client's own `search`, called with
exactly the arguments given: the official client turns `index` lists, `from_`, `filter_path`,
`request_timeout`, `headers`, auth options... into its request as it always does. The wrapper steps in
where that request reaches the client's transport (`perform_request`): when the body carries `ext.bmx`
or a policy matches, it plans the rerank (widens the window), sends the first stage through that same
transport (its node pool, retries, TLS and credentials) and reranks the answer exactly as the proxy does.
Every other attribute is the wrapped client's; `options(...)` returns a wrapper around `client.options(...)`.

The wrapper's own errors (a bad `ext.bmx`, a rerank past its deadline) are raised as the client raises
the cluster's: its own exception class for the status (`BadRequestError`/`RequestError`, ...), with the
error body the proxy would answer, caused by a `bmx_rerank.errors.SearchError`; a status the client is
told to ignore (`ignore_status`, `ignore`) is its answer instead.

The sidecar's own calls (`_analyze`, `_mtermvectors`, statistics) go to the client's nodes in turn, on to
the next where one cannot be reached (as the proxy's own calls do), with the client's TLS settings (CA bundle, verification, client certificate) and the request's credentials
(the `Authorization` the official client sends for that search); pass `url=` to send them elsewhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Sequence
from typing import Any

from bmx_rerank import defaults
from bmx_rerank.client.core import Core
from bmx_rerank.client.sidecar import Sidecar, node_url, sidecar_of, ssl_context
from bmx_rerank.client.transport import hooked, query_strings, search_index
from bmx_rerank.metrics import Metrics
from bmx_rerank.policy import Rule
from bmx_rerank.rerank.plan import Bounds
from bmx_rerank.stats.source import StatsFactory
from bmx_rerank.stats.store import DEFAULT_STORE

__all__ = [
    "AsyncBMXClient",
    "BMXClient",
    "Sidecar",
    "node_url",
    "query_strings",
    "search_index",
    "sidecar_of",
    "ssl_context",
]


class _Wrapper:
    """The constructor and attribute delegation both wrappers share."""

    def __init__(
        self,
        client: Any,
        url: str | None = None,
        *,
        policies: Sequence[Rule] = (),
        on_rerank_error: str = defaults.ON_RERANK_ERROR,
        stats: StatsFactory | None = None,
        store: str = DEFAULT_STORE,
        timeout: float = defaults.TIMEOUT,
        cache_bytes: int = defaults.CACHE_BYTES,
        tf_probes: str = defaults.TF_PROBES,
        bounds: Bounds | None = None,
        in_engine: bool = False,
        _core: Core | None = None,
    ) -> None:
        """`store`: the index statistics and applied configurations are kept in (`serve --stats-index`);
        `in_engine`: as `serve --in-engine`, a window OpenSearch can score exactly is scored there."""
        self.client = client
        self._core = _core or Core(
            sidecar_of(client, url),
            policies,
            on_rerank_error,
            stats,
            store,
            timeout,
            cache_bytes,
            tf_probes,
            bounds or Bounds(),
            in_engine=in_engine,
        )

    @property
    def bmx_metrics(self) -> Metrics:
        """The reranks' metrics, as the proxy's `/_bmx/metrics` has them (`.render()`: Prometheus text)."""
        return self._core.metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class AsyncBMXClient(_Wrapper):
    """An `AsyncElasticsearch`/`AsyncOpenSearch` whose `search` reranks with BMX; close it when done."""

    async def search(self, **kwargs: Any) -> Any:
        """The wrapped client's `search`, reranked when `ext.bmx` (or a policy) asks for it."""
        return await hooked(self.client, self._hook).search(**kwargs)

    async def _hook(self, view: Any, send: Any, method: str, path: str, kw: dict[str, Any], args=()) -> Any:
        if search_index(path) is None or args:
            return await send(method, path, *args, **kw)
        return await self._core.search(view, send, method, path, kw)

    def options(self, **kwargs: Any) -> AsyncBMXClient:
        """`client.options(...)` (elasticsearch-py), still reranking with the same sidecar."""
        return AsyncBMXClient(self.client.options(**kwargs), _core=self._core)

    async def close(self) -> None:
        """Close the sidecar's session (the wrapped client is the caller's to close)."""
        await self._core.close()

    async def __aenter__(self) -> AsyncBMXClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class BMXClient(_Wrapper):
    """An `Elasticsearch`/`OpenSearch` whose `search` reranks with BMX; close it when done.

    The pipeline runs on a private event loop in a daemon thread; the first stage goes through the
    wrapped client in a worker thread of that loop."""

    def __init__(self, client: Any, url: str | None = None, **options: Any) -> None:
        super().__init__(client, url, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bmx-rerank", daemon=True)
        self._thread.start()

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def search(self, **kwargs: Any) -> Any:
        """The wrapped client's `search`, reranked when `ext.bmx` (or a policy) asks for it."""
        return hooked(self.client, self._hook).search(**kwargs)

    def _hook(self, view: Any, send: Any, method: str, path: str, kw: dict[str, Any], args=()) -> Any:
        if search_index(path) is None or args:
            return send(method, path, *args, **kw)

        async def threaded(*args: Any, **kwargs: Any) -> Any:
            # The client is synchronous: its request runs in a worker thread, off the pipeline's loop.
            return await asyncio.to_thread(send, *args, **kwargs)

        return self._run(self._core.search(view, threaded, method, path, kw))

    def options(self, **kwargs: Any) -> BMXClient:
        """`client.options(...)` (elasticsearch-py), still reranking with the same sidecar and loop."""
        other = object.__new__(BMXClient)
        _Wrapper.__init__(other, self.client.options(**kwargs), _core=self._core)
        other._loop, other._thread = self._loop, self._thread
        return other

    def close(self) -> None:
        """Close the sidecar's session and its loop (the wrapped client is the caller's to close)."""
        if self._loop.is_closed():
            return
        self._run(self._core.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BMXClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
