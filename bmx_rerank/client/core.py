"""What both wrappers share: planning a search, and the rerank pipeline on one event loop."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from bmx_rerank.applied import AppliedConfigs
from bmx_rerank.client.errors import raised
from bmx_rerank.client.sidecar import Sidecar
from bmx_rerank.client.transport import (
    query_strings,
    request_headers,
    request_timeout,
    search_index,
    split_transport,
)
from bmx_rerank.deadline import request_budget, time_value, within
from bmx_rerank.errors import SearchError
from bmx_rerank.identity import credentials
from bmx_rerank.metrics import Metrics
from bmx_rerank.nodes import FailoverSession, NodePool
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank.pipeline import Answer, Outcome, Reranker
from bmx_rerank.rerank.plan import NO_INDEX, Bounds, Plan, bounded_plan
from bmx_rerank.rerank.term_vector_cache import TermVectorCache
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.source import StatsFactory
from bmx_rerank.upstream import Cluster

# Seconds the rerank's deadline gives beyond a caller's `request_timeout`, so that a first stage slower
# than it ends with the wrapped client's own timeout error, not the deadline's 504.
FIRST_STAGE_GRACE = 0.25
AsyncSend = Callable[..., Awaitable[Any]]  # a transport's perform_request(method, path, **kw)


class Core:
    """What both wrappers share: planning, and the rerank pipeline on one event loop."""

    def __init__(
        self,
        sidecar: Sidecar,
        policies: Sequence[Rule],
        on_rerank_error: str,
        stats: StatsFactory | None,
        store: str,
        timeout: float,
        cache_bytes: int,
        tf_probes: str,
        bounds: Bounds,
        *,
        in_engine: bool = False,
    ) -> None:
        self.sidecar = sidecar
        self.policies = list(policies)
        self.on_rerank_error = on_rerank_error
        self.stats: StatsFactory = stats or (lambda session, base: StatsCache(session, base, store=store))
        self.store = store
        self.timeout = timeout
        self.cache_bytes = cache_bytes
        self.tf_probes = tf_probes
        self.in_engine = in_engine
        self.metrics = Metrics()  # the proxy's metrics, for this wrapper's reranks
        self.bounds = bounds
        self.session: aiohttp.ClientSession | None = None
        self.reranker: Reranker | None = None
        self.applied: AppliedConfigs | None = None

    async def plan(
        self, index: str | None, params: Mapping[str, Any] | None, body: Any, headers: Mapping[str, str]
    ) -> Plan:
        """Read the search (raises SearchError on a bad `ext.bmx`, as the proxy answers 400): its own
        `ext.bmx`, else a policy, else the configuration applied to the index (`bmx-rerank eval --apply`);
        within the same bounds as the proxy's. `index` None: a search of `/_search`, as the proxy's."""
        body_map = dict(body) if isinstance(body, Mapping) else None
        policy = match_policy(self.policies, index) if index else None
        if policy is None:
            self._ready()
            assert self.applied is not None
            policy = await self.applied.policy(index, body_map, headers)
        skip = NO_INDEX if index is None else None  # statistics are per index
        return bounded_plan(body_map, query_strings(params), policy, self.bounds, skip=skip)

    async def search(self, view: Any, send: AsyncSend, method: str, path: str, kw: dict[str, Any]) -> Any:
        """One search the official client built (`send`: its transport's `perform_request`, awaitable),
        reranked when `ext.bmx` or a policy asks for it, else sent as planned. The wrapper's own errors
        (a bad `ext.bmx`, the deadline's 504) are raised as the client raises the cluster's."""
        try:
            return await self._search(view, send, method, path, kw)
        except SearchError as error:
            return raised(view, split_transport(kw.get("params"))[1], error)

    async def _search(self, view: Any, send: AsyncSend, method: str, path: str, kw: dict[str, Any]) -> Any:
        index = None if path.split("?", 1)[0].strip("/") == "_search" else search_index(path)
        params, transport = split_transport(kw.get("params"))
        headers = self.headers_for(request_headers(view, kw))
        body = decoded(kw.get("body"))
        if body is None and kw.get("body") is not None:  # not a JSON object: the cluster answers for it
            return await send(method, path, **kw)
        plan = await self.plan(index, params, body, headers)
        if plan.spec is None:
            if plan.body == body and plan.params == query_strings(params):  # as sent: the caller's own body
                return declined(await send(method, path, **kw), plan)
            unchanged = {**kw, "params": {**plan.params, **transport}, "body": plan.body}
            return declined(await send(method, path, **unchanged), plan)
        assert index is not None

        async def first_stage(
            body: dict[str, Any] | None, first: Mapping[str, str], *, undecoded: bool = False
        ) -> Answer:  # the wrapped client decodes its answers itself: always `data`
            try:
                response = await send("POST", path, **{**kw, "params": {**first, **transport}, "body": body})
            except Exception as exc:
                if (answer := refused(exc)) is None:
                    raise
                return answer
            return answered(response)

        # One deadline for the whole rerank: the caller's `request_timeout` and `ext.bmx.deadline`, where
        # given. The wrapped client bounds its own request (the first stage) by `request_timeout` and
        # raises its own timeout error, as without the wrapper: the deadline leaves it the time to.
        own = plan.spec.deadline if plan.spec is not None else None
        timeout = request_timeout(view, transport)
        limit = timeout + FIRST_STAGE_GRACE if isinstance(timeout, (int, float)) and timeout > 0 else None
        searched = (params or {}).get("timeout", body.get("timeout") if body is not None else None)
        with within(request_budget(0, limit, own, time_value(searched))):
            return result(await self._ready().rerank(index, plan, headers, first_stage))

    def _ready(self) -> Reranker:
        if self.reranker is None:
            connector = aiohttp.TCPConnector(ssl=self.sidecar.ssl) if self.sidecar.ssl else None
            # no cookies kept: one set on a call for one request's caller never goes with another's
            self.session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
            # each call on the next of the client's nodes, on to another when one cannot be reached
            calls: Any = FailoverSession(self.session, NodePool(self.sidecar.pool))
            self.reranker = Reranker(
                Cluster(calls, self.sidecar.url, self.timeout),
                self.stats(calls, self.sidecar.url),
                self.metrics,
                cache=TermVectorCache(self.cache_bytes),
                on_error=self.on_rerank_error,
                probes=self.tf_probes,
                scored_in_engine=self.in_engine,
            )
            self.applied = AppliedConfigs(calls, self.sidecar.url, store=self.store, timeout=self.timeout)
        return self.reranker

    def headers_for(self, request_headers: Mapping[str, str] | None) -> dict[str, str]:
        """The sidecar calls' headers for one search: the client's credentials, the request's own first."""
        return {**self.sidecar.headers, **credentials(request_headers)}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = self.reranker = self.applied = None


def decoded(body: Any) -> dict[str, Any] | None:
    """A search body as a dict: the clients also take it as a JSON string or bytes (None: no body, or
    not a JSON object)."""
    if isinstance(body, (str, bytes, bytearray)):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    return dict(body) if isinstance(body, Mapping) else None


def answered(response: Any) -> Answer:
    """The official client's answer to a first stage. It raises for a status >= 400, unless told to
    ignore it: elasticsearch-py's answer then has the status in its meta, opensearch-py's is the error
    body itself, with its `status`."""
    meta = getattr(response, "meta", None)
    status = getattr(meta, "status", None)
    if status is None:
        error = isinstance(response, Mapping) and "error" in response and response.get("status")
        status = error if isinstance(error, int) and not isinstance(error, bool) else 200
    return Answer(status, plain(response), response)


def refused(exc: Exception) -> Answer | None:
    """An error the cluster answered a first stage with (elasticsearch-py's `ApiError`, opensearch-py's
    `TransportError`, both with an HTTP `status_code`), as an answer; None for any other failure."""
    status = getattr(exc, "status_code", None)
    return Answer(status, None, exc) if isinstance(status, int) and status >= 300 else None


def result(outcome: Outcome) -> Any:
    """What `search` returns: the reranked body in the client's own response type, else the cluster's
    answer as the client gave it (its exception raised again)."""
    raw = outcome.answer.raw
    if outcome.body is None:
        if isinstance(raw, BaseException):
            raise raw
        return raw
    return rewrap(raw, outcome.body)


def plain(response: Any) -> dict[str, Any]:
    """A search answer as a dict (elasticsearch-py wraps it in an ObjectApiResponse)."""
    return dict(getattr(response, "body", response))


def rewrap(response: Any, body: dict[str, Any]) -> Any:
    """The reranked body in the same type the client returns (ObjectApiResponse keeps its meta)."""
    meta = getattr(response, "meta", None)
    return body if meta is None else type(response)(body=body, meta=meta)


def declined(response: Any, plan: Plan) -> Any:
    """The cluster's answer; a rerank the wrapper declined is said out loud in a `_bmx` marker (a library
    call has no header for it): `{"reranked": false, "skipped": reason}`."""
    if plan.skipped is None:
        return response
    answer = plain(response)
    answer["_bmx"] = {"reranked": False, "skipped": plan.skipped}
    return rewrap(response, answer)
