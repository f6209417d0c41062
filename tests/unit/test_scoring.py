"""The vectorized core against the naive per-document implementation, plus invariances and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmx_rerank import scoring
from bmx_rerank.stats.corpus import CorpusStats
from tests.support import naive

TERMS = [f"w{i}" for i in range(8)]
docs_st = st.lists(st.lists(st.sampled_from(TERMS), min_size=0, max_size=30), min_size=1, max_size=12)
query_st = st.lists(st.sampled_from(TERMS + ["unseen"]), min_size=0, max_size=6)
weight_st = st.floats(0.0, 1.0, allow_nan=False)


def core_inputs(corpus: list[list[str]], queries: list[list[str]], weights: list[float]):
    """Build core inputs the way the proxy does: CorpusStats from tf maps, terms looked up by name."""
    from collections import Counter

    stats_all = CorpusStats.from_documents(Counter(d) for d in corpus)
    terms = sorted({t for q in queries for t in q})
    index = {t: i for i, t in enumerate(terms)}
    stats = stats_all.term_stats(terms)
    tf = np.array([[Counter(d)[t] for t in terms] for d in corpus], dtype=float).reshape(
        len(corpus), len(terms)
    )
    cands = scoring.Candidates(tf, np.array([len(d) for d in corpus], dtype=float))
    qs = [
        scoring.Query([index[t] for t in q], np.full(len(q), w))
        for q, w in zip(queries, weights, strict=True)
    ]
    return stats, cands, qs


@settings(max_examples=150, deadline=None)
@given(corpus=docs_st, query=query_st)
def test_bmx_matches_naive(corpus, query):
    if not any(corpus):
        corpus = corpus + [["w0"]]
    stats, cands, qs = core_inputs(corpus, [query], [1.0])
    got = scoring.score(stats, cands, qs)
    want = [naive.bmx(corpus, d, query) for d in corpus]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(corpus=docs_st, query=query_st, k1=st.floats(0.0, 3.0), b=st.floats(0.0, 1.0))
def test_bm25_matches_naive(corpus, query, k1, b):
    if not any(corpus):
        corpus = corpus + [["w0"]]
    stats, cands, qs = core_inputs(corpus, [query], [1.0])
    got = scoring.score(stats, cands, qs, scoring.Request(mode="bm25", k1=k1, b=b))
    want = [naive.bm25(corpus, d, query, k1, b) for d in corpus]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    corpus=docs_st,
    query=query_st,
    augmented=st.lists(st.tuples(query_st, weight_st), min_size=1, max_size=3),
    alpha=st.one_of(st.none(), st.floats(0.0, 2.0)),
    beta=st.one_of(st.none(), st.floats(0.0, 2.0)),
)
def test_wqa_matches_naive(corpus, query, augmented, alpha, beta):
    if not any(corpus):
        corpus = corpus + [["w0"]]
    queries = [query] + [a for a, _ in augmented]
    weights = [1.0] + [w for _, w in augmented]
    stats, cands, qs = core_inputs(corpus, queries, weights)
    merged_tokens = [t for q in queries for t in q]
    merged_weights = [w for q, w in zip(queries, weights, strict=True) for _ in q]
    for mode in ("merged", "sum"):
        got = scoring.score(stats, cands, qs, scoring.Request(alpha=alpha, beta=beta, wqa_mode=mode))
        if mode == "merged":
            want = [naive.bmx(corpus, d, merged_tokens, merged_weights, alpha, beta) for d in corpus]
        else:
            want = [
                sum(
                    w * naive.bmx(corpus, d, q, None, alpha, beta)
                    for q, w in zip(queries, weights, strict=True)
                )
                for d in corpus
            ]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(corpus=docs_st, query=query_st, data=st.data())
def test_permuting_candidates_permutes_scores(corpus, query, data):
    if not any(corpus):
        corpus = corpus + [["w0"]]
    stats, cands, qs = core_inputs(corpus, [query], [1.0])
    perm = np.array(data.draw(st.permutations(range(cands.n))), dtype=int)
    shuffled = scoring.Candidates(cands.tf[perm], cands.length[perm])
    for mode in scoring.MODES:
        req = scoring.Request(mode=mode)
        # Rows in another order may take another matrix-kernel path: equal to the last bit or so.
        np.testing.assert_allclose(
            scoring.score(stats, shuffled, qs, req), scoring.score(stats, cands, qs, req)[perm], rtol=1e-12
        )


@settings(max_examples=60, deadline=None)
@given(corpus=docs_st, query=query_st, length=st.integers(0, 500))
def test_a_candidate_matching_nothing_changes_no_other_score(corpus, query, length):
    if not any(corpus):
        corpus = corpus + [["w0"]]
    stats, cands, qs = core_inputs(corpus, [query], [1.0])
    extra = scoring.Candidates(
        np.vstack([cands.tf, np.zeros((1, cands.tf.shape[1]))]), np.append(cands.length, float(length))
    )
    for mode in scoring.MODES:
        req = scoring.Request(mode=mode)
        got = scoring.score(stats, extra, qs, req)
        # One more row may change the matrix kernel's summation order: equal to the last bit or so.
        np.testing.assert_allclose(got[:-1], scoring.score(stats, cands, qs, req), rtol=1e-12, atol=0)
        assert got[-1] == 0.0


@settings(max_examples=100, deadline=None)
@given(a=docs_st, b=docs_st)
def test_statistics_of_disjoint_corpora_sum_to_their_union(a, b):
    from collections import Counter

    left = CorpusStats.from_documents(Counter(d) for d in a)
    right = CorpusStats.from_documents(Counter(d) for d in b)
    union = CorpusStats.from_documents(Counter(d) for d in a + b)
    total = left + right
    assert total.n_docs == union.n_docs
    assert total.total_length == union.total_length
    assert total.terms.tolist() == union.terms.tolist()
    np.testing.assert_array_equal(total.df, union.df)
    np.testing.assert_allclose(total.entropy, union.entropy, rtol=1e-12)


def _simple():
    stats = scoring.TermStats(4, 10.0, np.array([2.0, 1.0]), np.array([0.3, 0.2]))
    cands = scoring.Candidates(np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]), np.array([8.0, 12.0, 10.0]))
    return stats, cands


def test_zero_candidates_give_an_empty_score_vector():
    stats, _ = _simple()
    empty = scoring.Candidates(np.zeros((0, 2)), np.zeros(0))
    for mode in scoring.MODES:
        out = scoring.score(stats, empty, [scoring.Query([0, 1])], scoring.Request(mode=mode))
        assert out.shape == (0,) and out.dtype == np.float64


@pytest.mark.parametrize("normalize", scoring.NORMALIZATIONS)
def test_an_empty_query_or_only_unknown_tokens_scores_every_candidate_zero(normalize):
    stats = scoring.TermStats(4, 10.0, np.array([2.0, 0.0]), np.array([0.3, 0.0]))
    _, cands = _simple()
    for tokens in ([], [1], [1, 1]):
        out = scoring.score(stats, cands, [scoring.Query(tokens)], scoring.Request(normalize=normalize))
        np.testing.assert_array_equal(out, np.zeros(3))


def test_empty_documents_and_very_long_documents_stay_finite():
    stats = scoring.TermStats(3, 5.0, np.array([2.0]), np.array([0.4]))
    cands = scoring.Candidates(np.array([[0.0], [1.0], [1e6]]), np.array([0.0, 1e9, 1e9]))
    for mode in scoring.MODES:
        out = scoring.score(stats, cands, [scoring.Query([0])], scoring.Request(mode=mode))
        assert np.all(np.isfinite(out))
        assert out[0] == 0.0 and out[2] > out[1] > 0.0


def test_a_longer_document_with_the_same_tf_scores_lower():
    stats = scoring.TermStats(10, 20.0, np.array([3.0]), np.array([0.5]))
    cands = scoring.Candidates(np.array([[2.0], [2.0]]), np.array([10.0, 40.0]))
    for mode in scoring.MODES:
        a, b = scoring.score(stats, cands, [scoring.Query([0])], scoring.Request(mode=mode))
        assert a > b


def test_float64_throughout():
    stats, cands = _simple()
    out = scoring.score(stats, cands, [scoring.Query([0, 1], np.array([1, 1], dtype=np.float32))])
    assert out.dtype == np.float64


def test_duplicated_query_tokens_count_twice():
    stats, cands = _simple()
    once = scoring.score(stats, cands, [scoring.Query([0, 1])])
    twice = scoring.score(stats, cands, [scoring.Query([0, 0, 1])])
    assert twice[0] > once[0]


def test_alpha_beta_overrides_change_scores_and_defaults_follow_the_corpus():
    stats, cands = _simple()
    q = [scoring.Query([0, 1])]
    base = scoring.score(stats, cands, q)
    explicit = scoring.score(
        stats, cands, q, scoring.Request(alpha=scoring.default_alpha(10.0), beta=1 / math.log(5))
    )
    np.testing.assert_allclose(base, explicit, rtol=1e-15)
    assert not np.allclose(base, scoring.score(stats, cands, q, scoring.Request(alpha=0.05, beta=0.1)))
    assert scoring.default_alpha(20.0) == 0.5 and scoring.default_alpha(400.0) == 1.5
    assert scoring.default_alpha(120.0) == pytest.approx(1.2)


def test_normalized_bm25_divides_by_m_times_the_top_idf_as_the_papers_appendix_b():
    """BMX.md: the paper normalizes BMX by m (ln(1 + (N - 0.5)/1.5) + 1) and BM25 by m ln(...), without
    the + 1 (its appendix B); `reference` divides both by m ln(...)."""
    stats, cands = _simple()
    q = [scoring.Query([0, 1])]
    raw = scoring.score(stats, cands, q, scoring.Request(mode="bm25"))
    top_idf = math.log1p((stats.n_docs - 0.5) / 1.5)
    for kind in ("paper", "reference"):
        got = scoring.score(stats, cands, q, scoring.Request(mode="bm25", normalize=kind))
        np.testing.assert_allclose(got, raw / (2 * top_idf), rtol=1e-12)
    bmx = scoring.score(stats, cands, q, scoring.Request())
    paper = scoring.score(stats, cands, q, scoring.Request(normalize="paper"))
    np.testing.assert_allclose(paper, bmx / (2 * (top_idf + 1)), rtol=1e-12)


def test_score_terms_rows_sum_to_scores():
    stats, cands = _simple()
    qs = [scoring.Query([0, 1]), scoring.Query([1], np.array([0.5]))]
    for wqa in scoring.WQA_MODES:
        req = scoring.Request(wqa_mode=wqa, normalize="paper")
        np.testing.assert_allclose(
            scoring.score_terms(stats, cands, qs, req).sum(axis=1), scoring.score(stats, cands, qs, req)
        )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"beta": float("inf")}, "beta"),
        ({"beta": "high"}, "beta"),
        ({"k1": -0.1}, "k1"),
        ({"b": 1.5}, "b"),
        ({"mode": "bm42"}, "mode"),
        ({"wqa_mode": "avg"}, "wqa_mode"),
        ({"normalize": "max"}, "normalize"),
    ],
)
def test_invalid_parameters_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        scoring.Request(**kwargs)


def test_invalid_arrays_are_rejected_with_a_clear_message():
    stats, cands = _simple()
    with pytest.raises(ValueError, match="weights"):
        scoring.Query([0, 1], np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="weights"):
        scoring.Query([0, 1], np.array([1.0]))
    with pytest.raises(ValueError, match="weights"):
        scoring.Query([0], np.array([float("nan")]))
    with pytest.raises(ValueError, match="rows"):
        scoring.Candidates(np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="columns"):
        scoring.score(stats, scoring.Candidates(np.zeros((1, 3)), np.ones(1)), [scoring.Query([0])])
    with pytest.raises(ValueError, match="query tokens"):
        scoring.score(stats, cands, [scoring.Query([5])])
    with pytest.raises(ValueError, match="same shape"):
        scoring.TermStats(3, 1.0, np.array([1.0]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="df"):
        scoring.TermStats(3, 1.0, np.array([4.0]), np.array([0.1]))
    with pytest.raises(ValueError, match="queries"):
        scoring.score(stats, cands, [])
    with pytest.raises(ValueError, match="same weight"):
        scoring.score(
            stats,
            cands,
            [scoring.Query([0]), scoring.Query([0, 1], np.array([0.2, 0.3]))],
            scoring.Request(wqa_mode="sum"),
        )


@given(st.lists(st.integers(0, 40), max_size=30))
def test_distinct_terms_are_numpys_unique_with_its_inverse(tokens: list[int]) -> None:
    """The core's distinct terms (`_distinct`, by marking) are exactly `np.unique`'s, dtypes included."""
    array = np.array(tokens, dtype=np.int64)
    distinct, inverse = scoring._distinct(array)
    want, want_inverse = np.unique(array, return_inverse=True)
    assert distinct.dtype == want.dtype and inverse.dtype == want_inverse.dtype
    assert distinct.tolist() == want.tolist() and inverse.tolist() == want_inverse.reshape(-1).tolist()


_entry = st.sampled_from([0.0, 1.0, 2.5, 3.0, 4.0, -1.0, -0.0, float("nan"), float("inf"), float("-inf")])


def _refusal(make):
    """The message `make` refuses with (None: accepted)."""
    try:
        make()
    except ValueError as exc:
        return str(exc)
    return None


def _valid(*arrays):
    return all(np.isfinite(a).all() and (np.asarray(a) >= 0).all() for a in arrays)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-1, 3),
    st.sampled_from([1.0, 0.0, float("nan"), float("inf")]),
    st.lists(_entry, max_size=3),
    st.lists(_entry, max_size=3),
)
def test_statistics_are_accepted_exactly_when_every_check_passes(n_docs, avgdl, df, entropy):
    """The inputs' checks accept a valid input in a few reductions and go step by step only for a
    refused one (`_refuse`): they accept what the steps accept, and refuse with the first step's message."""
    expected = None
    dfa, ent = np.asarray(df, np.float64), np.asarray(entropy, np.float64)
    if not np.isfinite(dfa).all() or not np.isfinite(ent).all():
        expected = "must be finite"
    elif dfa.shape != ent.shape:
        expected = "same shape"
    elif n_docs < 0:
        expected = "n_docs"
    elif n_docs > 0 and not (math.isfinite(avgdl) and avgdl > 0):
        expected = "avgdl"
    elif (dfa < 0).any() or (dfa > n_docs).any():
        expected = "df must lie"
    elif (ent < 0).any():
        expected = "entropy must be"
    got = _refusal(lambda: scoring.TermStats(n_docs, avgdl, df, entropy))
    assert (got is None) == (expected is None), (got, expected)
    assert got is None or expected in got


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_entry, min_size=2, max_size=2), max_size=3), st.lists(_entry, max_size=3))
def test_features_and_weights_are_accepted_exactly_when_every_check_passes(tf, length):
    tf_array = np.array(tf, np.float64).reshape(len(tf), 2)
    got = _refusal(lambda: scoring.Candidates(tf_array, length))
    assert (got is None) == (len(tf) == len(length) and _valid(tf_array, length)), got
    got = _refusal(lambda: scoring.Query(list(range(len(length))), length))
    assert (got is None) == _valid(length), got
    assert got is None or "weights" in got
