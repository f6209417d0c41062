"""The client wrapper: BMX reranking inside a Python program, around the official clients.

`BMXClient` wraps a sync `elasticsearch.Elasticsearch` (8.x or 9.x) or `opensearchpy.OpenSearch` (2.x or
3.x), `AsyncBMXClient` their async twins. `search(...)` is the wrapped client's own `search`, called with
exactly the arguments given: the official client turns `index` lists, `from_`, `filter_path`,
`request_timeout`, `headers`, auth options... into its request as it always does. The wrapper steps in
where that request reaches the client's transport (`perform_request`): when the body carries `ext.bmx`
or a policy matches, it plans the rerank (widens the window), sends the first stage through that same
transport (its node pool, retries, TLS and credentials) and reranks the answer exactly as the proxy does.
Every other attribute is the wrapped client's; `options(...)` returns a wrapper around `client.options(...)`.

The sidecar's own calls (`_analyze`, `_mtermvectors`, statistics) go to the client's first node with the
client's TLS settings (CA bundle, verification, client certificate) and the request's credentials
(the `Authorization` the official client sends for that search); pass `url=` to send them elsewhere.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import ssl
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from bmx_rerank import defaults
from bmx_rerank.applied import AppliedConfigs
from bmx_rerank.deadline import request_budget, within
from bmx_rerank.identity import basic_auth as upstream_basic_auth
from bmx_rerank.identity import credentials
from bmx_rerank.metrics import Metrics
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank.candidates import TermVectorCache
from bmx_rerank.rerank.pipeline import Answer, FirstStage, Outcome, Reranker
from bmx_rerank.rerank.plan import Bounds, Plan, bounded_plan
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.stats.source import StatsFactory
from bmx_rerank.upstream import Cluster

# opensearch-py keeps these transport options in `params`; they are not part of the search.
TRANSPORT_PARAMS = ("request_timeout", "ignore")

Send = Callable[[str, str, dict[str, Any], Any], Any]
C = TypeVar("C")


# --------------------------------------------------------------------------------------------
# What the sidecar's own calls need from the wrapped client
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sidecar:
    """Where and how the sidecar's own calls go: the client's first node, its TLS and credentials."""

    url: str
    ssl: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _is_elastic(client: Any) -> bool:
    """elasticsearch-py 8/9 sit on elastic_transport (a node pool); opensearch-py has its own Transport."""
    return hasattr(client.transport, "node_pool")


def node_url(client: Any) -> str:
    """The first node's base URL of an official client (elasticsearch-py 8/9, opensearch-py 2/3)."""
    transport = client.transport
    if _is_elastic(client):
        return str(transport.node_pool.all()[0].base_url).rstrip("/")
    host = transport.hosts[0]
    scheme = "https" if host.get("use_ssl") or transport.kwargs.get("use_ssl") else host.get("scheme", "http")
    prefix = host.get("url_prefix", "")
    prefix = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
    return f"{scheme}://{host['host']}:{host.get('port', 9200)}{prefix}"


def ssl_context(
    *,
    context: ssl.SSLContext | None = None,
    ca_certs: str | None = None,
    verify_certs: bool = True,
    client_cert: str | None = None,
    client_key: str | None = None,
) -> ssl.SSLContext:
    """The TLS context the official clients build from the same options (their own, when given one)."""
    if context is not None:
        return context
    ctx = ssl.create_default_context(cafile=ca_certs)
    if not verify_certs:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client_cert:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


def basic_auth(user_pass: str | Sequence[str]) -> str:
    """`Basic ...` from opensearch-py's `http_auth` ("user:pass" or (user, pass))."""
    user, _, password = (user_pass if isinstance(user_pass, str) else ":".join(user_pass)).partition(":")
    return upstream_basic_auth(user, password)


def sidecar_of(client: Any, url: str | None = None) -> Sidecar:
    """The sidecar's target as the wrapped client would reach its first node."""
    base = (url or node_url(client)).rstrip("/")
    https = base.startswith("https:")
    if _is_elastic(client):
        config = client.transport.node_pool.all()[0].config
        tls = None
        if https:
            tls = ssl_context(
                context=config.ssl_context,
                ca_certs=config.ca_certs,
                verify_certs=config.verify_certs,
                client_cert=config.client_cert,
                client_key=config.client_key,
            )
        return Sidecar(base, tls, credentials(client._headers))
    options = client.transport.kwargs
    tls = None
    if https:
        tls = ssl_context(
            context=options.get("ssl_context"),
            ca_certs=options.get("ca_certs"),
            verify_certs=options.get("verify_certs", True),
            client_cert=options.get("client_cert"),
            client_key=options.get("client_key"),
        )
    headers = credentials(options.get("headers") or {})
    auth = options.get("http_auth")
    if callable(auth):
        raise TypeError(
            "the wrapped client signs each request (callable http_auth, e.g. AWS SigV4): the sidecar's "
            "own calls cannot be signed the same way; use the proxy (`bmx-rerank serve`) instead"
        )
    if auth is not None:
        headers["authorization"] = basic_auth(auth)
    return Sidecar(base, tls, headers)


# --------------------------------------------------------------------------------------------
# Reading the request the official client built
# --------------------------------------------------------------------------------------------


def search_index(path: str) -> str | None:
    """The index expression of a search path (`/a,b/_search` -> "a,b", `/_search` -> "_all"), or None
    when the request is not a search (the wrapper leaves those alone)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if parts == ["_search"]:
        return "_all"
    if len(parts) == 2 and parts[1] == "_search":
        return urllib.parse.unquote(parts[0])
    return None


def query_strings(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Query parameters as the clients put them on the URL: lists comma-joined, booleans lower-case
    (opensearch-py hands them over already escaped, as UTF-8 bytes)."""
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in value)
        elif isinstance(value, bool):
            value = str(value).lower()
        out[key] = str(value)
    return out


# --------------------------------------------------------------------------------------------
# The rerank around a first stage
# --------------------------------------------------------------------------------------------


class _Core:
    """What both wrappers share: planning, and the rerank pipeline on one event loop."""

    def __init__(
        self,
        sidecar: Sidecar,
        policies: Sequence[Rule],
        on_rerank_error: str,
        stats: StatsFactory | None,
        timeout: float,
        cache_bytes: int,
        tf_probes: str,
        bounds: Bounds,
    ) -> None:
        self.sidecar = sidecar
        self.policies = list(policies)
        self.on_rerank_error = on_rerank_error
        self.stats: StatsFactory = stats or (lambda session, base: StatsCache(session, base))
        self.timeout = timeout
        self.cache_bytes = cache_bytes
        self.tf_probes = tf_probes
        self.bounds = bounds
        self.session: aiohttp.ClientSession | None = None
        self.reranker: Reranker | None = None
        self.applied: AppliedConfigs | None = None

    async def plan(
        self, index: str, params: Mapping[str, Any] | None, body: Any, headers: Mapping[str, str]
    ) -> Plan:
        """Read the search (raises SearchError on a bad `ext.bmx`, as the proxy answers 400): its own
        `ext.bmx`, else a policy, else the configuration applied to the index (`bmx-rerank eval --apply`);
        within the same bounds as the proxy's."""
        body_map = dict(body) if isinstance(body, Mapping) else None
        policy = match_policy(self.policies, index)
        if policy is None:
            self._ready()
            assert self.applied is not None
            policy = await self.applied.policy(index, body_map, headers)
        return bounded_plan(body_map, query_strings(params), policy, self.bounds)

    async def rerank(
        self,
        index: str,
        plan: Plan,
        headers: Mapping[str, str],
        first_stage: FirstStage,
        request_timeout: Any = None,
    ) -> Outcome:
        """The rerank, within one deadline: the client's `request_timeout` and `ext.bmx.deadline`,
        where given (the wrapped client bounds each of its own requests as usual)."""
        own = plan.spec.deadline if plan.spec is not None else None
        timeout = request_timeout if isinstance(request_timeout, (int, float)) else None
        with within(request_budget(0, timeout, own)):
            return await self._ready().rerank(index, plan, headers, first_stage)

    def _ready(self) -> Reranker:
        if self.reranker is None:
            connector = aiohttp.TCPConnector(ssl=self.sidecar.ssl) if self.sidecar.ssl else None
            self.session = aiohttp.ClientSession(connector=connector)
            self.reranker = Reranker(
                Cluster(self.session, self.sidecar.url, self.timeout),
                self.stats(self.session, self.sidecar.url),
                Metrics(),
                cache=TermVectorCache(self.cache_bytes),
                on_error=self.on_rerank_error,
                probes=self.tf_probes,
            )
            self.applied = AppliedConfigs(self.session, self.sidecar.url, timeout=self.timeout)
        return self.reranker

    def headers_for(self, request_headers: Mapping[str, str] | None) -> dict[str, str]:
        """The sidecar calls' headers for one search: the client's credentials, the request's own first."""
        return {**self.sidecar.headers, **credentials(request_headers)}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = self.reranker = self.applied = None


def _answered(response: Any) -> Answer:
    """The official client's answer to a first stage (it raises for a status >= 400)."""
    meta = getattr(response, "meta", None)
    return Answer(getattr(meta, "status", 200), _plain(response), response)


def _refused(exc: Exception) -> Answer | None:
    """An error the cluster answered a first stage with (elasticsearch-py's `ApiError`, opensearch-py's
    `TransportError`, both with an HTTP `status_code`), as an answer; None for any other failure."""
    status = getattr(exc, "status_code", None)
    return Answer(status, None, exc) if isinstance(status, int) and status >= 300 else None


def _result(outcome: Outcome) -> Any:
    """What `search` returns: the reranked body in the client's own response type, else the cluster's
    answer as the client gave it (its exception raised again)."""
    raw = outcome.answer.raw
    if outcome.body is None:
        if isinstance(raw, BaseException):
            raise raw
        return raw
    return _rewrap(raw, outcome.body)


def _plain(response: Any) -> dict[str, Any]:
    """A search answer as a dict (elasticsearch-py wraps it in an ObjectApiResponse)."""
    return dict(getattr(response, "body", response))


def _rewrap(response: Any, body: dict[str, Any]) -> Any:
    """The reranked body in the same type the client returns (ObjectApiResponse keeps its meta)."""
    meta = getattr(response, "meta", None)
    return body if meta is None else type(response)(body=body, meta=meta)


def _declined(response: Any, plan: Plan) -> Any:
    """The cluster's answer; a rerank the wrapper declined is said out loud in a `_bmx` marker (a library
    call has no header for it): `{"reranked": false, "skipped": reason}`."""
    if plan.skipped is None:
        return response
    answer = _plain(response)
    answer["_bmx"] = {"reranked": False, "skipped": plan.skipped}
    return _rewrap(response, answer)


def _request_timeout(view: Any, transport: Mapping[str, Any]) -> Any:
    """The caller's `request_timeout` (opensearch-py: a transport param; elasticsearch-py: an option
    of the client view, `client.options(request_timeout=...)`), or None."""
    if "request_timeout" in transport:
        return transport["request_timeout"]
    return getattr(view, "_request_timeout", None)


def _split_transport(params: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(search params, opensearch-py transport options kept in params)."""
    search = dict(params or {})
    transport = {k: search.pop(k) for k in TRANSPORT_PARAMS if k in search}
    return search, transport


# --------------------------------------------------------------------------------------------
# Hooking the official clients' transport
# --------------------------------------------------------------------------------------------

Hook = Callable[..., Any]


@functools.cache
def _hooked_class(base: type) -> type:
    """A subclass of an elasticsearch-py client class whose `perform_request` goes through the hook
    its instance carries; `options()` passes the hook on, so per-call transport options work too."""
    if asyncio.iscoroutinefunction(base.perform_request):

        class Hooked(base):  # type: ignore[valid-type,misc]
            _bmx_hook: Hook

            async def perform_request(self, method: str, path: str, **kw: Any) -> Any:
                return await self._bmx_hook(self, super().perform_request, method, path, kw)

    else:

        class Hooked(base):  # type: ignore[valid-type,misc,no-redef]
            _bmx_hook: Hook

            def perform_request(self, method: str, path: str, **kw: Any) -> Any:
                return self._bmx_hook(self, super().perform_request, method, path, kw)

    def options(self: Any, **kwargs: Any) -> Any:
        other = base.options(self, **kwargs)
        other._bmx_hook = self._bmx_hook
        return other

    Hooked.options = options  # type: ignore[method-assign]
    Hooked.__name__ = Hooked.__qualname__ = f"BMX{base.__name__}"
    return Hooked


def _hooked_elastic(client: Any, hook: Hook) -> Any:
    """A copy of an elasticsearch-py client (made by its own `options()`: same transport, headers,
    timeouts) whose requests pass through `hook`."""
    view = client.options()
    view.__class__ = _hooked_class(type(client))
    view._bmx_hook = hook
    return view


class _HookedTransport:
    """opensearch-py's transport with `perform_request` through a hook; everything else delegated."""

    def __init__(self, transport: Any, hook: Hook) -> None:
        self._transport = transport
        self._hook = hook

    def perform_request(self, method: str, url: str, *args: Any, **kw: Any) -> Any:
        return self._hook(None, self._transport.perform_request, method, url, kw, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _hooked_opensearch(client: Any, hook: Hook) -> Any:
    view = copy.copy(client)
    view.transport = _HookedTransport(client.transport, hook)
    return view


def _hooked(client: Any, hook: Hook) -> Any:
    return _hooked_elastic(client, hook) if _is_elastic(client) else _hooked_opensearch(client, hook)


def _request_headers(view: Any, kw: Mapping[str, Any]) -> dict[str, str]:
    """The headers the client sends with this request (elasticsearch-py merges its own in later)."""
    own = dict(view._headers) if view is not None else {}
    return {**own, **(kw.get("headers") or {})}


# --------------------------------------------------------------------------------------------
# The wrappers
# --------------------------------------------------------------------------------------------


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
        timeout: float = defaults.TIMEOUT,
        cache_bytes: int = defaults.CACHE_BYTES,
        tf_probes: str = defaults.TF_PROBES,
        bounds: Bounds | None = None,
        _core: _Core | None = None,
    ) -> None:
        self.client = client
        self._core = _core or _Core(
            sidecar_of(client, url),
            policies,
            on_rerank_error,
            stats,
            timeout,
            cache_bytes,
            tf_probes,
            bounds or Bounds(),
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class AsyncBMXClient(_Wrapper):
    """An `AsyncElasticsearch`/`AsyncOpenSearch` whose `search` reranks with BMX; close it when done."""

    async def search(self, **kwargs: Any) -> Any:
        """The wrapped client's `search`, reranked when `ext.bmx` (or a policy) asks for it."""
        return await _hooked(self.client, self._hook).search(**kwargs)

    async def _hook(self, view: Any, send: Any, method: str, path: str, kw: dict[str, Any], args=()) -> Any:
        index = search_index(path)
        if index is None or args:
            return await send(method, path, *args, **kw)
        params, transport = _split_transport(kw.get("params"))
        headers = self._core.headers_for(_request_headers(view, kw))
        plan = await self._core.plan(index, params, kw.get("body"), headers)
        if plan.spec is None:
            unchanged = {**kw, "params": {**plan.params, **transport}, "body": plan.body}
            return _declined(await send(method, path, **unchanged), plan)

        async def first_stage(body: dict[str, Any] | None, first: Mapping[str, str]) -> Answer:
            try:
                return _answered(
                    await send("POST", path, **{**kw, "params": {**first, **transport}, "body": body})
                )
            except Exception as exc:
                if (refused := _refused(exc)) is None:
                    raise
                return refused

        timeout = _request_timeout(view, transport)
        return _result(await self._core.rerank(index, plan, headers, first_stage, timeout))

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
        return _hooked(self.client, self._hook).search(**kwargs)

    def _hook(self, view: Any, send: Any, method: str, path: str, kw: dict[str, Any], args=()) -> Any:
        index = search_index(path)
        if index is None or args:
            return send(method, path, *args, **kw)
        params, transport = _split_transport(kw.get("params"))
        headers = self._core.headers_for(_request_headers(view, kw))
        plan = self._run(self._core.plan(index, params, kw.get("body"), headers))
        if plan.spec is None:
            unchanged = {**kw, "params": {**plan.params, **transport}, "body": plan.body}
            return _declined(send(method, path, **unchanged), plan)

        async def first_stage(body: dict[str, Any] | None, first: Mapping[str, str]) -> Answer:
            # The client is synchronous: its request runs in a worker thread, off the pipeline's loop.
            request = {**kw, "params": {**first, **transport}, "body": body}
            try:
                return _answered(await asyncio.to_thread(send, "POST", path, **request))
            except Exception as exc:
                if (refused := _refused(exc)) is None:
                    raise
                return refused

        timeout = _request_timeout(view, transport)
        return _result(self._run(self._core.rerank(index, plan, headers, first_stage, timeout)))

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
