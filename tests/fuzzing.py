"""Bad input for the proxy: hypothesis strategies for malformed requests, a fake cluster that tags its
own answers, and the verdict on each answer. Shared by tests/unit/test_fuzz_proxy.py (a few hundred
examples in CI) and benchmarks/fuzz.py (>= 10,000, with the proxy's peak RSS).

The proxy runs for real (`make_app` + `start_server`) in a thread of its own with its own event loop;
requests go to it as raw bytes over a socket, so anything a client could send can be sent (lowercase
methods, bad framing, 8 KiB+ request lines). The fake cluster marks every answer it makes with
`X-Fake-Upstream: 1`: an error answer without that header is the sidecar's own."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import math
import socket
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from hypothesis import strategies as st

from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.rerank.spec import KEYS as EXT_BMX_KEYS
from bmx_rerank.stats.source import FixedStats
from tests.unit.test_proxy import CORPUS, DOCS  # the unit tests' fake corpus, one copy

UPSTREAM_TAG = "X-Fake-Upstream"
FAKE_BODY_LIMIT = 8 * 1024 * 1024  # the fake reads at most this much (inflated), like a cluster's cap


def _es_error(status: int, type_: str, reason: str) -> web.Response:
    cause = {"type": type_, "reason": reason}
    body = {"error": {"root_cause": [cause], **cause}, "status": status}
    return web.json_response(body, status=status)


class FakeCluster:
    """Enough of Elasticsearch for reranking; bad input gets the cluster's 400, never a crash."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._tag], client_max_size=FAKE_BODY_LIMIT)
        app.router.add_post("/_mtermvectors", self.termvectors)
        app.router.add_route("*", "/{index}/_analyze", self.analyze)
        app.router.add_get("/{index}/_mapping/field/{field}", self.mapping)
        app.router.add_route("*", "/{index}/_search", self.search)
        app.router.add_route("*", "/_search", self.search)
        app.router.add_route("*", "/{index}/_msearch", self.msearch)
        app.router.add_route("*", "/_msearch", self.msearch)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    @web.middleware
    async def _tag(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            resp = _es_error(exc.status, "http_exception", exc.reason)
        except Exception as exc:  # the fake's own limits: still a cluster answer, tagged
            resp = _es_error(400, "parse_exception", exc.__class__.__name__)
        resp.headers[UPSTREAM_TAG] = "1"
        return resp

    async def _body(self, request: web.Request) -> bytes:
        raw = await request.content.read(FAKE_BODY_LIMIT + 1)
        encoding = request.headers.get("Content-Encoding", "").lower()
        if encoding in ("gzip", "deflate"):
            d = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
            raw = d.decompress(raw, FAKE_BODY_LIMIT + 1)
        if len(raw) > FAKE_BODY_LIMIT:
            raise web.HTTPRequestEntityTooLarge(max_size=FAKE_BODY_LIMIT, actual_size=len(raw))
        return raw

    async def _json(self, request: web.Request) -> Any:
        raw = await self._body(request)
        if not raw.strip():
            return {}
        return json.loads(raw)

    async def other(self, request: web.Request) -> web.Response:
        await self._body(request)
        return web.json_response({"acknowledged": True})

    async def mapping(self, request: web.Request) -> web.Response:
        index, name = request.match_info["index"], request.match_info["field"]
        mapping = {name: {"full_name": name, "mapping": {name: {"type": "text"}}}}
        return web.json_response({index: {"mappings": mapping}})

    async def analyze(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        text = body.get("text", "")
        texts = text if isinstance(text, list) else [text]
        tokens = [{"token": t.lower()} for x in texts for t in str(x).split()]
        return web.json_response({"tokens": tokens})

    async def termvectors(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        docs = []
        for spec in body["docs"]:
            counts = Counter(DOCS.get(spec["_id"], "").split())
            terms = {t: {"term_freq": c} for t, c in counts.items()}
            docs.append(
                {
                    "_index": spec.get("_index"),
                    "_id": spec["_id"],
                    "found": True,
                    "term_vectors": {"body": {"terms": terms}},
                }
            )
        return web.json_response({"docs": docs})

    def _window(self, index: str, body: Any) -> dict[str, Any]:
        size = body.get("size", 10) if isinstance(body, dict) else 10
        size = size if isinstance(size, int) and 0 <= size <= 10_000 else 10
        hits = [
            {
                "_index": index,
                "_id": i,
                "_score": 1.0 / (n + 1),
                "_seq_no": n,
                "_primary_term": 1,
                "_source": {},
            }
            for n, i in enumerate(DOCS)
        ][:size]
        return {
            "took": 1,
            "timed_out": False,
            "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
            "hits": {"total": {"value": 5, "relation": "eq"}, "max_score": 1.0, "hits": hits},
        }

    async def search(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except (ValueError, RecursionError) as exc:
            return _es_error(400, "x_content_parse_exception", exc.__class__.__name__)
        if not isinstance(body, dict):
            return _es_error(400, "parsing_exception", "Unknown key")
        return web.json_response(self._window(request.match_info.get("index", "docs"), body))

    async def msearch(self, request: web.Request) -> web.Response:
        raw = await self._body(request)
        try:
            lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
        except (ValueError, RecursionError) as exc:
            return _es_error(400, "x_content_parse_exception", exc.__class__.__name__)
        responses = []
        for header, body in zip(lines[0::2], lines[1::2], strict=False):
            index = header.get("index", "docs") if isinstance(header, dict) else "docs"
            responses.append({**self._window(str(index), body), "status": 200})
        return web.json_response({"took": 1, "responses": responses})


# ---- the servers, in a thread ---------------------------------------------------------------------


@dataclass
class Servers:
    """A fake cluster and the real proxy in front of it, in a background event loop."""

    proxy_host: str = "127.0.0.1"
    proxy_port: int = 0
    upstream: str = ""
    loop: asyncio.AbstractEventLoop | None = None
    extra: dict[str, Any] = field(default_factory=dict)


STATS_INDICES = ("docs", "docs,other", "docs-*", "other")


def proxy_app(upstream: str, **config: Any) -> web.Application:
    stats = FixedStats({(name, "body"): CORPUS for name in STATS_INDICES})
    return make_app(ProxyConfig(upstream=upstream, **config), lambda session, base: stats)


@contextmanager
def running(**config: Any) -> Iterator[Servers]:
    """Start the fake cluster and the proxy in a daemon thread; stop both on exit."""
    servers = Servers()
    ready = threading.Event()
    stop: asyncio.Event | None = None
    errors: list[BaseException] = []

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        fake_runner = web.AppRunner(FakeCluster().app(), auto_decompress=False, access_log=None)
        await fake_runner.setup()
        site = web.TCPSite(fake_runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        servers.upstream = f"http://127.0.0.1:{port}"
        runner, url = await start_server(proxy_app(servers.upstream, **config))
        servers.proxy_port = int(url.rsplit(":", 1)[1])
        servers.loop = asyncio.get_running_loop()
        ready.set()
        await stop.wait()
        await runner.cleanup()
        await fake_runner.cleanup()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="fuzz-servers", daemon=True)
    thread.start()
    ready.wait(30)
    if errors:
        raise errors[0]
    try:
        yield servers
    finally:
        if servers.loop is not None and stop is not None:
            servers.loop.call_soon_threadsafe(stop.set)
        thread.join(30)


# ---- sending raw requests -------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """One request exactly as it goes on the wire (head and body given separately for readability)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    framing: str = "length"  # length | chunked | none | both (Content-Length and Transfer-Encoding)

    def wire(self, host: str) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/1.1", f"Host: {host}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        body = self.body
        if self.framing in ("length", "both"):
            lines.append(f"Content-Length: {len(body)}")
        if self.framing in ("chunked", "both"):
            lines.append("Transfer-Encoding: chunked")
            if self.framing == "chunked":
                body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        head = "\r\n".join(lines).encode("latin-1", "replace") + b"\r\n\r\n"
        return head + body

    def describe(self) -> str:
        return f"{self.method} {self.target[:120]} body={len(self.body)}B {self.body[:160]!r} framing={self.framing}"


@dataclass(frozen=True)
class Answer:
    status: int  # 0: the connection closed without an answer
    headers: dict[str, str]
    body: bytes


def send(servers: Servers, raw: Raw | bytes, timeout: float = 30.0) -> Answer:
    """Send the bytes, read one HTTP answer (or none, when the server just closes)."""
    data = raw.wire(f"{servers.proxy_host}:{servers.proxy_port}") if isinstance(raw, Raw) else raw
    with socket.create_connection((servers.proxy_host, servers.proxy_port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything: read what it said
        resp = http.client.HTTPResponse(sock, method=raw.method.upper() if isinstance(raw, Raw) else None)
        try:
            resp.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return Answer(0, {}, b"")
        except http.client.HTTPException as exc:  # e.g. a status line that is not HTTP/1.x
            return Answer(-1, {}, repr(exc).encode())
        try:
            body = resp.read()
        except (http.client.IncompleteRead, ConnectionResetError) as exc:
            body = getattr(exc, "partial", b"")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)


# ---- the verdict ----------------------------------------------------------------------------------


def es_error_shape(body: bytes, status: int) -> str | None:
    """None when `body` is `{"error": {"root_cause": [...], "type", "reason"}, "status": status}`."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"not JSON: {body[:200]!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
        return f"no error object: {body[:200]!r}"
    err = doc["error"]
    if not isinstance(err.get("root_cause"), list) or not err["root_cause"]:
        return f"no root_cause: {body[:200]!r}"
    if not isinstance(err.get("type"), str) or not isinstance(err.get("reason"), str):
        return f"no type/reason: {body[:200]!r}"
    if doc.get("status") != status:
        return f"status {doc.get('status')} in the body, {status} on the wire"
    return None


def problems(raw: Raw | None, answer: Answer) -> list[str]:
    """What is wrong with the proxy's answer to `raw`: [] when it is acceptable."""
    out = []
    from_upstream = answer.headers.get(UPSTREAM_TAG.lower()) == "1"
    if answer.status == 0:
        out.append("no answer at all (connection closed)")
    elif answer.status == -1:
        out.append(f"an answer that is not HTTP/1.x: {answer.body[:200]!r}")
    elif answer.status >= 500 and not from_upstream:
        out.append(f"sidecar answered {answer.status}: {answer.body[:300]!r}")
    if answer.status >= 400 and not from_upstream and (raw is None or raw.method.upper() != "HEAD"):
        shape = es_error_shape(answer.body, answer.status)
        if shape:
            out.append(f"rejection {answer.status} not in Elasticsearch's error shape: {shape}")
    marker = answer.headers.get("x-bmx-rerank", "")
    if answer.status == 200 and marker in ("bmx", "bm25"):
        try:
            doc = json.loads(answer.body)
            scores = [h.get("_score") for h in doc["hits"]["hits"]]
        except (ValueError, KeyError, TypeError) as exc:
            return [*out, f"reranked 200 is not a search answer: {exc}"]
        bad = [s for s in scores if not isinstance(s, (int, float)) or not math.isfinite(s)]
        if bad:
            out.append(f"reranked scores not finite numbers: {bad[:3]}")
    return out


# ---- strategies -----------------------------------------------------------------------------------

BMX_KEYS = EXT_BMX_KEYS  # every key ext.bmx takes, so a new one is fuzzed too
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 10_000, 10_001, 2**31, 2**63, 1e308, -1e308, 5e-324, 1e-300]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
WILD = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
GOOD_VALUES = {
    "field": st.sampled_from(["body", "title", "", "body.keyword"]),
    "fields": st.lists(st.sampled_from(["body", "title^2", "body^1e308", "^3", "", "body^-1"]), max_size=40),
    "combine": st.sampled_from(["replace", "linear", "rrf", "sum", ""]),
    "weight": NUMBERS,
    "rank_constant": st.one_of(st.integers(-5, 2_000_000), st.sampled_from([2**40, 10**30])),
    "query": st.sampled_from(["t0 t3", "t4", "", "T0 t9 t1"]),
    "window_size": st.one_of(st.integers(min_value=-5, max_value=20_000), st.sampled_from([2**40, 10**30])),
    "alpha": NUMBERS,
    "beta": NUMBERS,
    "k1": NUMBERS,
    "b": NUMBERS,
    "normalize": st.sampled_from(["none", "paper", "reference", "x"]),
    "min_score": NUMBERS,
    "mode": st.sampled_from(["bmx", "bm25", "BMX", ""]),
    "augment": st.one_of(
        st.fixed_dictionaries(
            {"queries": st.lists(st.sampled_from(["t0", "t3 t4", "", "x"]), max_size=6)},
            optional={"weights": st.lists(NUMBERS, max_size=6)},
        ),
        st.builds(lambda n: {"queries": ["t0"] * n, "weights": [0.1] * n}, st.integers(0, 3000)),
    ),
    "wqa_mode": st.sampled_from(["merged", "sum", "none"]),
    "widen": st.booleans(),
    "explain": st.booleans(),
}


@st.composite
def bmx_section(draw: st.DrawFn) -> Any:
    """`ext.bmx`: mostly plausible keys with edge values, sometimes wrong types or unknown keys."""
    keys = draw(st.lists(st.sampled_from(BMX_KEYS), unique=True, max_size=len(BMX_KEYS)))
    out: dict[str, Any] = {"field": "body"} if draw(st.booleans()) else {}
    for key in keys:
        out[key] = draw(st.one_of(GOOD_VALUES[key], GOOD_VALUES[key], WILD))
    if draw(st.integers(0, 9)) == 0:
        out[draw(st.text(min_size=1, max_size=8))] = draw(WILD)
    if draw(st.integers(0, 9)) == 0:
        return draw(WILD)  # not even an object
    return out


@st.composite
def search_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["query"] = draw(
            st.one_of(
                st.just({"match": {"body": "t0 t3"}}),
                st.builds(lambda t: {"match": {"body": t}}, st.text(max_size=30)),
                st.builds(
                    lambda t: {"multi_match": {"query": t, "fields": ["body", "title"]}}, st.text(max_size=10)
                ),
                WILD,
            )
        )
    for key in ("from", "size"):
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(st.one_of(st.integers(-3, 20_000), WILD))
    if draw(st.integers(0, 5)) == 0:
        body[
            draw(st.sampled_from(["sort", "search_after", "pit", "aggs", "rescore", "track_total_hits"]))
        ] = draw(WILD)
    if draw(st.integers(0, 5)) != 0:
        body["ext"] = {"bmx": draw(bmx_section())}
    elif draw(st.booleans()):
        body["ext"] = draw(WILD)
    return body


def nest(depth: int, where: str) -> bytes:
    """A body nested `depth` levels deep: inside ext.bmx, inside the query, or as the whole body."""
    inner = b"[" * depth + b"1" + b"]" * depth
    if where == "bmx":
        return b'{"query":{"match":{"body":"t0"}},"ext":{"bmx":{"field":"body","augment":' + inner + b"}}}"
    if where == "query":
        return b'{"query":{"bool":{"filter":' + inner + b"}}}"
    if where == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return inner


def mutate(data: bytes, cuts: list[tuple[int, bytes]]) -> bytes:
    """Broken JSON: bytes replaced at a few positions (invalid UTF-8 included)."""
    out = bytearray(data)
    for pos, junk in cuts:
        if out:
            i = pos % len(out)
            out[i : i + len(junk)] = junk
    return bytes(out)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, allow_nan=False).encode()


@st.composite
def body_bytes(draw: st.DrawFn) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A search body and the headers that label it (content type, sometimes an encoding)."""
    kind = draw(
        st.sampled_from(["json", "json", "json", "broken", "nested", "utf8", "ndjson", "empty", "binary"])
    )
    if kind == "json":
        data = _dumps(draw(search_body()))
    elif kind == "broken":
        cuts = draw(
            st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=4)), max_size=3)
        )
        data = mutate(_dumps(draw(search_body())), cuts)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    elif kind == "nested":
        depth = draw(st.one_of(st.integers(1, 300), st.integers(240, 270), st.integers(400, 5000)))
        data = nest(depth, draw(st.sampled_from(["bmx", "query", "objects", "bare"])))
    elif kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]))
        data = b'{"query":{"match":{"body":"t0 ' + bad + b'"}},"ext":{"bmx":{"field":"body"}}}'
    elif kind == "ndjson":
        items = draw(
            st.lists(
                st.one_of(
                    st.just({}), st.builds(lambda i: {"index": i}, st.sampled_from(["docs", "x"])), WILD
                ),
                max_size=4,
            )
        )
        lines = []
        for header in items:
            lines += [_dumps(header), _dumps(draw(search_body()))]
        data = b"\n".join(lines) + b"\n"
        if draw(st.booleans()):
            data = mutate(data, [(draw(st.integers(0, 1000)), b"\n{")])
    elif kind == "binary":
        data = draw(st.binary(max_size=200))
    else:
        data = b""
    headers: list[tuple[str, str]] = [
        (
            "Content-Type",
            draw(
                st.sampled_from(
                    [
                        "application/json",
                        "application/x-ndjson",
                        "text/plain",
                        "application/vnd.elasticsearch+json; compatible-with=8",
                    ]
                )
            ),
        )
    ]
    encoding = draw(st.sampled_from(["", "", "", "gzip", "gzip-lie", "deflate", "br"]))
    if encoding == "gzip":
        data = gzip.compress(data)
        headers.append(("Content-Encoding", "gzip"))
    elif encoding == "gzip-lie":
        headers.append(("Content-Encoding", "gzip"))  # says gzip, is not
    elif encoding == "deflate":
        data = zlib.compress(data)
        headers.append(("Content-Encoding", "deflate"))
    elif encoding == "br":
        headers.append(("Content-Encoding", "br"))
    if draw(st.integers(0, 4)) == 0:
        headers.append(
            (
                draw(st.sampled_from(["Accept", "Authorization", "X-Opaque-Id", "Accept-Encoding"])),
                draw(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)),
            )
        )
    return data, tuple(headers)


SEGMENT = st.sampled_from(
    [
        "docs",
        "docs-*",
        "docs,other",
        "other",
        "_all",
        "*",
        "%2e%2e",
        "..",
        "",
        "_bmx",
        "d%C3%A9",
        "%ff",
        "a b",
    ]
)
ENDPOINT = st.sampled_from(
    ["_search", "_search", "_msearch", "_count", "_doc/1", "_bulk", "_bmx/health", "_bmx/metrics", ""]
)
QUERY = st.sampled_from(
    [
        "",
        "",
        "?size=3",
        "?from=2&size=2",
        "?size=-1",
        "?size=x",
        "?pretty",
        "?filter_path=hits.hits._id",
        "?format=yaml",
        "?from=99999&size=1",
        "?%zz",
        "?q=t0&size=2",
    ]
)


@st.composite
def targets(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(
            st.sampled_from(
                [
                    "*",
                    "http://127.0.0.1:1/docs/_search",
                    "//docs/_search",
                    "/docs/_search#frag",
                    "docs/_search",
                    "/docs//_search",
                    "/%00/_search",
                    "/docs/_search/../../_bulk",
                ]
            )
        )
    segments = draw(st.lists(SEGMENT, max_size=2))
    return "/" + "/".join([*segments, draw(ENDPOINT)]) + draw(QUERY)


METHODS = st.sampled_from(["POST", "POST", "POST", "GET", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])


@st.composite
def requests(draw: st.DrawFn) -> Raw:
    """Any request a client could send: mostly searches, with every kind of bad body."""
    method = draw(st.one_of(METHODS, st.sampled_from(["post", "get", "FOO", "M-SEARCH", "CONNECT", "TRACE"])))
    data, headers = draw(body_bytes())
    framing = draw(st.sampled_from(["length", "length", "length", "chunked", "none", "both"]))
    if framing == "none":
        data = b""
    return Raw(method, draw(targets()), headers, data, framing)


def gzip_bomb(inflated: int) -> bytes:
    """A valid gzip of a JSON search whose inflated size is about `inflated` bytes (mostly spaces)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [comp.compress(b'{"query":{"match":{"body":"t0"}},"ext":{"bmx":{"field":"body"}}')]
    block = b" " * (1 << 20)
    for _ in range(inflated >> 20):
        out.append(comp.compress(block))
    out.append(comp.compress(b"}"))
    out.append(comp.flush())
    return b"".join(out)
