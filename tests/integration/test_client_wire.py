"""The wrapper sends what the official client would: checked on the wire, through a recording server
between the client and the engine. `index` lists, `from_`, `filter_path`, `request_timeout` and basic
auth behave as the wrapped client's own (elasticsearch-py's keyword style, opensearch-py's body= and
params), for the first stage and for the sidecar's own calls alike."""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import trustme

from bmx_rerank.client import AsyncBMXClient, BMXClient
from bmx_rerank.stats.build import build_snapshots
from bmx_rerank.upstream import Cluster
from tests.support.corpora import bulk
from tests.support.data import vectors
from tests.support.engine_client import EngineClient
from tests.support.recorder import Recorder

VECTORS = vectors()
CASE = VECTORS["cases"][0]  # BMX with defaults, query t0 t3, normalized variants too

AUTH = ("bmx-user", "s3cret")
BASIC = "Basic " + base64.b64encode(":".join(AUTH).encode()).decode()
FILTER = ["hits.hits._id", "hits.hits._score", "_bmx.reranked"]


@pytest.fixture(scope="module")
def split_corpus(engine: EngineClient) -> Iterator[tuple[str, str]]:
    """The test-vector corpus split over two indices (even ids, odd ids), statistics built for each:
    a search over both sees the whole corpus, so its scores are the vectors' scores."""
    tag = uuid.uuid4().hex[:8]
    names = (f"bmx-test-wire-even-{tag}", f"bmx-test-wire-odd-{tag}")
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    for parity, name in enumerate(names):
        engine.ok("PUT", f"/{name}", {"settings": {"number_of_replicas": 0}, "mappings": mappings})
        docs = {str(i): {"body": " ".join(t)} for i, t in enumerate(VECTORS["corpus"]) if i % 2 == parity}
        bulk(engine, name, docs)

    async def build() -> None:
        async with aiohttp.ClientSession() as session:
            for name in names:
                await build_snapshots(Cluster(session, engine.url), name, "body", {})

    asyncio.run(build())
    yield names
    for name in names:
        engine.call("DELETE", f"/{name}")


@pytest.fixture
def recorder(engine: EngineClient) -> Iterator[Recorder]:
    rec = Recorder(engine.url)
    yield rec
    rec.close()


def _client(kind: str, url: str, asynchronous: bool = False) -> Any:
    if kind == "elasticsearch":
        from elasticsearch import AsyncElasticsearch, Elasticsearch

        return (AsyncElasticsearch if asynchronous else Elasticsearch)(url, basic_auth=AUTH)
    from opensearchpy import AsyncOpenSearch, OpenSearch

    return (AsyncOpenSearch if asynchronous else OpenSearch)(hosts=[url], http_auth=AUTH)


def _search_kwargs(kind: str, names: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """One reranked search in the wrapped client's own calling style."""
    body = {"query": {"match": {"body": " ".join(CASE["query"])}}, "ext": {"bmx": {"field": "body"}}}
    if kind == "elasticsearch":
        return {"index": list(names), **body, **extra}
    return {"index": list(names), "body": body, **extra}


def _expected_ranking() -> list[tuple[str, float]]:
    scored = [(str(i), s) for i, s in enumerate(CASE["scores"]) if s > 0]
    return sorted(scored, key=lambda pair: -pair[1])


def _check_page(answer: Any, start: int, size: int) -> None:
    body = getattr(answer, "body", answer)
    assert set(body) == {"hits", "_bmx"} and body["_bmx"] == {"reranked": True}  # filter_path applied
    hits = body["hits"]["hits"]
    assert all(set(h) == {"_id", "_score"} for h in hits)
    want = _expected_ranking()[start : start + size]
    np.testing.assert_allclose([h["_score"] for h in hits], [s for _, s in want], rtol=1e-6)


def _check_wire(recorder: Recorder, names: tuple[str, str]) -> None:
    searches = recorder.requests("_search")
    assert len(searches) == 1, [r.path for r in searches]
    first = searches[0]
    assert first.path == f"/{names[0]},{names[1]}/_search"  # a list, as the client sends it
    body_and_query = {**first.query, **(first.body or {})}
    assert "filter_path" not in first.query  # the window needs every hit field: applied afterwards
    assert "request_timeout" not in body_and_query and "from_" not in body_and_query
    assert int(body_and_query.get("from", 0)) == 0 and int(body_and_query["size"]) >= 3  # widened window
    assert "ext" not in (first.body or {})
    side = recorder.requests("_analyze") + recorder.requests("_mtermvectors")
    assert recorder.requests("_mtermvectors"), "the window's term vectors come through the recorder too"
    for request in [first, *side]:
        assert request.headers.get("authorization") == BASIC, request.path


def test_sync_wrapper_sends_what_the_official_client_sends(
    engine: EngineClient, split_corpus: tuple[str, str], recorder: Recorder
):
    client = _client(engine.kind, recorder.url)
    try:
        with BMXClient(client) as bmx:
            if engine.kind == "elasticsearch":  # elasticsearch-py 8 deprecates request_timeout per call
                answer = bmx.options(request_timeout=30, headers={"x-bmx-test": "1"}).search(
                    **_search_kwargs(engine.kind, split_corpus, filter_path=FILTER), from_=1, size=2
                )
            else:
                kwargs = _search_kwargs(engine.kind, split_corpus, filter_path=FILTER, request_timeout=30)
                answer = bmx.search(**kwargs, from_=1, size=2, headers={"x-bmx-test": "1"})
            _check_page(answer, 1, 2)
            _check_wire(recorder, split_corpus)
            assert recorder.requests("_search")[0].headers.get("x-bmx-test") == "1"  # the client's headers
    finally:
        client.close()


def test_request_timeout_is_the_clients_own(
    engine: EngineClient, split_corpus: tuple[str, str], recorder: Recorder
):
    """request_timeout bounds the first stage as it bounds any call of the client (not a body key)."""
    client = _client(engine.kind, recorder.url)
    if engine.kind == "elasticsearch":
        from elasticsearch import ConnectionTimeout
    else:
        from opensearchpy import ConnectionTimeout
    recorder.delay["_search"] = 2.0
    try:
        with BMXClient(client) as bmx:
            with pytest.raises(ConnectionTimeout):
                bmx.search(**_search_kwargs(engine.kind, split_corpus, request_timeout=0.5))
            if engine.kind == "elasticsearch":  # the same through elasticsearch-py's options()
                with pytest.raises(ConnectionTimeout):
                    bmx.options(request_timeout=0.5, max_retries=0).search(
                        **_search_kwargs(engine.kind, split_corpus)
                    )
            recorder.delay.clear()
            answer = bmx.search(**_search_kwargs(engine.kind, split_corpus, request_timeout=30, size=3))
            assert getattr(answer, "body", answer)["_bmx"]["reranked"] is True
    finally:
        client.close()


def test_one_deadline_bounds_the_wrappers_whole_rerank(
    engine: EngineClient, split_corpus: tuple[str, str], recorder: Recorder
):
    """The client's `request_timeout` bounds the whole rerank, not each call: with the term vectors
    held back 3 s, a search with `request_timeout=1` answers within it (plus the first stage's grace),
    with the cluster's first-stage answer marked `skipped: deadline`."""
    client = _client(engine.kind, recorder.url)
    recorder.delay["_mtermvectors"] = 3.0
    try:
        with BMXClient(client) as bmx:
            start = time.monotonic()
            if engine.kind == "elasticsearch":
                answer = bmx.options(request_timeout=1.0).search(**_search_kwargs(engine.kind, split_corpus))
            else:
                answer = bmx.search(**_search_kwargs(engine.kind, split_corpus, request_timeout=1.0))
            took = time.monotonic() - start
        body = getattr(answer, "body", answer)
        assert body["_bmx"]["reranked"] is False and body["_bmx"]["skipped"] == "deadline", body["_bmx"]
        assert took < 1.0 + 0.25 + 0.5, took  # the deadline, the first stage's grace, a margin
        assert body["hits"]["hits"], "the cluster's own answer"
    finally:
        recorder.delay.clear()
        client.close()


def test_async_wrapper_sends_what_the_official_client_sends(
    engine: EngineClient, split_corpus: tuple[str, str], recorder: Recorder
):
    async def run() -> None:
        client = _client(engine.kind, recorder.url, asynchronous=True)
        try:
            async with AsyncBMXClient(client) as bmx:
                answer = await bmx.search(
                    **_search_kwargs(engine.kind, split_corpus, filter_path=FILTER, request_timeout=30),
                    from_=1,
                    size=2,
                )
                _check_page(answer, 1, 2)
                _check_wire(recorder, split_corpus)
        finally:
            await client.close()

    asyncio.run(run())


def test_per_request_credentials_reach_the_sidecar_calls(
    engine: EngineClient, split_corpus: tuple[str, str], recorder: Recorder
):
    """Credentials given for one call (options(basic_auth=...) / http_auth=) are that call's, everywhere."""
    other = ("someone-else", "pw")
    other_basic = "Basic " + base64.b64encode(":".join(other).encode()).decode()
    client = _client(engine.kind, recorder.url)
    try:
        with BMXClient(client) as bmx:
            if engine.kind == "elasticsearch":
                bmx.options(basic_auth=other).search(**_search_kwargs(engine.kind, split_corpus, size=3))
            else:
                bmx.search(**_search_kwargs(engine.kind, split_corpus, size=3), http_auth=other)
            calls = [r for r in recorder.received if r.endpoint in ("_search", "_analyze", "_mtermvectors")]
            assert calls and {r.headers.get("authorization") for r in calls} == {other_basic}
    finally:
        client.close()


def test_the_clients_tls_settings_serve_the_sidecar_calls(
    engine: EngineClient, split_corpus: tuple[str, str], tmp_path
):
    """HTTPS with a private CA that only the client's `ca_certs` trusts: the reranked search works, so the
    sidecar's `_analyze`/`_mtermvectors`/statistics calls verified the server with the client's CA."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    recorder = Recorder(engine.url, tls=server)
    if engine.kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        client = Elasticsearch(recorder.url, ca_certs=str(ca_path), basic_auth=AUTH)
    else:
        from opensearchpy import OpenSearch

        client = OpenSearch(hosts=[recorder.url], ca_certs=str(ca_path), verify_certs=True, http_auth=AUTH)
    try:
        with BMXClient(client) as bmx:
            answer = bmx.search(**_search_kwargs(engine.kind, split_corpus, size=3))
            assert getattr(answer, "body", answer)["_bmx"]["reranked"] is True
        assert recorder.requests("_mtermvectors") and recorder.requests("_search")
        assert all(r.headers.get("authorization") == BASIC for r in recorder.received)
    finally:
        client.close()
        recorder.close()
