"""Reading ext.bmx: defaults, every parameter, and a 400 in Elasticsearch's shape for each bad value."""

from __future__ import annotations

import dataclasses

import pytest

from bmx_rerank.errors import SearchError
from bmx_rerank.rerank.spec import Augment, RerankSpec, parse_spec


def test_defaults():
    spec = parse_spec({"field": "body"})
    assert spec == RerankSpec(field="body")
    assert spec.window_size == 100 and spec.mode == "bmx" and spec.normalize == "none"
    assert spec.scoring_request().mode == "bmx"


def test_every_parameter():
    spec = parse_spec(
        {
            "field": "body",
            "query": "t0 t3",
            "window_size": 50,
            "alpha": 0.05,
            "beta": 0.1,
            "normalize": "paper",
            "min_score": 0.2,
            "mode": "bm25",
            "k1": 1.5,
            "b": 0.5,
            "augment": {"queries": ["a b", "c"], "weights": [0.6, 0.3]},
            "wqa_mode": "sum",
            "widen": False,
            "explain": True,
        }
    )
    assert spec.query == "t0 t3" and spec.window_size == 50
    assert (spec.alpha, spec.beta, spec.k1, spec.b) == (0.05, 0.1, 1.5, 0.5)
    assert spec.augment == Augment(("a b", "c"), (0.6, 0.3))
    assert (spec.normalize, spec.mode, spec.wqa_mode, spec.widen, spec.explain) == (
        "paper",
        "bm25",
        "sum",
        False,
        True,
    )


def test_normalize_null_means_none_and_weights_default_to_one():
    spec = parse_spec({"field": "f", "normalize": None, "augment": {"queries": ["x", "y"]}})
    assert spec.normalize == "none"
    assert spec.augment.weights == (1.0, 1.0)


def test_fields_and_hybrid_combination():
    spec = parse_spec({"fields": ["title^2", "text"], "combine": "linear", "weight": 0.3})
    assert spec.field == "title" and spec.fields == (("title", 2.0), ("text", 1.0))
    assert spec.field_names == ("title", "text")
    assert (spec.combine, spec.weight, spec.rank_constant) == ("linear", 0.3, 60)
    assert spec.marker()["fields"] == ["title", "text"] and spec.marker()["combine"] == "linear"
    spec = parse_spec({"field": "text", "fields": ["title", "text"], "combine": "rrf", "rank_constant": 10})
    assert spec.field == "text" and spec.rank_constant == 10
    plain = parse_spec({"field": "text"})
    assert plain.fields == (("text", 1.0),) and plain.combine is None and plain.weight == 0.5
    assert "fields" not in plain.marker() and "combine" not in plain.marker()


def test_widen_default_comes_from_the_server():
    assert parse_spec({"field": "f"}, widen_default=False).widen is False


@pytest.mark.parametrize(
    ("raw", "kind", "needle"),
    [
        ({"field": "f", "nope": 1}, "x_content_parse_exception", "unknown field [nope]"),
        ({}, "illegal_argument_exception", "requires [field]"),
        ({"field": 3}, "x_content_parse_exception", "[field] expected a string"),
        ({"field": ""}, "illegal_argument_exception", "[field] must not be empty"),
        (
            {"field": "f", "window_size": "10"},
            "x_content_parse_exception",
            "[window_size] expected an integer",
        ),
        ({"field": "f", "window_size": 0}, "illegal_argument_exception", "[window_size] must lie in"),
        ({"field": "f", "window_size": 10_001}, "illegal_argument_exception", "[window_size] must lie in"),
        ({"field": "f", "alpha": -1}, "illegal_argument_exception", "[alpha] must be a number in [0, 100]"),
        ({"field": "f", "beta": True}, "x_content_parse_exception", "[beta] expected a number"),
        ({"field": "f", "b": 2}, "illegal_argument_exception", "[b] must be a number in [0, 1]"),
        ({"field": "f", "min_score": "x"}, "x_content_parse_exception", "[min_score] expected a number"),
        ({"field": "f", "normalize": "max"}, "illegal_argument_exception", "[normalize] must be one of"),
        ({"field": "f", "mode": "tfidf"}, "illegal_argument_exception", "[mode] must be one of"),
        ({"field": "f", "wqa_mode": "avg"}, "illegal_argument_exception", "[wqa_mode] must be one of"),
        ({"field": "f", "explain": "yes"}, "x_content_parse_exception", "[explain] expected a boolean"),
        ({"field": "f", "augment": []}, "x_content_parse_exception", "[augment] expected an object"),
        (
            {"field": "f", "augment": {"queries": ["a"], "x": 1}},
            "x_content_parse_exception",
            "unknown field [x]",
        ),
        ({"field": "f", "augment": {"queries": [1]}}, "x_content_parse_exception", "array of strings"),
        (
            {"field": "f", "augment": {"queries": ["a"], "weights": [1, 2]}},
            "illegal_argument_exception",
            "one weight per query",
        ),
        (
            {"field": "f", "augment": {"queries": ["a"], "weights": [-1]}},
            "illegal_argument_exception",
            "in [0, 100]",
        ),
        ("body", "x_content_parse_exception", "expected an object"),
        ({"fields": "title"}, "x_content_parse_exception", "[fields] expected an array of strings"),
        ({"fields": []}, "illegal_argument_exception", "[fields] must name 1 to"),
        ({"fields": ["a", "a^2"]}, "illegal_argument_exception", "names a field twice"),
        ({"fields": ["a*"]}, "illegal_argument_exception", "not patterns"),
        ({"fields": ["a^x"]}, "illegal_argument_exception", "NAME^BOOST"),
        ({"field": "c", "fields": ["a", "b"]}, "illegal_argument_exception", "must be one of [fields]"),
        ({"field": "f", "combine": "sum"}, "illegal_argument_exception", "[combine] must be one of"),
        ({"field": "f", "weight": 1.5}, "illegal_argument_exception", "[weight] must be a number in [0, 1]"),
        ({"field": "f", "weight": "x"}, "x_content_parse_exception", "[weight] expected a number"),
        ({"field": "f", "rank_constant": 0}, "illegal_argument_exception", "[rank_constant] must lie in"),
        ({"field": "f", "rank_constant": 1.5}, "x_content_parse_exception", "[rank_constant] expected an"),
    ],
)
def test_invalid_values_are_400s_in_elasticsearch_shape(raw, kind, needle):
    with pytest.raises(SearchError) as info:
        parse_spec(raw)
    err = info.value
    assert err.status == 400
    body = err.body()
    assert body["status"] == 400
    assert body["error"]["type"] == kind
    assert body["error"]["root_cause"][0]["type"] == kind
    assert needle in body["error"]["reason"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("alpha", 1e308),
        ("beta", 1e308),
        ("k1", 101),
        ("b", 1.0001),
        ("min_score", 1e10),
        ("min_score", -1e10),
        ("alpha", 10**400),
        ("k1", float("nan")),
        ("beta", float("inf")),
        ("weight", 1.5),
    ],
)
def test_every_numeric_parameter_has_a_finite_range(name, value):
    with pytest.raises(SearchError) as info:
        parse_spec({"field": "f", name: value})
    assert info.value.status == 400 and f"[{name}] must be a number in" in info.value.reason


def test_field_boosts_beyond_their_range_are_a_400():
    with pytest.raises(SearchError, match="boost of \\[title\\] must be a number in"):
        parse_spec({"fields": ["title^1e308", "body"]})


def test_weights_beyond_their_range_are_a_400():
    with pytest.raises(SearchError, match="in \\[0, 100\\]"):
        parse_spec({"field": "f", "augment": {"queries": ["a"], "weights": [1e308]}})


def test_range_edges_are_accepted_and_score_finitely():
    import numpy as np

    from bmx_rerank import scoring
    from bmx_rerank.rerank.spec import RANGES

    spec = parse_spec({"field": "f", **{k: RANGES[k][1] for k in ("alpha", "beta", "k1", "b")}})
    stats = scoring.TermStats(10, 5.0, np.array([3.0, 5.0]), np.array([0.5, 0.7]))
    cands = scoring.Candidates(np.array([[1e6, 0.0], [1.0, 7.0], [0.0, 0.0]]), np.array([1e9, 9.0, 0.0]))
    augmented = scoring.Query([1], np.array([RANGES["weights"][1]]))
    for mode in scoring.MODES:
        request = dataclasses.replace(spec.scoring_request(), mode=mode)
        with np.errstate(all="raise"):  # no overflow, no invalid operation
            out = scoring.score(stats, cands, [scoring.Query([0, 1]), augmented], request)
        assert np.all(np.isfinite(out))
