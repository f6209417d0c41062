"""The rerank proxy: a drop-in `_search` in front of Elasticsearch/OpenSearch.

Every request passes through untouched (method, path, query string, headers, body bytes streamed both
ways, compressed bodies left compressed), except searches that carry `ext.bmx` or match a server-side
policy: those are widened to the rerank window, rescored with exact BMX, and paged inside the window.
Failures talking to the cluster come back in Elasticsearch's error shape (502 unreachable, 504 timeout);
the cluster's own errors pass through as they are; nothing ever answers with a stack trace."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from bmx_rerank.applied import DEFAULT_TTL, AppliedConfigs
from bmx_rerank.errors import SearchError, UpstreamError, bad_request, timed_out, unreachable
from bmx_rerank.metrics import Metrics
from bmx_rerank.nodes import FailoverSession, NodePool, client_ssl, parse_nodes
from bmx_rerank.policy import Rule
from bmx_rerank.policy import match as match_policy
from bmx_rerank.rerank import filter_path
from bmx_rerank.rerank.candidates import TermVectorCache
from bmx_rerank.rerank.pipeline import Reranker, SideCalls
from bmx_rerank.rerank.plan import Plan, plan_search
from bmx_rerank.rerank.stats_source import StatsSource
from bmx_rerank.upstream import forwardable_headers

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
SEARCH_BODY_LIMIT = 64 * 1024 * 1024  # search and msearch bodies are read whole, to look for ext.bmx
CHUNK = 64 * 1024
STATE: web.AppKey[dict[str, Any]] = web.AppKey("bmx", dict)


@dataclass
class ProxyConfig:
    upstream: str | Sequence[str]  # one node URL, a comma-separated list, or a list (see bmx_rerank.nodes)
    policies: Sequence[Rule] = ()
    on_rerank_error: str = "fallback"
    timeout: float = 60.0  # first stage and sidecar calls, seconds
    connect_timeout: float = 10.0
    cache_size: int = 100_000
    widen: bool = True
    tf_probes: bool = True  # term frequencies from the first stage where the cluster can (rerank/tf_probe)
    upstream_ca: str | None = None  # PEM bundle the nodes' certificates are checked against
    upstream_cert: str | None = None  # client certificate (PEM) for https nodes
    upstream_key: str | None = None
    upstream_verify: bool = True
    applied_ttl: float = DEFAULT_TTL  # seconds an index's applied configuration is remembered (0: ignore)


def split_upstream(url: str) -> tuple[str, str | None]:
    """The upstream base URL without userinfo, and a Basic Authorization header made from it, if any.

    Credentials never stay in a URL the proxy might log."""
    parsed = URL(url)
    auth = None
    if parsed.user is not None:
        token = base64.b64encode(f"{parsed.user}:{parsed.password or ''}".encode()).decode()
        auth = f"Basic {token}"
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
    app = web.Application()
    metrics = Metrics()
    state: dict[str, Any] = {"config": config, "base": base, "nodes": pool.nodes, "metrics": metrics}
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
            cache=TermVectorCache(config.cache_size),
            timeout=config.timeout,
            on_error=config.on_rerank_error,
            probes=config.tf_probes,
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


async def _metrics(request: web.Request) -> web.Response:
    metrics: Metrics = request.app[STATE]["metrics"]
    resp = web.Response(body=metrics.render())
    resp.headers["Content-Type"] = metrics.content_type
    return resp


async def _dispatch(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    metrics: Metrics = state["metrics"]
    start = time.perf_counter()
    kind = "passthrough"
    status = 0
    try:
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
    """The request body as an async stream (None when there is none): never buffered whole."""
    if not request.body_exists:
        return None

    async def chunks():
        async for chunk in request.content.iter_chunked(CHUNK):
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
        raise unreachable(f"{request.method} {request.path} failed: {exc.__class__.__name__}") from exc


def _client_headers(request: web.Request, *, drop: Sequence[str] = ()) -> CIMultiDict[str]:
    """What goes upstream on the client's behalf: its end-to-end headers, credentials included."""
    return end_to_end_headers(request.headers, drop=drop)


# ---- search ---------------------------------------------------------------------------------------


class _TooLarge(Exception):
    """A search body past SEARCH_BODY_LIMIT: it goes upstream as it is, streamed, unread."""

    def __init__(self, prefix: bytes) -> None:
        super().__init__("search body too large to read")
        self.prefix = prefix

    async def body(self, request: web.Request) -> AsyncIterator[bytes]:
        yield self.prefix
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk


async def _read_json_body(request: web.Request) -> tuple[bytes, bytes]:
    """(raw bytes as sent, decoded bytes) of a search body; compressed bodies are inflated to look in.

    Raises `_TooLarge` past SEARCH_BODY_LIMIT bytes: the cluster decides about such a body, as it would
    without the proxy (it may well accept a large `_msearch`)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        parts.append(chunk)
        size += len(chunk)
        if size > SEARCH_BODY_LIMIT:
            raise _TooLarge(b"".join(parts))
    raw = b"".join(parts)
    encoding = request.headers.get("Content-Encoding", "").lower().strip()
    try:
        if encoding == "gzip":
            return raw, gzip.decompress(raw)
        if encoding == "deflate":
            return raw, zlib.decompress(raw)
    except (OSError, zlib.error, EOFError):
        return raw, b""  # let the cluster answer a broken body as it would
    return raw, raw


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
    body = _loads(decoded)
    if body is _Unparsable or (body is not None and not isinstance(body, dict)):
        return await _forward(request, raw or None)
    policy = match_policy(config.policies, index) if index else None
    if policy is None:
        policy = await state["applied"].policy(index, body, forwardable_headers(_client_headers(request)))
    params = {k: v for k, v in request.query.items()}
    plan = plan_search(body, params, policy, widen_default=config.widen, skip=_unreadable_format(request))
    if plan.spec is None:
        extra = {MARKER_HEADER: f"skipped; reason={plan.skipped}"} if plan.skipped else None
        if plan.body == body:  # a policy's search: its original bytes
            return await _forward(request, raw or None, extra=extra)
        return await _forward(request, orjson.dumps(plan.body), headers=_json_headers(request), extra=extra)
    if index is None:
        raise bad_request("[bmx] reranking needs an index in the path: statistics are per index")
    return await _rerank_one(request, index, plan)


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
    plan = await reranker.prepare(plan)
    side = reranker.start(index, plan, fwd)
    try:
        await reranker.first_stage(side, fwd)
        url = URL(state["base"] + request.path, encoded=False).with_query(side.params)
        status, headers, payload = await _call(request, url, orjson.dumps(side.body), "search")
        if status == 400 and reranker.drop_probes(side):
            url = URL(state["base"] + request.path, encoded=False).with_query(side.params)
            status, headers, payload = await _call(request, url, orjson.dumps(side.body), "search")
        data = _loads(payload) if status < 300 else _Unparsable
        if status >= 300 or not isinstance(data, dict):
            side.cancel()
            return _raw_response(status, headers, payload)
        outcome = await reranker.finish(side, data, fwd)
    except BaseException:
        side.cancel()
        raise
    state["metrics"].rerank_seconds.observe(time.perf_counter() - start)
    return _json_answer(request, status, headers, outcome.body, {MARKER_HEADER: outcome.kind})


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
        payload = gzip.decompress(payload)
        headers.popall("Content-Encoding", None)
    return status, headers, payload


def _raw_response(status: int, headers: CIMultiDict[str], payload: bytes) -> web.Response:
    resp = web.Response(status=status, body=payload)
    resp.headers.extend(end_to_end_headers(headers, drop=("Content-Length",)))
    return resp


def _json_answer(
    request: web.Request, status: int, headers: CIMultiDict[str], body: Any, extra: Mapping[str, str]
) -> web.Response:
    """An answer the proxy built; indented, with a final newline, when the client asked for `pretty`."""
    pretty = request.query.get("pretty", "false").lower() in ("", "true")
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE if pretty else 0)
    resp = web.Response(status=status, body=orjson.dumps(body, option=option))
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
    lines = parse_ndjson(decoded)
    if lines is None or len(lines) % 2 or not all(isinstance(x, dict) for x in lines):
        return await _forward(request, raw or None)
    plans: list[tuple[str | None, Plan]] = []
    skip = _unreadable_format(request)
    for header, body in zip(lines[0::2], lines[1::2], strict=True):
        item_index = _item_index(header, index)
        policy = match_policy(config.policies, item_index) if item_index else None
        if policy is None:
            policy = await state["applied"].policy(
                item_index, body, forwardable_headers(_client_headers(request))
            )
        plan = plan_search(body, {}, policy, widen_default=config.widen, skip=skip)
        if plan.spec is not None and item_index is None:
            raise bad_request("[bmx] reranking needs an index (in the path or the msearch header)")
        plans.append((item_index, plan))
    if all(p.spec is None and p.body == b for (_, p), b in zip(plans, lines[1::2], strict=True)):
        return await _forward(request, raw)
    reranker: Reranker = state["reranker"]
    fwd = forwardable_headers(_client_headers(request))
    plans = [(ix, await reranker.prepare(p)) for ix, p in plans]
    sides: dict[int, SideCalls] = {
        i: reranker.start(ix, p, fwd) for i, (ix, p) in enumerate(plans) if p.spec is not None and ix
    }
    try:
        out = b"".join(
            (orjson.dumps(sides[i].msearch_header(h)) + b"\n" + orjson.dumps(sides[i].body or {}) + b"\n")
            if i in sides
            else orjson.dumps(h) + b"\n" + orjson.dumps(p.body or {}) + b"\n"
            for i, (h, (_, p)) in enumerate(zip(lines[0::2], plans, strict=True))
        )
        # As for a single search: the window needs what a filter_path may drop; it applies at the end.
        query = dict(request.query)
        fpath = query.pop("filter_path", None) if sides else None
        url = URL(state["base"] + request.path, encoded=False).with_query(query)
        status, headers, payload = await _call(request, url, out, "msearch")
        data = _loads(payload) if status < 300 else _Unparsable
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
        for i, (_, p) in enumerate(plans):  # declined out loud: an item has no header of its own
            if p.skipped and isinstance(responses[i], dict) and "hits" in responses[i]:
                responses[i]["_bmx"] = {"reranked": False, "skipped": p.skipped}
    except BaseException:
        for side in sides.values():
            side.cancel()
        raise
    return _json_answer(request, status, headers, filter_path.apply(data, fpath), {MARKER_HEADER: "msearch"})


async def _msearch_item(reranker: Reranker, side: SideCalls, item: Any, fwd: Mapping[str, str]) -> Any:
    if not isinstance(item, dict) or "error" in item or "hits" not in item:
        side.cancel()
        return item
    try:
        return (await reranker.finish(side, item, fwd)).body
    except SearchError as err:
        return err.body()


# ---- logging --------------------------------------------------------------------------------------


class JsonLines(logging.Formatter):
    """One JSON object per line; only the fields the code chose to log (never headers or userinfo)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        return json.dumps(entry, default=str)


# ---- running --------------------------------------------------------------------------------------


async def start_server(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """Run `app` in this event loop (port 0: an ephemeral port); returns the runner and the base URL
    (https with `ssl_context`, see `nodes.server_ssl`).

    Request bodies are not decompressed by the server, so compressed bodies pass through untouched."""
    runner = web.AppRunner(app, auto_decompress=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound_host, bound_port = sock.getsockname()[:2]
    return runner, f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"
