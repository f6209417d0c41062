"""filter_path as Elasticsearch 8.19 applies it (each expected value was read from a real cluster)."""

from __future__ import annotations

import pytest

from bmx_rerank.rerank import filter_path
from bmx_rerank.rerank.plan import plan_search

ANSWER = {
    "took": 2,
    "timed_out": False,
    "hits": {
        "total": {"value": 1, "relation": "eq"},
        "max_score": 0.28,
        "hits": [
            {
                "_index": "fp",
                "_id": "1",
                "_score": 0.28,
                "_source": {"body": "a b", "tags": ["x", "y"], "o": {"p": 1, "q": 2}},
            }
        ],
    },
}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("hits.hits._id", {"hits": {"hits": [{"_id": "1"}]}}),
        ("hits.hits._source.o.p,-hits.hits._source.o.q", {"hits": {"hits": [{"_source": {"o": {"p": 1}}}]}}),
        ("hits.**.p", {"hits": {"hits": [{"_source": {"o": {"p": 1}}}]}}),
        ("hits.hits._source.*", {"hits": {"hits": [{"_source": ANSWER["hits"]["hits"][0]["_source"]}]}}),
        ("hits.hits._source.tags", {"hits": {"hits": [{"_source": {"tags": ["x", "y"]}}]}}),
        ("took,nothing", {"took": 2}),
        ("nothing", {}),
        (
            "-took,-hits.hits",
            {"timed_out": False, "hits": {"total": {"value": 1, "relation": "eq"}, "max_score": 0.28}},
        ),
        ("h*.max_*", {"hits": {"max_score": 0.28}}),
        ("", ANSWER),
    ],
)
def test_filter_path_like_elasticsearch(expr, expected):
    assert filter_path.apply(ANSWER, expr) == expected


def test_no_hits_filter_to_an_empty_object():
    assert filter_path.apply({"hits": {"hits": []}}, "hits.hits._id") == {}


def test_a_rerank_moves_filter_path_from_the_first_stage_to_the_answer():
    body = {"size": 2, "ext": {"bmx": {"field": "body", "query": "a"}}}
    plan = plan_search(body, {"filter_path": "hits.hits._id", "typed_keys": "true"})
    assert plan.params == {"typed_keys": "true"} and plan.filter_path == "hits.hits._id"
    untouched = plan_search({"size": 2}, {"filter_path": "hits.hits._id"})
    assert untouched.params == {"filter_path": "hits.hits._id"} and untouched.filter_path is None
