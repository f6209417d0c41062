"""CorpusStats and its exact accumulation: additivity, order independence, subtraction, lookups."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bmx_rerank.scoring import entropy_contribution
from bmx_rerank.stats import corpus
from bmx_rerank.stats.corpus import CorpusStats, EntropyAccumulator, entropy_units, units_to_float

TERMS = ["a", "b", "c", "ünï", "long" * 20, "0,1"]
doc_st = st.dictionaries(st.sampled_from(TERMS), st.integers(0, 60), max_size=6)
docs_st = st.lists(doc_st, max_size=25)


def naive_entropy(docs: list[dict[str, int]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for doc in docs:
        for term, tf in doc.items():
            if tf > 0:
                p = 1.0 / (1.0 + math.exp(-tf))
                out[term] = out.get(term, 0.0) - p * math.log(p)
    return out


@settings(max_examples=150, deadline=None)
@given(a=docs_st, b=docs_st)
def test_disjoint_corpora_sum_to_their_union_and_subtract_back(a, b):
    left, right = CorpusStats.from_documents(a), CorpusStats.from_documents(b)
    union = CorpusStats.from_documents(a + b)
    total = left + right
    assert (total.n_docs, total.total_length) == (union.n_docs, union.total_length)
    assert total.terms.tolist() == union.terms.tolist()
    np.testing.assert_array_equal(total.df, union.df)
    np.testing.assert_array_max_ulp(total.entropy, union.entropy, maxulp=2)
    back = total - right
    assert (back.n_docs, back.total_length, back.terms.tolist()) == (
        left.n_docs,
        left.total_length,
        left.terms.tolist(),
    )
    np.testing.assert_array_equal(back.df, left.df)
    np.testing.assert_allclose(back.entropy, left.entropy, rtol=1e-12, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(docs=docs_st, data=st.data())
def test_document_order_changes_nothing_bit_for_bit(docs, data):
    shuffled = data.draw(st.permutations(docs))
    assert CorpusStats.from_documents(docs).same_as(CorpusStats.from_documents(shuffled))


@settings(max_examples=150, deadline=None)
@given(docs=docs_st)
def test_matches_a_naive_float_computation(docs):
    stats = CorpusStats.from_documents(docs)
    kept = [d for d in docs if any(v > 0 for v in d.values())]
    assert stats.n_docs == len(kept)
    assert stats.total_length == sum(v for d in kept for v in d.values())
    df = Counter(t for d in kept for t, v in d.items() if v > 0)
    want = naive_entropy(kept)
    assert stats.terms.tolist() == sorted(df)
    np.testing.assert_array_equal(stats.df, [df[t] for t in sorted(df)])
    np.testing.assert_allclose(stats.entropy, [want[t] for t in sorted(df)], rtol=1e-12, atol=1e-300)


def test_entropy_units_are_exact_and_vanish_where_float_does():
    """The fixed-point units reproduce the scoring core's float contributions exactly."""
    for tf in range(1, 80):
        assert units_to_float(entropy_units(tf)) == float(entropy_contribution(np.array([tf]))[0]) + 0.0
    assert entropy_units(37) == 0 and entropy_units(10**9) == 0


def test_accumulator_counts_documents_without_tokens_as_seen_only():
    acc = EntropyAccumulator()
    for doc in [{"a": 2}, {}, {"a": 0}, {"b": 1, "a": 1}]:
        acc.add(doc)
    stats = acc.finish()
    assert (acc.n_seen, stats.n_docs, stats.total_length) == (4, 2, 4)
    assert stats.avgdl == 2.0


def test_term_stats_lookup_handles_unknown_and_out_of_range_terms():
    stats = CorpusStats.from_documents([{"b": 1, "d": 3}, {"b": 2}])
    ts = stats.term_stats(["zz", "b", "a", "d", "b"])
    np.testing.assert_array_equal(ts.df, [0, 2, 0, 1, 2])
    assert ts.entropy[0] == 0 and ts.entropy[1] > 0 and ts.n_docs == 2
    empty = CorpusStats.empty()
    assert empty.term_stats(["x"]).df.tolist() == [0] and empty.avgdl == 0.0


@settings(max_examples=60, deadline=None)
@given(docs_st, st.lists(st.lists(st.sampled_from([*TERMS, "zz", "b2"]), max_size=6), max_size=8))
def test_remembered_places_answer_as_the_binary_search(docs, queries):
    """Lookups answer the same whatever was looked up before (places remembered, the memo emptied
    when full), and the memo stays within its bound and out of pickles."""
    import pickle

    stats = CorpusStats.from_documents(docs)
    fresh = CorpusStats.from_documents(docs)
    bound = corpus.REMEMBERED_TERMS
    corpus.REMEMBERED_TERMS = 3
    try:
        for terms in queries:
            got = stats.lookup(terms)
            want = CorpusStats.from_documents(docs).lookup(terms)  # nothing remembered
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
            assert len(stats._places) <= 3
            held = zip(fresh.df.tolist(), fresh.entropy.tolist(), strict=True)
            by_term = dict(zip(fresh.terms.tolist(), held, strict=True))
            pairs = zip(got[0].tolist(), got[1].tolist(), strict=True)
            assert list(pairs) == [by_term.get(t, (0, 0.0)) for t in terms]
    finally:
        corpus.REMEMBERED_TERMS = bound
    again = pickle.loads(pickle.dumps(stats))
    assert again._places == {} and again.same_as(stats)


def test_subtracting_documents_not_held_is_refused():
    stats = CorpusStats.from_documents([{"a": 1}])
    other = CorpusStats.from_documents([{"b": 1}])
    try:
        stats - other
    except ValueError as exc:
        assert "does not hold" in str(exc)
    else:
        raise AssertionError("expected ValueError")
