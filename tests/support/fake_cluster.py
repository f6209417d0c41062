"""The fake cluster: a small corpus and enough of Elasticsearch in aiohttp for the proxy. `FakeCluster`
(for the unit tests: _search, _msearch, _analyze, _mtermvectors, mappings, echo, errors, slow and streamed
answers, recording what it was asked) and `TaggingCluster` (for fuzzing: tolerant of any input, every
answer tagged as its own); the proxy in front of either with the corpus's exact statistics, and a JSON
post."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bmx_rerank.proxy import ProxyApp, ProxyConfig, make_app, start_server
from bmx_rerank.proxy.server import Server
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.stats.source import FixedStats

DOCS = {
    "1": "t0 t0 t1",
    "2": "t0 t3 t3 t5 t6",
    "3": "t3",
    "4": "t1 t2 t2 t2",
    "5": "t0 t3 t4 t4 t4 t4 t4",
}
CORPUS = CorpusStats.from_documents(Counter(t.split()) for t in DOCS.values())
ES_HEADERS = {"X-Elastic-Product": "Elasticsearch"}


def window_hits(index: str, size: int, source: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """The first `size` documents of the corpus as the hits of a search, in corpus order, scores
    1, 1/2, 1/3, ...; `source(n)` is the n-th hit's `_source`."""
    hits = [
        {
            "_index": index,
            "_id": i,
            "_score": 1.0 / (n + 1),
            "_seq_no": n,
            "_primary_term": 1,
            "_source": source(n),
        }
        for n, i in enumerate(DOCS)
    ]
    return hits[:size]


class FakeCluster:
    """Enough of Elasticsearch for the proxy: _search, _msearch, _analyze, _mtermvectors, echo, errors."""

    def __init__(self) -> None:
        self.searches: list[dict] = []
        self.raw_bodies: list[bytes] = []  # every search's and msearch's body as it came
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.fail_termvectors = False
        self.analyze_calls = 0
        self.analyzers: list[str | None] = []  # the `analyzer` of each _analyze call
        self.sidecar_headers: list[dict[str, str]] = []  # of each _analyze and _mtermvectors call
        self.search_analyzer: str | None = None  # what the mapping of every index says
        self.probe_checks = 0  # searches with include_named_queries_score (refused)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("HEAD", "/", self.head)
        app.router.add_get("/gz", self.gz)
        app.router.add_get("/slow", self.slow)
        app.router.add_post("/sink", self.sink)
        app.router.add_get("/source", self.source)
        app.router.add_route("*", "/echo/{tail:.*}", self.echo)
        app.router.add_post("/_mtermvectors", self.termvectors)
        app.router.add_route("*", "/{index}/_analyze", self.analyze)
        app.router.add_get("/{index}/_mapping/field/{field}", self.mapping)
        app.router.add_route("*", "/{index}/_search", self.search)
        app.router.add_route("*", "/{index}/_msearch", self.msearch)
        return app

    async def head(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"name":"fake"}', content_type="application/json", headers=ES_HEADERS)

    async def gz(self, request: web.Request) -> web.Response:
        body = gzip.compress(b'{"compressed":true}')
        return web.Response(
            body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(1)  # past any test's proxy timeout (0.3 s); its cleanup waits for it
        return web.Response(text="late")

    async def sink(self, request: web.Request) -> web.Response:
        total = 0
        digest = hashlib.sha256()
        async for chunk in request.content.iter_chunked(1 << 16):
            total += len(chunk)
            digest.update(chunk)
        return web.json_response({"bytes": total, "sha256": digest.hexdigest()})

    async def source(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(int(request.query["chunks"])):
            await resp.write(b"x" * (1 << 20))
        await resp.write_eof()
        return resp

    async def echo(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append((request.method, request.path_qs, dict(request.headers), raw))
        headers = {
            **ES_HEADERS,
            "Warning": '299 Elasticsearch-8.19 "deprecated"',
            "X-Opaque-Id": request.headers.get("X-Opaque-Id", ""),
        }
        status = int(request.query.get("status", "200"))
        return web.Response(
            status=status, body=raw or b"{}", headers=headers, content_type="application/json"
        )

    async def mapping(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") == "Basic no-metadata":
            return web.json_response({"error": {"type": "security_exception"}, "status": 403}, status=403)
        index = request.match_info["index"]
        leaf = {"type": "text", **({"search_analyzer": self.search_analyzer} if self.search_analyzer else {})}
        return web.json_response({index: {"mappings": _field_mappings(request.match_info["field"], leaf)}})

    async def analyze(self, request: web.Request) -> web.Response:
        self.analyze_calls += 1
        self.sidecar_headers.append(dict(request.headers))
        body = await request.json()
        self.analyzers.append(body.get("analyzer"))
        tokens = [{"token": t.lower()} for t in body["text"].split()]
        return web.json_response({"tokens": tokens})

    async def termvectors(self, request: web.Request) -> web.Response:
        self.sidecar_headers.append(dict(request.headers))
        body = await request.json()
        docs = []
        for spec in body["docs"]:
            if self.fail_termvectors:
                docs.append({"_index": spec["_index"], "_id": spec["_id"], "error": {"reason": "boom"}})
                continue
            hidden = request.headers.get("Authorization") == "Basic fls"  # field-level security
            counts = Counter([] if hidden else DOCS[spec["_id"]].split())
            terms = {t: {"term_freq": c} for t, c in counts.items()}
            docs.append({"_id": spec["_id"], "found": True, "term_vectors": {"body": {"terms": terms}}})
        return web.json_response({"docs": docs})

    def _window(self, index: str, body: dict) -> dict:
        if index == "missing":
            raise web.HTTPNotFound(
                text=json.dumps({"error": {"type": "index_not_found_exception"}, "status": 404}),
                content_type="application/json",
            )
        size = body.get("size", 10)
        hits = window_hits(index, size, lambda n: {"n": n})
        return {
            "took": 1,
            "timed_out": False,
            "hits": {"total": {"value": 5, "relation": "eq"}, "max_score": 1.0, "hits": hits},
            "aggregations": {"a": {"value": 1}},
        }

    async def search(self, request: web.Request) -> web.Response:
        if "include_named_queries_score" in request.query:  # as an engine before ES 8.8 / OpenSearch 2.13
            self.probe_checks += 1
            reason = (
                f"request [{request.path}] contains unrecognized parameter: [include_named_queries_score]"
            )
            error = {"type": "illegal_argument_exception", "reason": reason}
            return web.json_response({"error": {"root_cause": [error], **error}, "status": 400}, status=400)
        self.raw_bodies.append(await request.read())
        body = await request.json() if request.body_exists else {}
        self.searches.append(body)
        return web.json_response(self._window(request.match_info["index"], body), headers=ES_HEADERS)

    async def msearch(self, request: web.Request) -> web.Response:
        self.raw_bodies.append(await request.read())
        try:
            lines = [json.loads(x) for x in (await request.read()).splitlines() if x.strip()]
        except ValueError:  # as the cluster: a body it cannot read is a 400
            return _es_error(400, "x_content_parse_exception", "not JSON")
        responses = []
        for header, body in zip(lines[0::2], lines[1::2], strict=True):
            self.searches.append(body)
            index = header.get("index", request.match_info["index"])
            try:
                responses.append({**self._window(index, body), "status": 200})
            except web.HTTPNotFound:
                responses.append({"error": {"type": "index_not_found_exception"}, "status": 404})
        return web.json_response({"took": 1, "responses": responses}, headers=ES_HEADERS)


UPSTREAM_TAG = "X-Fake-Upstream"
FAKE_BODY_LIMIT = 8 * 1024 * 1024  # the fake reads at most this much (inflated), like a cluster's cap


def _es_error(status: int, type_: str, reason: str) -> web.Response:
    cause = {"type": type_, "reason": reason}
    body = {"error": {"root_cause": [cause], **cause}, "status": status}
    return web.json_response(body, status=status)


class TaggingCluster:
    """Enough of Elasticsearch for reranking, every answer tagged `X-Fake-Upstream: 1`; bad input gets
    the cluster's 400, never a crash."""

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
        index = request.match_info["index"]
        return web.json_response(
            {index: {"mappings": _field_mappings(request.match_info["field"], {"type": "text"})}}
        )

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
        hits = window_hits(index, size, lambda n: {})
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


async def run_proxy(upstream: str, **config) -> tuple[Server, str]:
    """The proxy on an ephemeral port of this loop, with exact statistics of the corpus for `docs`."""
    return await start_server(proxy_app(upstream, ("docs", "docs,other", "docs-*"), **config))


def proxy_app(upstream: str, indices: tuple[str, ...], **config) -> ProxyApp:
    """The proxy app in front of `upstream`, with the corpus's exact statistics for each of `indices`."""
    stats = FixedStats({(name, "body"): CORPUS for name in indices})
    return make_app(ProxyConfig(upstream=upstream, **config), lambda session, base: stats)


async def post(client, url, body, **kw):
    """POST `body` as JSON: (status, headers, parsed answer)."""
    async with client.post(url, json=body, **kw) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


def _field_mappings(names: str, leaf: dict) -> dict:
    """`GET <index>/_mapping/field/<names>` of text fields (`leaf`), as the cluster answers it: each name
    given, `_source` as an index that keeps it maps it."""
    found = {}
    for name in names.split(","):
        found[name] = {"full_name": name, "mapping": {} if name == "_source" else {name: leaf}}
    return found
