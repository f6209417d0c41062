"""Query understanding: every search shape becomes its scoring tree, or declines with its own reason."""

from __future__ import annotations

import pytest

from bmx_rerank.rerank.query import (
    Combine,
    Declined,
    Text,
    fields,
    on_fields,
    parse_field,
    restrict,
    understand,
    weigh,
)

T, C = Text, Combine


@pytest.mark.parametrize(
    ("query", "tree"),
    [
        ({"match": {"text": "a b"}}, T("text", "a b")),
        (
            {"match": {"text": {"query": "a b", "operator": "and", "minimum_should_match": 2}}},
            T("text", "a b"),
        ),
        ({"match": {"text": {"query": "a", "boost": 3}}}, T("text", "a", 3.0)),
        ({"match": {"year": 2020}}, T("year", "2020")),
        ({"match": {"text": {"query": "a", "fuzziness": 0}}}, T("text", "a")),
        ({"match_phrase": {"text": {"query": "a b", "slop": 2}}}, T("text", "a b", quoted=True)),
        (
            {"multi_match": {"query": "q", "fields": ["title^2", "text"], "tie_breaker": 0.3}},
            C("max", (T("title", "q", 2.0), T("text", "q")), 0.3),
        ),
        (
            {"multi_match": {"query": "q", "fields": ["title^2", "text"], "type": "most_fields", "boost": 2}},
            C("sum", (T("title", "q", 2.0), T("text", "q")), 0.0, 2.0),
        ),
        (
            {"multi_match": {"query": "q r", "fields": ["title^2"], "type": "phrase"}},
            T("title", "q r", 2.0, quoted=True),
        ),
        (
            {"multi_match": {"query": "q", "fields": ["title", "text^3"], "type": "cross_fields"}},
            C("sum", (T("title", "q"), T("text", "q", 3.0))),
        ),
        (
            {"combined_fields": {"query": "q", "fields": ["title", "text"]}},
            C("sum", (T("title", "q"), T("text", "q"))),
        ),
        ({"multi_match": {"query": "q", "fields": "text"}}, T("text", "q")),
        (
            {
                "query_string": {
                    "query": "covid-19 vaccine",
                    "fields": ["title^2", "text"],
                    "tie_breaker": 0.5,
                }
            },
            C("max", (T("title", "covid-19 vaccine", 2.0), T("text", "covid-19 vaccine")), 0.5),
        ),
        ({"query_string": {"query": "a b", "default_field": "text"}}, T("text", "a b")),
        (
            {"simple_query_string": {"query": "a b", "fields": ["title", "text"]}},
            C("sum", (T("title", "a b"), T("text", "a b"))),
        ),
        ({"simple_query_string": {"query": "a +b", "fields": ["text"], "flags": "NONE"}}, T("text", "a +b")),
        (
            {
                "bool": {
                    "must": [{"match": {"text": "a"}}],
                    "should": {"match": {"title": "b"}},
                    "filter": [{"range": {"year": {"gte": 2000}}}, {"nested": {"path": "x", "query": {}}}],
                    "must_not": {"function_score": {}},
                    "minimum_should_match": 1,
                    "boost": 2,
                }
            },
            C("sum", (T("text", "a"), T("title", "b")), 0.0, 2.0),
        ),
        ({"bool": {"must": {"match": {"text": "a"}}, "filter": {"term": {"k": 1}}}}, T("text", "a")),
        (
            {
                "bool": {
                    "must": [{"match_all": {}}, {"match": {"text": {"query": "a", "boost": 2}}}],
                    "boost": 3,
                }
            },
            T("text", "a", 6.0),
        ),
        ({"bool": {"filter": [{"match": {"text": "a"}}]}}, None),
        ({"match_all": {}}, None),
        (  # in the should of the query's own bool every hit gets it: the same shift for all
            {"bool": {"should": [{"match_all": {"boost": 2}}, {"match": {"text": "a"}}]}},
            T("text", "a"),
        ),
        (
            {"bool": {"must": {"bool": {"should": [{"match_all": {}}, {"match": {"text": "a"}}]}}}},
            T("text", "a"),
        ),
        (
            {
                "bool": {
                    "must": [{"match": {"text": "a"}}, {"constant_score": {"filter": {"term": {"k": 1}}}}]
                }
            },
            T("text", "a"),
        ),
        (
            {
                "bool": {
                    "must": {"has_parent": {"parent_type": "p", "query": {"match_all": {}}}},
                    "should": {"match": {"text": "a"}},
                }
            },
            T("text", "a"),
        ),
        (
            {
                "bool": {
                    "should": [
                        {"match": {"text": "a"}},
                        {"nested": {"path": "c", "score_mode": "none", "query": {"match": {"c.t": "x"}}}},
                    ]
                }
            },
            T("text", "a"),
        ),
        (
            {
                "dis_max": {
                    "queries": [
                        {"has_child": {"type": "c", "query": {"match": {"t": "x"}}}},
                        {"match": {"text": "a"}},
                    ]
                }
            },
            T("text", "a"),
        ),
        (
            {
                "dis_max": {
                    "queries": [{"match": {"title": "a"}}, {"match": {"text": "a"}}],
                    "tie_breaker": 0.7,
                    "boost": 1.5,
                }
            },
            C("max", (T("title", "a"), T("text", "a")), 0.7, 1.5),
        ),
        (
            {"dis_max": {"queries": [{"bool": {"filter": {"term": {"k": 1}}}}, {"match": {"text": "a"}}]}},
            T("text", "a"),
        ),
        (  # a lone should beside no must or filter: every hit matches it, as a must
            {"bool": {"should": {"match_phrase": {"title": "a b"}}, "must_not": {"term": {"k": 1}}}},
            T("title", "a b", quoted=True),
        ),
        (  # required clauses may ask anything: every hit of the window matches them
            {
                "bool": {
                    "must": [
                        {"match_phrase": {"title": "a b"}},
                        {"match": {"text": {"query": "a b", "operator": "and"}}},
                    ]
                }
            },
            C("sum", (T("title", "a b", quoted=True), T("text", "a b"))),
        ),
        (  # optional clauses that one term matches: a should-only bool, at most one clause asked for
            {
                "bool": {
                    "should": [
                        {"bool": {"should": [{"match": {"text": "a"}}], "minimum_should_match": 1}},
                        {"bool": {"must": {"match": {"title": {"query": "b", "minimum_should_match": "1"}}}}},
                        {"bool": {"filter": {"term": {"k": 1}}}},
                    ]
                }
            },
            C("sum", (T("text", "a"), T("title", "b"))),
        ),
    ],
)
def test_shapes_become_their_scoring_tree(query, tree):
    assert understand(query) == tree


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ({"match": {"text": {"query": "a", "fuzziness": "AUTO"}}}, "fuzzy"),
        ({"multi_match": {"query": "a", "fields": ["text"], "fuzziness": 1}}, "fuzzy"),
        ({"match": {"text": {"query": "a", "analyzer": "whitespace"}}}, "analyzer"),
        ({"match_phrase_prefix": {"text": "a b"}}, "match_phrase_prefix"),
        ({"match_bool_prefix": {"text": "a b"}}, "match_bool_prefix"),
        ({"multi_match": {"query": "a", "fields": ["text"], "type": "phrase_prefix"}}, "match_phrase_prefix"),
        ({"multi_match": {"query": "a", "fields": ["text"], "type": "bool_prefix"}}, "match_bool_prefix"),
        ({"multi_match": {"query": "a"}}, "default_field"),
        ({"query_string": {"query": "a"}}, "default_field"),
        ({"simple_query_string": {"query": "a"}}, "default_field"),
        ({"multi_match": {"query": "a", "fields": ["ti*", "text"]}}, "field_pattern"),
        ({"query_string": {"query": "title:a", "fields": ["text"]}}, "query_string"),
        ({"query_string": {"query": "a AND b", "fields": ["text"]}}, "query_string"),
        ({"query_string": {"query": "a~2", "fields": ["text"]}}, "query_string"),
        ({"query_string": {"query": "-a b", "fields": ["text"]}}, "query_string"),
        ({"query_string": {"query": "a*", "fields": ["text"]}}, "query_string"),
        ({"simple_query_string": {"query": "a | b", "fields": ["text"]}}, "simple_query_string"),
        ({"simple_query_string": {"query": '"a b"', "fields": ["text"]}}, "simple_query_string"),
        ({"simple_query_string": {"query": "a -b", "fields": ["text"]}}, "simple_query_string"),
        ({"term": {"k": "v"}}, "term"),
        ({"terms": {"k": ["v"]}}, "terms"),
        ({"range": {"year": {"gte": 1}}}, "range"),
        ({"prefix": {"text": "ab"}}, "prefix"),
        ({"wildcard": {"text": "a*"}}, "wildcard"),
        ({"regexp": {"text": "a.*"}}, "regexp"),
        ({"fuzzy": {"text": "a"}}, "fuzzy"),
        ({"constant_score": {"filter": {"match": {"text": "a"}}}}, "constant_score"),
        ({"function_score": {"query": {"match": {"text": "a"}}}}, "function_score"),
        ({"script_score": {"query": {"match": {"text": "a"}}, "script": {"source": "1"}}}, "script_score"),
        ({"nested": {"path": "c", "query": {"match": {"c.text": "a"}}}}, "nested"),
        ({"has_child": {"type": "c", "score_mode": "max", "query": {"match_all": {}}}}, "has_child"),
        ({"has_parent": {"parent_type": "p", "score": True, "query": {"match_all": {}}}}, "has_parent"),
        (
            {
                "bool": {
                    "should": [{"match": {"text": "a"}}, {"constant_score": {"filter": {"term": {"k": 1}}}}]
                }
            },
            "constant_score",
        ),
        (
            {
                "dis_max": {
                    "queries": [{"match": {"text": "a"}}, {"constant_score": {"filter": {"term": {"k": 1}}}}]
                }
            },
            "constant_score",
        ),
        (  # required inside the inner bool, not for every hit of the query: not a shift
            {
                "bool": {
                    "should": [
                        {"match": {"text": "a"}},
                        {
                            "bool": {
                                "must": [
                                    {"constant_score": {"filter": {"term": {"k": 1}}}},
                                    {"match": {"text": "b"}},
                                ]
                            }
                        },
                    ]
                }
            },
            "optional_condition",  # its two must clauses are a condition of its own, read first
        ),
        ({"boosting": {"positive": {"match": {"text": "a"}}, "negative": {"term": {"k": 1}}}}, "boosting"),
        ({"knn": {"vec": {"vector": [1, 2], "k": 3}}}, "knn"),
        ({"hybrid": {"queries": [{"match": {"text": "a"}}]}}, "hybrid"),
        ({"bool": {"should": [{"match": {"text": "a"}}, {"term": {"k": 1}}]}}, "term"),
        ({"dis_max": {"queries": [{"match_all": {}}, {"match": {"text": "a"}}]}}, "match_all"),
        # Each field's part of a multi_match counts only where that field matches on its own.
        (
            {"multi_match": {"query": "a b", "fields": ["title", "text"], "type": "phrase"}},
            "optional_condition",
        ),
        (
            {"multi_match": {"query": "a b", "fields": ["title", "text"], "operator": "and"}},
            "optional_condition",
        ),
        (
            {"query_string": {"query": "a b", "fields": ["title", "text"], "minimum_should_match": 2}},
            "optional_condition",
        ),
        (  # beside a filter a should is optional: the filter's other hits score 0 on it
            {"bool": {"should": {"match_phrase": {"title": "a b"}}, "filter": {"term": {"k": 1}}}},
            "optional_condition",
        ),
        # An optional clause counts only on the hits it matches; where that asks more than one of its
        # terms, BMX would score hits the cluster does not count it on.
        (
            {"bool": {"should": [{"match_phrase": {"title": "a b"}}, {"match": {"text": "a b"}}]}},
            "optional_condition",
        ),
        (
            {
                "dis_max": {
                    "queries": [
                        {"match": {"title": {"query": "a b", "operator": "AND"}}},
                        {"match": {"text": "a"}},
                    ]
                }
            },
            "optional_condition",
        ),
        (
            {
                "bool": {
                    "must": {"match": {"text": "a"}},
                    "should": {"match": {"title": {"query": "a b c", "minimum_should_match": "2"}}},
                }
            },
            "optional_condition",
        ),
        (
            {
                "bool": {
                    "should": [
                        {"multi_match": {"query": "a b", "fields": ["title", "text"], "type": "phrase"}},
                        {"match": {"text": "a"}},
                    ]
                }
            },
            "optional_condition",
        ),
        (
            {
                "bool": {
                    "should": [
                        {"query_string": {"query": "a b", "fields": ["title"], "default_operator": "AND"}},
                        {"match": {"text": "a"}},
                    ]
                }
            },
            "optional_condition",
        ),
        (  # the lang-per-field pattern: each field's score counts only where its filter holds
            {
                "bool": {
                    "should": [
                        {"bool": {"filter": {"term": {"lang": "en"}}, "must": {"match": {"text": "a"}}}},
                        {"bool": {"filter": {"term": {"lang": "de"}}, "must": {"match": {"title": "a"}}}},
                    ]
                }
            },
            "optional_condition",
        ),
        (
            {
                "bool": {
                    "should": [
                        {
                            "bool": {
                                "should": [{"match": {"text": "a"}}, {"match": {"title": "b"}}],
                                "minimum_should_match": 2,
                            }
                        },
                        {"match": {"text": "c"}},
                    ]
                }
            },
            "optional_condition",
        ),
        (  # only the hits of the optional bool get match_all's constant: it reorders them against the rest
            {
                "bool": {
                    "should": [
                        {"bool": {"should": [{"match_all": {}}, {"match": {"text": "a"}}]}},
                        {"match": {"text": "b"}},
                    ]
                }
            },
            "match_all",
        ),
        (  # the same in a best-of: the branch holding it may win the max for its constant alone
            {
                "dis_max": {
                    "queries": [
                        {"bool": {"should": [{"match_all": {}}, {"match": {"text": "a"}}]}},
                        {"match": {"title": "b"}},
                    ]
                }
            },
            "match_all",
        ),
        ({"match": {"text": "a"}, "term": {"k": 1}}, "malformed"),
        ({"no such query\r\nX-Evil: 1": {}}, "unknown_query"),
        ({"match": {"text": {"query": "a", "boost": "x"}}}, "malformed"),
        ({"multi_match": {"query": "a", "fields": ["text"], "type": "nope"}}, "malformed"),
    ],
)
def test_shapes_bmx_cannot_reproduce_decline_with_their_own_reason(query, reason):
    with pytest.raises(Declined) as info:
        understand(query)
    assert info.value.reason == reason


def test_lenient_leaves_what_it_cannot_score_to_the_first_stage():
    query = {
        "bool": {
            "should": [
                {"match": {"text": "a"}},
                {"knn": {"v": {}}},
                {"match": {"t": {"query": "b", "fuzziness": 2}}},
            ]
        }
    }
    assert understand(query, lenient=True) == T("text", "a")
    assert understand({"knn": {"v": {}}}, lenient=True) is None
    with pytest.raises(Declined):
        understand({"match": "not an object"}, lenient=True)


def test_restrict_declines_other_fields_or_drops_them_when_lenient():
    tree = C("max", (T("title", "q", 2.0), T("text", "q")), 0.3)
    assert restrict(tree, ["title", "text"]) == tree
    with pytest.raises(Declined) as info:
        restrict(tree, ["text"])
    assert info.value.reason == "field"
    assert restrict(tree, ["text"], lenient=True) == T("text", "q")
    assert restrict(tree, ["other"], lenient=True) is None


def test_field_weights_multiply_every_leaf_on_their_field():
    tree = C("sum", (T("title", "q", 2.0), C("max", (T("title", "r"), T("text", "r")), 0.1, 3.0)))
    assert weigh(tree, {"title": 0.5}) == C(
        "sum", (T("title", "q", 1.0), C("max", (T("title", "r", 0.5), T("text", "r")), 0.1, 3.0))
    )
    assert fields(tree) == ["title", "text"]


def test_on_fields_and_parse_field():
    assert on_fields("q", [("text", 1.0)]) == T("text", "q")
    assert on_fields("q", [("title", 2.0), ("text", 1.0)]) == C("max", (T("title", "q", 2.0), T("text", "q")))
    assert parse_field("title^2.5") == ("title", 2.5) and parse_field("text") == ("text", 1.0)
    for bad in ("^2", "title^", "title^x", "title^-1"):
        with pytest.raises(ValueError):
            parse_field(bad)
