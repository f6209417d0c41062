"""Run one official client, unchanged, against a URL (the proxy): `python official_client_script.py KIND URL`.

Run in a subprocess so that the other major of a package (installed with `pip install --target` into a
side directory put first on PYTHONPATH) can be tested beside the venv's own. Prints one JSON line with
the client's version and what it checked; any failed check exits non-zero with the assertion."""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

DOCS = {
    "a": "the quick brown fox jumps over the lazy dog",
    "b": "a quick fox and a quick dog",
    "c": "lazy afternoon for a brown dog",
    "d": "nothing to see here",
}
QUERY = {"match": {"body": "quick dog"}}
EXT = {"bmx": {"field": "body", "window_size": 10}}


def _body(resp: Any) -> Any:
    return resp.body if hasattr(resp, "body") else resp


def _check_search(plain: dict, reranked: dict) -> None:
    assert "_bmx" not in plain and {h["_id"] for h in plain["hits"]["hits"]} == {"a", "b", "c"}, plain
    assert reranked["_bmx"]["reranked"] is True, reranked
    scores = [h["_score"] for h in reranked["hits"]["hits"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True), reranked


def run_elasticsearch(url: str, index: str) -> str:
    import elasticsearch
    from elasticsearch import BadRequestError, Elasticsearch, NotFoundError, helpers

    es = Elasticsearch(url).options(request_timeout=30)
    try:
        es.indices.create(
            index=index,
            settings={"number_of_shards": 1, "number_of_replicas": 0},
            mappings={"properties": {"body": {"type": "text"}}},
        )
        ok, errors = helpers.bulk(es, ({"_index": index, "_id": k, "body": v} for k, v in DOCS.items()))
        assert ok == 4 and not errors
        es.indices.refresh(index=index)
        _check_search(
            _body(es.search(index=index, query=QUERY)),
            _body(es.search(index=index, query=QUERY, size=2, ext=EXT)),
        )
        page = _body(es.search(index=index, scroll="1m", size=2, query={"match_all": {}}, sort=["_doc"]))
        seen = [h["_id"] for h in page["hits"]["hits"]]
        page = _body(es.scroll(scroll_id=page["_scroll_id"], scroll="1m"))
        seen += [h["_id"] for h in page["hits"]["hits"]]
        es.clear_scroll(scroll_id=page["_scroll_id"])
        assert sorted(seen) == sorted(DOCS), seen
        pit = _body(es.open_point_in_time(index=index, keep_alive="1m"))["id"]
        hits = _body(es.search(pit={"id": pit, "keep_alive": "1m"}, size=10, query=QUERY))["hits"]["hits"]
        assert {h["_id"] for h in hits} == {"a", "b", "c"}, hits
        es.close_point_in_time(id=pit)
        try:
            es.get(index=index, id="missing")
            raise AssertionError("a missing document must raise NotFoundError")
        except NotFoundError:
            pass
        try:
            es.search(index=index, query=QUERY, ext={"bmx": {"field": "body", "x": 1}})
            raise AssertionError("a bad ext.bmx must raise BadRequestError")
        except BadRequestError as err:
            assert "unknown field [x]" in str(err), err
    finally:
        es.options(ignore_status=404).indices.delete(index=index)
        es.close()
    return elasticsearch.__versionstr__


def run_opensearch(url: str, index: str) -> str:
    import opensearchpy
    from opensearchpy import NotFoundError, OpenSearch, RequestError, helpers

    client = OpenSearch(hosts=[url], timeout=30)
    try:
        client.indices.create(
            index=index,
            body={
                "settings": {"number_of_shards": 1, "number_of_replicas": 0},
                "mappings": {"properties": {"body": {"type": "text"}}},
            },
        )
        ok, errors = helpers.bulk(client, ({"_index": index, "_id": k, "body": v} for k, v in DOCS.items()))
        assert ok == 4 and not errors
        client.indices.refresh(index=index)
        _check_search(
            client.search(index=index, body={"query": QUERY}),
            client.search(index=index, body={"query": QUERY, "size": 2, "ext": EXT}),
        )
        page = client.search(
            index=index, scroll="1m", size=2, body={"query": {"match_all": {}}, "sort": ["_doc"]}
        )
        seen = [h["_id"] for h in page["hits"]["hits"]]
        page = client.scroll(scroll_id=page["_scroll_id"], scroll="1m")
        seen += [h["_id"] for h in page["hits"]["hits"]]
        client.clear_scroll(scroll_id=page["_scroll_id"])
        assert sorted(seen) == sorted(DOCS), seen
        pit = client.create_pit(index=index, keep_alive="1m")["pit_id"]
        body = {"pit": {"id": pit, "keep_alive": "1m"}, "size": 10, "query": QUERY}
        hits = client.search(body=body)["hits"]["hits"]
        assert {h["_id"] for h in hits} == {"a", "b", "c"}, hits
        client.delete_pit(body={"pit_id": [pit]})
        try:
            client.get(index=index, id="missing")
            raise AssertionError("a missing document must raise NotFoundError")
        except NotFoundError:
            pass
        try:
            client.search(index=index, body={"query": QUERY, "ext": {"bmx": {"field": "body", "x": 1}}})
            raise AssertionError("a bad ext.bmx must raise RequestError")
        except RequestError as err:
            assert "unknown field [x]" in str(err), err
    finally:
        client.indices.delete(index=index, ignore_unavailable=True)
        client.close()
    return opensearchpy.__versionstr__


if __name__ == "__main__":
    kind, url = sys.argv[1], sys.argv[2]
    index = f"bmx-test-clients-{uuid.uuid4().hex[:10]}"
    version = (run_elasticsearch if kind == "elasticsearch" else run_opensearch)(url, index)
    print(json.dumps({"client": kind, "version": version}))
