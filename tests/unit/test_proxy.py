"""The proxy against a fake cluster (a small aiohttp app): passthrough, reranking, failures, metrics."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import socket
import zlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from bmx_rerank import scoring
from bmx_rerank.policy import parse_rules
from bmx_rerank.proxy import ProxyConfig, make_app, search_route, split_upstream
from bmx_rerank.rerank.pipeline import Reranker
from bmx_rerank.rerank.rescore import candidate_features
from bmx_rerank.stats.source import FixedStats
from bmx_rerank.upstream import DocRef, DocTerms
from tests.support.fake_cluster import CORPUS, DOCS, FakeCluster, post, run_proxy
from tests.support.serving import serve_app


def expected_scores(ids, text, **request):
    tokens = text.split()
    vocab = sorted(set(tokens))
    docs = [DocTerms(DocRef("i", i), True, dict(Counter(DOCS[i].split()))) for i in ids]
    query = scoring.Query(np.array([vocab.index(t) for t in tokens]))
    return scoring.score(
        CORPUS.term_stats(vocab), candidate_features(docs, vocab), [query], scoring.Request(**request)
    )


TOP_T3 = list(DOCS)[int(np.argmax(expected_scores(list(DOCS), "t3")))]


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeCluster, str]]:
    fake = FakeCluster()
    runner, url = await serve_app(fake.app())
    yield fake, url
    await runner.cleanup()


@pytest.fixture
async def proxy(cluster) -> AsyncIterator[tuple[FakeCluster, str]]:
    fake, url = cluster
    runner, purl = await run_proxy(url, policies=parse_rules(["docs-*=body,window_size=5"]))
    yield fake, purl
    await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


# ---- passthrough ----


async def test_passthrough_keeps_method_path_query_headers_and_body(proxy, client):
    fake, url = proxy
    raw = b"\x00\x01 not json \xff" * 1000
    headers = {
        "Authorization": "Basic c2VjcmV0",
        "Content-Type": "application/vnd.elasticsearch+json; compatible-with=8",
        "Accept": "application/vnd.elasticsearch+json; compatible-with=8",
        "X-Opaque-Id": "abc",
    }
    async with client.put(
        f"{url}/echo/x/_doc/1?refresh=true&q=a%20b",
        data=raw,
        headers=headers,
        skip_auto_headers=["Accept-Encoding"],
    ) as resp:
        assert resp.status == 200
        assert await resp.read() == raw
        assert resp.headers["X-Elastic-Product"] == "Elasticsearch"
        assert resp.headers["Warning"] == '299 Elasticsearch-8.19 "deprecated"'
        assert resp.headers["X-Opaque-Id"] == "abc"
    method, path_qs, seen, body = fake.requests[-1]
    assert (method, path_qs, body) == ("PUT", "/echo/x/_doc/1?refresh=true&q=a%20b", raw)
    for name, value in headers.items():
        assert seen[name] == value
    assert "Accept-Encoding" not in seen, "the proxy adds no encoding the client did not ask for"


async def test_passthrough_status_codes(proxy, client):
    _, url = proxy
    async with client.delete(f"{url}/echo/x?status=409") as resp:
        assert resp.status == 409


async def test_compressed_bodies_pass_untouched_both_ways(proxy, client):
    fake, url = proxy
    raw = gzip.compress(b'{"index":{}}\n{"a":1}\n')
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/x-ndjson"}
    async with client.post(f"{url}/echo/_bulk", data=raw, headers=headers) as resp:
        assert await resp.read() == raw
    assert fake.requests[-1][3] == raw and fake.requests[-1][2]["Content-Encoding"] == "gzip"
    async with client.get(f"{url}/gz", headers={"Accept-Encoding": "gzip"}) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(await resp.read()) == b'{"compressed":true}'


async def test_large_bodies_stream_through_beyond_the_search_body_limit(proxy, client):
    """100 MiB each way: more than the proxy would ever buffer (its search-body limit is 64 MiB)."""
    _, url = proxy
    chunk = bytes(range(256)) * 4096  # 1 MiB

    async def body():
        for _ in range(100):
            yield chunk

    async with client.post(f"{url}/sink", data=body()) as resp:
        got = await resp.json()
    assert got["bytes"] == 100 * len(chunk)
    assert got["sha256"] == hashlib.sha256(chunk * 100).hexdigest()
    total = 0
    async with client.get(f"{url}/source?chunks=100") as resp:
        assert "Content-Length" not in resp.headers
        async for piece in resp.content.iter_chunked(1 << 16):
            total += len(piece)
    assert total == 100 * (1 << 20)


async def test_a_search_body_past_the_read_limit_goes_upstream_unread(cluster, client, monkeypatch):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, max_body=1000)
    try:
        search = {"size": 2, "pad": "x" * 5000, "ext": {"bmx": {"field": "body", "query": "t0"}}}
        status, headers, body = await post(client, f"{url}/docs/_search", search)
        assert status == 200 and "X-BMX-Rerank" not in headers and len(body["hits"]["hits"]) == 2
        assert fake.searches[-1] == search, "the cluster got the body as sent"
    finally:
        await runner.cleanup()


async def test_head_root(proxy, client):
    _, url = proxy
    async with client.head(f"{url}/") as resp:
        assert resp.status == 200
        assert resp.headers["X-Elastic-Product"] == "Elasticsearch"
        assert resp.headers["Content-Length"] == str(len(b'{"name":"fake"}'))


async def test_search_without_ext_is_forwarded_byte_for_byte(proxy, client):
    fake, url = proxy
    status, headers, body = await post(
        client, f"{url}/docs/_search", {"query": {"match": {"body": "t0"}}, "size": 2}
    )
    assert status == 200 and "X-BMX-Rerank" not in headers and "_bmx" not in body
    assert fake.searches[-1] == {"query": {"match": {"body": "t0"}}, "size": 2}
    assert [h["_id"] for h in body["hits"]["hits"]] == ["1", "2"]


async def test_upstream_404_passes_through(proxy, client):
    _, url = proxy
    status, _, body = await post(
        client, f"{url}/missing/_search", {"ext": {"bmx": {"field": "body", "query": "t0"}}}
    )
    assert status == 404 and body["error"]["type"] == "index_not_found_exception"


async def test_a_cookie_the_cluster_sets_for_one_caller_never_goes_with_another(client):
    """A cluster behind a gateway or load balancer may set cookies (a session, a sticky node). An answer
    takes them to its caller; the proxy's sessions keep none, so no other caller's request (passed
    through, or a sidecar call on its behalf) carries them. aiohttp's default jar keeps cookies from a
    named host (not from an IP address), so the cluster is reached as `localhost` here."""
    seen: list[str | None] = []

    @web.middleware
    async def gateway(request: web.Request, handler):
        seen.append(request.headers.get("Cookie"))
        resp = await handler(request)
        resp.set_cookie("session", request.headers.get("Authorization", "anyone"), path="/")
        return resp

    fake = FakeCluster()
    app = fake.app()
    app.middlewares.append(gateway)
    runner, url = await serve_app(app)
    proxy_runner, purl = await run_proxy(url.replace("127.0.0.1", "localhost"))
    try:
        for who in ("Basic YWxpY2U6eA==", "Basic Ym9iOnk="):
            headers = {"Authorization": who}
            async with client.get(f"{purl}/echo/_doc/d1", headers=headers) as r:
                assert r.status == 200 and r.cookies["session"].value == who, "the caller's own"
            ext = {"field": "body", "query": "t0 t3", "window_size": 5}
            body = {"query": {"match": {"body": "t0 t3"}}, "size": 2, "ext": {"bmx": ext}}
            status, answer_headers, _ = await post(client, f"{purl}/docs/_search", body, headers=headers)
            assert status == 200 and answer_headers["X-BMX-Rerank"] == "bmx"
        assert len(seen) > 4 and seen == [None] * len(seen), seen  # sidecar calls too: analysis, terms
    finally:
        await proxy_runner.cleanup()
        await runner.cleanup()


# ---- reranking ----


async def test_rerank_rescored_reordered_and_paged(proxy, client):
    fake, url = proxy
    ext = {"field": "body", "query": "t0 t3", "window_size": 5}
    status, headers, body = await post(
        client,
        f"{url}/docs/_search",
        {"query": {"match": {"body": "t0 t3"}}, "from": 1, "size": 2, "ext": {"bmx": ext}},
    )
    assert status == 200
    assert headers["X-BMX-Rerank"] == "bmx" and headers["X-Elastic-Product"] == "Elasticsearch"
    sent = fake.searches[-1]
    assert (sent["from"], sent["size"], sent["seq_no_primary_term"]) == (0, 5, True) and "ext" not in sent
    scores = expected_scores(list(DOCS), "t0 t3")
    order = np.argsort(-scores, kind="stable")
    hits = body["hits"]["hits"]
    assert [h["_id"] for h in hits] == [list(DOCS)[i] for i in order[1:3]]
    np.testing.assert_allclose([h["_score"] for h in hits], scores[order[1:3]], rtol=1e-12)
    assert body["hits"]["max_score"] == pytest.approx(scores.max())
    assert body["hits"]["total"]["value"] == 5 and body["aggregations"] == {"a": {"value": 1}}
    assert all("_seq_no" not in h for h in hits)
    assert body["_bmx"]["reranked"] is True and body["_bmx"]["estimated"] is False
    assert body["_bmx"]["window_size"] == 5 and body["_bmx"]["mode"] == "bmx"


async def test_rerank_modes_and_normalization(proxy, client):
    _, url = proxy
    for extra, request in (
        ({"mode": "bm25"}, {"mode": "bm25"}),
        ({"normalize": "paper"}, {"normalize": "paper"}),
        ({"alpha": 0.05, "beta": 0.1}, {"alpha": 0.05, "beta": 0.1}),
    ):
        ext = {"field": "body", "query": "t3 t4", "window_size": 5, **extra}
        _, _, body = await post(client, f"{url}/docs/_search", {"size": 5, "ext": {"bmx": ext}})
        got = {h["_id"]: h["_score"] for h in body["hits"]["hits"]}
        want = dict(zip(DOCS, expected_scores(list(DOCS), "t3 t4", **request), strict=True))
        assert got == pytest.approx(want, rel=1e-12)


async def test_pretty_is_honoured_on_a_reranked_answer(proxy, client):
    _, url = proxy
    search = {"size": 1, "ext": {"bmx": {"field": "body", "query": "t3"}}}
    async with client.post(f"{url}/docs/_search?pretty", json=search) as resp:
        text = await resp.text()
    assert text.startswith('{\n  "') and text.endswith("}\n") and json.loads(text)["_bmx"]["reranked"]
    async with client.post(f"{url}/docs/_search", json=search) as resp:
        assert "\n" not in await resp.text()


async def test_bad_ext_is_a_400_and_nothing_reaches_the_cluster(proxy, client):
    fake, url = proxy
    before = len(fake.searches)
    status, _, body = await post(
        client, f"{url}/docs/_search", {"ext": {"bmx": {"field": "body", "bogus": 1}}}
    )
    assert status == 400 and body["status"] == 400
    assert body["error"]["type"] == "x_content_parse_exception"
    assert body["error"]["root_cause"][0]["reason"] == "[bmx] unknown field [bogus]"
    status, _, body = await post(
        client,
        f"{url}/docs/_search",
        {"size": 10, "ext": {"bmx": {"field": "body", "query": "x", "window_size": 5}}},
    )
    assert status == 400 and body["error"]["type"] == "illegal_argument_exception"
    assert len(fake.searches) == before


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),  # the names Netty reads too
        ("deflate", zlib.compress),
        ("x-deflate", zlib.compress),
        ("deflate", _raw_deflate),  # raw deflate, without zlib's header: the cluster reads it
    ],
)
async def test_compressed_search_body_is_read(proxy, client, encoding, pack):
    fake, url = proxy
    raw = pack(json.dumps({"size": 1, "ext": {"bmx": {"field": "body", "query": "t3"}}}).encode())
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    async with client.post(f"{url}/docs/_search", data=raw, headers=headers) as resp:
        body = await resp.json()
        assert resp.headers["X-BMX-Rerank"] == "bmx"
    assert body["hits"]["hits"][0]["_id"] == TOP_T3
    assert "ext" not in fake.searches[-1]


async def test_sort_passes_through_unreranked(proxy, client):
    fake, url = proxy
    status, headers, body = await post(
        client,
        f"{url}/docs/_search",
        {"sort": ["n"], "size": 2, "ext": {"bmx": {"field": "body", "query": "t0"}}},
    )
    assert status == 200 and headers["X-BMX-Rerank"] == "skipped; reason=sort"
    assert fake.searches[-1] == {"sort": ["n"], "size": 2}


async def test_non_json_answers_pass_through_unreranked(proxy, client):
    """YAML/CBOR/Smile answers cannot be reranked: without the skip the client got the raw window."""
    fake, url = proxy
    search = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t0", "window_size": 5}}}
    for kw in ({"headers": {"Accept": "application/yaml"}}, {"params": {"format": "yaml"}}):
        async with client.post(f"{url}/docs/_search", json=search, **kw) as resp:
            assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "skipped; reason=format"
        assert fake.searches[-1] == {"size": 2}
    data = b"".join(json.dumps(x).encode() + b"\n" for x in ({}, search))
    headers = {"Content-Type": "application/x-ndjson", "Accept": "application/cbor"}
    async with client.post(f"{url}/docs/_msearch", data=data, headers=headers) as resp:
        assert resp.status == 200
    assert fake.searches[-1] == {"size": 2}


async def test_a_window_answered_in_a_form_the_rerank_cannot_read_is_never_the_answer(client):
    """However the cluster came to answer the first stage in another form (a format the proxy did not
    see asked for), the window is not sent: the caller's own search goes, said `reason=unreadable`."""
    fake = FakeCluster()
    inner = fake.app()

    @web.middleware
    async def unreadable(request: web.Request, handler):
        answer = await handler(request)
        if request.path.endswith("/_search"):
            return web.Response(body=b"---\nhits: yaml\n", content_type="application/yaml")
        return answer

    inner.middlewares.append(unreadable)
    runner, url = await serve_app(inner)
    proxy_runner, purl = await run_proxy(url)
    try:
        search = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t0", "window_size": 5}}}
        async with client.post(f"{purl}/docs/_search", json=search) as resp:
            assert resp.status == 200 and resp.headers["X-BMX-Rerank"] == "skipped; reason=unreadable"
            assert await resp.read() == b"---\nhits: yaml\n"
        assert fake.searches[-1] == {"size": 2}, "the caller's search, not the window's"
    finally:
        await proxy_runner.cleanup()
        await runner.cleanup()


async def test_a_fault_of_the_reranks_own_is_the_callers_search_not_a_500(proxy, client, monkeypatch):
    """A fault the pipeline does not answer itself (a bug; an answer of a shape nobody expected, read
    before the first stage) sends the search as sent, `reason=rerank_error`, never a 500 of the proxy's."""
    fake, url = proxy

    async def broken(*args, **kwargs):
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(Reranker, "rerank", broken)
    search = {"size": 2, "query": {"match": {"body": "t0"}}, "ext": {"bmx": {"field": "body"}}}
    async with client.post(f"{url}/docs/_search", json=search) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["X-BMX-Rerank"] == "skipped; reason=rerank_error"
        assert len((await resp.json())["hits"]["hits"]) == 2
    assert fake.searches[-1] == {"size": 2, "query": {"match": {"body": "t0"}}}


async def test_policy_drop_in(proxy, client):
    fake, url = proxy
    status, headers, body = await post(
        client, f"{url}/docs-1/_search", {"query": {"match": {"body": "t3"}}, "size": 3}
    )
    # docs-1 has no statistics in the fixed source: the default policy falls back, in upstream order
    assert headers["X-BMX-Rerank"] == "fallback"
    assert body["_bmx"]["reranked"] is False
    assert body["_bmx"]["error"]["type"] == "bmx_statistics_missing_exception"
    assert [h["_id"] for h in body["hits"]["hits"]] == ["1", "2", "3"]
    assert fake.searches[-1]["size"] == 5, "the policy's window"


async def test_policy_reranks_when_statistics_exist(proxy, client):
    _, url = proxy
    status, headers, body = await post(
        client, f"{url}/docs-*/_search", {"query": {"match": {"body": "t3"}}, "size": 2}
    )
    assert status == 200 and headers["X-BMX-Rerank"] == "bmx"
    assert body["hits"]["hits"][0]["_id"] == TOP_T3


async def test_explain_and_min_score(proxy, client):
    _, url = proxy
    ext = {"field": "body", "query": "t0 t3", "window_size": 5, "explain": True, "min_score": 0.01}
    _, _, body = await post(client, f"{url}/docs/_search", {"size": 5, "ext": {"bmx": ext}})
    ids = [h["_id"] for h in body["hits"]["hits"]]
    assert "4" not in ids, "document 4 holds neither token"
    for hit in body["hits"]["hits"]:
        details = hit["_bmx_explanation"]["details"]
        assert [d["token"] for d in details] == ["t0", "t3"]
        assert sum(d["value"] for d in details) == pytest.approx(hit["_score"])


async def test_a_cluster_refusing_named_query_scores_is_asked_once_then_term_vectors_serve(cluster, client):
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, tf_probes=True)
    search = {"ext": {"bmx": {"field": "body", "query": "t0 t1", "window_size": 5}}, "size": 3}
    first = (await post(client, f"{url}/docs/_search", search))[2]
    second = (await post(client, f"{url}/docs/_search", search))[2]
    assert fake.probe_checks == 1
    assert first["_bmx"]["reranked"] is True and first["hits"] == second["hits"]
    assert all("include_named_queries_score" not in json.dumps(b) for b in fake.searches)
    await runner.cleanup()


async def test_termvector_cache_hits_second_time(proxy, client):
    _, url = proxy
    for _ in range(2):
        await post(
            client,
            f"{url}/docs/_search",
            {"ext": {"bmx": {"field": "body", "query": "t0", "window_size": 5}}, "size": 5},
        )
    async with client.get(f"{url}/_bmx/metrics") as resp:
        text = await resp.text()
    assert 'bmx_termvector_cache_total{result="hit"} 5.0' in text
    assert 'bmx_termvector_cache_total{result="miss"} 5.0' in text
    assert 'bmx_requests_total{kind="bmx"}' in text
    assert (
        "bmx_rerank_seconds_bucket" in text and 'bmx_upstream_seconds_count{call="termvectors"} 1.0' in text
    )


async def test_termvector_cache_is_not_shared_across_credentials(proxy, client):
    """With field-level security the same document version has other term vectors for another user."""
    _, url = proxy
    search = {"ext": {"bmx": {"field": "body", "query": "t0", "window_size": 5}}, "size": 5}
    _, _, full = await post(client, f"{url}/docs/_search", search, headers={"Authorization": "Basic all"})
    assert max(h["_score"] for h in full["hits"]["hits"]) > 0
    _, headers, hidden = await post(
        client, f"{url}/docs/_search", search, headers={"Authorization": "Basic fls"}
    )
    # Its own (empty) term vectors: nothing matches, so the cluster's answer comes back, declined.
    assert headers["X-BMX-Rerank"] == "skipped; reason=no_text_match"
    assert hidden["_bmx"]["unmatched"] == 5 and hidden["_bmx"]["reranked"] is False
    assert [h["_score"] for h in hidden["hits"]["hits"]] != [h["_score"] for h in full["hits"]["hits"]]


async def test_rerank_error_fallback_and_fail(cluster, client):
    fake, upstream = cluster
    fake.fail_termvectors = True
    search = {"size": 2, "ext": {"bmx": {"field": "body", "query": "t0", "window_size": 5}}}
    runner, url = await run_proxy(upstream)
    try:
        status, headers, body = await post(client, f"{url}/docs/_search", search)
        assert status == 200 and headers["X-BMX-Rerank"] == "fallback"
        assert [h["_id"] for h in body["hits"]["hits"]] == ["1", "2"]
        assert body["_bmx"]["fallback"] is True and "boom" in body["_bmx"]["error"]["reason"]
    finally:
        await runner.cleanup()
    runner, url = await run_proxy(upstream, on_rerank_error="fail")
    try:
        status, _, body = await post(client, f"{url}/docs/_search", search)
        assert status == 500 and body["error"]["type"] == "bmx_termvectors_exception"
        assert "Traceback" not in json.dumps(body)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "value",
    [b"123456789012345678901234567890", b"-9223372036854775809"],
)
async def test_an_integer_beyond_64_bits_is_never_changed_on_its_way(proxy, client, value):
    """orjson reads it as a float, which written back is another number (a `term` on it would find other
    documents): a rerank asked of such a body is a 400, and any other such body goes as sent, byte for
    byte; so does an `_msearch` line."""
    JSON = {"Content-Type": "application/json"}
    fake, url = proxy
    text = b'{"size": 2, "query": {"bool": {"filter": {"term": {"code": ' + value + b"}}}}"
    asked = text[:-1] + b', "ext": {"bmx": {"field": "body", "query": "t3"}}}'
    async with client.post(f"{url}/docs/_search", data=asked, headers=JSON) as resp:
        assert resp.status == 400 and "beyond 64 bits" in (await resp.json())["error"]["reason"]
    async with client.post(f"{url}/docs-1/_search", data=text, headers=JSON) as resp:  # a policy's index
        assert "X-BMX-Rerank" not in resp.headers
    assert fake.raw_bodies[-1] == text
    ndjson = b'{"index": "docs"}\n' + asked + b"\n"
    async with client.post(
        f"{url}/_msearch", data=ndjson, headers={"Content-Type": "application/x-ndjson"}
    ) as resp:
        assert resp.status == 400


async def test_a_blank_line_inside_an_msearch_is_the_clusters_to_refuse(proxy, client):
    """The cluster reads a blank line as an item's line (and refuses the request); skipping it would pair
    the lines otherwise and rerank what the cluster refuses."""
    fake, url = proxy
    item = b'{"size": 2, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}}'
    for body in (b'{"index": "docs"}\n' + item + b"\n\n{}\n" + item + b"\n", b"\n{}\n" + item + b"\n"):
        async with client.post(
            f"{url}/docs/_msearch", data=body, headers={"Content-Type": "application/x-ndjson"}
        ) as resp:
            assert resp.status == 400, await resp.text()
    plain = b'{"index": "docs"}\n{"size": 1}\n\n{}\n{"size": 1}\n'
    async with client.post(
        f"{url}/docs/_msearch", data=plain, headers={"Content-Type": "application/x-ndjson"}
    ):
        pass
    assert fake.raw_bodies[-1] == plain, "without a rerank asked, the cluster's to answer as sent"


async def test_msearch_reranks_marked_items_only(proxy, client):
    fake, url = proxy
    lines = [
        {},
        {"size": 2, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}},
        {"index": "docs"},
        {"size": 2},
        {"index": "missing"},
        {"ext": {"bmx": {"field": "body", "query": "t3"}}},
        {},
        {"query": {"match": {"body": {"query": "t3", "fuzziness": 1}}}, "ext": {"bmx": {"field": "body"}}},
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    async with client.post(
        f"{url}/docs/_msearch", data=data, headers={"Content-Type": "application/x-ndjson"}
    ) as resp:
        assert resp.status == 200
        body = await resp.json()
    first, second, third, fourth = body["responses"]
    assert fourth["_bmx"] == {"reranked": False, "skipped": "fuzzy"}, "a declined item says so"
    assert first["_bmx"]["reranked"] is True and first["hits"]["hits"][0]["_id"] == TOP_T3
    assert len(first["hits"]["hits"]) == 2
    assert "_bmx" not in second and [h["_id"] for h in second["hits"]["hits"]] == ["1", "2"]
    assert third["status"] == 404
    assert fake.searches[-4]["size"] == 5 and "ext" not in fake.searches[-4]


async def test_msearch_without_ext_is_forwarded_unchanged(proxy, client):
    fake, url = proxy
    data = b'{}\n{"size":1}\n'
    async with client.post(
        f"{url}/docs/_msearch", data=data, headers={"Content-Type": "application/x-ndjson"}
    ) as resp:
        body = await resp.json()
    assert len(body["responses"][0]["hits"]["hits"]) == 1 and "_bmx" not in body["responses"][0]


async def test_analysis_happens_once_per_query_text(proxy, client):
    fake, url = proxy
    ext = {
        "field": "body",
        "query": "t0",
        "window_size": 5,
        "augment": {"queries": ["t3", "t4"], "weights": [0.5, 0.2]},
    }
    _, _, body = await post(client, f"{url}/docs/_search", {"size": 5, "ext": {"bmx": ext}})
    assert fake.analyze_calls == 3
    assert "bool" in fake.searches[-1]["query"], "augmented queries widen the first stage"
    assert body["_bmx"]["wqa_mode"] == "merged"


async def test_identity_headers_tell_callers_apart_in_the_analysis_cache_too(cluster, client):
    """With `--identity-header x-user`, two users are two callers for every cache, analysis included."""
    fake, upstream = cluster
    runner, url = await run_proxy(upstream, identity_headers=("x-user",))
    search = {"size": 1, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}}
    for user in ("a", "a", "b"):
        assert (await post(client, f"{url}/docs/_search", search, headers={"X-User": user}))[0] == 200
    assert fake.analyze_calls == 2, "once per user"
    await runner.cleanup()


async def test_a_caller_without_mapping_rights_does_not_decide_the_analyzer_of_others(proxy, client):
    fake, url = proxy
    fake.search_analyzer = "synonyms"
    search = {"size": 1, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}}
    await post(client, f"{url}/docs/_search", search, headers={"Authorization": "Basic no-metadata"})
    assert fake.analyzers[-1] is None, "no mapping to read: the field's analyzer"
    await post(client, f"{url}/docs/_search", search, headers={"Authorization": "Basic reader"})
    assert fake.analyzers[-1] == "synonyms", "the mapping's search_analyzer, not a remembered failure"


# ---- failures ----


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_upstream_is_502(client):
    runner, url = await run_proxy(f"http://127.0.0.1:{closed_port()}")
    try:
        async with client.get(f"{url}/x/_doc/1") as resp:
            body = await resp.json()
            assert resp.status == 502 and body["status"] == 502
            assert body["error"]["type"] == "bmx_upstream_unreachable_exception"
        status, _, body = await post(
            client, f"{url}/docs/_search", {"ext": {"bmx": {"field": "body", "query": "t0"}}}
        )
        assert (
            status == 502 and body["error"]["root_cause"][0]["type"] == "bmx_upstream_unreachable_exception"
        )
    finally:
        await runner.cleanup()


async def test_an_upstream_that_does_not_speak_http_is_502(client):
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    runner, url = await run_proxy(f"http://127.0.0.1:{port}")
    try:
        async with client.get(f"{url}/x/_doc/1") as resp:
            body = await resp.json()
            assert resp.status == 502 and body["error"]["type"] == "bmx_upstream_unreachable_exception"
        status, _, body = await post(
            client, f"{url}/docs/_search", {"ext": {"bmx": {"field": "body", "query": "t0"}}}
        )
        assert status == 502 and body["error"]["type"] == "bmx_upstream_unreachable_exception"
    finally:
        await runner.cleanup()
        server.close()
        await server.wait_closed()


async def test_slow_upstream_is_504(cluster, client):
    _, upstream = cluster
    runner, url = await run_proxy(upstream, timeout=0.3)
    try:
        async with client.get(f"{url}/slow") as resp:
            body = await resp.json()
            assert resp.status == 504 and body["error"]["type"] == "bmx_upstream_timeout_exception"
    finally:
        await runner.cleanup()


async def test_health_and_upstream_credentials_refused(cluster, client):
    """Credentials in --upstream would be lent to anonymous clients: refused, without echoing them."""
    fake, upstream = cluster
    with pytest.raises(ValueError, match="must not carry credentials") as err:
        make_app(ProxyConfig(upstream.replace("http://", "http://user:s3cret@")), lambda s, b: FixedStats({}))
    assert "s3cret" not in str(err.value)
    runner, url = await run_proxy(upstream)
    try:
        async with client.get(f"{url}/_bmx/health") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"
        async with client.get(f"{url}/echo/a") as resp:
            assert resp.status == 200
        assert "Authorization" not in fake.requests[-1][2], "no credentials of the proxy's own"
        async with client.get(f"{url}/echo/a", headers={"Authorization": "Bearer mine"}) as resp:
            assert resp.status == 200
        assert fake.requests[-1][2]["Authorization"] == "Bearer mine", "the client's own credentials go up"
    finally:
        await runner.cleanup()


async def test_sidecar_calls_carry_any_authentication_header_of_the_caller(cluster, client):
    """OpenSearch proxy authentication sends no Authorization: the sidecar must not use its own then."""
    fake, upstream = cluster
    runner, url = await run_proxy(upstream)
    try:
        headers = {"X-Proxy-User": "alice", "X-Proxy-Roles": "reader", "Content-Type": "application/json"}
        search = {"size": 1, "ext": {"bmx": {"field": "body", "query": "t3", "window_size": 5}}}
        status, response_headers, _ = await post(client, f"{url}/docs/_search", search, headers=headers)
        assert status == 200 and response_headers["X-BMX-Rerank"] == "bmx"
        assert len(fake.sidecar_headers) == 2, "one _analyze, one _mtermvectors"
        for seen in fake.sidecar_headers:
            assert seen["X-Proxy-User"] == "alice" and seen["X-Proxy-Roles"] == "reader"
            assert "Authorization" not in seen
            assert seen["Content-Type"] == "application/json" and "Content-Length" in seen
    finally:
        await runner.cleanup()


async def test_a_proxy_bug_is_an_elasticsearch_shaped_500(proxy, client, monkeypatch):
    _, url = proxy

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("bmx_rerank.proxy.admission.bounded_plan", broken)
    status, _, body = await post(client, f"{url}/docs/_search", {"query": {"match_all": {}}})
    assert status == 500 and body["error"]["type"] == "bmx_proxy_exception"
    assert "secret internals" not in json.dumps(body) and "Traceback" not in json.dumps(body)


def test_split_upstream_and_routes():
    assert split_upstream("http://u:p@h:9200/") == ("http://h:9200", "Basic dTpw")
    assert split_upstream("https://h:9200") == ("https://h:9200", None)
    assert search_route("POST", "/idx/_search") == ("search", "idx")
    assert search_route("GET", "/_search") == ("search", None)
    assert search_route("POST", "/a,b/_msearch") == ("msearch", "a,b")
    assert search_route("PUT", "/idx/_search") is None
    assert search_route("POST", "/idx/_search/template") is None
    assert search_route("GET", "/idx/_doc/1") is None
    # a date-math name: its escaped `/` is its own, split before it is decoded
    assert search_route("POST", "/%3Clogs-%7Bnow%2Fd%7D%3E/_search") == ("search", "<logs-{now/d}>")
    assert search_route("POST", "/%3Clogs-%7Bnow%2Fd%7D%3E,b/_msearch") == ("msearch", "<logs-{now/d}>,b")


async def test_the_serving_process_collects_its_youngest_generation_less_often() -> None:
    import gc

    from bmx_rerank.proxy.app import GC_YOUNG_THRESHOLD

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # Python's default
        runner, _ = await run_proxy("http://127.0.0.1:9")  # starting calls no upstream
        await runner.cleanup()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10), "raised, the older generations kept"
        gc.set_threshold(GC_YOUNG_THRESHOLD * 3, 5, 5)  # an operator's own, higher: never lowered
        runner, _ = await run_proxy("http://127.0.0.1:9")
        await runner.cleanup()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD * 3, 5, 5)
    finally:
        gc.set_threshold(*before)
