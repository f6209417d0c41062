"""The guard against a fake cluster: what the cluster would refuse, or what would harm it, never
reaches it. Bodies nested deeper than `--max-depth` (counted on the bytes when the parser gives up, and
as they stream when they are too large to read), bool queries deeper than `--max-query-depth`, an
unreadable body asking for a rerank, a body over `--max-content-length`; each a 400/413 in
Elasticsearch's shape, counted in the metrics."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import random
import time

import aiohttp
import pytest
from aiohttp import web

from bmx_rerank.proxy.bodies import RawDepth, nesting, raw_depth
from tests.support.fake_cluster import FakeCluster, run_proxy
from tests.support.serving import serve_app

JSON = {"Content-Type": "application/json"}
NDJSON = {"Content-Type": "application/x-ndjson"}


class Counting(FakeCluster):
    """Also keeps the method and path of every request that reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.reached: list[str] = []

    def app(self) -> web.Application:
        inner = super().app()

        @web.middleware
        async def count(request: web.Request, handler):
            if not request.path.startswith("/bmx-stats"):  # the applied configuration's reads
                self.reached.append(f"{request.method} {request.path}")
            return await handler(request)

        inner.middlewares.append(count)
        return inner


class Receiving(Counting):
    """Also keeps every search and msearch body as it arrived: its bytes, and whether it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[tuple[bytes, bool]] = []

    async def search(self, request: web.Request) -> web.Response:
        data = bytearray()
        try:
            async for chunk in request.content.iter_any():
                data += chunk
        except BaseException:
            self.bodies.append((bytes(data), False))
            raise
        self.bodies.append((bytes(data), True))
        return web.json_response({"took": 1, "hits": {"hits": []}})

    msearch = search


@pytest.fixture
async def cluster():
    fake = Receiving()
    runner, url = await serve_app(fake.app())
    yield fake, url
    await runner.cleanup()


@pytest.fixture
async def client():
    async with aiohttp.ClientSession() as session:
        yield session


def bools(depth: int) -> bytes:
    return b'{"query":' + b'{"bool":{"must":[' * depth + b'{"match_all":{}}' + b"]}}" * depth + b"}"


def deep_bmx(depth: int) -> bytes:
    return b'{"ext":{"bmx":{"field":"body","query":"t3","x":' + b"[" * depth + b"]" * depth + b"}}}"


async def refused(client, url, path, data, headers, status, kind):
    async with client.post(f"{url}/{path}", data=data, headers=headers) as resp:
        body = await resp.json()
        assert resp.status == status, body
        assert body["error"]["type"] == kind and body["status"] == status, body
        assert body["error"]["root_cause"][0]["type"] == kind
        return body


async def metric(client, url, reason):
    async with client.get(f"{url}/_bmx/metrics") as resp:
        text = await resp.text()
    line = f'bmx_guard_refused_total{{reason="{reason}"}} '
    return next((float(x[len(line) :]) for x in text.splitlines() if x.startswith(line)), 0.0)


def test_raw_depth_counts_brackets_outside_strings():
    assert raw_depth(b'{"a":[1,{"b":"[[[{{{"}]}') == 3
    assert raw_depth(b'{"a":"\\"[[[[\\\\"}') == 1, "escaped quotes do not end a string"
    assert raw_depth(b"[" * 5000) == 5000, "an unclosed body counts all the same"
    assert raw_depth(b"]]]" + b"[" * 7) == 7, "stray closers never count below zero"
    assert raw_depth(bools(2000)) > 6000
    big = b"[" * 3_000_000 + b"]" * 3_000_000  # past one chunk of the vectorized count
    assert raw_depth(big) == 3_000_000


def naive_depth(data: bytes) -> int:
    """The same count, one byte at a time (a string left open hides the rest)."""
    deepest = level = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
        elif byte == ord('"'):
            in_string = True
        elif byte in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif byte in b"]}":
            level = max(0, level - 1)
    return deepest


def test_raw_depth_fed_in_pieces_counts_as_the_whole():
    """Split anywhere (inside a string, between a backslash and what it escapes, inside a run of
    backslashes), the pieces count as the whole body does, and as a byte-by-byte count."""
    rng = random.Random(7)
    bodies = [
        b'{"a":"x\\\\"}[[',
        b'{"a":"\\"[[\\\\\\"]]"}{{',
        b'["[[[", {"b": "\\\\\\\\"}, [[["]]]"]]]]',
        b'{"open": "[[[ \\',
        b"]]}}[[{",
    ]
    bodies += [bytes(rng.choice(b'[]{}"\\ax') for _ in range(rng.randint(1, 60))) for _ in range(300)]
    for body in bodies:
        whole = raw_depth(body)
        assert whole == naive_depth(body), body
        for cut in range(len(body) + 1):
            scanner = RawDepth()
            scanner.feed(body[:cut])
            assert scanner.feed(body[cut:]) == whole, (body, cut)
        pieces = RawDepth()
        for i in range(len(body)):
            pieces.feed(body[i : i + 1])
        assert pieces.deepest == whole, body


def test_an_open_string_full_of_escaped_quotes_is_counted_in_one_pass():
    """The pattern that blanks strings out never scans a string left open again from each of its quotes
    (that was quadratic: minutes for this megabyte)."""
    body = b'{"a":"' + b'\\"x' * 350_000
    started = time.perf_counter()
    assert raw_depth(body) == 1
    scanner = RawDepth()
    for start in range(0, len(body), 65536):
        scanner.feed(body[start : start + 65536])
    assert scanner.deepest == 1
    assert time.perf_counter() - started < 5


def test_nesting_counts_nested_bool_queries():
    import orjson

    assert nesting(orjson.loads(bools(30)))[1] == 30
    assert nesting({"query": {"match": {"bool": "x"}}})[1] == 0, "a field named bool is no query"
    assert nesting({"aggs": {"f": {"filter": {"bool": {"filter": [{"bool": {}}]}}}}})[1] == 2


@pytest.mark.parametrize("path", ["docs/_search", "docs/_msearch"])
@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("bool 2000 deep, no ext", bools(2000), "depth"),
        ("bool 31 deep, no ext", bools(31), "query_depth"),
        ("ext.bmx 400 deep", deep_bmx(400), "depth"),
        ("ext.bmx 1100 deep", deep_bmx(1100), "depth"),
        ("aggs 101 deep", b'{"aggs":' + b'{"a":' * 101 + b"1" + b"}" * 101 + b"}", "depth"),
    ],
)
async def test_bodies_deeper_than_the_cluster_accepts_never_reach_it(
    cluster, client, path, name, data, reason
):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream)
    try:
        headers = JSON
        if path.endswith("_msearch"):
            data, headers = b"{}\n" + data + b"\n", NDJSON
        await refused(client, url, path, data, headers, 400, "x_content_parse_exception")
        assert fake.reached == [], f"{name}: the cluster never saw it"
        assert await metric(client, url, reason) == 1.0
    finally:
        await runner.cleanup()


async def test_a_query_at_the_clusters_own_limits_goes_through(cluster, client):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream)
    try:
        async with client.post(f"{url}/docs/_search", data=bools(30), headers=JSON) as resp:
            assert resp.status == 200
        assert fake.reached == ["POST /docs/_search"]
    finally:
        await runner.cleanup()


async def test_an_unparsable_body_asking_for_a_rerank_is_a_400_never_forwarded(cluster, client):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream)
    try:
        bad = b'{"ext":{"bmx":{"field":"body","query":"t3"}},"size":2,}'
        await refused(client, url, "docs/_search", bad, JSON, 400, "x_content_parse_exception")
        await refused(
            client, url, "docs/_msearch", b"{}\n" + bad + b"\n", NDJSON, 400, "x_content_parse_exception"
        )
        assert fake.reached == []
        assert await metric(client, url, "unparsable_bmx") == 2.0
        # Without ext.bmx the cluster answers an unreadable body for itself, as without the proxy.
        async with client.post(f"{url}/docs/_search", data=b'{"size":', headers=JSON):
            pass
        assert fake.reached == ["POST /docs/_search"]
    finally:
        await runner.cleanup()


async def test_search_bodies_over_max_content_length_are_413s(cluster, client):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, max_body=1000, max_content_length=5000)
    try:
        await refused(client, url, "docs/_search", b" " * 6000, JSON, 413, "content_too_long_exception")

        async def slowly():  # no Content-Length: counted on the way
            for _ in range(10):
                await asyncio.sleep(0.01)
                yield b" " * 1000

        async with client.post(f"{url}/docs/_search", data=slowly(), headers=JSON) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "content_too_long_exception"
        assert await metric(client, url, "content_length") == 2.0
        # Other endpoints stream through whatever their size.
        async with client.post(f"{url}/sink", data=b"x" * 20000) as resp:
            assert (await resp.json())["bytes"] == 20000
        # Between --max-body and --max-content-length: forwarded unread (and counted, see below).
        async with client.post(f"{url}/docs/_search", data=b"{}" + b" " * 3000, headers=JSON) as resp:
            assert resp.status == 200
    finally:
        await runner.cleanup()


def padded(deep: int, pad: int = 400_000) -> bytes:
    """A search body of ~`pad` bytes of string full of brackets, quotes and backslashes (none of them
    nesting), then aggregations nested `deep` levels."""
    rng = random.Random(deep)
    text = "".join(rng.choice(["[", "{", "]", "}", '\\"', "\\\\", "a"]) for _ in range(pad // 2))
    aggs = b'{"a":' * deep + b"1" + b"}" * deep
    return b'{"query":{"match_all":{}},"pad":"' + text.encode() + b'","aggs":' + aggs + b"}"


@pytest.mark.parametrize("path", ["docs/_search", "docs/_msearch"])
@pytest.mark.parametrize("encoding", ["identity", "gzip"])
async def test_a_body_streamed_unread_is_cut_where_it_nests_too_deep(cluster, client, path, encoding):
    """Over --max-body, under --max-content-length: the body streams up as sent, its nesting counted on
    the way (inflated first); past --max-depth the upstream request is abandoned before the deep part
    leaves, and the client gets the guard's 400."""
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, max_body=1000)
    try:
        data, headers = padded(150), dict(JSON)
        if path.endswith("_msearch"):
            data, headers = b"{}\n" + data + b"\n", NDJSON
        if encoding == "gzip":
            data, headers = gzip.compress(data, 1), {**headers, "Content-Encoding": "gzip"}
        assert len(data) > 65536, "a chunk or more streams up before the deep part"
        await refused(client, url, path, data, headers, 400, "x_content_parse_exception")
        assert await metric(client, url, "depth") == 1.0
        assert all(not ended for _, ended in fake.bodies), "the cluster never got a whole body"
        for sent, _ in fake.bodies:
            inflated = zlib_inflate(sent) if encoding == "gzip" else sent
            assert raw_depth(inflated) <= 100, "nor the part nested too deep"
        # The same body nested within the limit goes up, byte for byte, and is answered.
        fake.bodies.clear()
        ok = padded(90)
        if path.endswith("_msearch"):
            ok = b"{}\n" + ok + b"\n"
        if encoding == "gzip":
            ok = gzip.compress(ok, 1)
        async with client.post(f"{url}/{path}", data=ok, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
        assert [(hashlib.sha256(b).hexdigest(), e) for b, e in fake.bodies] == [
            (hashlib.sha256(ok).hexdigest(), True)
        ]
    finally:
        await runner.cleanup()


def zlib_inflate(data: bytes) -> bytes:
    """What a gzip prefix inflates to, however it was cut."""
    import zlib

    return zlib.decompressobj(31).decompress(data)


async def test_a_streamed_body_inflating_past_max_content_length_is_a_413_and_a_broken_one_a_400(
    cluster, client
):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, max_body=1000, max_content_length=1 << 20)
    try:
        bomb = gzip.compress(b'{"pad":"' + b" " * (4 << 20) + b'"}')  # a few KiB, 4 MiB inflated
        headers = {**JSON, "Content-Encoding": "gzip"}
        await refused(client, url, "docs/_search", bomb, headers, 413, "content_too_long_exception")
        assert all(not ended for _, ended in fake.bodies)
        # Not the gzip it is labelled, past the part read: the 400 a read body gets, not an outage.
        broken = gzip.compress(padded(10), 1)
        broken = broken[:80_000] + bytes(100) + broken[80_100:]
        await refused(client, url, "docs/_search", broken, headers, 400, "parse_exception")
        assert all(not ended for _, ended in fake.bodies)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("content_type", "data", "status"),
    [
        ("application/yaml", b"query: " + b"{a: " * 300 + b"1" + b"}" * 300, 400),  # flow style nests
        ("text/plain", b"{" * 300, 400),
        ("text/plain", b'{"ext":{"bmx":{"field":"body"}},', 400),
        ("application/cbor", b"\xbf" + b"[{" * 300, 200),  # binary: brackets are bytes, not nesting
        ("application/smile", b":)\n\x00" + b"{" * 300, 200),
    ],
    ids=["yaml", "text-deep", "text-bmx", "cbor", "smile"],
)
async def test_a_body_that_is_not_json_gets_the_raw_check_unless_binary(
    cluster, client, content_type, data, status
):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream)
    try:
        async with client.post(
            f"{url}/docs/_search", data=data, headers={"Content-Type": content_type}
        ) as resp:
            answer = await resp.json(content_type=None)
            assert resp.status == status, answer
        if status == 400:
            assert answer["error"]["type"] == "x_content_parse_exception" and answer["status"] == 400
            assert fake.bodies == []
        else:
            assert fake.bodies == [(data, True)], "the cluster's to read, as sent"
    finally:
        await runner.cleanup()


async def test_the_guard_can_be_turned_off(cluster, client):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, max_depth=0, max_query_depth=0, max_content_length=0)
    try:
        async with client.post(f"{url}/docs/_search", data=bools(40), headers=JSON) as resp:
            assert resp.status == 200
        assert fake.reached == ["POST /docs/_search"]
    finally:
        await runner.cleanup()
