"""Production query shapes through the proxy, on both engines, 3 shards: each is reranked (never with
zero scores) or declined out loud, answering exactly the cluster's own hits with the reason header."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bmx_rerank.policy import parse_rules
from bmx_rerank.rerank.plan import mentions
from bmx_rerank.stats.source import FixedStats
from tests.support.corpora import bulk, exact_stats
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
MAPPINGS = {
    "properties": {
        "title": {"type": "text"},
        "text": {"type": "text"},
        "tag": {"type": "keyword"},
        "n": {"type": "integer"},
        "kids": {"type": "nested", "properties": {"text": {"type": "text"}}},
    }
}
WINDOW = 60  # covers every document: the window is the whole corpus


@pytest.fixture(scope="module")
def shapes(engine: EngineClient) -> Iterator[tuple[EngineClient, str, EngineClient]]:
    """40 documents with a title and a text in a 3-shard index; a proxy with a policy on `text`."""
    index = f"bmxtest-shapes-{uuid.uuid4().hex[:10]}"
    mappings = {"properties": {**MAPPINGS["properties"]}}
    if engine.kind == "elasticsearch":  # top-level knn is Elasticsearch's
        mappings["properties"]["v"] = {
            "type": "dense_vector",
            "dims": 2,
            "index": True,
            "similarity": "cosine",
        }
    engine.ok(
        "PUT",
        f"/{index}",
        {"settings": {"number_of_shards": 3, "number_of_replicas": 0}, "mappings": mappings},
    )
    rng = random.Random(9)
    docs = {
        str(i): {
            "title": " ".join(rng.choices(WORDS, k=rng.randint(1, 4))),
            "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 14))),
            "tag": "even" if i % 2 == 0 else "odd",
            "n": i,
            "kids": [{"text": " ".join(rng.choices(WORDS, k=3))}],
            **({"v": [math.cos(i), math.sin(i)]} if engine.kind == "elasticsearch" else {}),
        }
        for i in range(40)
    }
    bulk(engine, index, docs)
    stats = FixedStats({})
    engine.ok("POST", "/_aliases", {"actions": [{"add": {"index": index, "alias": f"{index}-two"}}]})
    rules = [f"{index}-two=title^2|text,window_size={WINDOW}", f"{index}=text,window_size={WINDOW}"]
    proxy = ProxyThread(engine.url, stats, policies=parse_rules(rules))
    for field in ("text", "title"):
        stats.table[(index, field)] = stats.table[(f"{index}-two", field)] = proxy.run(
            exact_stats(engine.url, index, field)
        )
    try:
        yield engine, index, EngineClient(engine.kind, proxy.url)
    finally:
        proxy.close()
        engine.call("DELETE", f"/{index}")


MATCH = {"match": {"text": "alpha beta"}}
EXT = {"field": "text", "window_size": WINDOW}

# (request body without ext.bmx, reason): the cluster answers for every one of them.
DECLINED = [
    ({"query": {"match": {"text": {"query": "alpah betta", "fuzziness": "AUTO"}}}}, "fuzzy"),
    ({"query": {"match_phrase_prefix": {"text": "alpha be"}}}, "match_phrase_prefix"),
    (
        {"query": {"query_string": {"query": "text:alpha OR title:beta", "default_field": "text"}}},
        "query_string",
    ),
    (
        {"query": {"simple_query_string": {"query": "alpha | beta*", "fields": ["text"]}}},
        "simple_query_string",
    ),
    ({"query": {"function_score": {"query": MATCH, "field_value_factor": {"field": "n"}}}}, "function_score"),
    ({"query": {"constant_score": {"filter": MATCH, "boost": 2}}}, "constant_score"),
    (
        {"query": {"script_score": {"query": MATCH, "script": {"source": "_score * 2 + doc['n'].value"}}}},
        "script_score",
    ),
    ({"query": {"nested": {"path": "kids", "query": {"match": {"kids.text": "alpha"}}}}}, "nested"),
    ({"query": {"bool": {"must": [MATCH, {"term": {"tag": "odd"}}]}}}, "term"),
    ({"query": {"bool": {"should": [MATCH, {"match": {"title": "gamma"}}]}}}, "field"),
    ({"query": {"match": {"text": {"query": "alpha", "analyzer": "whitespace"}}}}, "analyzer"),
    (  # the phrase boost counts only on hits holding the phrase, which BMX cannot see
        {
            "query": {
                "bool": {"should": [MATCH, {"match_phrase": {"text": {"query": "alpha beta", "boost": 2}}}]}
            }
        },
        "optional_condition",
    ),
    (
        {
            "query": MATCH,
            "rescore": {"window_size": 10, "query": {"rescore_query": {"match": {"title": "beta"}}}},
        },
        "rescore",
    ),
    ({"query": MATCH, "indices_boost": [{"bmxtest-shapes-*": 2.0}]}, "indices_boost"),
    ({"query": MATCH, "min_score": 0.5}, "min_score"),
    ({"query": MATCH, "collapse": {"field": "tag"}}, "collapse"),
    ({"query": MATCH, "sort": [{"n": "asc"}]}, "sort"),
    ({"query": MATCH, "knn": {"field": "v", "query_vector": [1.0, 0.0], "k": 3, "num_candidates": 5}}, "knn"),
]


def _same_answer(got: Any, direct: Any) -> None:
    assert got.status == direct.status, (got.body, direct.body)
    if got.status == 200:
        pairs = [(h["_id"], h["_score"]) for h in got.body["hits"]["hits"]]
        assert pairs == [(h["_id"], h["_score"]) for h in direct.body["hits"]["hits"]]
        assert "_bmx" not in got.body


@pytest.mark.parametrize(("body", "reason"), DECLINED, ids=[r for _, r in DECLINED])
@pytest.mark.parametrize("how", ["ext", "policy"])
def test_declined_shapes_answer_the_clusters_own_hits_with_the_reason(shapes, body, reason, how):
    engine, index, proxy = shapes
    sent = {**body, "size": 10, **({"ext": {"bmx": EXT}} if how == "ext" else {})}
    got = proxy.call("POST", f"/{index}/_search", sent)
    direct = engine.call("POST", f"/{index}/_search", {**body, "size": 10})
    if how == "policy" and not mentions(body.get("query"), ["text"]):
        assert "X-BMX-Rerank" not in got.headers, "a search on other fields is not the policy's"
    elif how == "policy" and reason == "field":
        # A policy scores every field of a query that scores one of its fields (ext.bmx names them).
        assert got.headers.get("X-BMX-Rerank") == "bmx" and got.body["_bmx"]["fields"] == ["text", "title"]
        return
    else:
        assert got.headers.get("X-BMX-Rerank") == f"skipped; reason={reason}"
    _same_answer(got, direct)


def test_a_search_the_policy_is_not_about_passes_unmarked(shapes):
    engine, index, proxy = shapes
    for query in ({"term": {"tag": "odd"}}, {"match": {"title": "alpha"}}):
        got = proxy.call("POST", f"/{index}/_search", {"query": query})
        assert "X-BMX-Rerank" not in got.headers
        _same_answer(got, engine.call("POST", f"/{index}/_search", {"query": query}))


def _reranked(proxy: EngineClient, index: str, body: dict) -> dict[str, float]:
    got = proxy.call("POST", f"/{index}/_search", {**body, "size": WINDOW})
    assert got.status == 200 and got.headers.get("X-BMX-Rerank") == "bmx", got.body
    hits = got.body["hits"]["hits"]
    assert hits and all(h["_score"] > 0 for h in hits), "a reranked answer never scores a match 0"
    return {h["_id"]: h["_score"] for h in hits}


# Shapes that score the same text on `text` as MATCH: their BMX scores are MATCH's, on the hits they keep.
SAME_AS_MATCH = [
    {"query": {"bool": {"must": [MATCH], "filter": [{"term": {"tag": "odd"}}]}}},
    {
        "query": {"bool": {"must": MATCH, "must_not": {"range": {"n": {"lt": 5}}}}},
        "post_filter": {"term": {"tag": "even"}},
    },
    {
        "query": {
            "bool": {"should": [MATCH], "filter": {"range": {"n": {"gte": 10}}}, "minimum_should_match": 1}
        }
    },
    {"query": {"multi_match": {"query": "alpha beta", "fields": ["text"]}}},
    {"query": {"query_string": {"query": "alpha beta", "default_field": "text"}}},
    {"query": {"simple_query_string": {"query": "alpha beta", "fields": ["text"]}}},
    {"query": {"dis_max": {"queries": [MATCH]}}},
    {
        "query": {
            "bool": {"must": [MATCH, {"constant_score": {"filter": {"term": {"tag": "odd"}}, "boost": 3}}]}
        }
    },
    {
        "query": {
            "bool": {
                "must": MATCH,
                "should": {
                    "nested": {
                        "path": "kids",
                        "score_mode": "none",
                        "query": {"match": {"kids.text": "beta"}},
                    }
                },
            }
        }
    },
]


@pytest.mark.parametrize("body", SAME_AS_MATCH, ids=range(len(SAME_AS_MATCH)))
@pytest.mark.parametrize("how", ["ext", "policy"])
def test_text_shapes_are_reranked_with_the_scores_of_their_text(shapes, body, how):
    engine, index, proxy = shapes
    plain = _reranked(proxy, index, {"query": MATCH})
    sent = {**body, **({"ext": {"bmx": EXT}} if how == "ext" else {})}
    got = _reranked(proxy, index, sent)
    direct = engine.ok("POST", f"/{index}/_search", {**body, "size": WINDOW})
    assert set(got) == {h["_id"] for h in direct["hits"]["hits"]}, "filters kept: the cluster's own hits"
    assert got == pytest.approx({i: plain[i] for i in got}, rel=1e-9)


def test_a_phrase_is_matched_by_the_cluster_and_scored_on_its_terms(shapes):
    engine, index, proxy = shapes
    phrase = {"query": {"match_phrase": {"text": "alpha beta"}}}
    got = _reranked(proxy, index, {**phrase, "ext": {"bmx": EXT}})
    direct = engine.ok("POST", f"/{index}/_search", {**phrase, "size": WINDOW})
    assert set(got) == {h["_id"] for h in direct["hits"]["hits"]}
    plain = _reranked(proxy, index, {"query": MATCH})
    assert got == pytest.approx({i: plain[i] for i in got}, rel=1e-9)


def test_widening_keeps_every_hit_of_a_filter_and_should_query(shapes):
    engine, index, proxy = shapes
    query = {"bool": {"filter": [{"term": {"tag": "odd"}}], "should": [{"match": {"text": "omega"}}]}}
    ext = {**EXT, "augment": {"queries": ["sigma"], "weights": [0.5]}}
    got = proxy.call("POST", f"/{index}/_search", {"query": query, "size": WINDOW, "ext": {"bmx": ext}})
    direct = engine.ok("POST", f"/{index}/_search", {"query": query, "size": WINDOW})
    assert got.status == 200 and got.headers["X-BMX-Rerank"] == "bmx"
    got_ids = {h["_id"] for h in got.body["hits"]["hits"]}
    assert {h["_id"] for h in direct["hits"]["hits"]} <= got_ids, "widening never drops an original hit"
    assert len(got_ids) == 20 and all(int(i) % 2 == 1 for i in got_ids), "nor lets a filtered one in"


KNN = {"field": "v", "query_vector": [1.0, 0.0], "k": 5, "num_candidates": 40}
# The requests of issue 9's table, as a new user sends them: (body, through a policy?).
ISSUE_TABLE = [
    ({"query": {"bool": {"must": [MATCH], "filter": [{"term": {"tag": "odd"}}]}}}, True),
    ({"query": {"match": {"text": {"query": "alpah beta", "fuzziness": "AUTO"}}}}, False),
    ({"query": {"multi_match": {"query": "alpha beta", "fields": ["text^2", "title"]}}}, True),
    ({"query": {"multi_match": {"query": "alpha beta", "fields": ["text^2", "title"]}}}, False),
    ({"query": {"match_phrase": {"text": "alpha beta"}}}, False),
    ({"query": {"query_string": {"query": "alpha beta", "default_field": "text"}}}, False),
    ({"query": {"query_string": {"query": "text:alpha AND beta", "default_field": "text"}}}, False),
    ({"query": {"simple_query_string": {"query": "alpha beta", "fields": ["text"]}}}, False),
    ({"query": {"combined_fields": {"query": "alpha beta", "fields": ["text", "title"]}}}, False),
    ({"query": {"combined_fields": {"query": "alpha beta", "fields": ["text"]}}}, False),
    ({"query": {"dis_max": {"queries": [MATCH, {"match": {"title": "beta"}}], "tie_breaker": 0.2}}}, False),
    ({"query": {"function_score": {"query": MATCH, "field_value_factor": {"field": "n"}}}}, False),
    ({"query": {"constant_score": {"filter": MATCH}}}, False),
    ({"query": {"nested": {"path": "kids", "query": {"match": {"kids.text": "alpha"}}}}}, False),
    ({"query": MATCH, "knn": KNN}, False),
    ({"query": MATCH, "knn": KNN, "ext": {"bmx": {**EXT, "combine": "rrf"}}}, False),
    ({"query": MATCH, "rescore": {"query": {"rescore_query": {"match": {"title": "beta"}}}}}, False),
    ({"query": MATCH, "rank": {"rrf": {}}}, False),
    ({"query": MATCH, "indices_boost": [{"bmxtest-shapes-*": 2.0}]}, False),
]


COMBINED = {**EXT, "query": "alpha beta"}
# Hybrid first stages with a combination asked for: reranked with every hit scored, or the cluster's error.
HYBRID = [
    ({"knn": KNN, "ext": {"bmx": {**COMBINED, "combine": "linear", "weight": 0.3}}}, False),
    ({"knn": KNN, "ext": {"bmx": {**COMBINED, "combine": "rrf"}}}, False),
    ({"retriever": {"standard": {"query": MATCH}}, "ext": {"bmx": {**COMBINED, "combine": "rrf"}}}, False),
    (
        {
            "query": MATCH,
            "rescore": {"query": {"rescore_query": MATCH}},
            "ext": {"bmx": {**EXT, "combine": "linear"}},
        },
        False,
    ),
    ({"query": MATCH, "min_score": 0.5, "ext": {"bmx": {**EXT, "combine": "rrf"}}}, False),
]


@pytest.mark.parametrize(("body", "policy"), ISSUE_TABLE + HYBRID, ids=range(len(ISSUE_TABLE + HYBRID)))
def test_no_request_of_the_issue_table_is_a_zero_score_rerank_or_a_silent_loss(shapes, body, policy):
    engine, index, proxy = shapes
    ext = {} if policy or "ext" in body else {"ext": {"bmx": {**EXT, "fields": ["text", "title"]}}}
    got = proxy.call("POST", f"/{index}/_search", {**body, **ext, "size": 10})
    marker = got.headers.get("X-BMX-Rerank", "")
    direct = engine.call(
        "POST", f"/{index}/_search", {**{k: v for k, v in body.items() if k != "ext"}, "size": 10}
    )
    if marker.startswith("skipped; reason=") or direct.status != 200:  # declined, or the cluster's error
        _same_answer(got, direct)
        return
    assert got.status == 200 and marker == "bmx", (marker, got.body)
    hits = got.body["hits"]["hits"]
    assert hits and all(h["_score"] > 0 for h in hits), "reranked, so every hit scored"
    assert got.body["_bmx"]["reranked"] is True


def test_the_validate_rewrite_benchmark_runs_small(engine):
    """The small version of benchmarks/validate_rewrite.py, so the benchmark keeps working."""
    from benchmarks import validate_rewrite as bench

    kind = "es" if engine.kind == "elasticsearch" else "os"
    out = bench.main(["--engines", kind, f"--{kind}-url", engine.url, "--docs", "300", "--queries", "3"])
    times = out[kind]["times"]
    assert set(times) == {"search", "rewrite", "rewrite fuzzy", "rewrite fuzzy all"}
    assert all(len(v) == 3 and min(v) > 0 for v in times.values())
    assert 0 <= out[kind]["differ"] <= 3


@pytest.mark.parametrize(
    ("query", "same"),
    [
        (
            {
                "query_string": {
                    "query": "alpha beta-gamma",
                    "fields": ["title^2", "text"],
                    "tie_breaker": 0.3,
                }
            },
            {"multi_match": {"query": "alpha beta-gamma", "fields": ["title^2", "text"], "tie_breaker": 0.3}},
        ),
        (
            {"query_string": {"query": "alpha beta", "fields": ["title", "text"], "type": "most_fields"}},
            {"multi_match": {"query": "alpha beta", "fields": ["title", "text"], "type": "most_fields"}},
        ),
        (
            {"simple_query_string": {"query": "alpha beta", "fields": ["title^2", "text"]}},
            {"multi_match": {"query": "alpha beta", "fields": ["title^2", "text"], "type": "most_fields"}},
        ),
    ],
)
def test_plain_query_strings_score_as_the_multi_match_they_are_read_as(shapes, query, same):
    """The reading of query.py checked against the cluster's own parser: same hits, same BM25 scores."""
    engine, index, _ = shapes
    got = engine.ok("POST", f"/{index}/_search", {"query": query, "size": WINDOW})["hits"]["hits"]
    want = engine.ok("POST", f"/{index}/_search", {"query": same, "size": WINDOW})["hits"]["hits"]
    assert got and {h["_id"]: h["_score"] for h in got} == pytest.approx(
        {h["_id"]: h["_score"] for h in want}, rel=1e-6
    )


def test_the_client_wrapper_marks_a_declined_search(shapes):
    """No header in a library call: the reason is in the `_bmx` marker, the hits are the cluster's."""
    from bmx_rerank.client import BMXClient
    from tests.support.clients import official_client

    engine, index, _ = shapes
    body = {"query": {"match": {"text": {"query": "alpah", "fuzziness": "AUTO"}}}, "size": 5}
    client = official_client(engine.kind, engine.url, asynchronous=False)
    with BMXClient(client) as bmx:
        answer = bmx.search(index=index, body={**body, "ext": {"bmx": EXT}})
    direct = engine.ok("POST", f"/{index}/_search", body)
    assert answer["_bmx"] == {"reranked": False, "skipped": "fuzzy"}
    assert [(h["_id"], h["_score"]) for h in answer["hits"]["hits"]] == [
        (h["_id"], h["_score"]) for h in direct["hits"]["hits"]
    ]


def test_a_policy_on_two_weighted_fields_reranks_multi_field_queries_as_ext_bmx_does(shapes):
    engine, index, proxy = shapes
    query = {"multi_match": {"query": "alpha beta", "fields": ["title", "text"], "type": "most_fields"}}
    by_policy = _reranked(proxy, f"{index}-two", {"query": query})
    ext = {"ext": {"bmx": {"fields": ["title^2", "text"], "window_size": WINDOW}}}
    by_ext = _reranked(proxy, index, {"query": query, **ext})
    assert by_policy == pytest.approx(by_ext, rel=1e-12) and len(by_policy) > 10
    text_only = _reranked(proxy, f"{index}-two", {"query": MATCH})
    assert text_only == pytest.approx(_reranked(proxy, index, {"query": MATCH}), rel=1e-12)
