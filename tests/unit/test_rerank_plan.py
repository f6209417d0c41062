"""Reading a search: what is reranked, the first-stage body, widening, window paging."""

from __future__ import annotations

import pytest

from bmx_rerank.errors import SearchError
from bmx_rerank.rerank.plan import plan_search, score_sorted
from bmx_rerank.rerank.query import Combine, Text
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


@pytest.mark.parametrize("size", [5, 5.0, 5.9, "5", " 5", "5.5", "005"])
def test_a_bodys_size_is_read_as_the_cluster_reads_it(size):
    """A number or a numeric string, a fraction cut off (Elasticsearch and OpenSearch answer 5 hits)."""
    plan = plan_search({"size": size, "ext": {"bmx": {"field": "f", "query": "x"}}}, {})
    assert plan.size == 5


@pytest.mark.parametrize("size", ["x", True, -1, "1_0", float("inf"), None, [5]])
def test_a_bodys_size_the_cluster_refuses_is_a_400(size):
    with pytest.raises(SearchError) as err:
        plan_search({"size": size, "ext": {"bmx": {"field": "f", "query": "x"}}}, {})
    assert err.value.status == 400


def test_bad_from_is_a_400():
    with pytest.raises(SearchError) as info:
        plan_search({"ext": {"bmx": {"field": "f", "query": "x"}}}, {"from": "abc"})
    assert info.value.status == 400


def test_missing_query_is_a_400():
    for query in ({"bool": {"filter": [{"term": {"k": "v"}}]}}, {"match_all": {}}, None):
        with pytest.raises(SearchError) as info:
            plan_search({"query": query, "ext": {"bmx": {"field": "body"}}}, {})
        assert "needs [query]" in info.value.reason


def test_query_only_in_ext_becomes_a_match_first_stage():
    plan = plan_search({"ext": {"bmx": {"field": "body", "query": "t0 t3"}}}, {})
    assert plan.body["query"] == {"match": {"body": {"query": "t0 t3"}}}


def test_seq_no_kept_when_the_client_asked():
    plan = plan_search({"seq_no_primary_term": True, "ext": {"bmx": {"field": "f", "query": "x"}}}, {})
    assert plan.wants_seq_no


@pytest.mark.parametrize(
    ("body", "params"),
    [
        ({"stored_fields": "_none_"}, {}),
        ({"stored_fields": ["_none_"]}, {}),  # as elasticsearch-py sends stored_fields=["_none_"]
        ({}, {"stored_fields": "_none_"}),
        ({"stored_fields": "_none_"}, {"_source": "false"}),
        ({"stored_fields": "_id", "_source": True}, {"stored_fields": "_none_", "_source": "false"}),
    ],
)
def test_no_stored_fields_reads_ids_without_source_and_leaves_them_out_of_the_answer(body, params):
    """The window needs each hit's `_id`, which `stored_fields: _none_` leaves out: the first stage
    reads it (and no `_source`), and the answer's hits come without it, as the cluster's would."""
    ext = {"query": {"match": {"body": "a"}}, "ext": {"bmx": {"field": "body"}}}
    plan = plan_search({**ext, **body}, {**params, "filter_path": "hits.hits"})
    assert plan.no_stored_fields and plan.body is not None and plan.body["_source"] is False
    assert "stored_fields" not in plan.body and "stored_fields" not in plan.params
    hit = {"_index": "i", "_id": "1", "_routing": "r", "_score": 2.0, "fields": {"n": [1]}}
    answer = {"took": 1, "hits": {"total": {"value": 1}, "hits": [hit]}, "_bmx": {}}
    assert plan.shaped(answer) == {"hits": {"hits": [{"_index": "i", "_score": 2.0, "fields": {"n": [1]}}]}}
    assert hit["_id"] == "1", "the hits are not mutated"


@pytest.mark.parametrize(
    ("body", "params"),
    [
        ({"_source": True}, {}),
        ({"_source": ["t"]}, {}),
        ({}, {"_source_includes": "t"}),
        ({}, {"_source_excludes": "t"}),
        ({"fields": ["t"]}, {}),
        ({"highlight": {"fields": {"t": {}}}}, {}),
        ({}, {"stored_fields": "_id"}),  # the URL's stands for the body's
    ],
)
def test_no_stored_fields_with_source_goes_as_sent_for_the_cluster_to_refuse(body, params):
    """With `_source` or `fields` the cluster refuses it; with `highlight` its hits carry `_id`."""
    ext = {"query": {"match": {"body": "a"}}, "stored_fields": "_none_", "ext": {"bmx": {"field": "body"}}}
    plan = plan_search({**ext, **body}, params)
    assert not plan.no_stored_fields and plan.body is not None and plan.body["stored_fields"] == "_none_"
    answer = {"hits": {"hits": [{"_id": "1"}]}}
    assert plan.shaped(answer) == answer


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


def test_policy_applies_to_text_queries_on_its_field_whatever_filters_surround_them():
    policy = parse_spec({"field": "body", "window_size": 30})
    plan = plan_search({"query": {"match": {"body": "t1"}}}, {}, policy)
    assert plan.spec is policy and plan.query_text == "t1" and plan.body["size"] == 30
    filtered = {"bool": {"must": [{"match": {"body": "t2"}}], "filter": [{"term": {"k": 1}}]}}
    plan = plan_search({"query": filtered, "post_filter": {"term": {"j": 2}}}, {}, policy)
    assert plan.spec is not None and plan.query_text == "t2"
    assert plan.body["query"] == filtered and plan.body["post_filter"] == {"term": {"j": 2}}
    for other in ({"query": {"match": {"title": "t1"}}}, {"query": {"term": {"k": "v"}}}, None):
        plan = plan_search(other, {}, policy)
        assert plan.spec is None and plan.body == other and plan.skipped is None, "not the policy's"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"query": {"match": {"body": "t1"}}, "sort": ["date"]}, "sort"),
        ({"query": {"match": {"body": {"query": "t1", "fuzziness": "AUTO"}}}}, "fuzzy"),
        ({"query": {"function_score": {"query": {"match": {"body": "t1"}}}}}, "function_score"),
    ],
)
def test_policy_declines_out_loud_what_it_cannot_rerank_on_its_field(body, reason):
    policy = parse_spec({"field": "body", "window_size": 30})
    plan = plan_search(body, {}, policy)
    assert plan.spec is None and plan.body == body and plan.skipped == reason


def test_a_policy_scores_every_field_of_a_query_that_scores_one_of_its_fields():
    """Issue 9: a multi_match over the policy's field and another loses neither field nor boost; each
    field is scored on its own statistics. ext.bmx keeps naming the fields it scores."""
    policy = parse_spec({"fields": ["body^3"], "window_size": 30})
    mm = {"query": "t2", "fields": ["body^2", "title"], "tie_breaker": 0.3}
    plan = plan_search({"query": {"multi_match": mm}}, {}, policy)
    assert plan.spec is policy and plan.skipped is None
    assert plan.scoring == Combine("max", (Text("body", "t2", 6.0), Text("title", "t2")), 0.3)
    most = {
        "bool": {"must": [{"match": {"title": "a"}}, {"match": {"body": "b"}}], "filter": {"term": {"k": 1}}}
    }
    plan = plan_search({"query": most}, {}, policy)
    assert plan.scoring == Combine("sum", (Text("title", "a"), Text("body", "b", 3.0)))
    # Scoring clauses on none of its fields: not the policy's, even when a filter names its field.
    elsewhere = {"bool": {"must": {"match": {"title": "a"}}, "filter": {"term": {"body": "x"}}}}
    plan = plan_search({"query": elsewhere}, {}, policy)
    assert plan.spec is None and plan.skipped is None and plan.body == {"query": elsewhere}
    ext = {"query": {"multi_match": mm}, "ext": {"bmx": {"field": "body"}}}
    assert plan_search(ext, {}).skipped == "field", "ext.bmx scores only its own fields"


def test_widen_adds_augmented_matches_and_keeps_filters_outside():
    query = {"bool": {"must": [{"match": {"body": "a"}}], "filter": [{"term": {"k": 1}}]}}
    out = widen(query, "body", ["b c", " "])
    assert out == {
        "bool": {
            "filter": [{"term": {"k": 1}}],
            "should": [query, {"match": {"body": {"query": "b c"}}}],
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


@pytest.mark.parametrize("paging", [{"size": -1}, {"from": True}, {"size": "ten"}])
def test_a_policy_never_answers_for_paging_the_cluster_owns(paging):
    policy = parse_spec({"field": "body", "window_size": 30})
    body = {"query": {"match": {"body": "t1"}}, **paging}
    plan = plan_search(body, {}, policy)
    assert plan.spec is None and plan.body == body
    with pytest.raises(SearchError) as info:
        plan_search({**body, "ext": {"bmx": {"field": "body"}}}, {})
    assert info.value.status == 400


EXT = {"field": "body", "window_size": 20}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"knn": {"field": "v", "query_vector": [1.0], "k": 5, "num_candidates": 10}}, "knn"),
        ({"rescore": {"query": {"rescore_query": {"match": {"body": "x"}}}}}, "rescore"),
        ({"rank": {"rrf": {}}}, "rank"),
        ({"sub_searches": [{"query": {"match": {"body": "x"}}}]}, "sub_searches"),
        ({"indices_boost": [{"a": 2}]}, "indices_boost"),
        ({"min_score": 1.5}, "min_score"),
        ({"collapse": {"field": "k"}}, "collapse"),
        ({"retriever": {"standard": {"query": {"match": {"body": "a"}}}}}, "retriever"),
    ],
)
def test_other_scoring_is_declined_unless_the_caller_says_how_to_combine(extra, reason):
    body = {"query": {"match": {"body": "a"}}, **extra, "ext": {"bmx": EXT}}
    plan = plan_search(body, {})
    assert plan.spec is None and plan.skipped == reason
    assert plan.body == {"query": {"match": {"body": "a"}}, **extra}, "forwarded as sent, ext.bmx removed"
    combined = plan_search({**body, "ext": {"bmx": {**EXT, "combine": "rrf"}}}, {})
    if reason == "collapse":
        assert combined.skipped == "collapse", "a group's hit is picked by the cluster's score"
    else:
        assert combined.spec is not None and combined.spec.combine == "rrf"
        assert combined.scoring == Text("body", "a") and combined.body[reason] == extra[reason]


def test_knn_only_with_combine_keeps_its_first_stage_and_scores_the_given_text():
    knn = {"field": "v", "query_vector": [1.0], "k": 5, "num_candidates": 10}
    ext = {**EXT, "query": "a b", "combine": "linear", "weight": 0.2, "augment": {"queries": ["c"]}}
    plan = plan_search({"knn": knn, "ext": {"bmx": ext}}, {})
    assert plan.spec is not None and plan.scoring == Text("body", "a b")
    assert "query" not in plan.body, "no match is added beside knn: the hybrid first stage stays as sent"
    assert plan.body["knn"] == knn and plan.body["size"] == 20


def test_combine_leaves_clauses_bmx_cannot_score_to_the_first_stage():
    query = {"bool": {"should": [{"match": {"body": "a"}}, {"knn": {"v": {"vector": [1], "k": 3}}}]}}
    assert plan_search({"query": query, "ext": {"bmx": EXT}}, {}).skipped == "knn"
    plan = plan_search({"query": query, "ext": {"bmx": {**EXT, "combine": "linear"}}}, {})
    assert plan.spec is not None and plan.scoring == Text("body", "a") and plan.body["query"] == query


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ({"match": {"body": {"query": "a", "fuzziness": "AUTO"}}}, "fuzzy"),
        ({"query_string": {"query": "body:a OR b", "default_field": "body"}}, "query_string"),
        ({"function_score": {"query": {"match": {"body": "a"}}}}, "function_score"),
        ({"bool": {"must": [{"match": {"body": "a"}}, {"match": {"title": "b"}}]}}, "field"),
    ],
)
def test_query_shapes_bmx_cannot_score_are_declined_not_400(query, reason):
    plan = plan_search({"query": query, "ext": {"bmx": EXT}}, {})
    assert plan.spec is None and plan.skipped == reason and plan.body == {"query": query}


def test_ext_query_names_the_text_and_replaces_the_query_scoring():
    query = {"function_score": {"query": {"match": {"body": "a"}}}}
    plan = plan_search({"query": query, "ext": {"bmx": {**EXT, "query": "z"}}}, {})
    assert plan.spec is not None and plan.scoring == Text("body", "z") and plan.body["query"] == query


def test_bool_with_filters_scores_its_text_and_keeps_the_filters_in_the_first_stage():
    query = {"bool": {"must": {"match_phrase": {"body": "a b"}}, "filter": [{"term": {"k": 1}}]}}
    plan = plan_search({"query": query, "post_filter": {"term": {"j": 1}}, "ext": {"bmx": EXT}}, {})
    assert plan.scoring == Text("body", "a b", quoted=True) and plan.query_text == "a b"
    assert plan.body["query"] == query and plan.body["post_filter"] == {"term": {"j": 1}}


def test_several_fields_plan_their_tree():
    combined = {"query": {"match": {"body": "a"}}, "ext": {"bmx": {**EXT, "combine": "rrf"}}}
    assert plan_search(combined, {}).spec is not None, "combinations are executed"
    mm = {"multi_match": {"query": "q", "fields": ["title^2", "body"], "type": "most_fields"}}
    ext = {"fields": ["title^3", "body"], "window_size": 20}
    plan = plan_search({"query": mm, "ext": {"bmx": ext}}, {})
    assert plan.scoring == Combine("sum", (Text("title", "q", 6.0), Text("body", "q")))
    plan = plan_search({"ext": {"bmx": {**ext, "query": "z"}}}, {})
    assert plan.scoring == Combine("max", (Text("title", "z", 3.0), Text("body", "z")))
    assert plan.body["query"] == {"multi_match": {"query": "z", "fields": ["title", "body"]}}
    policy = parse_spec({"fields": ["title", "body"]})
    plan = plan_search({"query": {"bool": {"should": mm, "filter": {"term": {"k": 1}}}}}, {}, policy)
    assert plan.spec is policy and plan.scoring == Combine(
        "sum", (Text("title", "q", 2.0), Text("body", "q"))
    )


def test_widening_never_drops_a_document_the_original_returned():
    # bool with filter and should: the should is optional (minimum_should_match 0), every filtered
    # document matches; taking the should out on its own would make it required.
    query = {"bool": {"filter": [{"term": {"k": 1}}], "should": [{"match": {"body": "a"}}]}}
    out = widen(query, "body", ["b"])
    assert out["bool"]["should"][0] == query, "the original query kept whole"
    assert out["bool"]["filter"] == [{"term": {"k": 1}}] and out["bool"]["minimum_should_match"] == 1
    pure = {"bool": {"filter": [{"term": {"k": 1}}]}}
    assert widen(pure, "body", ["b"])["bool"]["should"][0] == pure, "a pure filter still returns all it did"
    assert widen(None, ["title", "body"], ["b"]) == {
        "bool": {
            "should": [{"multi_match": {"query": "b", "fields": ["title", "body"]}}],
            "minimum_should_match": 1,
        }
    }


def test_combination_reading_the_first_stage_score_is_not_widened():
    ext = {**EXT, "augment": {"queries": ["x"]}, "combine": "linear"}
    plan = plan_search({"query": {"match": {"body": "a"}}, "ext": {"bmx": ext}}, {})
    assert plan.body["query"] == {"match": {"body": "a"}}


def test_one_preference_per_window_the_callers_kept():
    from bmx_rerank.rerank.window import window_request

    body = {"query": {"match": {"body": "a b"}}, "ext": {"bmx": {**EXT, "window_size": 30}}}
    pages = [plan_search({**body, "from": f, "size": 10}, {}) for f in (0, 10, 20)]
    requests = [window_request("idx", p) for p in pages]
    assert len({params["preference"] for _, params in requests}) == 1, "every page: the same copies"
    assert requests[0][1]["preference"].startswith("bmx-") and requests[0][0]["version"] is True
    other = window_request("idx", plan_search({**body, "query": {"match": {"body": "c"}}}, {}))
    assert other[1]["preference"] != requests[0][1]["preference"]
    assert window_request("other", pages[0])[1]["preference"] != requests[0][1]["preference"]
    mine = window_request("idx", plan_search(body, {"preference": "_local"}))
    assert mine[1]["preference"] == "_local"
    assert "version" not in pages[0].body, "the plan itself is left as it is"


def test_an_msearch_item_gets_the_windows_preference_unless_it_has_its_own():
    from bmx_rerank.rerank.window import Window, window_request

    plan = plan_search({"query": {"match": {"body": "a"}}, "ext": {"bmx": EXT}}, {})
    body, params = window_request("idx", plan)
    side = Window("idx", plan, "digest", body, params, None, {})
    assert side.msearch_header({"index": "idx"}) == {"index": "idx", "preference": params["preference"]}
    assert side.msearch_header({"index": "idx", "preference": "mine"})["preference"] == "mine"
    assert "preference" not in side.msearch_header({"index": "idx"}, "_local"), "the URL's applies"


def test_mentions_finds_a_field_as_a_key_or_in_a_field_list():
    from bmx_rerank.rerank.plan import mentions

    assert mentions({"bool": {"filter": [{"term": {"body": "x"}}]}}, ["body"])
    assert mentions({"multi_match": {"query": "x", "fields": ["title", "body^2"]}}, ["body"])
    assert mentions({"query_string": {"query": "x", "default_field": "body"}}, ["body"])
    assert not mentions({"match": {"title": "body"}}, ["body"]), "a value is not a field"
    assert not mentions({"nested": {"path": "c", "query": {"match": {"c.body": "x"}}}}, ["body"])
    assert not mentions(None, ["body"])


def test_a_url_query_string_is_declined_and_goes_to_the_cluster_as_its_search():
    """`q=` is a Lucene query string on the index's default field, which the cluster reads; a rerank
    asked of it is declined out loud (`reason=q`), not refused."""
    body = {"ext": {"bmx": {"field": "body"}}, "size": 5}
    plan = plan_search(body, {"q": "title:alpha beta"})
    assert plan.spec is None and plan.skipped == "q"
    assert plan.body == {"size": 5} and plan.params == {"q": "title:alpha beta"}
