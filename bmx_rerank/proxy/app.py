"""The proxy application: its routes (the ops endpoints, then every path to the cluster), startup and
shutdown, and the dispatch that sends each request down one path: `_search`, `_msearch`, or straight
through."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
from yarl import URL

from bmx_rerank.applied import AppliedConfigs
from bmx_rerank.errors import SearchError, bad_request, timed_out, unreachable
from bmx_rerank.h1 import H1Session
from bmx_rerank.identity import basic_auth, forwardable_headers
from bmx_rerank.logs import ACCESS
from bmx_rerank.metrics import Metrics
from bmx_rerank.nodes import FailoverSession, NodePool, client_ssl, parse_nodes
from bmx_rerank.proxy.admission import Admission
from bmx_rerank.proxy.bodies import ContentTooLong, TooDeep, TooLarge, refuse, stream_body
from bmx_rerank.proxy.config import ProxyConfig, ProxyState
from bmx_rerank.proxy.framing import METHODS, end_to_end, error_response
from bmx_rerank.proxy.http import Request, Response, json_response
from bmx_rerank.proxy.memory import CircuitBreaking, InFlight
from bmx_rerank.proxy.msearch import msearch
from bmx_rerank.proxy.relay import forward
from bmx_rerank.proxy.search import search
from bmx_rerank.rerank.lean import PageCache
from bmx_rerank.rerank.pipeline import Reranker
from bmx_rerank.rerank.plan import Bounds
from bmx_rerank.rerank.term_vector_cache import TermVectorCache
from bmx_rerank.stats.source import StatsSource
from bmx_rerank.upstream import Cluster

log = logging.getLogger("bmx_rerank.proxy")
READY_TIMEOUT = 5.0  # seconds each readiness check may take, at most
# Connections to the cluster at most, each of the two clients (the proxy's own, `h1`, and aiohttp's for
# streamed bodies): client traffic (passthrough and first stages), and the sidecar's own calls.
CLIENT_CONNECTIONS = 256
# Python collects its youngest generation every 700 net container allocations by default: a decoded
# window of 100 hits alone holds more, so nearly every rerank ran a collection that walked its live
# objects and aged them into older generations, walked again later (0.1-0.2 ms a rerank, measured:
# benchmarks/RESULTS.md). At 10,000 a request's objects are freed by their reference counts first;
# cyclic garbage waits for at most that many allocations (~1-2 MB).
GC_YOUNG_THRESHOLD = 10_000
SIDECAR_CONNECTIONS = 64


def split_upstream(url: str) -> tuple[str, str | None]:
    """The upstream base URL without userinfo, and a Basic Authorization header made from it, if any.

    Credentials never stay in a URL the proxy might log."""
    parsed = URL(url)
    auth = None if parsed.user is None else basic_auth(parsed.user, parsed.password)
    clean = parsed.with_user(None).with_password(None)
    return str(clean).rstrip("/"), auth


class ProxyApp:
    """The proxy: its state, what it starts and stops, and `handle`, which answers every request (the
    ops endpoints, else `_dispatch`). Served by `proxy.server`."""

    def __init__(self, config: ProxyConfig, stats: Callable[[Any, str], StatsSource]) -> None:
        # Credentials in a node URL are refused: lent to requests without any, they would let every
        # client read as that user.
        nodes = [config.upstream] if isinstance(config.upstream, str) else config.upstream
        self.pool = NodePool(parse_nodes(nodes))
        self.tls = client_ssl(
            config.upstream_ca, config.upstream_cert, config.upstream_key, config.upstream_verify
        )
        metrics = Metrics()
        admission = Admission(
            config.policies,
            Bounds(config.max_window, config.max_augment, config.widen),
            metrics,
            max_running=config.max_concurrent_reranks,
            reject=config.on_overload == "reject",
        )
        memory = InFlight(config.max_in_flight, metrics)
        self.state = ProxyState(config, self.pool.base, self.pool.nodes, metrics, admission, memory)
        self.stats = stats
        # run at the end of `startup`, each with the app (the benchmarks turn caches off there)
        self.on_startup: list[Callable[[ProxyApp], Awaitable[None]]] = []
        self._sidecar: FailoverSession | None = None

    async def startup(self) -> None:
        """The sessions to the cluster and the reranker.

        Two sessions: client traffic must stay byte-exact (no decompression), while the sidecar's own
        JSON calls (analysis, term vectors, statistics) want ordinary decoded answers. Both fail over
        between the nodes; call sites build URLs on `base` (see bmx_rerank.nodes). Neither keeps
        cookies: one the cluster (or a gateway before it) sets for a caller goes back to that caller
        alone, never with another caller's request (aiohttp's default jar would send it)."""
        state, config, tls = self.state, self.state.config, self.tls
        _collect_less_often()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout)
        connector = aiohttp.TCPConnector(limit=CLIENT_CONNECTIONS, ssl=tls)
        # Requests whose body is in memory go on connections of the proxy's own (`h1`, which keeps no
        # cookie either); the rest by aiohttp's client.
        session = aiohttp.ClientSession(
            auto_decompress=False, connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
        )
        state.session = FailoverSession(H1Session(session, limit=CLIENT_CONNECTIONS, tls=tls), self.pool)
        connector = aiohttp.TCPConnector(limit=SIDECAR_CONNECTIONS, ssl=tls)
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
        )
        sidecar = self._sidecar = FailoverSession(
            H1Session(session, limit=SIDECAR_CONNECTIONS, tls=tls), self.pool
        )
        state.reranker = Reranker(
            Cluster(sidecar, state.base, config.timeout),  # type: ignore[arg-type]  # a ClientSession's calls
            self.stats(sidecar, state.base),
            state.metrics,
            cache=TermVectorCache(config.cache_bytes),
            on_error=config.on_rerank_error,
            probes=str(config.tf_probes),
            identity_headers=config.identity_headers,
            pages=PageCache(config.page_cache_bytes),
            scored_in_engine=config.in_engine,
        )
        state.admission.applied = AppliedConfigs(
            sidecar,  # type: ignore[arg-type]
            state.base,
            ttl=config.applied_ttl,
            store=config.stats_index,
            widen_default=config.widen,
            timeout=config.timeout,
        )
        for hook in self.on_startup:
            await hook(self)

    async def cleanup(self) -> None:
        if self.state.session is not None:
            await self.state.session.close()
        if self._sidecar is not None:
            await self._sidecar.close()

    async def handle(self, request: Request) -> Response:
        """The answer to one request; never raises but `ConnectionResetError` (an answer cut midway)."""
        if request.method in ("GET", "HEAD"):
            ops = OPS.get(request.path)
            if ops is not None:
                return await ops(request)
        return await _dispatch(request)


def make_app(config: ProxyConfig, stats: Callable[[Any, str], StatsSource]) -> ProxyApp:
    """The proxy application; `stats(session, base_url)` builds the statistics source at startup."""
    return ProxyApp(config, stats)


def _collect_less_often() -> None:
    """The serving process's youngest-generation threshold raised to GC_YOUNG_THRESHOLD (never lowered)."""
    young, *older = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)


def search_route(method: str, encoded_path: str) -> tuple[str, str | None] | None:
    """("search" | "msearch", index expression or None) for the endpoints the proxy may rerank, from
    the path as sent: split before it is decoded, as a date-math name's `/` is escaped
    (`/%3Clogs-%7Bnow%2Fd%7D%3E/_search`)."""
    if method not in ("GET", "POST"):
        return None
    parts = [unquote(p) if "%" in p else p for p in encoded_path.split("/") if p]
    if parts in (["_search"], ["_msearch"]):
        return parts[0][1:], None
    if len(parts) == 2 and parts[1] in ("_search", "_msearch") and not parts[0].startswith("_bmx"):
        return parts[1][1:], parts[0]
    return None


async def _dispatch(request: Request) -> Response:
    state = request.state
    metrics = state.metrics
    start = time.perf_counter()
    kind = "passthrough"
    status = 0
    try:
        if request.version not in ((1, 0), (1, 1)):
            # As Elasticsearch answers (a 400 naming the version), on an HTTP/1.1 status line (the
            # server's for every other version): no HTTP/1.x client parses another.
            major, minor = request.version
            err = bad_request(f"Unexpected http protocol version: HTTP/{major}.{minor}")
            metrics.errors.labels(err.type).inc()
            resp = error_response(err)
            resp.force_close()
            status = resp.status
            return resp
        if request.method not in METHODS:  # as Elasticsearch answers; OpenSearch would hang up
            raise SearchError(
                405, "method_not_allowed_exception", f"Unexpected http method: {request.method[:64]}"
            )
        if not request.target.startswith("/"):  # absolute-form or `*` request target: no such route
            raise bad_request(
                f"no handler found for uri [{request.target[:512]}] and method [{request.method}]"
            )
        route = search_route(request.method, request.encoded_path)
        if route is not None:
            kind, index = route
            request.account = state.memory.account()
            try:
                resp = await (search(request, index) if kind == "search" else msearch(request, index))
            except TooLarge as big:
                kind = "passthrough"
                try:
                    resp = await forward(request, big.body(request))
                except Exception as exc:  # cut on the way: past --max-content-length, or too deep
                    if big.refusal is None:
                        raise
                    if isinstance(big.refusal, TooDeep):
                        refuse(request, metrics, "depth", streamed=big.size)
                    raise big.refusal from exc
        else:
            resp = await forward(request, stream_body(request))
        status = resp.status
        return resp
    except SearchError as err:
        metrics.errors.labels(err.type).inc()
        resp = error_response(err)
        if isinstance(err, ContentTooLong):  # the rest of the body is not read: the connection ends
            refuse(request, metrics, "content_length", length=request.content_length)
        if isinstance(err, (ContentTooLong, CircuitBreaking, TooDeep)) and not request.content.at_eof():
            resp.force_close()
        status = resp.status
        return resp
    except ConnectionResetError:
        raise  # the answer was already under way: closing the connection is the only signal left
    except Exception as exc:  # a bug of the proxy: say so in the cluster's error shape, no stack trace
        log.exception("proxy error", extra={"fields": {"error": exc.__class__.__name__}})
        err = SearchError(500, "bmx_proxy_exception", f"{exc.__class__.__name__} in the rerank proxy")
        metrics.errors.labels(err.type).inc()
        resp = error_response(err)
        status = resp.status
        return resp
    finally:
        account = request.account
        if account is not None:
            account.release()
        marker = request.marker
        metrics.served(marker.kind if marker else kind)
        ACCESS.write(
            {
                "method": request.method,
                "path": request.path,
                "status": status,
                "kind": str(marker) if marker else kind,
                "ms": round((time.perf_counter() - start) * 1000, 2),
            }
        )


# ---- ops endpoints ---------------------------------------------------------------------------------


async def _health(request: Request) -> Response:
    state = request.state
    body = {"status": "ok", "upstream": list(state.nodes), "on_rerank_error": state.config.on_rerank_error}
    return json_response(body)


async def _ready(request: Request) -> Response:
    """Ready when the cluster answers HTTP and the statistics store can be read (or does not exist yet:
    then searches run in the estimated mode). Both checks run with the probe's own headers, as every
    call on a client's behalf does: on a secured cluster give the probe credentials that may read the
    store. 503 in Elasticsearch's error shape otherwise, saying which check failed."""
    state = request.state
    reranker = state.rerank
    headers = forwardable_headers(end_to_end(request))
    limit = min(state.config.timeout, READY_TIMEOUT)
    checks: dict[str, str] = {}
    try:
        status = await _status_of(reranker.cluster.session, state.base + "/", headers, limit)
        checks["upstream"] = "ok" if status < 500 else f"status {status}"
        store = getattr(reranker.stats, "store", None)
        if store is None:
            checks["statistics"] = "ok"  # fixed statistics, in memory
        else:
            status = await _status_of(
                reranker.cluster.session, f"{state.base}/{store}/_search?size=0", headers, limit
            )
            checks["statistics"] = {200: "ok", 404: "absent (estimated mode)"}.get(status, f"status {status}")
    except SearchError as exc:
        checks.setdefault("upstream", exc.type)
        checks.setdefault("statistics", "not checked")
    failed = {k: v for k, v in checks.items() if v != "ok" and not v.startswith("absent")}
    if failed:
        reason = "; ".join(f"{k}: {v}" for k, v in failed.items())
        err = SearchError(503, "bmx_not_ready_exception", f"the rerank proxy is not ready ({reason})")
        return json_response({**err.body(), "checks": checks}, status=503)
    return json_response({"status": "ready", "checks": checks})


async def _status_of(session: Any, url: str, headers: Mapping[str, str], timeout: float) -> int:
    """The status of a GET, or a 502/504 `SearchError` when the cluster does not answer HTTP in time."""
    try:
        async with session.request(
            "GET", url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            return resp.status
    except asyncio.TimeoutError as exc:
        raise timed_out(f"no answer within {timeout}s") from exc
    except aiohttp.ClientError as exc:
        raise unreachable(exc.__class__.__name__) from exc


async def _metrics(request: Request) -> Response:
    metrics: Metrics = request.state.metrics
    return Response(200, metrics.render(), content_type=metrics.content_type)


OPS: dict[str, Callable[[Request], Awaitable[Response]]] = {
    "/_bmx/health": _health,
    "/_bmx/ready": _ready,
    "/_bmx/metrics": _metrics,
}
