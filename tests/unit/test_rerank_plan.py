"""Reading a search: what is reranked, the first-stage body, widening, window paging."""

from __future__ import annotations

import pytest

from bmx_rerank.errors import SearchError
from bmx_rerank.rerank.plan import find_match_text, plain_match_text, plan_search, score_sorted
from bmx_rerank.rerank.spec import parse_spec
from bmx_rerank.rerank.widen import widen


def test_no_ext_no_policy_is_untouched():
    body = {"query": {"match": {"body": "a"}}, "size": 3}
    plan = plan_search(body, {"from": "2"})
    assert plan.spec is None and plan.body == body and plan.params == {"from": "2"}


def test_ext_is_removed_and_the_window_requested_from_zero():
    body = {
        "query": {"match": {"body": {"query": "t0 t3", "operator": "or"}}},
        "from": 5,
        "size": 5,
        "aggs": {"x": {"terms": {"field": "k"}}},
        "ext": {"bmx": {"field": "body", "window_size": 20}, "other": {}},
    }
    plan = plan_search(body, {})
    assert plan.spec is not None and plan.spec.window_size == 20
    assert plan.query_text == "t0 t3"
    assert (plan.from_, plan.size, plan.wants_seq_no) == (5, 5, False)
    assert plan.body["from"] == 0 and plan.body["size"] == 20
    assert plan.body["seq_no_primary_term"] is True
    assert plan.body["ext"] == {"other": {}}
    assert plan.body["aggs"] == body["aggs"]
    assert body["ext"]["bmx"] == {"field": "body", "window_size": 20}, "the caller's body is not mutated"


def test_url_from_size_win_and_are_removed_from_the_upstream_url():
    plan = plan_search({"ext": {"bmx": {"field": "f", "query": "x"}}, "size": 1}, {"from": "3", "size": "4"})
    assert (plan.from_, plan.size) == (3, 4)
    assert "from" not in plan.params and "size" not in plan.params


def test_window_overflow_is_a_400_like_rank_window_size():
    with pytest.raises(SearchError) as info:
        plan_search(
            {"ext": {"bmx": {"field": "f", "query": "x", "window_size": 10}}, "from": 5, "size": 6}, {}
        )
    assert info.value.status == 400 and "window_size" in info.value.reason


def test_bad_from_is_a_400():
    with pytest.raises(SearchError) as info:
        plan_search({"ext": {"bmx": {"field": "f", "query": "x"}}}, {"from": "abc"})
    assert info.value.status == 400


def test_missing_query_is_a_400():
    with pytest.raises(SearchError) as info:
        plan_search({"query": {"term": {"k": "v"}}, "ext": {"bmx": {"field": "body"}}}, {})
    assert "needs [query]" in info.value.reason


def test_query_only_in_ext_becomes_a_match_first_stage():
    plan = plan_search({"ext": {"bmx": {"field": "body", "query": "t0 t3"}}}, {})
    assert plan.body["query"] == {"match": {"body": {"query": "t0 t3"}}}


def test_seq_no_kept_when_the_client_asked():
    plan = plan_search({"seq_no_primary_term": True, "ext": {"bmx": {"field": "f", "query": "x"}}}, {})
    assert plan.wants_seq_no


@pytest.mark.parametrize(
    ("body", "params", "reason"),
    [
        ({"sort": [{"date": "desc"}]}, {}, "sort"),
        ({"pit": {"id": "x"}}, {}, "pit"),
        ({"search_after": [1]}, {}, "search_after"),
        ({}, {"scroll": "1m"}, "scroll"),
    ],
)
def test_unpageable_searches_pass_through_with_ext_removed(body, params, reason):
    plan = plan_search({**body, "ext": {"bmx": {"field": "f", "query": "x"}}}, params)
    assert plan.spec is None and plan.skipped == reason
    assert "ext" not in plan.body


def test_score_sorts_are_fine():
    assert score_sorted(None) and score_sorted("_score") and score_sorted(["_score"])
    assert score_sorted([{"_score": "desc"}]) and score_sorted([{"_score": {"order": "desc"}}])
    assert not score_sorted([{"_score": "asc"}]) and not score_sorted(["_score", "date"])


def test_policy_applies_only_to_plain_match_queries():
    policy = parse_spec({"field": "body", "window_size": 30})
    plan = plan_search({"query": {"match": {"body": "t1"}}}, {}, policy)
    assert plan.spec is policy and plan.query_text == "t1" and plan.body["size"] == 30
    plan = plan_search({"query": {"multi_match": {"query": "t2", "fields": ["title", "body^2"]}}}, {}, policy)
    assert plan.spec is policy and plan.query_text == "t2"
    for other in (
        {"query": {"match": {"title": "t1"}}},
        {"query": {"bool": {"must": [{"match": {"body": "t1"}}]}}},
        {"query": {"match": {"body": "t1"}}, "sort": ["date"]},
        None,
    ):
        plan = plan_search(other, {}, policy)
        assert plan.spec is None and plan.body == other and plan.skipped is None


def test_find_match_text_looks_into_bool():
    query = {"bool": {"filter": [{"term": {"k": 1}}], "must": [{"match": {"body": "deep"}}]}}
    assert plain_match_text(query, "body") is None
    assert find_match_text(query, "body") == "deep"


def test_widen_adds_augmented_matches_and_keeps_filters_outside():
    query = {"bool": {"must": [{"match": {"body": "a"}}], "filter": [{"term": {"k": 1}}]}}
    out = widen(query, "body", ["b c", " "])
    assert out == {
        "bool": {
            "filter": [{"term": {"k": 1}}],
            "should": [{"bool": {"must": [{"match": {"body": "a"}}]}}, {"match": {"body": {"query": "b c"}}}],
            "minimum_should_match": 1,
        }
    }
    assert widen({"match": {"body": "a"}}, "body", []) == {"match": {"body": "a"}}
    plain = widen({"match": {"body": "a"}}, "body", ["z"])
    assert plain["bool"]["should"][0] == {"match": {"body": "a"}}
    assert plain["bool"]["minimum_should_match"] == 1


def test_plan_widens_unless_told_not_to():
    ext = {"field": "body", "augment": {"queries": ["x"], "weights": [0.5]}}
    plan = plan_search({"query": {"match": {"body": "a"}}, "ext": {"bmx": ext}}, {})
    assert "bool" in plan.body["query"]
    plan = plan_search({"query": {"match": {"body": "a"}}, "ext": {"bmx": {**ext, "widen": False}}}, {})
    assert plan.body["query"] == {"match": {"body": "a"}}


def test_policy_grows_its_window_to_the_page_instead_of_failing():
    policy = parse_spec({"field": "body", "window_size": 30})
    plan = plan_search({"query": {"match": {"body": "t1"}}, "from": 20, "size": 20}, {}, policy)
    assert plan.spec is not None and plan.spec.window_size == 40 and plan.body["size"] == 40
    huge = {"query": {"match": {"body": "t1"}}, "size": 20_000}
    plan = plan_search(huge, {}, policy)
    assert plan.spec is None and plan.body == huge, "beyond the largest window: left to the cluster"


def test_size_zero_is_not_reranked():
    body = {"size": 0, "aggs": {"a": {}}, "ext": {"bmx": {"field": "body", "query": "t1"}}}
    plan = plan_search(body, {})
    assert plan.spec is None and plan.skipped == "size" and plan.body == {"size": 0, "aggs": {"a": {}}}
    policy = parse_spec({"field": "body", "window_size": 30})
    quiet = plan_search({"query": {"match": {"body": "t1"}}}, {"size": "0"}, policy)
    assert quiet.spec is None and quiet.skipped is None and quiet.params == {"size": "0"}


@pytest.mark.parametrize("paging", [{"size": -1}, {"from": 1.0}, {"size": "ten"}])
def test_a_policy_never_answers_for_paging_the_cluster_owns(paging):
    policy = parse_spec({"field": "body", "window_size": 30})
    body = {"query": {"match": {"body": "t1"}}, **paging}
    plan = plan_search(body, {}, policy)
    assert plan.spec is None and plan.body == body
    with pytest.raises(SearchError) as info:
        plan_search({**body, "ext": {"bmx": {"field": "body"}}}, {})
    assert info.value.status == 400
