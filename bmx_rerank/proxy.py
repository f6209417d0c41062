"""The rerank proxy: a drop-in `_search` in front of Elasticsearch/OpenSearch.

Every request passes through untouched (method, path, query string, headers, body bytes streamed both
ways, compressed bodies left compressed), except searches that carry `ext.bmx` or match a server-side
policy: those are widened to the rerank window, rescored with exact BMX, and paged inside the window.
Failures talking to the cluster come back in Elasticsearch's error shape (502 unreachable, 504 timeout);
the cluster's own errors pass through as they are; nothing ever answers with a stack trace."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import signal
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong
from multidict import CIMultiDict
from pythonjsonlogger.json import JsonFormatter
from yarl import URL

from bmx_rerank.applied import DEFAULT_TTL, AppliedConfigs
from bmx_rerank.errors import SearchError, UpstreamError, bad_request, timed_out, unreachable
from bmx_rerank.metrics import Metrics
from bmx_rerank.nodes import FailoverSession, NodePool, client_ssl, parse_nodes
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank import filter_path
from bmx_rerank.rerank.candidates import IDENTITY_HEADERS, TermVectorCache
from bmx_rerank.rerank.pipeline import PROBE_MODES, Reranker, SideCalls
from bmx_rerank.rerank.plan import Plan, plan_search
from bmx_rerank.rerank.spec import DEFAULT_WINDOW, MAX_WINDOW
from bmx_rerank.rerank.stats_source import StatsSource
from bmx_rerank.upstream import basic_auth, forwardable_headers

log = logging.getLogger("bmx_rerank.proxy")

# RFC 9110 §7.6.1 connection-specific headers, plus those the proxy recomputes itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
    )
)
# Headers aiohttp would add on its own to an upstream request; the client's own choice must win.
SKIP_AUTO = ("Accept-Encoding", "User-Agent", "Content-Type", "Accept")
MARKER_HEADER = "X-BMX-Rerank"
CHUNK = 64 * 1024
# Nesting levels of a search body the proxy rewrites (deeper ones it forwards unread, or refuses when
# they ask for a rerank): far beyond any real query (Elasticsearch refuses queries nested 30+ deep) and
# far below what copying and re-serializing can handle (orjson stops at 255, Python's recursion ~1000).
MAX_DEPTH = 100
# Answers bigger than this are parsed and serialized in a worker thread, so passthrough traffic never
# waits behind a large rerank.
THREAD_BYTES = 1 << 20
ON_OVERLOAD = ("fallback", "reject")
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"))  # the cluster's
CHECK_BYTES = 64 * 1024  # inflated bytes of a passthrough body checked for a valid encoding
BAD_ENCODING = web.RequestKey("bmx_bad_encoding", str)  # set when a body does not decode as labelled
MAX_LINE = 4096  # request line, as Elasticsearch's http.max_initial_line_length
MAX_FIELD = 8192  # one header, as Elasticsearch's http.max_header_size
STATE: web.AppKey[dict[str, Any]] = web.AppKey("bmx", dict)


@dataclass
class ProxyConfig:
    upstream: str | Sequence[str]  # one node URL, a comma-separated list, or a list (see bmx_rerank.nodes)
    policies: Sequence[Rule] = ()
    on_rerank_error: str = "fallback"
    timeout: float = 60.0  # first stage and sidecar calls, seconds
    connect_timeout: float = 10.0
    cache_bytes: int = 256 << 20  # term-vector cache, bytes (estimated)
    widen: bool = True
    # Term frequencies from the first stage (rerank/tf_probe): "auto" probes new windows only (see
    # `Reranker._probe`), "on" every search that can, "off" none; True/False mean "on"/"off".
    tf_probes: str | bool = "auto"
    upstream_ca: str | None = None  # PEM bundle the nodes' certificates are checked against
    upstream_cert: str | None = None  # client certificate (PEM) for https nodes
    upstream_key: str | None = None
    upstream_verify: bool = True
    applied_ttl: float = DEFAULT_TTL  # seconds an index's applied configuration is remembered (0: ignore)
    max_body: int = 64 << 20  # bytes of a search/msearch body read to look for ext.bmx, after inflation
    max_window: int = MAX_WINDOW  # hits a rerank may ask the cluster for
    max_augment: int = 64  # augmented queries (WQA) per search: each costs an `_analyze`
    max_msearch: int = 100  # items reranked per `_msearch`; the others get the cluster's own answer
    max_concurrent_reranks: int = 32  # reranks (searches or msearches) running at once
    on_overload: str = "fallback"  # past that: the cluster's own answer, marked, or "reject" (429)
    identity_headers: Sequence[str] = IDENTITY_HEADERS  # what tells callers apart (caches, statistics)

    def __post_init__(self) -> None:
        if self.on_overload not in ON_OVERLOAD:
            raise ValueError(f"on_overload must be one of {ON_OVERLOAD}, got {self.on_overload!r}")
        for name in ("max_body", "max_window", "max_msearch", "max_concurrent_reranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_augment < 0 or self.cache_bytes < 0:
            raise ValueError("max_augment and cache_bytes must be >= 0")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if isinstance(self.tf_probes, bool):
            self.tf_probes = "on" if self.tf_probes else "off"
        if self.tf_probes not in PROBE_MODES:
            raise ValueError(f"tf_probes must be one of {PROBE_MODES}, got {self.tf_probes!r}")


def split_upstream(url: str) -> tuple[str, str | None]:
    """The upstream base URL without userinfo, and a Basic Authorization header made from it, if any.

    Credentials never stay in a URL the proxy might log."""
    parsed = URL(url)
    auth = None if parsed.user is None else basic_auth(parsed.user, parsed.password)
    clean = parsed.with_user(None).with_password(None)
    return str(clean).rstrip("/"), auth


def make_app(
    config: ProxyConfig, stats: Callable[[aiohttp.ClientSession, str], StatsSource]
) -> web.Application:
    """The proxy application; `stats(session, base_url)` builds the statistics source at startup."""
    # Credentials in a node URL are refused: lent to requests without any, they would let every client
    # read as that user.
    pool = NodePool(parse_nodes([config.upstream] if isinstance(config.upstream, str) else config.upstream))
    tls = client_ssl(config.upstream_ca, config.upstream_cert, config.upstream_key, config.upstream_verify)
    base = pool.base
    app = web.Application(middlewares=[_no_route])
    metrics = Metrics()
    state: dict[str, Any] = {
        "config": config,
        "base": base,
        "nodes": pool.nodes,
        "metrics": metrics,
        "reranks": 0,
    }
    app[STATE] = state

    async def lifecycle(app: web.Application):
        # Two sessions: client traffic must stay byte-exact (no decompression), while the sidecar's own
        # JSON calls (analysis, term vectors, statistics) want ordinary decoded answers.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout)
        # Both fail over between the nodes; call sites build URLs on `base` (see bmx_rerank.nodes).
        session = FailoverSession(
            aiohttp.ClientSession(
                auto_decompress=False, connector=aiohttp.TCPConnector(limit=256, ssl=tls), timeout=timeout
            ),
            pool,
        )
        sidecar = FailoverSession(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, ssl=tls), timeout=timeout), pool
        )
        state["session"] = session
        state["reranker"] = Reranker(
            sidecar,  # type: ignore[arg-type]  # the ClientSession calls the reranker makes
            base,
            stats(sidecar, base),  # type: ignore[arg-type]
            metrics,
            cache=TermVectorCache(config.cache_bytes),
            timeout=config.timeout,
            on_error=config.on_rerank_error,
            probes=str(config.tf_probes),
            identity_headers=config.identity_headers,
        )
        state["applied"] = AppliedConfigs(
            sidecar,  # type: ignore[arg-type]
            base,
            ttl=config.applied_ttl,
            widen_default=config.widen,
            timeout=config.timeout,
        )
        yield
        await session.close()
        await sidecar.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/_bmx/health", _health)
    app.router.add_get("/_bmx/ready", _ready)
    app.router.add_get("/_bmx/metrics", _metrics)
    app.router.add_route("*", "/{tail:.*}", _dispatch)
    return app


async def _health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = {
        "status": "ok",
        "upstream": list(state["nodes"]),
        "on_rerank_error": state["config"].on_rerank_error,
    }
    return web.json_response(body)


READY_TIMEOUT = 5.0  # seconds each readiness check may take, at most


async def _ready(request: web.Request) -> web.Response:
    """Ready when the cluster answers HTTP and the statistics store can be read (or does not exist yet:
    then searches run in the estimated mode). Both checks run with the probe's own headers, as every
    call on a client's behalf does: on a secured cluster give the probe credentials that may read the
    store. 503 in Elasticsearch's error shape otherwise, saying which check failed."""
    state = request.app[STATE]
    reranker: Reranker = state["reranker"]
    headers = forwardable_headers(_client_headers(request))
    limit = min(state["config"].timeout, READY_TIMEOUT)
    checks: dict[str, str] = {}
    try:
        status = await _probe(reranker.session, state["base"] + "/", headers, limit)
        checks["upstream"] = "ok" if status < 500 else f"status {status}"
        store = getattr(reranker.stats, "store", None)
        if store is None:
            checks["statistics"] = "ok"  # fixed statistics, in memory
        else:
            status = await _probe(reranker.session, f"{state['base']}/{store}/_search?size=0", headers, limit)
            checks["statistics"] = {200: "ok", 404: "absent (estimated mode)"}.get(status, f"status {status}")
    except SearchError as exc:
        checks.setdefault("upstream", exc.type)
        checks.setdefault("statistics", "not checked")
    failed = {k: v for k, v in checks.items() if v != "ok" and not v.startswith("absent")}
    if failed:
        reason = "; ".join(f"{k}: {v}" for k, v in failed.items())
        err = SearchError(503, "bmx_not_ready_exception", f"the rerank proxy is not ready ({reason})")
        return web.json_response({**err.body(), "checks": checks}, status=503)
    return web.json_response({"status": "ready", "checks": checks})


async def _probe(session: Any, url: str, headers: Mapping[str, str], timeout: float) -> int:
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


async def _metrics(request: web.Request) -> web.Response:
    metrics: Metrics = request.app[STATE]["metrics"]
    resp = web.Response(body=metrics.render())
    resp.headers["Content-Type"] = metrics.content_type
    return resp


@web.middleware
async def _no_route(request: web.Request, handler: Any) -> web.StreamResponse:
    """A request no route takes (`CONNECT *`, an authority-form target): the router's plain-text 404
    becomes the cluster's answer to an unknown URI, a 400 in Elasticsearch's error shape."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        reason = f"no handler found for uri [{request.raw_path[:512]}] and method [{request.method}]"
        return error_response(bad_request(reason))


async def _dispatch(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    metrics: Metrics = state["metrics"]
    start = time.perf_counter()
    kind = "passthrough"
    status = 0
    try:
        if request.method not in METHODS:  # as Elasticsearch answers; OpenSearch would hang up
            raise SearchError(
                405, "method_not_allowed_exception", f"Unexpected http method: {request.method[:64]}"
            )
        if not request.raw_path.startswith("/"):  # absolute-form or `*` request target: no such route
            raise bad_request(
                f"no handler found for uri [{request.raw_path[:512]}] and method [{request.method}]"
            )
        route = search_route(request.method, request.path)
        if route is not None:
            kind, index = route
            try:
                resp = await (_search(request, index) if kind == "search" else _msearch(request, index))
                kind = resp.headers.get(MARKER_HEADER, kind) if kind == "search" else kind
            except _TooLarge as big:
                kind = "passthrough"
                resp = await _forward(request, big.body(request))
        else:
            resp = await _forward(request, await _stream_body(request))
        status = resp.status
        return resp
    except SearchError as err:
        metrics.errors.labels(err.type).inc()
        resp = error_response(err)
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
        metrics.requests.labels(kind.split(";")[0]).inc()
        log.info(
            "request",
            extra={
                "fields": {
                    "method": request.method,
                    "path": request.path,
                    "status": status,
                    "kind": kind,
                    "ms": round((time.perf_counter() - start) * 1000, 2),
                }
            },
        )


def search_route(method: str, path: str) -> tuple[str, str | None] | None:
    """("search" | "msearch", index expression or None) for the endpoints the proxy may rerank."""
    if method not in ("GET", "POST"):
        return None
    parts = [p for p in path.split("/") if p]
    if parts in (["_search"], ["_msearch"]):
        return parts[0][1:], None
    if len(parts) == 2 and parts[1] in ("_search", "_msearch") and not parts[0].startswith("_bmx"):
        return parts[1][1:], parts[0]
    return None


def error_response(err: SearchError) -> web.Response:
    """An error as the client would get it from the cluster: the cluster's own payload when it sent one."""
    if isinstance(err, UpstreamError) and err.payload:
        resp = web.Response(status=err.status, body=err.payload)
        resp.headers["Content-Type"] = err.content_type
        return resp
    resp = web.Response(status=err.status, body=orjson.dumps(err.body()))
    resp.headers["Content-Type"] = "application/json"
    return resp


# ---- passthrough ---------------------------------------------------------------------------------


def end_to_end_headers(headers: Mapping[str, str], *, drop: Sequence[str] = ()) -> CIMultiDict[str]:
    """Headers minus hop-by-hop ones (and `drop`), duplicates kept: a request's or an answer's."""
    skip = HOP_BY_HOP | {d.lower() for d in drop}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in skip:
            out.add(name, value)
    return out


async def _stream_body(request: web.Request):
    """The request body as an async stream (None when there is none): never buffered whole.

    A body labelled gzip or deflate has its first bytes inflated on the way (a bounded check, output
    discarded): the cluster closes the connection on a body that does not decode, and the client then
    learns why (400) instead of getting a 502 that reads as an outage."""
    if not request.body_exists:
        return None
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    check = _Inflater(encoding, CHECK_BYTES) if encoding in ("gzip", "deflate") else None

    async def chunks():
        nonlocal check
        async for chunk in request.content.iter_chunked(CHUNK):
            if check is not None:
                try:
                    check.feed(chunk)
                    check.parts.clear()
                except SearchError:
                    request[BAD_ENCODING] = encoding
                    check = None
                else:
                    check = None if check.size > check.limit else check
            yield chunk

    return chunks()


async def _forward(
    request: web.Request,
    data: Any,
    *,
    url: URL | None = None,
    headers: CIMultiDict[str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Send the request upstream and stream the answer back byte for byte."""
    state = request.app[STATE]
    session: FailoverSession = state["session"]
    hdrs = headers if headers is not None else _client_headers(request)
    if isinstance(data, (bytes, bytearray)):
        hdrs.popall("Content-Length", None)
    target = url or URL(state["base"] + request.raw_path, encoded=True)
    start = time.perf_counter()
    with _upstream_failures(request):
        upstream = await session.request(
            request.method,
            target,
            data=data,
            headers=hdrs,
            skip_auto_headers=SKIP_AUTO,
            allow_redirects=False,
            compress=None,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=state["config"].connect_timeout, sock_read=state["config"].timeout
            ),
        )
    state["metrics"].upstream_seconds.labels("passthrough").observe(time.perf_counter() - start)
    try:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        resp.headers.extend(end_to_end_headers(upstream.headers))
        for name, value in (extra or {}).items():
            resp.headers[name] = value
        await resp.prepare(request)
        if request.method != "HEAD":
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
        await resp.write_eof()
        return resp
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        # Headers are gone already: the only honest signal left is to cut the connection.
        log.warning("upstream broke mid-body", extra={"fields": {"error": exc.__class__.__name__}})
        raise ConnectionResetError("upstream broke mid-body") from exc
    finally:
        upstream.release()


@contextlib.contextmanager
def _upstream_failures(request: web.Request) -> Iterator[None]:
    """A call to the cluster that did not give a usable answer: 504 when slow, else 502 (refused,
    dropped, or not HTTP at all), in the cluster's error shape. Never the URL: it is the cluster's."""
    try:
        yield
    except asyncio.TimeoutError as exc:
        timeout = request.app[STATE]["config"].timeout
        raise timed_out(f"{request.method} {request.path} took longer than {timeout}s") from exc
    except aiohttp.ClientError as exc:
        encoding = request.get(BAD_ENCODING)
        if encoding:  # the cluster closed the connection on a body that does not decode
            raise bad_request(
                f"the request body is labelled [Content-Encoding: {encoding}] but is not valid {encoding}",
                "parse_exception",
            ) from exc
        raise unreachable(f"{request.method} {request.path} failed: {exc.__class__.__name__}") from exc


def _client_headers(request: web.Request, *, drop: Sequence[str] = ()) -> CIMultiDict[str]:
    """What goes upstream on the client's behalf: its end-to-end headers, credentials included."""
    return end_to_end_headers(request.headers, drop=drop)


# ---- search ---------------------------------------------------------------------------------------


class _TooLarge(Exception):
    """A search body past `max_body` (read or inflated): it goes upstream as sent, streamed, unread."""

    def __init__(self, prefix: bytes) -> None:
        super().__init__("search body too large to read")
        self.prefix = prefix

    async def body(self, request: web.Request) -> AsyncIterator[bytes]:
        yield self.prefix
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk


async def _read_json_body(request: web.Request) -> tuple[bytes, bytes]:
    """(raw bytes as sent, decoded bytes) of a search body; gzip and deflate bodies are inflated,
    streamed, to look in.

    Raises `_TooLarge` once the bytes read or inflated pass `max_body`: the cluster decides about such a
    body, as it would without the proxy (it may well accept a large `_msearch`), and it gets the bytes
    as they were sent. A body whose encoding does not decode is a 400 (the cluster would just close the
    connection)."""
    limit = request.app[STATE]["config"].max_body
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    inflater = _Inflater(encoding, limit) if encoding in ("gzip", "deflate") else None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        parts.append(chunk)
        size += len(chunk)
        if inflater is not None:
            inflater.feed(chunk)
        if size > limit or (inflater is not None and inflater.size > limit):
            raise _TooLarge(b"".join(parts))
    raw = b"".join(parts)
    if inflater is None or not raw:
        return raw, raw
    return raw, inflater.result()


class _Inflater:
    """Streamed gzip/deflate inflation that stops a little past `limit` bytes (a bomb never inflates)."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self._obj = zlib.decompressobj(self.wbits)

    def feed(self, data: bytes) -> None:
        try:
            while data and self.size <= self.limit:
                if self._obj.eof:  # a further gzip member follows
                    self._obj = zlib.decompressobj(self.wbits)
                piece = self._obj.decompress(data, self.limit - self.size + 1)
                self.parts.append(piece)
                self.size += len(piece)
                data = self._obj.unused_data if self._obj.eof else self._obj.unconsumed_tail
        except zlib.error as exc:
            raise self._broken() from exc

    def result(self) -> bytes:
        if not self._obj.eof:
            raise self._broken()
        return b"".join(self.parts)

    def _broken(self) -> SearchError:
        return bad_request(
            f"the request body is labelled [Content-Encoding: {self.encoding}] but is not valid {self.encoding}",
            "parse_exception",
        )


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data) if data.strip() else None
    except orjson.JSONDecodeError:
        return _Unparsable


class _Unparsable:
    """Marks a body the proxy cannot read: the cluster gets it as it is and answers for itself."""


async def _search(request: web.Request, index: str | None) -> web.StreamResponse:
    state = request.app[STATE]
    config: ProxyConfig = state["config"]
    raw, decoded = await _read_json_body(request)
    body = await _parse(decoded)
    if body is _Unparsable or (body is not None and not isinstance(body, dict)):
        return await _forward(request, raw or None)
    if body is not None and too_deep(body):
        if _asks_bmx(body):
            raise _too_deep_error()
        return await _forward(request, raw or None)  # the cluster answers such a body for itself
    policy = match_policy(config.policies, index) if index else None
    if policy is None:
        policy = await state["applied"].policy(index, body, forwardable_headers(_client_headers(request)))
    params = {k: v for k, v in request.query.items()}
    plan = bounded_plan(config, body, params, policy, skip=_unreadable_format(request))
    if plan.spec is not None and _overloaded(state):
        plan = replace(bounded_plan(config, body, params, policy, skip="overloaded"), skipped="overloaded")
    if plan.spec is None:
        extra = {MARKER_HEADER: f"skipped; reason={plan.skipped}"} if plan.skipped else None
        if plan.body == body:  # a policy's search: its original bytes
            return await _forward(request, raw or None, extra=extra)
        return await _forward(request, orjson.dumps(plan.body), headers=_json_headers(request), extra=extra)
    if index is None:
        raise bad_request("[bmx] reranking needs an index in the path: statistics are per index")
    return await _rerank_one(request, index, plan)


def bounded_plan(
    config: ProxyConfig,
    body: dict[str, Any] | None,
    params: Mapping[str, str],
    policy: Any,
    *,
    skip: str | None = None,
) -> Plan:
    """`plan_search` within the server's bounds: a rerank the client asked for beyond them is a 400; a
    policy's beyond them (a deep page through a drop-in policy) is not reranked at all. A request that
    does not name its window gets the default, or `max_window` when that is smaller."""
    ext = body.get("ext") if isinstance(body, dict) else None
    raw = ext.get("bmx") if isinstance(ext, dict) else None
    if isinstance(raw, dict) and "window_size" not in raw and config.max_window < DEFAULT_WINDOW:
        body = {**body, "ext": {**ext, "bmx": {**raw, "window_size": config.max_window}}}  # type: ignore[dict-item]
    plan = plan_search(body, params, policy, widen_default=config.widen, skip=skip)
    spec = plan.spec
    if spec is None:
        return plan
    asked = _asks_bmx(body)
    if spec.window_size > config.max_window:
        if not asked:
            return Plan(body, dict(params))
        raise bad_request(
            f"[bmx] [window_size] must lie in [1, {config.max_window}] (the server's --max-window), "
            f"got {spec.window_size}"
        )
    if len(spec.augment.queries) > config.max_augment:
        raise bad_request(
            f"[bmx] [augment.queries] takes at most {config.max_augment} queries (the server's "
            f"--max-augment), got {len(spec.augment.queries)}"
        )
    return plan


def _asks_bmx(body: Any) -> bool:
    """Whether a search body carries `ext.bmx` (read without copying it)."""
    return isinstance(body, dict) and isinstance(body.get("ext"), dict) and "bmx" in body["ext"]


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether a JSON value nests objects/arrays deeper than `limit` (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _too_deep_error() -> SearchError:
    return bad_request(
        f"[bmx] the request body nests deeper than [{MAX_DEPTH}] levels, more than a rerank reads",
        "x_content_parse_exception",
    )


def _overloaded(state: Mapping[str, Any]) -> bool:
    """True when `max_concurrent_reranks` reranks run already; raises the 429 when so configured."""
    config: ProxyConfig = state["config"]
    if state["reranks"] < config.max_concurrent_reranks:
        return False
    state["metrics"].reranks.labels("overloaded").inc()
    if config.on_overload == "reject":
        raise SearchError(
            429,
            "es_rejected_execution_exception",
            f"rejected: {config.max_concurrent_reranks} reranks are running (--max-concurrent-reranks)",
        )
    return True


@contextlib.contextmanager
def _rerank_slot(state: dict[str, Any]) -> Iterator[None]:
    state["reranks"] += 1
    try:
        yield
    finally:
        state["reranks"] -= 1


async def _parse(data: bytes) -> Any:
    """`_loads`, in a worker thread for large payloads."""
    if len(data) > THREAD_BYTES:
        return await asyncio.to_thread(_loads, data)
    return _loads(data)


def _unreadable_format(request: web.Request) -> str | None:
    """ "format" when the client asked for an answer the proxy cannot rerank (YAML, CBOR, Smile, via
    `format` or `Accept`): it would get the raw window otherwise. Such a search passes through."""
    fmt = request.query.get("format")
    if fmt is not None and fmt.lower() != "json":
        return "format"
    accept = request.headers.get("Accept", "").lower()
    if accept and "json" not in accept and "*/*" not in accept:
        return "format"
    return None


def _json_headers(request: web.Request) -> CIMultiDict[str]:
    """Client headers for a body the proxy re-serialized: identity encoding both ways."""
    hdrs = _client_headers(request, drop=("Content-Length", "Content-Encoding", "Accept-Encoding"))
    if "Content-Type" not in hdrs:
        hdrs["Content-Type"] = "application/json"
    return hdrs


async def _rerank_one(request: web.Request, index: str, plan: Plan) -> web.StreamResponse:
    state = request.app[STATE]
    reranker: Reranker = state["reranker"]
    start = time.perf_counter()
    fwd = forwardable_headers(_client_headers(request))
    with _rerank_slot(state):
        plan = await reranker.prepare(plan)
        side = reranker.start(index, plan, fwd)
        try:
            await reranker.first_stage(side, fwd)
            url = URL(state["base"] + request.path, encoded=False).with_query(side.params)
            status, headers, payload = await _call(request, url, orjson.dumps(side.body), "search")
            if status == 400 and reranker.drop_probes(side):
                url = URL(state["base"] + request.path, encoded=False).with_query(side.params)
                status, headers, payload = await _call(request, url, orjson.dumps(side.body), "search")
            data = await _parse(payload) if status < 300 else _Unparsable
            if status >= 300 or not isinstance(data, dict):
                side.cancel()
                return _raw_response(status, headers, payload)
            outcome = await reranker.finish(side, data, fwd)
        except BaseException:
            side.cancel()
            raise
        state["metrics"].rerank_seconds.observe(time.perf_counter() - start)
        big = len(payload) > THREAD_BYTES
        return await _json_answer(request, status, headers, outcome.body, {MARKER_HEADER: outcome.kind}, big)


async def _call(
    request: web.Request, url: URL, body: bytes, call: str
) -> tuple[int, CIMultiDict[str], bytes]:
    """One buffered upstream call with the client's headers (identity encoding), for the rerank path."""
    state = request.app[STATE]
    session: FailoverSession = state["session"]
    hdrs = _json_headers(request)
    start = time.perf_counter()
    try:
        with _upstream_failures(request):
            async with session.request(
                request.method,
                url,
                data=body,
                headers=hdrs,
                skip_auto_headers=SKIP_AUTO,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=state["config"].timeout),
            ) as resp:
                payload = await resp.read()
                headers = CIMultiDict(resp.headers)
                status = resp.status
    finally:
        state["metrics"].upstream_seconds.labels(call).observe(time.perf_counter() - start)
    if headers.get("Content-Encoding", "identity").lower() == "gzip":
        try:
            payload = gzip.decompress(payload)
        except (OSError, EOFError, zlib.error) as exc:
            raise unreachable(
                f"{request.method} {request.path}: the cluster's answer is not valid gzip"
            ) from exc
        headers.popall("Content-Encoding", None)
    return status, headers, payload


def _raw_response(status: int, headers: CIMultiDict[str], payload: bytes) -> web.Response:
    resp = web.Response(status=status, body=payload)
    resp.headers.extend(end_to_end_headers(headers, drop=("Content-Length",)))
    return resp


async def _json_answer(
    request: web.Request,
    status: int,
    headers: CIMultiDict[str],
    body: Any,
    extra: Mapping[str, str],
    big: bool = False,
) -> web.Response:
    """An answer the proxy built; indented, with a final newline, when the client asked for `pretty`.
    A `big` one is serialized in a worker thread."""
    pretty = request.query.get("pretty", "false").lower() in ("", "true")
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE if pretty else 0)
    data = (
        await asyncio.to_thread(orjson.dumps, body, option=option)
        if big
        else orjson.dumps(body, option=option)
    )
    resp = web.Response(status=status, body=data)
    resp.headers.extend(end_to_end_headers(headers, drop=("Content-Length", "Content-Encoding")))
    if "Content-Type" not in resp.headers:
        resp.headers["Content-Type"] = "application/json"
    resp.headers.update(extra)
    return resp


# ---- msearch --------------------------------------------------------------------------------------


def parse_ndjson(data: bytes) -> list[Any] | None:
    """The lines of an NDJSON body as JSON values, or None when any line is not JSON."""
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            return None
    return out


def _item_index(header: Mapping[str, Any], default: str | None) -> str | None:
    value = header.get("index", default)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value if isinstance(value, str) else default


async def _msearch(request: web.Request, index: str | None) -> web.StreamResponse:
    state = request.app[STATE]
    config: ProxyConfig = state["config"]
    raw, decoded = await _read_json_body(request)
    chunks = [line for line in decoded.split(b"\n") if line.strip()]
    lines = (
        await asyncio.to_thread(parse_ndjson, decoded)
        if len(decoded) > THREAD_BYTES
        else parse_ndjson(decoded)
    )
    if lines is None or len(lines) % 2 or not all(isinstance(x, dict) for x in lines):
        return await _forward(request, raw or None)
    # Per item: None when it goes up as sent, else its plan (a rerank, or ext.bmx removed and why).
    plans: list[tuple[str | None, Plan | None]] = []
    skip = _unreadable_format(request)
    reranked, overloaded = 0, False
    for header, body in zip(lines[0::2], lines[1::2], strict=True):
        item_index = _item_index(header, index)
        if too_deep(body):
            if _asks_bmx(body):
                raise _too_deep_error()
            plans.append((item_index, None))
            continue
        policy = match_policy(config.policies, item_index) if item_index else None
        if policy is None:
            policy = await state["applied"].policy(
                item_index, body, forwardable_headers(_client_headers(request))
            )
        plan = bounded_plan(config, body, {}, policy, skip=skip)
        if plan.spec is not None:
            if item_index is None:
                raise bad_request("[bmx] reranking needs an index (in the path or the msearch header)")
            overloaded = overloaded or (reranked == 0 and _overloaded(state))
            reason = "overloaded" if overloaded else "max_msearch" if reranked >= config.max_msearch else None
            if reason:
                plan = replace(bounded_plan(config, body, {}, policy, skip=reason), skipped=reason)
            else:
                reranked += 1
        unchanged = plan.spec is None and not plan.skipped and plan.body == body
        plans.append((item_index, None if unchanged else plan))
    if all(p is None for _, p in plans):
        return await _forward(request, raw)
    reranker: Reranker = state["reranker"]
    fwd = forwardable_headers(_client_headers(request))
    with _rerank_slot(state) if reranked else contextlib.nullcontext():
        plans = [(ix, p if p is None else await reranker.prepare(p)) for ix, p in plans]
        sides: dict[int, SideCalls] = {
            i: reranker.start(ix, p, fwd)
            for i, (ix, p) in enumerate(plans)
            if p is not None and p.spec is not None and ix
        }
        try:
            out = b"".join(
                (
                    orjson.dumps(sides[i].msearch_header(h, request.query.get("preference")))
                    + b"\n"
                    + orjson.dumps(sides[i].body or {})
                    + b"\n"
                )
                if i in sides
                else head + b"\n" + (item if p is None else orjson.dumps(p.body or {})) + b"\n"
                for i, (h, head, item, (_, p)) in enumerate(
                    zip(lines[0::2], chunks[0::2], chunks[1::2], plans, strict=True)
                )
            )
            # As for a single search: the window needs what a filter_path may drop; it applies at the end.
            query = dict(request.query)
            fpath = query.pop("filter_path", None) if sides else None
            url = URL(state["base"] + request.path, encoded=False).with_query(query)
            status, headers, payload = await _call(request, url, out, "msearch")
            data = await _parse(payload) if status < 300 else _Unparsable
            if status >= 300 or not isinstance(data, dict) or not isinstance(data.get("responses"), list):
                for side in sides.values():
                    side.cancel()
                return _raw_response(status, headers, payload)
            responses = data["responses"]
            results = await asyncio.gather(
                *(_msearch_item(reranker, side, responses[i], fwd) for i, side in sides.items())
            )
            for i, item in zip(sides, results, strict=True):
                responses[i] = item
            for i, (_, p) in enumerate(plans):
                item = responses[i] if i < len(responses) else None
                if p is not None and p.skipped and isinstance(item, dict) and "error" not in item:
                    item["_bmx"] = {"reranked": False, "skipped": p.skipped}
        except BaseException:
            for side in sides.values():
                side.cancel()
            raise
        answer = filter_path.apply(data, fpath)
        big = len(payload) > THREAD_BYTES
        return await _json_answer(request, status, headers, answer, {MARKER_HEADER: "msearch"}, big)


async def _msearch_item(reranker: Reranker, side: SideCalls, item: Any, fwd: Mapping[str, str]) -> Any:
    if not isinstance(item, dict) or "error" in item or "hits" not in item:
        side.cancel()
        return item
    try:
        return (await reranker.finish(side, item, fwd)).body
    except SearchError as err:
        return err.body()


# ---- logging --------------------------------------------------------------------------------------


class JsonLines(JsonFormatter):
    """One JSON object per line (python-json-logger): ts, level, logger, msg, the fields the code chose
    to log, and the stack trace (`exc_info`) of an exception. Never headers, bodies or userinfo: the
    proxy logs method, path, status, kind, timings and error classes only."""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger", "message": "msg"},
            datefmt="%Y-%m-%dT%H:%M:%SZ",
        )

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_record, record, message_dict)
        fields = log_record.pop("fields", None)
        if isinstance(fields, dict):
            log_record.update(fields)
        log_record["level"] = record.levelname.lower()


def json_log_handler(stream: Any) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    return handler


# ---- running --------------------------------------------------------------------------------------


class _EsShapedErrors(web_protocol.RequestHandler):
    """The HTTP server's own rejections (a request line or header too long, an unknown or lowercase
    method, bad framing) in Elasticsearch's error shape instead of aiohttp's plain text."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.info("bad http request", extra={"fields": {"status": status, "error": exc.__class__.__name__}})
        if request.writer.output_size > 0:
            raise ConnectionError("the answer is under way: no error answer can follow")
        err = http_error(status, exc)
        resp = web.Response(status=err.status, body=orjson.dumps(err.body()), content_type="application/json")
        resp.force_close()
        return resp


def http_error(status: int, exc: BaseException | None) -> SearchError:
    """The Elasticsearch-shaped error for a request the HTTP server itself could not take."""
    if isinstance(exc, BadHttpMethod):
        return SearchError(405, "method_not_allowed_exception", "unexpected http method")
    if isinstance(exc, LineTooLong):
        if len(exc.args) > 1 and exc.args[1] == MAX_LINE:
            return SearchError(
                400, "too_long_http_line_exception", f"An HTTP line is larger than {MAX_LINE} bytes."
            )
        return SearchError(
            400, "too_long_http_header_exception", f"HTTP header is larger than {MAX_FIELD} bytes."
        )
    if status == 504:
        return timed_out("the request took too long")
    if status >= 500:
        return SearchError(500, "bmx_proxy_exception", "the rerank proxy failed to handle the request")
    return SearchError(
        status, "bad_http_request_exception", f"malformed HTTP request ({exc.__class__.__name__})"
    )


class _Server(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _EsShapedErrors(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    """An AppRunner whose connections answer protocol errors in Elasticsearch's shape."""

    async def _make_server(self) -> web_server.Server:
        plain = await super()._make_server()
        # aiohttp builds its Server in Application._make_handler; this one only swaps the protocol.
        return _Server(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )


async def start_server(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[web.AppRunner, str]:
    """Run `app` in this event loop (port 0: an ephemeral port); returns the runner and the base URL
    (https with `ssl_context`, see `nodes.server_ssl`).

    Request bodies are not decompressed by the server, so compressed bodies pass through untouched."""
    runner = _Runner(
        app, auto_decompress=False, access_log=None, max_line_size=MAX_LINE, max_field_size=MAX_FIELD
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port or None)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound_host, bound_port = sock.getsockname()[:2]
    return runner, f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"


def serve_forever(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> None:
    """Run the proxy until SIGINT or SIGTERM, then close its connections and sessions (`reuse_port`:
    several worker processes share the port)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner, _ = await start_server(app, host, port, ssl_context=ssl_context, reuse_port=reuse_port)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
