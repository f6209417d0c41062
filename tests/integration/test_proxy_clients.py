"""The official clients work unchanged through the proxy: the venv's elasticsearch-py 8.x and
opensearch-py against every configured engine (index, bulk, get, search, msearch, delete), with and
without compression. The other client majors: test_official_clients.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from bmx_rerank.stats.cache import StatsCache
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

DOCS = {
    "a": "the quick brown fox jumps over the lazy dog",
    "b": "a quick fox and a quick dog",
    "c": "lazy afternoon for a brown dog",
    "d": "nothing to see here",
}


def official_client(kind: str, url: str, **kw: Any) -> Any:
    if kind == "elasticsearch":
        from elasticsearch import Elasticsearch

        return Elasticsearch(url, request_timeout=30, **kw)
    from opensearchpy import OpenSearch

    return OpenSearch(hosts=[url], timeout=30, **kw)


def _body(resp: Any) -> dict:
    return resp.body if hasattr(resp, "body") else resp


@pytest.fixture
def proxy(engine: EngineClient):
    proxy = ProxyThread(engine.url, lambda session, base: StatsCache(session, base))
    yield proxy
    proxy.close()


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_official_client_round_trip(engine: EngineClient, proxy: ProxyThread, compress: bool):
    index = f"bmxtest-proxy-{uuid.uuid4().hex[:10]}"
    client = official_client(engine.kind, proxy.url, http_compress=compress)
    try:
        client.indices.create(
            index=index,
            body={
                "settings": {"number_of_shards": 1, "number_of_replicas": 0},
                "mappings": {"properties": {"body": {"type": "text"}}},
            },
        )
        client.index(index=index, id="a", body={"body": DOCS["a"]}, refresh=True)
        actions: list[dict] = []
        for doc_id in ("b", "c", "d"):
            actions += [{"index": {"_index": index, "_id": doc_id}}, {"body": DOCS[doc_id]}]
        bulk = _body(client.bulk(body=actions, refresh=True))
        assert bulk["errors"] is False and len(bulk["items"]) == 3
        got = _body(client.get(index=index, id="c"))
        assert got["found"] is True and got["_source"] == {"body": DOCS["c"]}

        plain = _body(client.search(index=index, body={"query": {"match": {"body": "quick dog"}}}))
        assert "_bmx" not in plain and {h["_id"] for h in plain["hits"]["hits"]} == {"a", "b", "c"}

        ext = {"bmx": {"field": "body", "window_size": 10, "explain": True}}
        reranked = _body(
            client.search(
                index=index, body={"query": {"match": {"body": "quick dog"}}, "size": 2, "ext": ext}
            )
        )
        assert reranked["_bmx"]["reranked"] is True
        assert len(reranked["hits"]["hits"]) == 2
        assert all("_bmx_explanation" in h for h in reranked["hits"]["hits"])
        scores = [h["_score"] for h in reranked["hits"]["hits"]]
        assert scores == sorted(scores, reverse=True)

        searches = [
            {"index": index},
            {"query": {"match": {"body": "lazy"}}, "ext": {"bmx": {"field": "body"}}},
            {"index": index},
            {"query": {"match": {"body": "nothing"}}},
        ]
        msearch = _body(client.msearch(body=searches))
        first, second = msearch["responses"]
        assert first["_bmx"]["reranked"] is True and {h["_id"] for h in first["hits"]["hits"]} == {"a", "c"}
        assert [h["_id"] for h in second["hits"]["hits"]] == ["d"]

        deleted = _body(client.delete(index=index, id="d", refresh=True))
        assert deleted["result"] == "deleted"
        count = _body(client.count(index=index))
        assert count["count"] == 3
    finally:
        client.indices.delete(index=index, ignore_unavailable=True)
        client.close()


def test_official_client_sees_errors_as_from_the_cluster(engine: EngineClient, proxy: ProxyThread):
    client = official_client(engine.kind, proxy.url)
    if engine.kind == "elasticsearch":
        from elasticsearch import BadRequestError, NotFoundError
    else:
        from opensearchpy import NotFoundError
        from opensearchpy import RequestError as BadRequestError
    try:
        with pytest.raises(NotFoundError):
            client.get(index="bmxtest-proxy-missing", id="1")
        with pytest.raises(BadRequestError) as info:
            client.search(index="bmxtest-proxy-missing", body={"ext": {"bmx": {"field": "body", "x": 1}}})
        assert "unknown field [x]" in str(info.value)
    finally:
        client.close()
