"""The client wrapper: BMX reranking inside a Python program, around the official clients.

`BMXClient` wraps a sync `elasticsearch.Elasticsearch` or `opensearchpy.OpenSearch`, `AsyncBMXClient`
their async twins. `search(index=..., body=...)` (or the clients' keyword style, `query=..., ext=...`)
reranks exactly as the proxy does (same plan, same pipeline, same statistics in the cluster) when the
body carries `ext.bmx` or a policy matches; the first-stage search goes through the wrapped client,
with its own connection, retries and credentials. Every other attribute is the wrapped client's.

The sidecar's own calls (`_analyze`, `_mtermvectors`, statistics) go to `url` with `headers`: pass the
same credentials the client uses (e.g. `{"Authorization": "ApiKey ..."}`); `url` defaults to the
client's first node.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from bmx_rerank.applied import AppliedConfigs
from bmx_rerank.metrics import Metrics
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank.candidates import TermVectorCache
from bmx_rerank.rerank.pipeline import Reranker
from bmx_rerank.rerank.plan import plan_search
from bmx_rerank.rerank.stats_source import StatsSource
from bmx_rerank.stats.cache import StatsCache

JSON_HEADERS = {"accept": "application/json", "content-type": "application/json"}

FirstStage = Callable[[str, dict[str, Any] | None, dict[str, str]], Awaitable[Any]]


def node_url(client: Any) -> str:
    """The first node's base URL of an official client (elasticsearch-py 8, opensearch-py 2/3)."""
    transport = client.transport
    if hasattr(transport, "node_pool"):  # elastic_transport
        return str(transport.node_pool.all()[0].base_url).rstrip("/")
    host = transport.hosts[0]
    scheme = "https" if host.get("use_ssl") or host.get("scheme") == "https" else "http"
    return f"{scheme}://{host['host']}:{host.get('port', 9200)}{host.get('url_prefix', '')}".rstrip("/")


def _request_body(body: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The search body from either calling style: `body=` or the clients' keyword arguments."""
    if body is not None and kwargs:
        raise TypeError("pass the search either as body= or as keyword arguments, not both")
    if body is not None:
        return dict(body)
    return dict(kwargs) or None


class _Core:
    """What both wrappers share: the rerank pipeline around a first-stage call, in one event loop."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None,
        policies: Sequence[Rule],
        on_rerank_error: str,
        stats: Callable[[aiohttp.ClientSession, str], StatsSource] | None,
        timeout: float,
        cache_size: int,
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = dict(headers or {})
        self.policies = list(policies)
        self.on_rerank_error = on_rerank_error
        self.stats = stats or (lambda session, base: StatsCache(session, base))
        self.timeout = timeout
        self.cache_size = cache_size
        self.session: aiohttp.ClientSession | None = None
        self.reranker: Reranker | None = None
        self.applied: AppliedConfigs | None = None

    def _ready(self) -> Reranker:
        if self.reranker is None:
            self.session = aiohttp.ClientSession()
            self.reranker = Reranker(
                self.session,
                self.url,
                self.stats(self.session, self.url),
                Metrics(),
                cache=TermVectorCache(self.cache_size),
                timeout=self.timeout,
                on_error=self.on_rerank_error,
            )
            self.applied = AppliedConfigs(self.session, self.url, timeout=self.timeout)
        return self.reranker

    async def search(
        self, first_stage: FirstStage, index: str, body: dict[str, Any] | None, params: Mapping[str, str]
    ) -> Any:
        policy = match_policy(self.policies, index)
        if policy is None:
            self._ready()
            assert self.applied is not None
            policy = await self.applied.policy(index, body, self.headers)
        plan = plan_search(body, params, policy)
        if plan.spec is None:
            response = await first_stage(index, plan.body, plan.params)
            if plan.skipped is None:
                return response
            answer = _plain(response)  # declined out loud: the cluster's answer, marked with the reason
            answer["_bmx"] = {"reranked": False, "skipped": plan.skipped}
            return answer
        reranker = self._ready()
        plan = await reranker.prepare(plan)
        side = reranker.start(index, plan, self.headers)
        try:
            response = await first_stage(index, side.body, side.params)
            return (await reranker.finish(side, _plain(response), self.headers)).body
        except BaseException:
            side.cancel()
            raise

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = self.reranker = self.applied = None


def _plain(response: Any) -> dict[str, Any]:
    """A search answer as a dict (elasticsearch-py wraps it in an ObjectApiResponse)."""
    return dict(getattr(response, "body", response))


def _path(index: str) -> str:
    return f"/{index}/_search"


def _call_first_stage(client: Any, index: str, body: Any, params: Mapping[str, str]) -> Any:
    """POST {index}/_search through the wrapped client's own transport (sync or async alike)."""
    if hasattr(client.transport, "node_pool"):  # elasticsearch-py 8
        return client.perform_request(
            "POST", _path(index), params=dict(params) or None, headers=JSON_HEADERS, body=body
        )
    return client.transport.perform_request("POST", _path(index), params=dict(params) or None, body=body)


class _Wrapper:
    """The constructor and attribute delegation both wrappers share."""

    def __init__(
        self,
        client: Any,
        url: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        policies: Sequence[Rule] = (),
        on_rerank_error: str = "fallback",
        stats: Callable[[aiohttp.ClientSession, str], StatsSource] | None = None,
        timeout: float = 60.0,
        cache_size: int = 100_000,
    ) -> None:
        self.client = client
        self._core = _Core(
            url or node_url(client), headers, policies, on_rerank_error, stats, timeout, cache_size
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class AsyncBMXClient(_Wrapper):
    """An `AsyncElasticsearch`/`AsyncOpenSearch` whose `search` reranks with BMX; close it when done."""

    async def search(
        self,
        *,
        index: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        async def first_stage(idx: str, b: Any, p: dict[str, str]) -> Any:
            return await _call_first_stage(self.client, idx, b, p)

        return await self._core.search(first_stage, index, _request_body(body, kwargs), params or {})

    async def close(self) -> None:
        await self._core.close()

    async def __aenter__(self) -> AsyncBMXClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class BMXClient(_Wrapper):
    """An `Elasticsearch`/`OpenSearch` whose `search` reranks with BMX; close it when done.

    The pipeline is asynchronous, so it runs on a private event loop in a daemon thread; the first
    stage runs through the wrapped (sync) client in a worker thread of that loop."""

    def __init__(self, client: Any, url: str | None = None, **options: Any) -> None:
        super().__init__(client, url, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bmx-rerank", daemon=True)
        self._thread.start()

    def search(
        self,
        *,
        index: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        async def first_stage(idx: str, b: Any, p: dict[str, str]) -> Any:
            return await asyncio.to_thread(_call_first_stage, self.client, idx, b, p)

        coro = self._core.search(first_stage, index, _request_body(body, kwargs), params or {})
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._core.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BMXClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
