"""Scoring a window and packing the answer: order, slicing, min_score, explain, untouched parts."""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np
import pytest

from bmx_rerank import scoring
from bmx_rerank.identity import caller
from bmx_rerank.rerank.frequencies import doc_refs
from bmx_rerank.rerank.hits import scores
from bmx_rerank.rerank.pack import combine, fallback, minmax, pack, ranking
from bmx_rerank.rerank.plan import plan_search
from bmx_rerank.rerank.query import Combine, Text
from bmx_rerank.rerank.rescore import Folded, candidate_features, features_of, rescore, score_tree
from bmx_rerank.rerank.term_vector_cache import TermVectorCache, cache_key, entry_bytes
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import DocRef, DocTerms

DOCS = {
    "a": "t0 t0 t1",
    "b": "t0 t3 t3 t5 t6",
    "c": "t3",
    "d": "t1 t2 t2 t2",
    "e": "t0 t3 t4",
}
CORPUS = CorpusStats.from_documents(Counter(text.split()) for text in DOCS.values())


def terms(doc_id: str) -> DocTerms:
    return DocTerms(DocRef("i", doc_id), True, dict(Counter(DOCS[doc_id].split())))


def window(ids):
    hits = [
        {"_index": "i", "_id": i, "_score": 1.0, "_seq_no": n, "_primary_term": 1, "_source": {"n": n}}
        for n, i in enumerate(ids)
    ]
    return {
        "took": 3,
        "hits": {"total": {"value": 42, "relation": "eq"}, "max_score": 1.0, "hits": hits},
        "aggregations": {"k": {"buckets": []}},
    }


def fold(ids, query: str) -> Folded:
    """A one-leaf tree (query on field f) scored over the documents `ids`."""
    tokens = {("f", query): query.split()}
    docs = {"f": [terms(i) for i in ids]}
    return score_tree(
        Text("f", query), {"f": CORPUS}, features_of(docs), len(ids), tokens, [], [1.0], scoring.Request()
    )


def hits_of(response):
    return response["hits"]["hits"]


def brute(ids, tokens, **kw):
    vocab = sorted(set(tokens))
    stats = CORPUS.term_stats(vocab)
    cands = candidate_features([terms(i) for i in ids], vocab)
    q = scoring.Query(np.array([vocab.index(t) for t in tokens]))
    return scoring.score(stats, cands, [q], scoring.Request(**kw))


def test_rescore_equals_the_scoring_core():
    ids = list(DOCS)
    scored = rescore(
        CORPUS,
        partial(candidate_features, [terms(i) for i in ids]),
        [["t0", "t3", "nope"]],
        [1.0],
        scoring.Request(),
    )
    np.testing.assert_allclose(scored.scores, brute(ids, ["t0", "t3", "nope"]), rtol=1e-12)
    assert [lab.token for lab in scored.labels] == ["t0", "t3"], "df=0 tokens are dropped"
    np.testing.assert_allclose(scored.parts.sum(axis=1), scored.scores)


def _pack(response: dict, tree: Folded, plan, marker: dict) -> dict:
    """`pack` of the window's hits as the pipeline packs them, with their `_score`s."""
    hits = hits_of(response)
    return pack(response, hits, scores(hits), tree, plan, marker)


def test_pack_orders_slices_and_keeps_the_rest():
    ids = list(DOCS)
    plan = plan_search(
        {"from": 1, "size": 2, "ext": {"bmx": {"field": "f", "query": "t0 t3", "window_size": 5}}}, {}
    )
    scored = fold(ids, "t0 t3")
    response = window(ids)
    out = _pack(response, scored, plan, {"reranked": True})
    expected = [ids[i] for i in np.argsort(-scored.scores, kind="stable")]
    assert [h["_id"] for h in out["hits"]["hits"]] == expected[1:3]
    assert out["hits"]["max_score"] == pytest.approx(scored.scores.max())
    assert [h["_score"] for h in out["hits"]["hits"]] == sorted(
        [h["_score"] for h in out["hits"]["hits"]], reverse=True
    )
    assert out["hits"]["total"] == {"value": 42, "relation": "eq"}
    assert out["aggregations"] == response["aggregations"]
    assert all("_seq_no" not in h and "_primary_term" not in h for h in out["hits"]["hits"])
    assert all("_source" in h for h in out["hits"]["hits"])
    assert out["_bmx"] == {"reranked": True, "unmatched": 1}, "d holds neither t0 nor t3"
    assert len(response["hits"]["hits"]) == 5, "the upstream answer is not mutated"


def test_min_score_and_explain():
    ids = list(DOCS)
    ext = {"field": "f", "query": "t0 t3", "window_size": 5, "min_score": 0.5, "explain": True}
    plan = plan_search({"size": 5, "ext": {"bmx": ext}}, {})
    scored = fold(ids, "t0 t3")
    response = window(ids)
    out = _pack(response, scored, plan, {})
    kept = [h["_id"] for h in out["hits"]["hits"]]
    assert kept == [ids[i] for i in ranking(scored.scores, 0.5)]
    assert "d" not in kept, "d has neither token: score 0 < min_score"
    for hit in out["hits"]["hits"]:
        exp = hit["_bmx_explanation"]
        assert exp["value"] == pytest.approx(hit["_score"])
        assert sum(d["value"] for d in exp["details"]) == pytest.approx(hit["_score"])
        assert [d["token"] for d in exp["details"]] == ["t0", "t3"]


def test_min_score_above_everything_gives_no_hits_and_null_max_score():
    plan = plan_search({"ext": {"bmx": {"field": "f", "query": "t0", "min_score": 1e9}}}, {})
    response = window(["a"])
    out = _pack(response, fold(["a"], "t0"), plan, {})
    assert out["hits"]["hits"] == [] and out["hits"]["max_score"] is None


def test_seq_no_kept_when_asked():
    plan = plan_search({"seq_no_primary_term": True, "ext": {"bmx": {"field": "f", "query": "t0"}}}, {})
    response = window(["a"])
    assert _pack(response, fold(["a"], "t0"), plan, {})["hits"]["hits"][0]["_seq_no"] == 0


def test_fallback_pages_in_upstream_order():
    plan = plan_search({"from": 1, "size": 2, "ext": {"bmx": {"field": "f", "query": "t0"}}}, {})
    out = fallback(window(list(DOCS)), plan, {"reranked": False})
    assert [h["_id"] for h in out["hits"]["hits"]] == ["b", "c"]
    assert all(h["_score"] == 1.0 for h in out["hits"]["hits"])
    assert out["_bmx"] == {"reranked": False}


def test_wqa_sum_and_merged_through_rescore():
    ids = list(DOCS)
    tokens = [["t0", "t3"], ["t1", "t3"], ["t2"]]
    weights = [1.0, 0.6, 0.3]
    for wqa in ("merged", "sum"):
        req = scoring.Request(wqa_mode=wqa, normalize="paper")
        scored = rescore(CORPUS, partial(candidate_features, [terms(i) for i in ids]), tokens, weights, req)
        vocab = sorted({t for q in tokens for t in q})
        queries = [
            scoring.Query(np.array([vocab.index(t) for t in q]), np.full(len(q), w))
            for q, w in zip(tokens, weights, strict=True)
        ]
        direct = scoring.score(
            CORPUS.term_stats(vocab), candidate_features([terms(i) for i in ids], vocab), queries, req
        )
        np.testing.assert_allclose(scored.scores, direct, rtol=1e-12)
        assert [(lab.token, lab.query) for lab in scored.labels] == [
            ("t0", 0),
            ("t3", 0),
            ("t1", 1),
            ("t3", 1),
            ("t2", 2),
        ]


def test_candidates_and_cache():
    hits = [
        {"_index": "i", "_id": "a", "_routing": "r", "_seq_no": 4, "_primary_term": 2},
        {"_index": "i", "_id": 7},
    ]
    assert doc_refs(hits) == [DocRef("i", "a", "r"), DocRef("i", "7", None)]
    assert cache_key(hits[0], "f", "u") == ("u", "i", "a", 4, 2, "f")
    assert cache_key(hits[1], "f", "u") is None
    alice = caller({"Authorization": "Basic YWxpY2U=", "X-Opaque-Id": "1"})
    assert alice == caller({"authorization": "Basic YWxpY2U=", "X-Opaque-Id": "2"}), "tracing is not identity"
    assert alice != caller({"Authorization": "Basic Ym9i"}) and "YWxpY2U" not in alice
    with pytest.raises(ValueError):
        doc_refs([{"_score": 1}])
    cache = TermVectorCache(max_bytes=2 * entry_bytes(terms("a")))
    for n in range(3):
        cache.put(("u", "i", str(n), 1, 1, "f"), terms("a"))
    assert len(cache) == 2 and cache.get(("u", "i", "0", 1, 1, "f")) is None
    assert cache.get(("u", "i", "2", 1, 1, "f")) == terms("a")
    cache.put(None, terms("a"))
    cache.put(("u", "i", "x", 1, 1, "f"), DocTerms(DocRef("i", "x"), False))
    assert cache.get(("u", "i", "x", 1, 1, "f")) is None, "missing documents are not cached"
    feats = candidate_features([terms("b")], ["t3", "t9"])
    assert feats.tf.tolist() == [[2.0, 0.0]] and feats.length.tolist() == [5.0]


def test_minmax_and_the_three_combinations():
    first = np.array([3.0, 2.0, 1.0, 0.5])
    text = np.array([0.0, 4.0, 2.0, 0.0])
    matched = np.array([False, True, True, False])
    np.testing.assert_allclose(minmax(first), [1.0, 0.6, 0.2, 0.0])
    np.testing.assert_array_equal(minmax(np.array([2.0, 2.0])), [0.0, 0.0])
    final, keys = combine(first, text, matched, "linear", 0.25, 60)
    np.testing.assert_allclose(final, 0.25 * minmax(first) + 0.75 * minmax(text))
    final, _ = combine(first, text, matched, "rrf", 0.5, 10)
    # first-stage ranks 1..4; text ranks: hit 1 first, hit 2 second; hits 0 and 3 absent
    np.testing.assert_allclose(final, [1 / 11, 1 / 12 + 1 / 11, 1 / 13 + 1 / 12, 1 / 14])
    final, keys = combine(first, text, matched, "replace", 0.5, 60)
    np.testing.assert_array_equal(final, [0.0, 4.0, 2.0, 0.0])
    assert [int(i) for i in np.argsort(-keys, kind="stable")] == [1, 2, 0, 3], "unmatched below, in order"
    with pytest.raises(ValueError):
        combine(first, text, matched, "sum", 0.5, 60)


def test_several_fields_fold_as_the_tree_says():
    ids = list(DOCS)
    docs = {"f": [terms(i) for i in ids], "g": [terms(i) for i in reversed(ids)]}
    tokens = {("f", "t0"): ["t0"], ("g", "t3"): ["t3"]}
    req = scoring.Request()
    of = features_of(docs)
    one = {
        f: score_tree(Text(f, q), {"f": CORPUS, "g": CORPUS}, of, len(ids), tokens, [], [1.0], req).scores
        for f, q in (("f", "t0"), ("g", "t3"))
    }
    parts = (Text("f", "t0", 2.0), Text("g", "t3"))
    for how, tie, want in (
        ("sum", 0.0, 2 * one["f"] + one["g"]),
        ("max", 0.5, np.maximum(2 * one["f"], one["g"]) + 0.5 * np.minimum(2 * one["f"], one["g"])),
    ):
        tree = Combine(how, parts, tie_breaker=tie, boost=3.0)
        folded = score_tree(tree, {"f": CORPUS, "g": CORPUS}, of, len(ids), tokens, [], [1.0], req)
        np.testing.assert_allclose(folded.scores, 3 * want, rtol=1e-12)
        np.testing.assert_array_equal(folded.matched, (one["f"] > 0) | (one["g"] > 0))


def test_pack_linear_and_rrf_over_the_window():
    ids = list(DOCS)
    response = window(ids)
    for n, hit in enumerate(response["hits"]["hits"]):
        hit["_score"] = 10.0 - n
    folded = fold(ids, "t0 t3")
    for how in ("linear", "rrf"):
        ext = {"field": "f", "query": "t0 t3", "window_size": 5, "combine": how, "explain": True}
        plan = plan_search({"size": 5, "ext": {"bmx": ext}}, {})
        out = _pack(response, folded, plan, {})
        want, _ = combine(np.arange(10.0, 5.0, -1), folded.scores, folded.matched, how, 0.5, 60)
        got = {h["_id"]: h["_score"] for h in out["hits"]["hits"]}
        assert got == pytest.approx(dict(zip(ids, want, strict=True)))
        assert out["hits"]["hits"][0]["_bmx_explanation"]["details"][0]["description"] == "first-stage _score"


def test_caller_identity_is_the_authentication_headers_only():
    alice = caller({"Authorization": "Basic YWxpY2U=", "X-Request-Id": "1", "traceparent": "00-a"})
    assert alice == caller({"authorization": "Basic YWxpY2U=", "X-Request-Id": "2"}), "per-request ids"
    for name in (
        "Cookie",
        "es-secondary-authorization",
        "x-proxy-user",
        "x-proxy-roles",
        "es-security-runas-user",
    ):
        assert caller({"Authorization": "Basic YWxpY2U=", name: "x"}) != alice, name
    assert caller({}) == caller({"X-Request-Id": "3"}), "anonymous callers share one identity"
    custom = ("Authorization", "X-Jwt")
    assert caller({"X-Jwt": "a"}, custom) != caller({"X-Jwt": "b"}, custom), "a configured header counts"


def test_term_vector_cache_is_bounded_in_bytes():
    long_doc = DocTerms(DocRef("i", "long"), True, {f"term{n}": 1 for n in range(10_000)})
    short = terms("a")
    cache = TermVectorCache(max_bytes=entry_bytes(long_doc) + 10 * entry_bytes(short))
    for n in range(20):
        cache.put(("u", "i", str(n), 1, 1, "f"), short)
    assert len(cache) == 20 and cache.bytes == 20 * entry_bytes(short)
    cache.put(("u", "i", "long", 1, 1, "f"), long_doc)
    assert cache.get(("u", "i", "long", 1, 1, "f")) is long_doc
    assert cache.bytes <= cache.max_bytes and len(cache) <= 11, "short entries made room for the long one"
    tiny = TermVectorCache(max_bytes=entry_bytes(short))
    tiny.put(("u", "i", "long", 1, 1, "f"), long_doc)
    assert len(tiny) == 0, "an entry bigger than the whole cache is not kept"
    assert TermVectorCache(0).get(("u", "i", "long", 1, 1, "f")) is None
