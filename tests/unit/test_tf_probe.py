"""tf_probe's pure parts: where probes may go, how they are placed, and how hits are read back."""

from __future__ import annotations

import orjson

from bmx_rerank.rerank import tf_probe


def _why(body: dict, params: dict | None = None) -> str | None:
    return tf_probe.why_not(body, orjson.dumps(body), params or {})


def test_why_not_refuses_every_shape_whose_answer_would_show_the_probes():
    q = {"match": {"body": "a b"}}
    assert _why({"query": q, "min_score": 1, "aggs": {"n": {"value_count": {"field": "x"}}}}) is None
    assert _why({"query": q, "explain": True}) == "explain"
    assert _why({"query": q, "profile": True}) == "explain"
    assert _why({"query": q}, {"explain": "true"}) == "explain"
    assert _why({"query": q, "highlight": {"fields": {"body": {}}}}) == "highlight"
    assert _why({"query": {"match": {"body": {"query": "a", "_name": "mine"}}}}) == "named_queries"
    assert _why({"query": q, "aggs": {"t": {"top_hits": {"size": 1}}}}) == "inner_hits"
    assert _why({"query": q, "collapse": {"field": "k", "inner_hits": {"name": "x"}}}) == "inner_hits"
    assert _why({"size": 10}) == "no_query"


def test_with_probes_wraps_the_callers_query_in_a_branch_that_never_matches():
    probe = tf_probe.Probe((("body", "a"), ("title", "b")))
    caller = {"bool": {"should": [{"match": {"body": "a"}}], "minimum_should_match": 1}}
    body = tf_probe.with_probes({"query": caller, "size": 5}, probe)
    assert body["size"] == 5
    outer = body["query"]["bool"]
    assert outer["must"] == [caller], "wrapped, never merged into"
    assert set(outer) == {"must", "should"}
    (never,) = outer["should"]
    assert never["bool"]["filter"] == [{"term": {"_id": tf_probe.NEVER}}]
    named = [c["intervals"][f] for c, f in zip(never["bool"]["should"][:2], ("body", "title"), strict=True)]
    assert [n["_name"] for n in named] == ["_bmx_tf_0", "_bmx_tf_1"]
    assert [n["match"]["query"] for n in named] == ["a", "b"]
    assert never["bool"]["should"][2] == {"match_all": {"_name": tf_probe.CANARY}}


def test_take_frequencies_reads_tf_and_refuses_what_it_cannot_read_exactly():
    probe = tf_probe.Probe((("body", "a"), ("body", "b")))
    ok = tf_probe.CANARY
    hits = [
        {"_id": "1", "matched_queries": {"_bmx_tf_0": 0.75, "_bmx_tf_1": 0.5, ok: 1.0}},
        {"_id": "2", "matched_queries": {ok: 1.0}},  # neither token: tf 0, exactly
        {"_id": "3", "matched_queries": {"_bmx_tf_0": 0.75}},  # no canary: probes not evaluated
        {"_id": "4"},  # nothing at all
        {"_id": "5", "matched_queries": {"_bmx_tf_0": 1.0, ok: 1.0}},  # saturated: tf too large
        {"_id": "6", "matched_queries": {"_bmx_tf_1": "NaN", ok: 1.0}},
    ]
    got = tf_probe.take_frequencies(hits, probe)
    assert got == [{"body": {"a": 3, "b": 1}}, {"body": {}}, None, None, None, None]
    assert all("matched_queries" not in h for h in hits)
