"""The proxy's bounds against a fake cluster: body and inflation caps, windows, augmentations, msearch
items, concurrent reranks, nesting depth, and the HTTP server's own rejections in Elasticsearch's shape."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import socket
import warnings
import zlib

import pytest
from aiohttp import web

from bmx_rerank.policy import parse_rules
from bmx_rerank.proxy.bodies import MAX_DEPTH, Inflater, nesting
from tests.support.fake_cluster import FakeCluster, post, run_proxy
from tests.support.serving import serve_app

BMX = {"field": "body", "query": "t3", "window_size": 5}
NDJSON = {"Content-Type": "application/x-ndjson"}


class Recording(FakeCluster):
    """Also keeps the raw bytes of every search, and can hold term vectors until released."""

    def __init__(self) -> None:
        super().__init__()
        self.raw_searches: list[tuple[dict[str, str], bytes]] = []
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/raw/_search", self.raw)
        for route in super().app().router.routes():
            app.router.add_route(route.method, route.resource.canonical, route.handler)
        return app

    async def raw(self, request: web.Request) -> web.Response:
        self.raw_searches.append((dict(request.headers), await request.read()))
        return web.json_response({"hits": {"hits": []}}, status=200)

    async def termvectors(self, request: web.Request) -> web.Response:
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        return await super().termvectors(request)


@pytest.fixture
async def cluster():
    fake = Recording()
    runner, url = await serve_app(fake.app())
    yield fake, url
    await runner.cleanup()


@pytest.fixture
async def client():
    import aiohttp

    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def proxy_for(cluster, **config):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, **config)
    return fake, runner, url


def _error(body, kind):
    assert body["error"]["type"] == kind and body["error"]["root_cause"][0]["type"] == kind, body
    assert body["status"] >= 400


# ---- bodies ----


def test_inflation_stops_at_the_cap_whatever_the_bomb():
    bomb = gzip.compress(b"\0" * (100 << 20), 9)  # 100 MiB in about 100 KiB
    inflater = Inflater("gzip", 1 << 20)
    for i in range(0, len(bomb), 65536):
        inflater.feed(bomb[i : i + 65536])
        if inflater.size > inflater.limit:
            break
    assert inflater.limit < inflater.size <= inflater.limit + 1, "never more than the cap plus one byte"
    assert sum(len(p) for p in inflater.parts) == inflater.size


def test_inflation_of_a_valid_body_and_of_concatenated_gzip_members():
    body = json.dumps({"query": {"match": {"body": "t3"}}}).encode()
    for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        inflater = Inflater(encoding, 1 << 20)
        for i in range(0, len(data), 7):
            inflater.feed(data[i : i + 7])
        assert inflater.result() == body
    two = Inflater("gzip", 1 << 20)
    two.feed(gzip.compress(b'{"a":') + gzip.compress(b"1}"))
    assert two.result() == b'{"a":1}'


async def test_a_gzip_bomb_goes_upstream_compressed_and_unread(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_body=1 << 20)
    try:
        body = b'{"ext":{"bmx":{"field":"body"}},"pad":"' + b" " * (50 << 20) + b'"}'
        bomb = gzip.compress(body, 9)
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        async with client.post(f"{url}/raw/_search", data=bomb, headers=headers) as resp:
            assert resp.status == 200 and "X-BMX-Rerank" not in resp.headers
        seen, raw = fake.raw_searches[-1]
        assert raw == bomb and seen["Content-Encoding"] == "gzip", "the cluster got the bytes as sent"
    finally:
        await runner.cleanup()


async def test_a_compressed_search_within_the_cap_is_reranked(cluster, client):
    _, runner, url = await proxy_for(cluster)
    try:
        data = gzip.compress(json.dumps({"size": 2, "ext": {"bmx": BMX}}).encode())
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        async with client.post(f"{url}/docs/_search", data=data, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "bmx"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_labelled_compressed_that_is_not_is_a_400_not_a_502(cluster, client, encoding):
    _, runner, url = await proxy_for(cluster)
    try:
        for data in (b'{"query":{"match_all":{}}}', gzip.compress(b'{"size":1}')[:-6]):
            headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
            async with client.post(f"{url}/docs/_search", data=data, headers=headers) as resp:
                assert resp.status == 400
                _error(await resp.json(), "parse_exception")
    finally:
        await runner.cleanup()


# ---- windows, augmentations, msearch items ----


async def test_window_beyond_max_window_is_a_400_and_a_policy_beyond_it_is_not_reranked(cluster, client):
    rules = parse_rules(["docs-*=body,window_size=5"])
    fake, runner, url = await proxy_for(cluster, max_window=20, policies=rules)
    try:
        status, _, body = await post(
            client, f"{url}/docs/_search", {"ext": {"bmx": {**BMX, "window_size": 21}}}
        )
        assert status == 400 and "--max-window" in body["error"]["reason"]
        _error(body, "illegal_argument_exception")
        n = len(fake.searches)
        page = {"from": 9990, "size": 10, "query": {"match": {"body": "t3"}}}
        status, headers, body = await post(client, f"{url}/docs-*/_search", page)
        assert status == 200 and "X-BMX-Rerank" not in headers
        assert fake.searches[n:] == [page], "the cluster got the page as sent, not a 10,000-hit window"
        status, headers, _ = await post(client, f"{url}/docs-*/_search", {**page, "from": 10})
        assert headers["X-BMX-Rerank"] == "bmx" and fake.searches[-1]["size"] == 20, "within the cap"
    finally:
        await runner.cleanup()


async def test_more_augmented_queries_than_max_augment_is_a_400_before_any_call(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_augment=2)
    try:
        ext = {**BMX, "augment": {"queries": ["t0", "t1", "t2"]}}
        status, _, body = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": ext}})
        assert status == 400 and "--max-augment" in body["error"]["reason"]
        assert fake.analyze_calls == 0 and fake.searches == []
        ext["augment"]["queries"] = ["t0", "t1"]
        status, headers, _ = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": ext}})
        assert status == 200 and headers["X-BMX-Rerank"] == "bmx"
    finally:
        await runner.cleanup()


async def test_alpha_and_beta_at_1e308_are_400s_through_the_proxy(cluster, client):
    _, runner, url = await proxy_for(cluster)
    try:
        for name in ("alpha", "beta"):
            status, _, body = await post(
                client, f"{url}/docs/_search", {"ext": {"bmx": {**BMX, name: 1e308}}}
            )
            assert status == 400 and f"[{name}] must be a number in" in body["error"]["reason"]
    finally:
        await runner.cleanup()


async def test_msearch_reranks_at_most_max_msearch_items(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_msearch=2)
    try:
        lines = [{}, {"size": 2, "ext": {"bmx": BMX}}] * 3
        data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        async with client.post(f"{url}/docs/_msearch", data=data, headers=NDJSON) as resp:
            assert resp.status == 200
            responses = (await resp.json())["responses"]
        assert [r["_bmx"]["reranked"] for r in responses] == [True, True, False]
        assert responses[2]["_bmx"]["skipped"] == "max_msearch" and len(responses[2]["hits"]["hits"]) == 2
        assert fake.searches[-1] == {"size": 2}, "the item beyond the cap went up without ext.bmx"
    finally:
        await runner.cleanup()


# ---- concurrent reranks ----


async def _blocked_rerank(fake, client, url):
    fake.gate = asyncio.Event()
    first = asyncio.ensure_future(post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": BMX}}))
    await asyncio.wait_for(fake.waiting.wait(), 5)
    return first


async def test_reranks_beyond_the_cap_get_the_clusters_answer_marked(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_concurrent_reranks=1)
    try:
        first = await _blocked_rerank(fake, client, url)
        status, headers, body = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": BMX}})
        assert status == 200 and headers["X-BMX-Rerank"] == "skipped; reason=overloaded"
        assert [h["_id"] for h in body["hits"]["hits"]] == ["1", "2"] and "ext" not in fake.searches[-1]
        lines = [{}, {"size": 1, "ext": {"bmx": BMX}}]
        data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        async with client.post(f"{url}/docs/_msearch", data=data, headers=NDJSON) as resp:
            item = (await resp.json())["responses"][0]
        assert item["_bmx"] == {"reranked": False, "skipped": "overloaded"}
        fake.gate.set()
        status, headers, _ = await first
        assert status == 200 and headers["X-BMX-Rerank"] == "bmx"
        status, headers, _ = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": BMX}})
        assert headers["X-BMX-Rerank"] == "bmx", "the slot is free again"
    finally:
        await runner.cleanup()


async def test_reranks_beyond_the_cap_can_be_rejected_with_429(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_concurrent_reranks=1, on_overload="reject")
    try:
        first = await _blocked_rerank(fake, client, url)
        status, _, body = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": BMX}})
        assert status == 429
        _error(body, "es_rejected_execution_exception")
        status, headers, _ = await post(client, f"{url}/docs/_search", {"size": 2})
        assert status == 200, "searches without a rerank are never refused"
        fake.gate.set()
        assert (await first)[0] == 200
    finally:
        await runner.cleanup()


# ---- nesting ----


def _nested(depth: int) -> bytes:
    return b'{"query":{"match_all":{}},"aggs":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def test_nesting_counts_levels_without_recursion():
    value: object = 1
    for _ in range(5000):
        value = [value]
    assert (
        nesting(value)[0] == 5000
        and nesting({"a": [{"b": 1}]})[0] == 3
        and nesting({"a": [{"b": []}]})[0] == 4
    )


@pytest.mark.parametrize("depth", [300, 600, 1000, 2000])
async def test_deep_bodies_without_ext_never_reach_the_cluster(cluster, client, depth):
    """Deeper than the cluster accepts (orjson gives up past 255 levels: counted on the bytes) is a 400
    in Elasticsearch's shape, counted and logged; with the guard off (`max_depth=0`) such a body goes
    upstream as sent, as it did before the guard."""
    fake, runner, url = await proxy_for(cluster, policies=parse_rules(["raw=body"]))
    off, off_url = await run_proxy(cluster[1], policies=parse_rules(["raw=body"]), max_depth=0)
    try:
        data = _nested(depth)
        sent = len(fake.raw_searches)
        async with client.post(
            f"{url}/raw/_search", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
            _error(await r.json(), "x_content_parse_exception")
        assert len(fake.raw_searches) == sent, "the cluster never saw it"
        async with client.get(f"{url}/_bmx/metrics") as r:
            assert 'bmx_guard_refused_total{reason="depth"} 1.0' in await r.text()
        async with client.post(
            f"{off_url}/raw/_search", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 200
        assert fake.raw_searches[-1][1] == data
    finally:
        await runner.cleanup()
        await off.cleanup()


@pytest.mark.parametrize("where", ["body", "ext.bmx", "msearch"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 254, 300, 1000])
async def test_deep_bodies_asking_for_a_rerank_are_400s(cluster, client, where, depth):
    _, runner, url = await proxy_for(cluster)
    try:
        deep = b"[" * depth + b"]" * depth
        if where == "body":
            data = b'{"ext":{"bmx":{"field":"body","query":"t3"}},"aggs":{"x":' + deep + b"}}"
        else:
            data = b'{"ext":{"bmx":{"field":"body","query":' + deep + b"}}}"
        path, headers = "docs/_search", {"Content-Type": "application/json"}
        if where == "msearch":
            data, path, headers = b"{}\n" + data + b"\n", "docs/_msearch", NDJSON
        async with client.post(f"{url}/{path}", data=data, headers=headers) as resp:
            assert resp.status == 400
            _error(await resp.json(), "x_content_parse_exception")
    finally:
        await runner.cleanup()


# ---- the HTTP server's own rejections ----


def _raw_request(url: str, data: bytes) -> tuple[int, dict]:
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    assert b"application/json" in head.lower(), head
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("request_bytes", "status", "kind"),
    [
        (b"get / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed_exception"),
        (b"FO{O / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed_exception"),
        (b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed_exception"),
        (b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed_exception"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400, "too_long_http_line_exception"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 17000 + b"\r\n\r\n",
            400,
            "too_long_http_header_exception",
        ),
        (
            b"POST /docs/_search HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "bad_http_request_exception",
        ),
        (
            b"GET http://127.0.0.1:1/_cluster/health HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
            "illegal_argument_exception",
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "bad_http_request_exception"),
    ],
)
async def test_malformed_http_is_answered_in_elasticsearch_shape(cluster, request_bytes, status, kind):
    _, runner, url = await proxy_for(cluster)
    try:
        got_status, body = await asyncio.to_thread(
            _raw_request, url, request_bytes.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1)
        )
        assert got_status == status
        _error(body, kind)
    finally:
        await runner.cleanup()


# ---- no stray coroutines ----


async def test_a_rerank_cancelled_at_once_leaves_no_coroutine_never_awaited(cluster, client):
    _, runner, url = await proxy_for(cluster)
    try:
        from bmx_rerank.rerank.plan import plan_search

        reranker = runner.app.state.rerank
        plan = plan_search({"size": 2, "ext": {"bmx": BMX}}, {})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(20):
                reranker.open("docs", plan, {}).close()
            await asyncio.sleep(0.05)
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
    finally:
        await runner.cleanup()


async def test_a_rerank_without_a_window_gets_max_window_when_that_is_smaller(cluster, client):
    fake, runner, url = await proxy_for(cluster, max_window=3)
    try:
        ext = {"field": "body", "query": "t3"}
        status, headers, _ = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": ext}})
        assert status == 200 and headers["X-BMX-Rerank"] == "bmx" and fake.searches[-1]["size"] == 3
    finally:
        await runner.cleanup()


async def test_a_passthrough_body_that_does_not_decode_is_a_400_when_the_cluster_hangs_up(client):
    """As Elasticsearch does with a `_bulk` labelled gzip that is not: it reads, then closes."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(b":")[1]
        )
        await reader.readexactly(length)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runner, url = await run_proxy(f"http://127.0.0.1:{port}")
    try:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/x-ndjson"}
        async with client.post(f"{url}/x/_bulk", data=b'{"index":{}}\n{"a":1}\n', headers=headers) as resp:
            assert resp.status == 400
            _error(await resp.json(), "parse_exception")
        async with client.post(
            f"{url}/x/_bulk", data=gzip.compress(b'{"index":{}}\n'), headers=headers
        ) as resp:
            assert resp.status == 502, "a valid body the cluster dropped is the cluster's failure"
    finally:
        await runner.cleanup()
        server.close()
        await server.wait_closed()


# ---- large answers off the event loop ----


async def test_large_windows_are_parsed_scored_and_packed_off_the_event_loop(cluster, client, monkeypatch):
    """Above the thresholds (lowered here to this small window) the CPU-bound steps run in worker
    threads, never on the loop thread that serves passthrough traffic."""
    import threading

    from bmx_rerank.proxy import bodies, search
    from bmx_rerank.rerank import pipeline

    threads: dict[str, set[str]] = {}

    def spy(name, real):
        def wrapper(*args, **kwargs):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(pipeline, "THREAD_HITS", 1)
    monkeypatch.setattr(bodies, "THREAD_BYTES", 10)
    monkeypatch.setattr(search, "THREAD_BYTES", 10)
    monkeypatch.setattr(pipeline, "score_tree", spy("score", pipeline.score_tree))
    monkeypatch.setattr(pipeline, "pack", spy("pack", pipeline.pack))
    monkeypatch.setattr(bodies, "loads", spy("parse", bodies.loads))
    _, runner, url = await proxy_for(cluster)
    try:
        status, headers, body = await post(client, f"{url}/docs/_search", {"size": 2, "ext": {"bmx": BMX}})
        assert status == 200 and headers["X-BMX-Rerank"] == "bmx" and len(body["hits"]["hits"]) == 2
    finally:
        await runner.cleanup()
    loop_thread = threading.current_thread().name
    for step in ("parse", "score", "pack"):
        assert threads[step] and loop_thread not in threads[step], (step, threads[step])
