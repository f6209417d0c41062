"""A reranked answer has the cluster's own shape, whatever the search asks for besides its query: each
of 21 sets of query parameters with each of 22 bodies (fields asked for or left out, versions, totals,
explanations, aggregations, suggestions, highlights, `stored_fields`, `min_score`, score sorts, paging
written as the cluster reads it), through the proxy (with `ext.bmx`, or under a policy) and straight to
the cluster without it. The order and scores differ (that is the rerank); the status, the keys of the
answer and of each hit, each hit's fields, how many hits, the totals, the aggregations and the
suggestions do not."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from bmx_rerank.policy import parse_rules
from bmx_rerank.stats.source import FixedStats
from tests.support.corpora import bulk, exact_stats
from tests.support.data import scifact_records
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

pytestmark = pytest.mark.integration

WINDOW = 40
PARAMS = (
    "",
    "rest_total_hits_as_int=true",
    "typed_keys=true",
    "version=true",
    "seq_no_primary_term=true",
    "_source=false",
    "_source_excludes=body",
    "stored_fields=_none_",
    "stored_fields=_id",
    "track_total_hits=false",
    "track_total_hits=5",
    "docvalue_fields=n",
    "explain=true",
    "track_scores=true",
    "search_type=dfs_query_then_fetch",
    "pretty=true",
    "human=true",
    "error_trace=true",
    "ignore_unavailable=true",
    "request_cache=true",
    "q=cancer",  # the query in the URL, the text to score in `ext.bmx.query`
)
BODIES: tuple[dict[str, Any], ...] = (
    {"size": 10},
    {"size": 10, "from": 30},
    {"size": "7.9", "from": 2.0},  # read as the cluster reads a body's integers: 7 hits from the third
    {"size": 10, "explain": True},
    {"size": 10, "version": True, "seq_no_primary_term": True},
    {"size": 10, "_source": {"excludes": ["body"]}},
    {"size": 10, "stored_fields": []},
    {"size": 10, "stored_fields": ["_id"]},
    {"size": 10, "fields": ["body"]},
    {
        "size": 10,
        "runtime_mappings": {"r": {"type": "long", "script": {"source": "emit(1)"}}},
        "fields": ["r"],
    },
    {"size": 10, "track_scores": True},
    {"size": 10, "suggest": {"s": {"text": "cancr", "term": {"field": "body"}}}},
    {"size": 10, "highlight": {"fields": {"body": {}}}},
    {"size": 10, "aggs": {"t": {"terms": {"field": "_index"}}, "m": {"max": {"field": "n"}}}},
    {"size": 10, "docvalue_fields": ["n"], "stored_fields": "_none_"},
    {"size": 10, "stored_fields": ["_none_"]},  # the list elasticsearch-py sends
    {"size": 10, "timeout": "1s"},
    {"size": 10, "terminate_after": 1000},
    {"size": 10, "min_score": 0.5, "ext": {"bmx": {"combine": "linear"}}},
    {"size": 10, "sort": [{"_score": "desc"}]},
    {"size": 10, "sort": "_score"},
    {"size": 10, "track_total_hits": 3},
    {"size": 10, "stats": ["g"], "script_fields": {"two": {"script": "2"}}},
)
SCORED = ("_score", "_explanation", "_bmx_explanation", "sort", "_shard", "_node")  # a hit's, by its rank


def _shape_of(hit: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hit.items() if k not in SCORED}


@pytest.mark.parametrize("asked", ["ext", "policy"])
def test_a_reranked_answer_has_the_clusters_shape_whatever_else_the_search_asks(
    engine: EngineClient, asked: str
) -> None:
    """Asked for with `ext.bmx`, or by a `--policy` on the index (a client that never asked)."""
    index = f"bmxtest-shape-{uuid.uuid4().hex[:10]}"
    settings = {"number_of_shards": 3, "number_of_replicas": 0}
    mappings = {"properties": {"body": {"type": "text"}, "n": {"type": "long"}}}
    engine.ok("PUT", f"/{index}", {"settings": settings, "mappings": mappings})
    records = scifact_records("corpus.jsonl", 300)
    bulk(
        engine,
        index,
        {d["_id"]: {"body": f"{d['title']} {d['text']}", "n": i % 5} for i, d in enumerate(records)},
    )
    stats = FixedStats({})
    policies = parse_rules([f"{index}=body,window_size={WINDOW}"] if asked == "policy" else [])
    proxy = ProxyThread(engine.url, stats, policies=policies)
    via = EngineClient(engine.kind, proxy.url)
    text = "cancer cells in the lung"
    try:
        stats.table[(index, "body")] = proxy.run(exact_stats(engine.url, index, "body"))
        reranked = 0
        asks = PARAMS if asked == "ext" else PARAMS[::2]  # a policy's with every other set (CI's time)
        for params, extra in itertools.product(asks, BODIES):
            body = {"query": {"match": {"body": text}}, **extra}
            if params.startswith("q="):
                del body["query"]
            bmx = {"field": "body", "window_size": WINDOW, **extra.get("ext", {}).get("bmx", {})}
            bmx |= {"query": text} if params.startswith("q=") else {}
            path = f"/{index}/_search?{params}"
            plain = {k: v for k, v in body.items() if k != "ext"}
            sent = {**body, "ext": {"bmx": bmx}} if asked == "ext" else plain
            a, b = via.call("POST", path, sent), engine.call("POST", path, plain)
            said = (path, extra, str(a.body)[:400], str(b.body)[:400])
            assert a.status == b.status, said
            if a.status >= 300:
                assert a.body["error"]["type"] == b.body["error"]["type"], said
                continue
            reranked += a.headers.get("X-BMX-Rerank") == "bmx"
            assert set(a.body) - {"took", "_bmx"} == set(b.body) - {"took"}, said
            assert set(a.body["hits"]) == set(b.body["hits"]), said
            assert a.body["hits"].get("total") == b.body["hits"].get("total"), said
            assert len(a.body["hits"]["hits"]) == len(b.body["hits"]["hits"]), said
            assert a.body.get("aggregations") == b.body.get("aggregations"), said
            assert a.body.get("suggest") == b.body.get("suggest"), said
            # each hit as the cluster shows it among the window's (by `_id` where hits carry one)
            window = engine.ok("POST", path, {**plain, "from": 0, "size": WINDOW})["hits"]["hits"]
            shown = {h.get("_id"): _shape_of(h) for h in window}
            for hit in a.body["hits"]["hits"]:
                if "_id" in hit:
                    assert _shape_of(hit) == shown[hit["_id"]], (said, hit, shown[hit["_id"]])
                else:
                    assert set(_shape_of(hit)) == set(_shape_of(window[0])), (said, hit, window[0])
        assert reranked >= len(asks) * len(BODIES) * 3 // 4, reranked
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")
