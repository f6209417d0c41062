"""The client wrapper around the official clients, sync and async, against real engines.

The test-vector corpus is indexed on 3 shards; statistics are built and stored through the cluster
(`stats_build.build_snapshots`, as `bmx-rerank stats build` does); the wrapper then reproduces the
expected scores and leaves every other call to the wrapped client."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from bmx_rerank.client import AsyncBMXClient, BMXClient, node_url
from bmx_rerank.errors import SearchError
from bmx_rerank.rerank.plan import Bounds
from tests.support.clients import official_client
from tests.support.corpora import index_vectors
from tests.support.data import vectors
from tests.support.engine_client import EngineClient

VECTORS = vectors()
CASE = VECTORS["cases"][0]  # BMX with defaults, query t0 t3, normalized variants too


@pytest.fixture(scope="module")
def corpus(engine: EngineClient) -> Iterator[str]:
    index = f"bmx-test-client-{uuid.uuid4().hex[:8]}"
    mappings = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
    index_vectors(engine, index, {"number_of_shards": 3}, mappings)
    yield index
    engine.call("DELETE", f"/{index}")


def _search_body(size: int = 30, **bmx) -> dict:
    return {
        "size": size,
        "query": {"match": {"body": " ".join(CASE["query"])}},
        "ext": {"bmx": {"field": "body", **bmx}},
    }


def _scores_by_id(answer) -> dict[int, float]:
    return {int(h["_id"]): h["_score"] for h in answer["hits"]["hits"]}


def _check_expected(answer, key: str = "scores") -> None:
    got = _scores_by_id(answer)
    expected = {i: s for i, s in enumerate(CASE[key]) if s > 0}
    assert set(got) == set(expected)
    np.testing.assert_allclose([got[i] for i in sorted(got)], [expected[i] for i in sorted(got)], rtol=1e-6)
    ranked = [h["_score"] for h in answer["hits"]["hits"]]
    assert ranked == sorted(ranked, reverse=True)
    assert answer["_bmx"]["reranked"] is True and answer["_bmx"]["estimated"] is False


def _raised(err: pytest.ExceptionInfo, kind: str, status: int) -> SearchError:
    """The wrapper's error, raised as the client raises the cluster's: its own class for the status,
    carrying the error body, caused by the `SearchError` the proxy would answer."""
    if kind == "elasticsearch":
        import elasticsearch

        assert isinstance(err.value, elasticsearch.ApiError) and err.value.meta.status == status
        body = err.value.body
    else:
        import opensearchpy

        assert isinstance(err.value, opensearchpy.TransportError) and err.value.status_code == status
        body = err.value.info
    cause = err.value.__cause__
    assert isinstance(cause, SearchError) and cause.status == status and body == cause.body()
    return cause


def test_node_url_is_read_from_the_official_client(engine: EngineClient):
    client = official_client(engine.kind, engine.url, asynchronous=False)
    assert node_url(client) == engine.url.rstrip("/")


def test_sync_wrapper_reranks_exactly_and_passes_everything_else_through(engine: EngineClient, corpus: str):
    client = official_client(engine.kind, engine.url, asynchronous=False)
    with BMXClient(client) as bmx:
        _check_expected(bmx.search(index=corpus, body=_search_body()))
        _check_expected(bmx.search(index=corpus, body=_search_body(normalize="paper")), "normalized_paper")
        plain = bmx.search(index=corpus, body={"size": 30, "query": {"match": {"body": "t0 t3"}}})
        direct = client.search(index=corpus, body={"size": 30, "query": {"match": {"body": "t0 t3"}}})
        assert "_bmx" not in plain
        assert _scores_by_id(plain) == _scores_by_id(direct)
        assert bmx.count(index=corpus)["count"] == len(VECTORS["corpus"])  # the wrapped client's own API
        with pytest.raises(Exception) as err:
            bmx.search(index=corpus, body=_search_body(alpha=-1))
        assert "alpha" in _raised(err, engine.kind, 400).reason


def test_async_wrapper_reranks_exactly(engine: EngineClient, corpus: str):
    async def run() -> None:
        client = official_client(engine.kind, engine.url, asynchronous=True)
        try:
            async with AsyncBMXClient(client) as bmx:
                answers = await asyncio.gather(
                    bmx.search(index=corpus, body=_search_body()),
                    bmx.search(index=corpus, body=_search_body(size=5, normalize="reference")),
                )
                _check_expected(answers[0])
                top = answers[1]["hits"]["hits"]
                expected = sorted(CASE["normalized_reference"], reverse=True)[:5]
                np.testing.assert_allclose([h["_score"] for h in top], expected, rtol=1e-6)
        finally:
            await client.close()

    asyncio.run(run())


def test_calling_style_is_the_wrapped_clients_own(engine: EngineClient, corpus: str):
    """elasticsearch-py's keyword style (query=, size=, ext=) works where the client takes it; opensearch-py
    refuses body fields as keywords, and so does the wrapper: it adds nothing to the client's signature."""
    client = official_client(engine.kind, engine.url, asynchronous=False)
    with BMXClient(client) as bmx:
        keywords = {"size": 30, "query": {"match": {"body": "t0 t3"}}, "ext": {"bmx": {"field": "body"}}}
        if engine.kind == "elasticsearch":
            _check_expected(bmx.search(index=corpus, **keywords))
        else:
            with pytest.raises(TypeError, match="query"):
                client.search(index=corpus, **keywords)
            with pytest.raises(TypeError, match="query"):
                bmx.search(index=corpus, **keywords)
            _check_expected(bmx.search(index=corpus, body=keywords))


def test_the_wrapper_probes_and_is_bounded_as_the_proxy_is(engine: EngineClient, corpus: str):
    """One pipeline for every front end: a new window's first stage carries term-frequency probes
    (`auto`, the statistics hold a length table), the same window again comes from the cache (kept
    whole), both exact; the server's bounds apply to the wrapper too."""
    client = official_client(engine.kind, engine.url, asynchronous=False)
    with BMXClient(client) as bmx:
        first = bmx.search(index=corpus, body=_search_body())
        _check_expected(first)
        assert first["_bmx"]["tf_probes"] is None and first["_bmx"]["tf"] == "probes", first["_bmx"]
        again = bmx.search(index=corpus, body=_search_body())
        _check_expected(again)
        assert again["_bmx"]["tf_probes"] == "seen" and again["_bmx"]["tf"] == "window", again["_bmx"]
        metrics = bmx.bmx_metrics.render().decode()  # measured as the proxy measures its reranks
        assert "bmx_rerank_seconds_count 2.0" in metrics, metrics
        assert 'bmx_reranks_total{outcome="reranked"} 2.0' in metrics
    with BMXClient(client, tf_probes="off", bounds=Bounds(max_window=10)) as bmx:
        with pytest.raises(Exception) as err:
            bmx.search(index=corpus, body=_search_body(window_size=100))
        assert "--max-window" in _raised(err, engine.kind, 400).reason
        answer = bmx.search(index=corpus, body=_search_body(size=5, window_size=10))
        assert answer["_bmx"]["tf_probes"] == "off" and len(answer["hits"]["hits"]) == 5


def test_a_body_given_as_json_text_is_the_same_search(engine: EngineClient, corpus: str):
    """The official clients also take a body as a JSON string or bytes: the wrapper reads it so,
    reranked or sent as given."""
    client = official_client(engine.kind, engine.url, asynchronous=False)
    plain = {"size": 30, "query": {"match": {"body": "t0 t3"}}}
    with BMXClient(client) as bmx:
        for encode in (json.dumps, lambda body: json.dumps(body).encode()):
            _check_expected(bmx.search(index=corpus, body=encode(_search_body())))
            got = bmx.search(index=corpus, body=encode(plain))
            assert "_bmx" not in got
            assert _scores_by_id(got) == _scores_by_id(client.search(index=corpus, body=plain))


def test_an_error_the_client_is_told_to_ignore_is_its_answer_not_a_rerank(engine: EngineClient, corpus: str):
    """elasticsearch-py's `ignore_status`, opensearch-py's `ignore`: the cluster's error comes back as
    the answer, as without the wrapper, with no `_bmx` marker and no hits made up."""
    client = official_client(engine.kind, engine.url, asynchronous=False)
    missing = f"{corpus}-missing"
    unasked = {k: v for k, v in _search_body().items() if k != "ext"}  # the cluster refuses `ext.bmx`
    with BMXClient(client) as bmx:
        if engine.kind == "elasticsearch":
            got = bmx.options(ignore_status=404).search(index=missing, body=_search_body())
            want = client.options(ignore_status=404).search(index=missing, body=unasked)
        else:
            got = bmx.search(index=missing, body=_search_body(), ignore=404)
            want = client.search(index=missing, body=unasked, ignore=404)
        assert got["status"] == want["status"] == 404 and got["error"]["type"] == "index_not_found_exception"
        assert "_bmx" not in got and "hits" not in got
        # so is the wrapper's own 400, for a bad `ext.bmx`
        bad = _search_body(alpha=-1)
        if engine.kind == "elasticsearch":
            got = bmx.options(ignore_status=400).search(index=corpus, body=bad)
        else:
            got = bmx.search(index=corpus, body=bad, ignore=400)
        assert got["status"] == 400 and "alpha" in got["error"]["reason"]


def test_the_search_timeout_and_a_search_of_no_index_are_answered_as_the_proxy_answers(
    engine: EngineClient, corpus: str
):
    """The search's own `timeout` lowers the rerank's deadline (a 504 once past it), and a rerank asked of
    `/_search`, which names no index, is declined as the proxy declines it: statistics are per index."""
    client = official_client(engine.kind, engine.url, asynchronous=False)
    with BMXClient(client) as bmx:
        with pytest.raises(Exception) as err:
            bmx.search(index=corpus, body={**_search_body(), "timeout": "1nanos"})
        assert _raised(err, engine.kind, 504).type == "bmx_upstream_timeout_exception"
        unnamed = bmx.search(body={**_search_body(), "query": {"ids": {"values": ["1"]}}})
        assert unnamed["_bmx"] == {"reranked": False, "skipped": "no_index"}, unnamed["_bmx"]


def test_the_sidecars_calls_fail_over_from_a_node_that_cannot_be_reached(engine: EngineClient, corpus: str):
    """The wrapped client knows several nodes, the first one down: the sidecar's own calls (statistics,
    term vectors, analysis) fail over to the next as the client's requests do, so the rerank stands."""
    dead = "http://127.0.0.1:1"  # nothing listens: the connection is refused
    if engine.kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        client = Elasticsearch([dead, engine.url], max_retries=3, retry_on_timeout=True)
    else:
        from opensearchpy import OpenSearch

        client = OpenSearch(hosts=[dead, engine.url], max_retries=3)
    with BMXClient(client) as bmx:
        assert set(bmx._core.sidecar.pool) == {dead, engine.url.rstrip("/")}
        for size in (30, 5, 30):
            answer = bmx.search(index=corpus, body=_search_body(size=size))
            assert answer["_bmx"]["reranked"] is True and len(answer["hits"]["hits"]) == size
        _check_expected(bmx.search(index=corpus, body=_search_body()))
